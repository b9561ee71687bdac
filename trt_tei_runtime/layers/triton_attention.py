"""A varlen FlashAttention forward in Triton for what torch's `varlen_attn` cannot do:
attention-logit soft-capping (Gemma 2), with causal or bidirectional masks, sliding
windows and grouped-query attention, straight on the packed tokens.

It never synchronizes with the host and allocates only its output, so CUDA graphs can
capture it; programs of query blocks past their sequence's end (empty sequences of a
graph's static batch included) return at once. Scores, soft-cap and softmax are float32.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None


def available(q: torch.Tensor) -> bool:
    return triton is not None and q.is_cuda


if triton is not None:

    @triton.jit
    def _softcap_attention_kernel(
        Q,
        K,
        V,
        Out,
        CU,
        stride_qt,
        stride_qh,
        stride_kt,
        stride_kh,
        stride_vt,
        stride_vh,
        stride_ot,
        stride_oh,
        scale,
        softcap,
        window_left,
        window_right,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        HAS_LEFT: tl.constexpr,
        HAS_RIGHT: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        seq = tl.program_id(1)
        head = tl.program_id(2)
        start = tl.load(CU + seq)
        length = tl.load(CU + seq + 1) - start
        m0 = pid_m * BLOCK_M
        if m0 >= length:
            return
        kv_head = head // GROUP
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        row_ok = offs_m < length
        q_ptrs = Q + (start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        lo = 0
        hi = length
        if HAS_LEFT:
            lo = tl.maximum(m0 - window_left, 0)
            lo = (lo // BLOCK_N) * BLOCK_N
        if HAS_RIGHT:
            hi = tl.minimum(m0 + BLOCK_M + window_right, length)
        for n0 in range(lo, hi, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            col_ok = offs_n < length
            k_ptrs = (
                K + (start + offs_n)[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None]
            )
            k = tl.load(k_ptrs, mask=col_ok[None, :] & d_ok[:, None], other=0.0)
            s = tl.dot(q, k) * scale
            # softcap * tanh(s / softcap), tanh through exp (saturates cleanly at +-1).
            s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
            allowed = col_ok[None, :]
            distance = offs_m[:, None] - offs_n[None, :]  # query - key
            if HAS_LEFT:
                allowed = allowed & (distance <= window_left)
            if HAS_RIGHT:
                allowed = allowed & (-distance <= window_right)
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v_ptrs = (
                V + (start + offs_n)[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :]
            )
            v = tl.load(v_ptrs, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptrs = Out + (start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def softcap_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    causal: bool,
    sliding_window: int | None,
    scale: float,
    softcap: float,
) -> torch.Tensor:
    """q `[T, Hq, D]`, k/v `[T, Hkv, D]` → `[T, Hq, D]`; masks as `varlen_attention`'s."""
    assert triton is not None
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    tokens, heads, head_dim = q.shape
    out = torch.empty_like(q)
    if causal:
        left = -1 if sliding_window is None else sliding_window - 1
        right = 0
    else:
        left = right = -1 if sliding_window is None else sliding_window
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m = 64
    block_n = 64 if block_d <= 128 else 32
    grid = (triton.cdiv(max(max_seqlen, 1), block_m), cu_seqlens.numel() - 1, heads)
    _softcap_attention_kernel[grid](
        q,
        k,
        v,
        out,
        cu_seqlens,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        float(scale),
        float(softcap),
        max(left, 0),
        max(right, 0),
        GROUP=heads // k.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HAS_LEFT=left >= 0,
        HAS_RIGHT=right >= 0,
        num_warps=4 if block_d <= 64 else 8,
        num_stages=2,
    )
    return out
