"""Linear layers at query sizes (M = 16 or 32 tokens): cuBLAS against a Triton sweep.

    python benchmarks/experiments/bench_skinny_gemm.py

A single query's forward is a chain of skinny GEMMs that each read a whole weight matrix
once: they should run at HBM bandwidth. This prints, for the linear shapes of bert-large
and qwen3-8b, the µs per call and the weight bandwidth reached by `F.linear` (cuBLAS) and
by the best of a sweep of plain Triton kernels (optionally split along K with fp32
atomics). Each weight is one of several copies, larger than L2 together, cycled in a
CUDA graph: as in a forward pass, no weight is read from L2. Reports only; CUDA only.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from trt_tei_runtime.kernels.reference import quantize_fp8_rowwise
from trt_tei_runtime.layers.fp8 import Fp8Linear

# name: (in_features, out_features)
SHAPES = {
    "bert-large qkv": (1024, 3072),
    "bert-large out": (1024, 1024),
    "bert-large up": (1024, 4096),
    "bert-large down": (4096, 1024),
    "qwen3-8b qkv": (4096, 6144),
    "qwen3-8b out": (4096, 4096),
    "qwen3-8b gate_up": (4096, 24576),
    "qwen3-8b down": (12288, 4096),
}
L2_BYTES = 64 << 20


@triton.jit
def _skinny_kernel(
    X,
    W,
    Y,
    S,
    M,
    N,
    K,
    HAS_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """Y[M, N] (+)= X[M, K] @ W[N, K]^T for one BLOCK_N slice of N and one K split; with
    HAS_SCALE, W is FP8 and S its per-output-channel scales (weight-only FP8)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_chunk = K // SPLIT_K
    k_start = pid_k * k_chunk
    x_ptrs = X + offs_m[:, None] * K + (k_start + offs_k)[None, :]
    w_ptrs = W + offs_n[None, :] * K + (k_start + offs_k)[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, k_chunk, BLOCK_K):
        x = tl.load(x_ptrs, mask=offs_m[:, None] < M, other=0.0)
        w = tl.load(w_ptrs)
        acc += tl.dot(x, w.to(x.dtype))
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_SCALE:
        acc *= tl.load(S + offs_n)[None, :]
    y_ptrs = Y + offs_m[:, None] * N + offs_n[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=offs_m[:, None] < M)
    else:
        tl.atomic_add(y_ptrs, acc, mask=offs_m[:, None] < M)


def skinny_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    config: tuple[int, int, int, int, int],
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    block_n, block_k, split_k, warps, stages = config
    m, k = x.shape
    n = w.shape[0]
    block_m = max(16, triton.next_power_of_2(m))
    if split_k == 1:
        y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    else:
        y = torch.zeros((m, n), device=x.device, dtype=torch.float32)
    grid = (n // block_n, split_k)
    _skinny_kernel[grid](
        x, w, y, scale if scale is not None else w, m, n, k, HAS_SCALE=scale is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return y if split_k == 1 else y.to(x.dtype)


def graph_time_us(calls, rounds: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Median µs per call of a CUDA graph that runs each of `calls` once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(calls))
    return float(np.median(times))


def best_triton(name, m, x, weights, expected, configs, scales=None):  # type: ignore[no-untyped-def]
    """(µs, config) of the fastest correct Triton configuration."""
    best: tuple[float, object] = (float("inf"), None)
    k, n = x.shape[1], weights[0].shape[0]
    for config in configs:
        if n % config[0] or k % (config[1] * config[2]):
            continue
        scale = None if scales is None else scales[0]
        try:
            got = skinny_linear(x, weights[0], config, scale).float()
        except OutOfResources:
            continue
        if (got - expected).abs().max() > 2e-2 * expected.abs().max():
            print(f"{name} M={m} {config}: wrong result", flush=True)
            continue
        calls = [
            lambda w=w, c=config, x=x, i=i: skinny_linear(
                x, w, c, None if scales is None else scales[i]
            )
            for i, w in enumerate(weights)
        ]
        t = graph_time_us(calls)
        best = min(best, (t, config), key=lambda r: r[0])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", default="16,32")
    parser.add_argument("--linears", default="", help="only linears whose name contains this")
    parser.add_argument(
        "--fp8",
        action="store_true",
        help="also FP8 weights: the engine's Fp8Linear (per-token FP8 activations, "
        "_scaled_mm) and Triton with weight-only FP8 (bf16 activations)",
    )
    args = parser.parse_args()
    # (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages)
    configs = list(itertools.product([32, 64, 128], [128, 256], [1, 2, 4], [4], [3, 4]))
    rows = []
    for name, (k, n) in SHAPES.items():
        if args.linears not in name:
            continue
        copies = max(2, -(-2 * L2_BYTES // (n * k * 2)))
        weights = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)
        ]
        fp8 = [quantize_fp8_rowwise(w) for w in weights] if args.fp8 else []
        for m in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            expected = F.linear(x, weights[0]).float()
            cublas = graph_time_us([lambda w=w, x=x: F.linear(x, w) for w in weights])
            best = best_triton(name, m, x, weights, expected, configs)
            row = dict(name=name, m=m, mb=n * k * 2 / 1e6, cublas=cublas, triton=best)
            if fp8:
                layers = [Fp8Linear(q, s.reshape(1, -1), None) for q, s in fp8]
                row["scaled_mm"] = graph_time_us([lambda f=f, x=x: f(x) for f in layers])
                q0, s0 = fp8[0]
                dequantized = F.linear(x, (q0.float() * s0).to(x.dtype)).float()
                row["w8a16"] = best_triton(
                    name, m, x, [q for q, _ in fp8], dequantized, configs,
                    scales=[s.reshape(-1) for _, s in fp8],
                )  # fmt: skip
            rows.append(row)
            print(f"{name} M={m}: {row}", flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16")
    head = "| linear | M | weight MB (bf16) | cuBLAS µs | TB/s | best Triton µs | TB/s | config |"
    if args.fp8:
        head += " FP8 _scaled_mm µs | FP8 weight-only Triton µs | TB/s | config |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        t, config = r["triton"]
        line = (
            f"| {r['name']} | {r['m']} | {r['mb']:.0f} | {r['cublas']:.1f} "
            f"| {r['mb'] / r['cublas']:.2f} | {t:.1f} | {r['mb'] / t:.2f} | {config} |"
        )
        if args.fp8:
            t8, config8 = r["w8a16"]
            line += f" {r['scaled_mm']:.1f} | {t8:.1f} | {r['mb'] / 2 / t8:.2f} | {config8} |"
        print(line)


if __name__ == "__main__":
    main()
