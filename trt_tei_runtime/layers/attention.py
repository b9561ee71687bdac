"""Attention over packed (varlen) batches: no sequence attends to its neighbours.

The implementations, chosen here and nowhere else:
- CUDA, fp16/bf16: our Triton varlen FlashAttention kernel (`triton_attention.py`) on the
  packed tokens. Measured against torch's FlashAttention 2 (`varlen_attn`) on an H100
  (benchmarks/bench_attention.py, docs/journal/results-log.md): 2.2–2.7x faster on a
  24-token query, 1.5–1.8x on a 16k-token backfill batch, and it also does soft-capping (Gemma 2).
- CUDA without Triton: FlashAttention 2 through `torch.nn.attention.varlen.varlen_attn`.
- Everything else (CPU, fp32): scatter the packed tokens into a padded
  `[n_seqs, heads, max_len, head_dim]` tensor and run `scaled_dot_product_attention` with a
  key-padding mask. The scatter indices are computed once per batch in `AttentionMetadata`.
  Soft-capping there takes explicit scores (`_padded_eager`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import triton_attention

try:  # torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:  # pragma: no cover - older torch falls back to padded SDPA
    _varlen_attn = None  # type: ignore[assignment]

_FLASH_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class AttentionMetadata:
    """Per-batch facts every attention layer needs, computed once per forward pass."""

    cu_seqlens: torch.Tensor  # int32 [n+1]
    max_seqlen: int
    # Padded fallback only: flat index of each packed token in [n * max_len] and the
    # key mask [n, 1, 1, max_len] (True = real token).
    pad_index: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    # Triton only: the batch's query blocks (`triton_attention.fill_block_table`), for a
    # launch whose shape depends on neither the batch's sequences nor their lengths (the
    # bulk lane's CUDA graphs); other kernels go by `cu_seqlens` and `max_seqlen`.
    block_table: torch.Tensor | None = None

    @classmethod
    def build(cls, cu_seqlens: torch.Tensor, max_seqlen: int, *, packed: bool) -> AttentionMetadata:
        if packed:
            return cls(cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        pad_index, key_mask = _padding(cu_seqlens, max_seqlen)
        return cls(
            cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, pad_index=pad_index, key_mask=key_mask
        )

    def padding(self, num_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`pad_index` and `key_mask`; computed afresh on each call for a batch built for
        flash (never cached: a CUDA graph's static metadata changes between replays)."""
        if self.pad_index is not None and self.key_mask is not None:
            return self.pad_index, self.key_mask
        return _padding(self.cu_seqlens, self.max_seqlen, num_tokens)


def _padding(
    cu_seqlens: torch.Tensor, max_seqlen: int, num_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    n = lengths.numel()
    seq_of_token = torch.repeat_interleave(
        torch.arange(n, device=lengths.device), lengths, output_size=num_tokens
    )
    pos_in_seq = (
        torch.arange(seq_of_token.numel(), device=lengths.device) - cu_seqlens[seq_of_token].long()
    )
    pad_index = seq_of_token * max_seqlen + pos_in_seq
    key_mask = torch.arange(max_seqlen, device=lengths.device)[None, :] < lengths[:, None]
    return pad_index, key_mask[:, None, None, :]


def packed_attention_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether attention runs on the packed tokens themselves (Triton or FlashAttention:
    CUDA, half precision), with shapes that do not depend on the batch's lengths, which is
    what CUDA graphs need; else it pads (`AttentionMetadata.padding`)."""
    return _varlen_attn is not None and device.type == "cuda" and dtype in _FLASH_DTYPES


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    *,
    causal: bool = False,
    sliding_window: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """q `[T, Hq, D]`, k/v `[T, Hkv, D]` (Hq a multiple of Hkv) → `[T, Hq, D]`.

    `sliding_window` follows Hugging Face's meaning: with `causal`, a query sees itself and
    the `sliding_window - 1` keys before it; without, every key at most `sliding_window`
    positions away on either side (transformers' bidirectional sliding mask).
    `softcap` caps the scaled scores as `softcap * tanh(scores / softcap)` (Gemma 2).
    `bias` `[Hq, L, L]` or `[n, Hq, L, L]` (L = `meta.max_seqlen`) is added to the scaled
    scores at (query position, key position) within each sequence: shared by all sequences
    (MPNet's relative position buckets) or per sequence (DeBERTa's disentangled terms).
    Neither kernel takes one: a bias runs the padded eager path, in float32 scores, on
    every device.
    """
    if bias is not None:
        return _padded_eager(q, k, v, meta, causal, sliding_window, scale, softcap, bias)
    if meta.pad_index is None and triton_attention.available(q):
        return triton_attention.attention(
            q,
            k,
            v,
            meta.cu_seqlens,
            meta.max_seqlen,
            causal=causal,
            sliding_window=sliding_window,
            scale=q.shape[-1] ** -0.5 if scale is None else scale,
            softcap=softcap,
            block_table=meta.block_table,
        )
    if softcap is not None:
        return _padded_eager(q, k, v, meta, causal, sliding_window, scale, softcap)
    if meta.pad_index is None:
        return _flash(q, k, v, meta, causal, sliding_window, scale)
    return _padded_sdpa(q, k, v, meta, causal, sliding_window, scale)


def _flash(q, k, v, meta, causal, sliding_window, scale):  # type: ignore[no-untyped-def]
    assert _varlen_attn is not None
    if sliding_window is None:
        window = (-1, 0) if causal else (-1, -1)
    elif causal:
        window = (sliding_window - 1, 0)
    else:
        window = (sliding_window, sliding_window)
    # FlashAttention takes grouped k/v heads as they are (GQA): no repeated copies.
    # tests/test_kernels_gpu.py checks this equals attention over repeated heads.
    return _varlen_attn(
        q,
        k,
        v,
        meta.cu_seqlens,
        meta.cu_seqlens,
        meta.max_seqlen,
        meta.max_seqlen,
        scale=scale,
        window_size=window,
    )


def pad_heads(x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """Packed `[T, H, D]` → padded `[n, H, L, D]` (zeros past each sequence's end): for
    models that compute a per-sequence attention bias from q or k (DeBERTa)."""
    return _pad(x, meta, meta.padding(x.shape[0])[0])


def _pad(x: torch.Tensor, meta: AttentionMetadata, pad_index: torch.Tensor) -> torch.Tensor:
    n = meta.cu_seqlens.numel() - 1
    padded = x.new_zeros((n * meta.max_seqlen, x.shape[1], x.shape[2]))
    padded[pad_index] = x
    # [n, L, H, D] -> [n, H, L, D]
    return padded.view(n, meta.max_seqlen, x.shape[1], x.shape[2]).transpose(1, 2)


def _padded_sdpa(q, k, v, meta, causal, sliding_window, scale):  # type: ignore[no-untyped-def]
    heads, head_dim = q.shape[1], q.shape[2]
    if k.shape[1] != heads:
        repeat = heads // k.shape[1]
        k = k.repeat_interleave(repeat, dim=1)
        v = v.repeat_interleave(repeat, dim=1)
    pad_index, mask = meta.padding()
    qp, kp, vp = _pad(q, meta, pad_index), _pad(k, meta, pad_index), _pad(v, meta, pad_index)
    allowed = _position_mask(meta.max_seqlen, causal, sliding_window, q.device)
    if allowed is not None:
        mask = mask & allowed[None, None, :, :]
    out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scale)
    # [n, H, L, D] -> [n * L, H, D], then back to the packed tokens.
    out = out.transpose(1, 2).reshape(-1, heads, head_dim)
    return out[pad_index]


def _position_mask(
    length: int, causal: bool, sliding_window: int | None, device: torch.device
) -> torch.Tensor | None:
    """`[L, L]` (query, key) positions allowed by causality and the sliding window."""
    if not causal and sliding_window is None:
        return None
    idx = torch.arange(length, device=device)
    distance = idx[:, None] - idx[None, :]  # query - key
    if not causal:
        assert sliding_window is not None
        return distance.abs() <= sliding_window
    allowed = distance >= 0
    if sliding_window is not None:
        allowed = allowed & (distance < sliding_window)
    return allowed


def _padded_eager(q, k, v, meta, causal, sliding_window, scale, softcap, bias=None):  # type: ignore[no-untyped-def]
    """Explicit scores for what SDPA cannot express (soft-capping, a bias); softmax in
    float32."""
    heads, head_dim = q.shape[1], q.shape[2]
    if k.shape[1] != heads:
        repeat = heads // k.shape[1]
        k = k.repeat_interleave(repeat, dim=1)
        v = v.repeat_interleave(repeat, dim=1)
    pad_index, mask = meta.padding(q.shape[0])
    qp, kp, vp = _pad(q, meta, pad_index), _pad(k, meta, pad_index), _pad(v, meta, pad_index)
    scores = torch.matmul(qp, kp.transpose(-1, -2)).float()
    scores = scores * (head_dim**-0.5 if scale is None else scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + (bias.float() if bias.dim() == 4 else bias.float()[None])
    allowed = _position_mask(meta.max_seqlen, causal, sliding_window, q.device)
    if allowed is not None:
        mask = mask & allowed[None, None, :, :]
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(vp.dtype)
    out = torch.matmul(probs, vp)
    out = out.transpose(1, 2).reshape(-1, heads, head_dim)
    return out[pad_index]
