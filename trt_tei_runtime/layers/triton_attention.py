"""A varlen FlashAttention forward in Triton, straight on the packed tokens.

The engine's attention on CUDA. Against torch's `varlen_attn` (FlashAttention 2) it is
faster at every batch size we serve (benchmarks/bench_attention.py): tiles sized to the
batch's longest sequence make a single query cheap, and base-2 exponentials with 4-warp
64-query tiles do better than FlashAttention 2 on Hopper for sequences of 64–512 tokens. It
also does attention-logit soft-capping (Gemma 2), which FlashAttention 2 does not offer.

Causal or bidirectional masks, sliding windows and grouped-query attention (k/v heads
shared by `GROUP` query heads, never repeated in memory). It never synchronizes with the
host and allocates only its output, so CUDA graphs can capture it; programs of query
blocks past their sequence's end (empty sequences of a graph's static batch included)
return at once. Scores, soft-cap and softmax are float32; exponentials are base 2 with
log2(e) folded into the scale.

Two launches of the one kernel. By default a grid of (query block, sequence, head)
programs sized to the batch: cheap where the batch is what it is launched for (eager
passes, and small graphs whose every slot a batch may fill). With a block table
(`fill_block_table`), a fixed set of persistent programs takes the batch's real query
blocks in turn: the bulk lane's CUDA graphs, whose launch must serve any batch of their
bucket, where a grid sized for the longest possible sequence in every slot took a
decoder's attention 5.5x as long (benchmarks/experiments/bench_table_attention.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

_LOG2E = 1.4426950408889634
# The block-table kernel's query tile: what `default_blocks` picks for every sequence of 64
# tokens or more, at every head size.
TABLE_BLOCK_M = 64
# Persistent programs per SM of the block-table kernel: with 32, as fast as the grid kernel
# on the batch's own grid, or faster (benchmarks/experiments/bench_table_attention.py,
# docs/journal/results-log.md).
PROGRAMS_PER_SM = 32


def available(q: torch.Tensor) -> bool:
    return triton is not None and q.is_cuda


@dataclass(frozen=True)
class Blocks:
    """Tile sizes and launch shape of one kernel instance."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def default_blocks(max_seqlen: int, head_dim: int) -> Blocks:
    """Tiles from the H100 sweep of benchmarks/bench_attention.py
    (docs/journal/results-log.md): query and key tiles no larger than the longest sequence
    needs (at least 16, what `tl.dot` takes),
    else 64 queries by 64 keys in 3 stages for head_dim 64, by 32 keys in 2 stages for
    head_dim 128 (and 256, to stay in registers); 4 warps beat 8 at every size swept."""
    block_d = _block_d(head_dim)
    fit = max(16, triton.next_power_of_2(max(max_seqlen, 1)))
    if fit < 64:
        return Blocks(fit, fit, num_warps=4, num_stages=2)
    if block_d <= 64:
        return Blocks(64, 64, num_warps=4, num_stages=3)
    return Blocks(64, 32, num_warps=4 if block_d <= 128 else 8, num_stages=2)


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


if triton is not None:

    @triton.jit
    def _attend_block(
        Q,
        K,
        V,
        Out,
        start,
        length,
        m0,
        head,
        kv_head,
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
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        HAS_LEFT: tl.constexpr,
        HAS_RIGHT: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr,
    ):
        """One head's attention for the queries `m0 : m0 + BLOCK_M` of the sequence at
        `start` of `length` tokens."""
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
            s = tl.dot(q, k)
            if HAS_SOFTCAP:
                # softcap * tanh(s * scale / softcap), tanh through exp (saturates cleanly
                # at +-1); then into base-2 units for exp2.
                s = s * scale
                s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0)) * 1.4426950408889634
            else:
                s = s * scale  # the launcher folded log2(e) into `scale`
            allowed = col_ok[None, :]
            distance = offs_m[:, None] - offs_n[None, :]  # query - key
            if HAS_LEFT:
                allowed = allowed & (distance <= window_left)
            if HAS_RIGHT:
                allowed = allowed & (-distance <= window_right)
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
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

    @triton.jit
    def _attention_kernel(
        Q,
        K,
        V,
        Out,
        CU,
        TABLE,
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
        HEADS: tl.constexpr,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        HAS_LEFT: tl.constexpr,
        HAS_RIGHT: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr,
        FROM_TABLE: tl.constexpr,
    ):
        """Without `FROM_TABLE`: a program per (query block, sequence, head), blocks past
        their sequence's end doing nothing. With it: persistent programs taking (query
        block, head) items in turn from the block table, `TABLE[0]` blocks and then one
        `seq << 16 | block` entry each."""
        if FROM_TABLE:
            items = tl.load(TABLE) * HEADS
            for item in range(tl.program_id(0), items, tl.num_programs(0)):
                entry = tl.load(TABLE + 1 + item // HEADS)
                head = item % HEADS
                seq = entry >> 16
                start = tl.load(CU + seq)
                _attend_block(
                    Q, K, V, Out, start, tl.load(CU + seq + 1) - start,
                    (entry & 0xFFFF) * BLOCK_M, head, head // GROUP,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_ot, stride_oh, scale, softcap, window_left, window_right,
                    HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                )  # fmt: skip
        else:
            seq = tl.program_id(1)
            head = tl.program_id(2)
            start = tl.load(CU + seq)
            length = tl.load(CU + seq + 1) - start
            m0 = tl.program_id(0) * BLOCK_M
            if m0 < length:
                _attend_block(
                    Q, K, V, Out, start, length, m0, head, head // GROUP,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_ot, stride_oh, scale, softcap, window_left, window_right,
                    HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                )  # fmt: skip


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    causal: bool,
    sliding_window: int | None,
    scale: float,
    softcap: float | None = None,
    blocks: Blocks | None = None,
    block_table: torch.Tensor | None = None,
    programs: int | None = None,
) -> torch.Tensor:
    """q `[T, Hq, D]`, k/v `[T, Hkv, D]` → `[T, Hq, D]`; masks as `varlen_attention`'s.

    `max_seqlen` bounds the sequences in `cu_seqlens` (it sizes the grid and the tiles);
    `blocks` overrides the tiles (benchmarks sweep them). With a `block_table`
    (`fill_block_table`) the grid is a fixed set of persistent programs that take the
    table's blocks in turn: it depends on neither the sequences' count nor their lengths,
    and rows of tokens in no listed block are left unwritten. `programs` overrides their
    count (`persistent_programs`)."""
    assert triton is not None
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    tokens, heads, head_dim = q.shape
    out = torch.empty_like(q)
    if causal:
        left = -1 if sliding_window is None else sliding_window - 1
        right = 0
    else:
        left = right = -1 if sliding_window is None else sliding_window
    if block_table is None:
        tiles = blocks or default_blocks(max_seqlen, head_dim)
        grid: tuple[int, ...] = (
            triton.cdiv(max(max_seqlen, 1), tiles.block_m),
            cu_seqlens.numel() - 1,
            heads,
        )
    else:
        tiles = table_blocks(max_seqlen, head_dim)
        grid = (programs or persistent_programs(q.device),)
    _attention_kernel[grid](
        q,
        k,
        v,
        out,
        cu_seqlens,
        cu_seqlens if block_table is None else block_table,  # not read without a table
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        float(scale) if softcap is not None else float(scale) * _LOG2E,
        float(softcap or 1.0),
        max(left, 0),
        max(right, 0),
        HEADS=heads,
        GROUP=heads // k.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_D=_block_d(head_dim),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        HAS_LEFT=left >= 0,
        HAS_RIGHT=right >= 0,
        HAS_SOFTCAP=softcap is not None,
        FROM_TABLE=block_table is not None,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out


def table_blocks(max_seqlen: int, head_dim: int) -> Blocks:
    """The tiles of the block-table kernel: the default ones with `TABLE_BLOCK_M` queries,
    whatever the batch (the table was cut into blocks of that size)."""
    tiles = default_blocks(max(max_seqlen, TABLE_BLOCK_M), head_dim)
    assert tiles.block_m == TABLE_BLOCK_M
    return tiles


def persistent_programs(device: torch.device) -> int:
    """How many programs the block-table kernel runs: more than an SM holds at once, so
    that a program that drew short blocks is followed by another, not by an idle SM."""
    return PROGRAMS_PER_SM * _multiprocessors(device)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def block_table_capacity(max_tokens: int, max_sequences: int) -> int:
    """Entries a block table needs (its count included) for batches of up to these sizes:
    every sequence adds at most one partial block."""
    return 1 + -(-max_tokens // TABLE_BLOCK_M) + max_sequences


def fill_block_table(cu_seqlens: np.ndarray, table: np.ndarray) -> None:
    """Writes the query blocks of the sequences of `cu_seqlens` into `table` (int32, at
    least `block_table_capacity` entries): their count, then `sequence << 16 | block` for
    each, the longest sequences' first, so that the persistent programs, which take the
    entries in turn, end at about the same time."""
    lengths: np.ndarray = np.diff(cu_seqlens.astype(np.int64))
    if lengths.size >= 1 << 15 or (lengths.size and lengths.max() > TABLE_BLOCK_M << 16):
        raise ValueError("a block table holds up to 32,767 sequences of up to 4M tokens")
    order = np.argsort(-lengths, kind="stable")
    counts: np.ndarray = -(-lengths[order] // TABLE_BLOCK_M)
    total = int(counts.sum())
    sequence: np.ndarray = np.repeat(order, counts)
    first_of_sequence: np.ndarray = np.repeat(np.cumsum(counts) - counts, counts)
    block: np.ndarray = np.arange(total) - first_of_sequence
    table[0] = total
    table[1 : 1 + total] = (sequence << 16) | block
