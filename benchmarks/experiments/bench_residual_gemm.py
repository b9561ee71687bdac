"""The residual add: in the norm after the GEMM, or in the GEMM itself (cuBLAS beta = 1).

    python benchmarks/experiments/bench_residual_gemm.py [--tokens 16384]

A layer's output projection and the norm after it, over a backfill batch, two ways:
- "add in the norm" (the engine before): the GEMM writes its output, and the fused
  add-and-norm kernel reads it and the residual stream;
- "add in the GEMM": `residual.addmm_(x, W^T)` accumulates into the residual stream (the
  GEMM reads it as C, beta = 1), and the norm reads one tensor. BERT's output bias, which
  the GEMM then leaves out, is added by the norm as a broadcast row.
For bert-large's attention-output and FFN-down projections (+ LayerNorm) and qwen3-0.6b's
o_proj and down_proj (+ RMSNorm on the pre-norm residual stream), prints µs per GEMM + norm,
each pair replayed in a CUDA graph, and the largest difference between the two results.
Reports only; CUDA only.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers these experiments share with the maintained scripts live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse

import torch
import torch.nn.functional as F
from bench_attention import graph_time_us

from trt_tei_runtime.kernels import add_layer_norm, add_rms_norm

# name: (hidden, [in_features of the projections that feed the residual], norm)
SHAPES = {
    "bert-large": (1024, [1024, 4096], "layer"),
    "qwen3-0.6b": (1024, [2048, 3072], "rms"),
    "qwen3-8b": (4096, [4096, 12288], "rms"),
}


def measure(tokens: int, hidden: int, features: int, norm: str) -> tuple[float, float, float]:
    """(µs add in the norm, µs add in the GEMM, max abs difference of the norms' outputs)."""
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(tokens, features, device=dev, dtype=dt)
    weight = torch.randn(hidden, features, device=dev, dtype=dt) * features**-0.5
    bias = torch.randn(hidden, device=dev, dtype=dt) if norm == "layer" else None
    stream = torch.randn(tokens, hidden, device=dev, dtype=dt)
    norm_w = torch.rand(hidden, device=dev, dtype=dt) + 0.5
    norm_b = torch.randn(hidden, device=dev, dtype=dt)
    accumulated = stream.clone()

    def in_norm() -> torch.Tensor:
        out = F.linear(x, weight, bias)
        if norm == "layer":
            return add_layer_norm(out, stream, norm_w, norm_b, 1e-12)
        return add_rms_norm(out, stream, norm_w, 1e-6)[0]

    def in_gemm() -> torch.Tensor:
        # The same input every call: the graph replays it, and the stream must not drift.
        accumulated.copy_(stream)
        summed = accumulated.addmm_(x, weight.t())
        if norm == "layer":
            assert bias is not None
            return add_layer_norm(summed, bias.expand_as(summed), norm_w, norm_b, 1e-12)
        return add_rms_norm(summed, None, norm_w, 1e-6)[0]

    def copy_only() -> None:
        accumulated.copy_(stream)

    error = (in_norm().float() - in_gemm().float()).abs().max().item()
    # The copy that keeps `in_gemm`'s input fixed is not part of the engine's work.
    fused = graph_time_us(in_gemm) - graph_time_us(copy_only)
    return graph_time_us(in_norm), fused, error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--tokens", type=int, default=16384)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for shape in args.shapes.split(","):
        hidden, features_list, norm = SHAPES[shape]
        for features in features_list:
            before, after, error = measure(args.tokens, hidden, features, norm)
            rows.append((shape, f"{hidden}x{features}", before, after, error))
            print(rows[-1], flush=True)
    print(
        f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.tokens} tokens, bf16"
    )
    print(
        "| shape | projection (out x in) | add in the norm µs | add in the GEMM µs | gain "
        "| max abs diff |"
    )
    print("|---|---|---|---|---|---|")
    for shape, proj, before, after, error in rows:
        print(
            f"| {shape} | {proj} | {before:.1f} | {after:.1f} | {1 - after / before:+.1%} "
            f"| {error:.1e} |"
        )


if __name__ == "__main__":
    main()
