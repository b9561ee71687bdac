"""A linear layer for a handful of tokens (a query), as a chain of kernels that overlap
(`bench_query_pdl.py`; measured against cuBLAS, not adopted: docs/journal/results-log.md,
tenth session).

A 24-token query reads every weight once and does little else: each linear is a skinny GEMM
whose few microseconds are mostly its own start (launch, the first loads from HBM) and its
tail. cuBLAS cannot overlap those with the kernel before it. This kernel can, on Hopper and
later, through programmatic dependent launch (PDL):

- it is launched with the PDL attribute, so it may start while the kernel before it still
  runs;
- before anything else it asks the TMA unit to bring its own rows of the weight into L2
  (`cp.async.bulk.prefetch.L2`: weights never depend on the kernel before);
- then it waits for that kernel (`griddepcontrol.wait`), lets the kernel after it start
  in turn, and reads its inputs.

Every program owns BLOCK_N whole rows of W, which are one contiguous range of memory, and
computes them for all M tokens (no split along K: the result is the same bit for bit
whatever the launch). Epilogues: a bias, tanh-GELU, a gated activation (the rows of W
are [gate; up], the output act(gate) * up), and an accumulate into a residual stream.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from bench_query_prefetch import l2_prefetch
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# Prefetch requests per program: each asks for 1/PREFETCH_CHUNKS of its rows.
PREFETCH_CHUNKS = 8

GATED_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


@triton.jit
def _gelu_tanh(x):
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))


@triton.jit
def _prefetch_rows(
    w_ptr, first_row, K, ROWS: tl.constexpr, CHUNKS: tl.constexpr, ELEMENT_BYTES: tl.constexpr
):
    """Ask for ROWS whole rows of W (contiguous) to be brought into L2, in CHUNKS requests
    spread over the program's threads; returns zeros (see `l2_prefetch`)."""
    elements = ROWS * K // CHUNKS
    starts = w_ptr + first_row.to(tl.int64) * K + tl.arange(0, CHUNKS).to(tl.int64) * elements
    size = tl.full((CHUNKS,), 0, tl.int32) + elements * ELEMENT_BYTES
    return l2_prefetch(starts, size)


@triton.jit
def _finish(acc, acc_up, b_ptr, c_ptr, y_ptr, offs_n, offs_m, rows_m, N, stride_c, stride_y,
            HAS_BIAS: tl.constexpr, HAS_C: tl.constexpr, GELU: tl.constexpr,
            GATED: tl.constexpr, GATE_ACT: tl.constexpr):  # fmt: skip
    """The epilogue: bias, activation, residual, one rounding to the output's type."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n).to(tl.float32)[:, None]
        if GATED:
            acc_up += tl.load(b_ptr + N + offs_n).to(tl.float32)[:, None]
    out_ty = y_ptr.dtype.element_ty
    if GATED:
        # As the unfused path rounds: each GEMM's output, then the activation's.
        gate = acc.to(out_ty).to(tl.float32)
        up = acc_up.to(out_ty).to(tl.float32)
        if GATE_ACT == 0:
            gate = gate * tl.sigmoid(gate)
        else:
            gate = _gelu_tanh(gate)
        acc = gate.to(out_ty).to(tl.float32) * up
    if GELU:
        acc = _gelu_tanh(acc)
    if HAS_C:
        c = tl.load(c_ptr + offs_m[None, :] * stride_c + offs_n[:, None], mask=rows_m)
        acc += c.to(tl.float32)
    tl.store(y_ptr + offs_m[None, :] * stride_y + offs_n[:, None], acc.to(out_ty), mask=rows_m)


@triton.jit
def _skinny_linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    c_ptr,
    y_ptr,
    ws_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_x,
    stride_c,
    stride_y,
    HAS_BIAS: tl.constexpr,
    HAS_C: tl.constexpr,
    GELU: tl.constexpr,
    GATED: tl.constexpr,
    GATE_ACT: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    EARLY_TRIGGER: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREFETCH_CHUNKS: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    first = pid * BLOCK_N
    if PREFETCH:
        pending = _prefetch_rows(w_ptr, first, K, BLOCK_N, PREFETCH_CHUNKS, 2)
        if GATED:
            pending += _prefetch_rows(w_ptr, first + N, K, BLOCK_N, PREFETCH_CHUNKS, 2)
    if PDL:
        if EARLY_TRIGGER:
            gdc_launch_dependents()
        # Nothing above read what the kernel before wrote, or wrote anything.
        gdc_wait()
        if not EARLY_TRIGGER:
            gdc_launch_dependents()
    k_len = K // SPLIT_K
    offs_n = first + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = pid_k * k_len + tl.arange(0, BLOCK_K)
    rows_m = offs_m[None, :] < M
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[None, :] * stride_x + offs_k[:, None]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    up_ptrs = w_ptrs + N.to(tl.int64) * K
    for _ in range(0, k_len, BLOCK_K):
        x = tl.load(x_ptrs, mask=rows_m, other=0.0)
        acc = tl.dot(tl.load(w_ptrs), x, acc)
        if GATED:
            acc_up = tl.dot(tl.load(up_ptrs), x, acc_up)
            up_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if SPLIT_K == 1:
        _finish(acc, acc_up, b_ptr, c_ptr, y_ptr, offs_n, offs_m, rows_m, N, stride_c, stride_y,
                HAS_BIAS, HAS_C, GELU, GATED, GATE_ACT)  # fmt: skip
    else:
        # Each split leaves its partial sums; the last to arrive adds them in split order
        # (the same result whichever arrives last) and finishes.
        tile_size: tl.constexpr = BLOCK_N * BLOCK_M
        tile = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + offs_m[None, :]
        parts = ws_ptr + pid.to(tl.int64) * (2 * SPLIT_K * tile_size)
        tl.store(parts + pid_k * tile_size + tile, acc)
        if GATED:
            tl.store(parts + (SPLIT_K + pid_k) * tile_size + tile, acc_up)
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for split in range(SPLIT_K):
                acc += tl.load(parts + split * tile_size + tile, cache_modifier=".cg")
                if GATED:
                    acc_up += tl.load(
                        parts + (SPLIT_K + split) * tile_size + tile, cache_modifier=".cg"
                    )
            tl.atomic_xchg(count_ptr + pid, 0)  # ready for the next call
            _finish(acc, acc_up, b_ptr, c_ptr, y_ptr, offs_n, offs_m, rows_m, N, stride_c,
                    stride_y, HAS_BIAS, HAS_C, GELU, GATED, GATE_ACT)  # fmt: skip
    if PREFETCH:
        # Never stores: keeps the requests' (zero) results alive.
        sink = y_ptr + tl.arange(0, PREFETCH_CHUNKS)
        tl.store(sink, tl.zeros((PREFETCH_CHUNKS,), y_ptr.dtype.element_ty), mask=pending != 0)


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    into: torch.Tensor | None = None,
    gelu: bool = False,
    gated: str | None = None,
    pdl: bool = True,
    prefetch: bool = True,
    early_trigger: bool = False,
    block_n: int = 16,
    block_k: int = 128,
    num_warps: int = 4,
    num_stages: int = 3,
    split_k: int = 1,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x W^T + b` (then GELU with `gelu`; `act(gate) * up` with `gated`, W's rows being
    [gate; up]); with `into` (`[T, N]`), `into + x W^T + b` written into `into`.
    `pdl`/`prefetch`: overlap with the kernel before (module docstring)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    n = weight.shape[0] // (2 if gated else 1)
    while (k // split_k) % block_k:
        block_k //= 2
    block_m = max(16, triton.next_power_of_2(m))
    workspace = None
    if split_k > 1:
        blocks = n // block_n
        workspace = torch.empty(blocks * 2 * split_k * block_n * block_m, device=x.device)
        if counters is None:
            counters = torch.zeros(blocks, device=x.device, dtype=torch.int32)
    if into is not None:
        out = into.view(-1, n)
    else:
        out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    _skinny_linear_kernel[(n // block_n, split_k)](
        x2,
        weight,
        bias if bias is not None else weight,
        out,
        out,
        workspace if workspace is not None else out,
        counters if counters is not None else out,
        m,
        n,
        k,
        x2.stride(0),
        out.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        HAS_C=into is not None,
        GELU=gelu,
        GATED=gated is not None,
        GATE_ACT=GATED_ACTIVATIONS[gated] if gated is not None else 0,
        PDL=pdl,
        PREFETCH=prefetch,
        EARLY_TRIGGER=early_trigger,
        SPLIT_K=split_k,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PREFETCH_CHUNKS=PREFETCH_CHUNKS,
        num_warps=num_warps,
        num_stages=num_stages,
        launch_pdl=pdl,
    )
    return into if into is not None else out.reshape(*x.shape[:-1], n)
