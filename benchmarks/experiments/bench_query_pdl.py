"""A query's layers as overlapping kernels: cuBLAS against `skinny_linear` with PDL.

    python benchmarks/experiments/bench_query_pdl.py --shapes bert-large,qwen3-0.6b [--tokens 24]

A 24-token query's graph is a chain of ~7 kernels a layer that each read a few MB of
weights; cuBLAS's skinny GEMMs reach ≤ 1.5 TB/s because each starts from nothing when the
one before ends. This builds the linears and norms of each shape's layers (every layer its
own random weights, as in a model; attention left out, its input is a slice of the QKV
output) and times one CUDA graph of the whole stack, per variant:

- `cublas`: what the engine's bulk lane runs (F.linear, addmm into the residual stream,
  cuBLASLt's GELU epilogue, the Triton norm and gated-activation kernels);
- `cublaslt`: the same with torch's BLAS preference on cuBLASLt, as the interactive lane's
  graphs are captured;
- `triton`: `skinny_linear.py` (beside this script) for every linear, gated activations in its
  epilogue, nothing overlapped;
- `pdl`: the same kernels and the norms launched with programmatic dependent launch;
- `pdl+prefetch`: and each linear asks for its weights into L2 before it waits;
- `pdl+prefetch+early`: and each lets the next kernel start before it waits itself;
- `...:BN/BK/W/S[/SPLIT]`: another block size, warps and stages for the linears, and
  optionally each linear split SPLIT ways along K (the last split adds the parts).

Prints µs per stack (GPU time between two events, back-to-back replays, median), the
weight bandwidth that is, and the largest difference of the stack's output from
`cublas`'s (bf16; the per-linear check against F.linear is printed first). CUDA only.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from skinny_linear import skinny_linear
from triton.runtime.errors import OutOfResources

from trt_tei_runtime.kernels import triton_kernels


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    qkv: int  # output features of the fused QKV linear
    attn: int  # input features of the output projection
    intermediate: int
    decoder: bool  # RMSNorm before, gated SiLU; else BERT: LayerNorm after, GELU


SHAPES = {
    "minilm": Shape(6, 384, 3 * 384, 384, 1536, False),
    "bert-large": Shape(24, 1024, 3 * 1024, 1024, 4096, False),
    "qwen3-0.6b": Shape(28, 1024, 4096, 2048, 3072, True),
    "qwen3-8b": Shape(36, 4096, 6144, 4096, 12288, True),
}

VARIANTS = (
    "cublas,triton,pdl,pdl+prefetch,pdl+prefetch+early,"
    "pdl+prefetch:32/128/4/3,pdl+prefetch:16/256/4/3"
)


def layer_weights(shape: Shape, device: str) -> dict[str, torch.Tensor]:
    def w(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5

    def v(n: int, scale: float = 0.02) -> torch.Tensor:
        return torch.randn(n, device=device, dtype=torch.bfloat16) * scale

    h, i = shape.hidden, shape.intermediate
    return {
        "qkv": w(shape.qkv, h),
        "qkv_b": v(shape.qkv),
        "o": w(h, shape.attn),
        "o_b": v(h),
        "up": w(2 * i if shape.decoder else i, h),
        "up_b": v(i),
        "down": w(h, i),
        "down_b": v(h),
        "g1": 1 + v(h, 0.1),
        "b1": v(h),
        "g2": 1 + v(h, 0.1),
        "b2": v(h),
    }


def stack(shape: Shape, weights: list[dict[str, torch.Tensor]], variant: str) -> Callable:
    """A function h -> the stack's output, for one variant."""
    name, _, config = variant.partition(":")
    parts = set(name.split("+"))
    use_skinny = name not in ("cublas", "cublaslt")
    pdl = "pdl" in parts
    options: dict[str, object] = dict(
        pdl=pdl, prefetch="prefetch" in parts, early_trigger="early" in parts
    )
    split_k = 1
    if config:
        bn, bk, warps, stages, *split = (int(c) for c in config.split("/"))
        split_k = split[0] if split else 1
        options.update(block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)
    eps = 1e-6
    # Split-K counters live outside the graph (created by the eager pass before capture).
    counters: dict[int, torch.Tensor] = {}

    def linear(x, w, b=None, **kw):  # type: ignore[no-untyped-def]
        if use_skinny:
            k_split = split_k if x.shape[-1] % (split_k * 16) == 0 else 1
            if k_split > 1 and id(w) not in counters:
                counters[id(w)] = torch.zeros(w.shape[0], device=w.device, dtype=torch.int32)
            return skinny_linear(
                x, w, b, **kw, **options, split_k=k_split, counters=counters.get(id(w))
            )
        into, gelu, gated = kw.get("into"), kw.get("gelu"), kw.get("gated")
        if gelu:
            return torch._addmm_activation(b, x, w.t(), use_gelu=True)
        if into is not None:
            return into.addmm_(x, w.t())
        out = F.linear(x, w, b)
        return triton_kernels.gated_activation(out, gated) if gated else out

    def bert(h: torch.Tensor) -> torch.Tensor:
        a = shape.attn
        for lw in weights:
            qkv = linear(h, lw["qkv"], lw["qkv_b"])
            linear(qkv[:, :a], lw["o"], into=h)
            h = triton_kernels.add_layer_norm(
                h, lw["o_b"].expand_as(h), lw["g1"], lw["b1"], eps, pdl=pdl
            )
            up = linear(h, lw["up"], lw["up_b"], gelu=True)
            linear(up, lw["down"], into=h)
            h = triton_kernels.add_layer_norm(
                h, lw["down_b"].expand_as(h), lw["g2"], lw["b2"], eps, pdl=pdl
            )
        return h

    def decoder(h: torch.Tensor) -> torch.Tensor:
        a = shape.attn
        for lw in weights:
            n, _ = triton_kernels.add_rms_norm(h, None, lw["g1"], eps, False, pdl=pdl)
            qkv = linear(n, lw["qkv"])
            linear(qkv[:, :a], lw["o"], into=h)
            n, _ = triton_kernels.add_rms_norm(h, None, lw["g2"], eps, False, pdl=pdl)
            act = linear(n, lw["up"], gated="silu")
            linear(act, lw["down"], into=h)
        return h

    body = decoder if shape.decoder else bert
    if name != "cublaslt":
        return body

    def with_cublaslt(h: torch.Tensor) -> torch.Tensor:
        before = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            return body(h)
        finally:
            torch.backends.cuda.preferred_blas_library(before)

    return with_cublaslt


def check_linears(shape: Shape, lw: dict[str, torch.Tensor], tokens: int) -> None:
    """Each linear of one layer, `skinny_linear` against F.linear (max abs difference)."""
    h = torch.randn(tokens, shape.hidden, device="cuda", dtype=torch.bfloat16)
    i = shape.intermediate
    cases = {
        "qkv": (skinny_linear(h, lw["qkv"], lw["qkv_b"]), F.linear(h, lw["qkv"], lw["qkv_b"])),
    }
    x = torch.randn(tokens, shape.attn, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(tokens, shape.hidden, device="cuda", dtype=torch.bfloat16)
    cases["o into"] = (skinny_linear(x, lw["o"], into=r.clone()), r.clone().addmm_(x, lw["o"].t()))
    if shape.decoder:
        expected = triton_kernels.gated_activation(F.linear(h, lw["up"]), "silu")
        cases["gate_up silu"] = (skinny_linear(h, lw["up"], gated="silu"), expected)
    else:
        expected = torch._addmm_activation(lw["up_b"], h, lw["up"].t(), use_gelu=True)
        cases["up gelu"] = (skinny_linear(h, lw["up"], lw["up_b"], gelu=True), expected)
    u = torch.randn(tokens, i, device="cuda", dtype=torch.bfloat16)
    cases["down"] = (skinny_linear(u, lw["down"]), F.linear(u, lw["down"]))
    cases["down, 4 splits"] = (skinny_linear(u, lw["down"], split_k=4), F.linear(u, lw["down"]))
    if shape.decoder:
        cases["gate_up silu, 2 splits"] = (
            skinny_linear(h, lw["up"], gated="silu", split_k=2),
            cases["gate_up silu"][1],
        )
    for name, (got, want) in cases.items():
        diff = (got.float() - want.float()).abs().max().item()
        scale = want.float().abs().max().item()
        print(f"  {name}: max abs diff {diff:.3g} (output max {scale:.3g})", flush=True)


def graph_us(fn: Callable, h0: torch.Tensor, reps: int) -> tuple[float, torch.Tensor]:
    """Median GPU µs of one replay of `fn` captured in a graph, and its output."""
    h = h0.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(h.clone())  # compiles every kernel outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(h)
    times = []
    for rep in range(reps + 10):
        h.copy_(h0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if rep >= 10:
            times.append(start.elapsed_time(end) * 1000)
    h.copy_(h0)
    graph.replay()
    torch.cuda.synchronize()
    return float(np.median(times)), out.clone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="bert-large,qwen3-0.6b")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--variants", default=VARIANTS, help=f"comma-separated ({VARIANTS})")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for shape_name in args.shapes.split(","):
        shape = SHAPES[shape_name]
        weights = [layer_weights(shape, "cuda") for _ in range(shape.layers)]
        weight_bytes = sum(
            t.numel() * t.element_size() for lw in weights for t in lw.values() if t.dim() == 2
        )
        print(f"{shape_name}: one layer's linears, skinny_linear vs F.linear", flush=True)
        check_linears(shape, weights[0], args.tokens)
        h0 = torch.randn(args.tokens, shape.hidden, device="cuda", dtype=torch.bfloat16)
        reference = None
        for variant in args.variants.split(","):
            try:
                us, out = graph_us(stack(shape, weights, variant), h0, args.reps)
            except OutOfResources as error:
                print(f"  {variant}: skipped ({error})", flush=True)
                continue
            if reference is None:
                reference = out
            diff = (out.float() - reference.float()).abs().max().item()
            rows.append((shape_name, variant, us, weight_bytes / us / 1e6, diff))
            print(f"  {variant}: {us:.1f} µs, max abs diff from the first {diff:.3g}", flush=True)
    device = torch.cuda.get_device_name()
    print(f"\n{device}, torch {torch.__version__}, {args.tokens} tokens, bf16")
    print("| shape | variant | µs per stack | weights TB/s | max abs diff from cublas |")
    print("|---|---|---|---|---|")
    for shape_name, variant, us, tbs, diff in rows:
        print(f"| {shape_name} | {variant} | {us:.1f} | {tbs:.2f} | {diff:.3g} |")


if __name__ == "__main__":
    main()
