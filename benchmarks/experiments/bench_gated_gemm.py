"""A gated MLP's up-projection and activation as one Triton GEMM, against the engine's
cuBLAS GEMM followed by its fused activation kernel, over a backfill batch.

    python benchmarks/experiments/bench_gated_gemm.py --tokens 16384

The engine computes `gate_up = x @ W^T` (`W = [W_gate; W_up]`, one cuBLAS GEMM writing
`[T, 2F]`), then `silu(gate) * up` (one Triton pass reading `[T, 2F]`, writing `[T, F]`).
The fused kernel keeps two accumulators per output tile, one over W_gate's rows and one
over W_up's, and writes only `silu(gate) * up`: the `[T, 2F]` intermediate never reaches
memory (for qwen3-0.6b at 16k tokens, 201 MB written and read back per layer). It pays only
if its GEMM is about as fast as cuBLAS's. Variant `[KIND:]BM/BN/BK/W/S` = rows and columns
(per half) of an output tile, K per step, warps, stages; KIND `tma` loads tiles through
tensor descriptors, `tma-ws` also warp-specializes the K loop; none: pointer loads. Prints
µs per call (median of CUDA events over graph replays) and the largest difference to the
engine's result last.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from trt_tei_runtime.kernels import fused
from trt_tei_runtime.kernels.triton_kernels import grouped_tile

# (hidden, intermediate) of gated MLPs: docs/performance.md's decoder shapes, nomic-embed-text-v1.5.
SHAPES = {
    "qwen3-0.6b": (1024, 3072),
    "qwen3-8b": (4096, 12288),
    "nomic-embed-text": (768, 3072),
}
VARIANTS = [
    "128/64/64/8/3",
    "128/128/64/8/3",
    "tma:128/64/64/8/3",
    "tma:128/64/64/8/4",
    "tma:128/128/64/8/3",
    "tma-ws:128/64/64/8/3",
    "tma-ws:128/128/64/8/3",
    "tma-ws:128/128/64/4/3",
]


@triton.jit
def _gated_matmul_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    F,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """out[m, f] = silu(x[m] . w[f]) * (x[m] . w[F + f]) for one [BM, BN] tile."""
    tile_m, tile_n = grouped_tile(tl.program_id(0), M, F, BM, BN, GROUP_M)
    rows = tile_m * BM + tl.arange(0, BM)
    cols = tile_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    x_tile = x_ptr + rows[:, None] * stride_xm + ks[None, :]
    gate_tile = w_ptr + cols[None, :] * stride_wn + ks[:, None]
    up_tile = w_ptr + (cols[None, :] + F) * stride_wn + ks[:, None]
    row_ok = rows[:, None] < M
    col_ok = cols[None, :] < F
    gate = tl.zeros((BM, BN), dtype=tl.float32)
    up = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        k_ok = (k + ks) < K
        a = tl.load(x_tile, mask=row_ok & k_ok[None, :], other=0.0)
        g = tl.load(gate_tile, mask=col_ok & k_ok[:, None], other=0.0)
        u = tl.load(up_tile, mask=col_ok & k_ok[:, None], other=0.0)
        gate = tl.dot(a, g, gate)
        up = tl.dot(a, u, up)
        x_tile += BK
        gate_tile += BK
        up_tile += BK
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok & col_ok,
    )


@triton.jit
def _gated_matmul_tma_kernel(
    x_desc,
    w_desc,
    out_desc,
    M,
    F,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """The same tile by tensor-memory-accelerator loads (host-built descriptors), the K
    loop optionally warp-specialized (producer warps load, consumer warps multiply)."""
    tile_m, tile_n = grouped_tile(tl.program_id(0), M, F, BM, BN, GROUP_M)
    off_m = tile_m * BM
    off_n = tile_n * BN
    gate = tl.zeros((BM, BN), dtype=tl.float32)
    up = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=WARP_SPECIALIZE):
        a = x_desc.load([off_m, k])
        g = w_desc.load([off_n, k])
        u = w_desc.load([F + off_n, k])
        gate = tl.dot(a, g.T, gate)
        up = tl.dot(a, u.T, up)
    out = gate / (1.0 + tl.exp(-gate)) * up
    out_desc.store([off_m, off_n], out.to(out_desc.dtype))


def gated_matmul(x: torch.Tensor, w: torch.Tensor, variant: str) -> torch.Tensor:
    kind, _, sizes = variant.rpartition(":")
    bm, bn, bk, warps, stages = (int(v) for v in sizes.split("/"))
    if kind:
        return _gated_matmul_tma(x, w, bm, bn, bk, warps, stages, kind == "tma-ws")
    m, k = x.shape
    f = w.shape[0] // 2
    out = torch.empty((m, f), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, bm) * triton.cdiv(f, bn),)
    _gated_matmul_kernel[grid](
        x,
        w,
        out,
        m,
        f,
        k,
        x.stride(0),
        w.stride(0),
        out.stride(0),
        BM=bm,
        BN=bn,
        BK=bk,
        GROUP_M=8,
        num_warps=warps,
        num_stages=stages,
    )
    return out


def _gated_matmul_tma(  # type: ignore[no-untyped-def]
    x, w, bm, bn, bk, warps, stages, warp_specialize
) -> torch.Tensor:
    m, k = x.shape
    f = w.shape[0] // 2
    out = torch.empty((m, f), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, bm) * triton.cdiv(f, bn),)
    _gated_matmul_tma_kernel[grid](
        TensorDescriptor.from_tensor(x, [bm, bk]),
        TensorDescriptor.from_tensor(w, [bn, bk]),
        TensorDescriptor.from_tensor(out, [bm, bn]),
        m,
        f,
        k,
        BM=bm,
        BN=bn,
        BK=bk,
        GROUP_M=8,
        WARP_SPECIALIZE=warp_specialize,
        num_warps=warps,
        num_stages=stages,
    )
    return out


def engine(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return fused.gated_activation(torch.nn.functional.linear(x, w), "silu")


def time_us(fn, reps: int = 50) -> float:  # type: ignore[no-untyped-def]
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--variants", default=";".join(VARIANTS))
    args = parser.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        hidden, ffn = SHAPES[shape]
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(args.tokens, hidden, device="cuda", generator=gen).bfloat16()
        w = (torch.randn(2 * ffn, hidden, device="cuda", generator=gen) * hidden**-0.5).bfloat16()
        reference = engine(x, w)
        gemm_only = time_us(lambda x=x, w=w: torch.nn.functional.linear(x, w))
        base = time_us(lambda x=x, w=w: engine(x, w))
        flops = 2 * args.tokens * hidden * 2 * ffn
        rows.append(
            f"| {shape} | cuBLAS GEMM, then the activation kernel | {base:,.1f} "
            f"(GEMM alone {gemm_only:,.1f}, {flops / gemm_only / 1e6:,.0f} TFLOP/s) | – |"
        )
        for variant in args.variants.split(";"):
            try:
                out = gated_matmul(x, w, variant)
                diff = (out.float() - reference.float()).abs().max().item()
                us = time_us(lambda x=x, w=w, v=variant: gated_matmul(x, w, v))
            except Exception as exc:  # noqa: BLE001 - a variant that does not compile
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"
                rows.append(f"| {shape} | fused {variant} | failed ({why}) | – |")
                continue
            rows.append(
                f"| {shape} | fused {variant} | {us:,.1f} ({flops / us / 1e6:,.0f} TFLOP/s, "
                f"{base / us - 1:+.1%}) | {diff:.2e} |"
            )
    print(f"device: {torch.cuda.get_device_name()}; {args.tokens} tokens; µs per call")
    print("| shape | kernel | µs | max abs diff to the engine |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
