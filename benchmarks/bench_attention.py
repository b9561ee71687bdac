"""Packed attention: FlashAttention 2 (torch's `varlen_attn`), cuDNN's fused attention and
FlashAttention 4 (the CuTe-DSL kernels of the `flash-attn-4` package, Hopper and newer,
where it is installed) against our Triton kernel.

    python benchmarks/bench_attention.py [--no-cudnn]

For the attention shapes of docs/performance.md's models (bert-large, qwen3-0.6b, qwen3-8b) and
batches from a single 24-token query to a 16k-token backfill batch, prints the time of one
call of each implementation and the Triton tile sweep. cuDNN runs through
`aten._cudnn_attention_forward` with ragged offsets, the path torch's `varlen_attn` takes
when it selects cuDNN; its column says how it ran (in a CUDA graph, else eagerly, else
eagerly without the graph's empty tail sequences) or "fails" where cuDNN refuses the shape.
The others are captured in a CUDA graph and replayed, as the engine runs them, so launch
overhead is not counted, and their `cu_seqlens` carry a CUDA graph's empty tail sequences,
as the engine's graphs do. It is what chose the Triton kernel over FlashAttention 2
(`layers/attention.py`) and the default tiles (`triton_attention.default_blocks`).
FlashAttention 4 compiles each kernel on its first call; its column gives that call's time
beside the replayed one. Reports only; CUDA only.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from trt_tei_runtime.layers import attention

try:
    from flash_attn.cute.interface import flash_attn_varlen_func as fa4_varlen
except ImportError:
    fa4_varlen = None
from trt_tei_runtime.layers.triton_attention import Blocks, default_blocks
from trt_tei_runtime.layers.triton_attention import attention as triton_attention

# name: (query heads, kv heads, head_dim, causal)
HEADS = {
    "bert-large": (16, 16, 64, False),
    "qwen3-0.6b": (16, 8, 128, True),
    "qwen3-8b": (32, 8, 128, True),
}
# name: sequence lengths of one batch
BATCHES = {
    "query 24": [24],
    "16 x 24": [24] * 16,
    "8 x 64-128": list(np.random.default_rng(0).integers(64, 129, 8)),
    "4 x 256": [256] * 4,
    "backfill 16k": list(np.random.default_rng(0).integers(64, 513, 56)),
}
SWEEP = [
    Blocks(16, 16, 4, 2),
    Blocks(32, 32, 4, 2),
    Blocks(64, 32, 4, 2),
    Blocks(64, 64, 4, 2),
    Blocks(64, 64, 4, 3),
    Blocks(64, 64, 8, 2),
    Blocks(64, 128, 4, 2),
    Blocks(128, 64, 4, 2),
    Blocks(128, 64, 8, 3),
    Blocks(128, 128, 8, 2),
    Blocks(128, 64, 8, 2),
    Blocks(128, 128, 8, 3),
    Blocks(64, 64, 4, 4),
]
GRAPH_SLOTS = 66  # a CUDA graph's cu_seqlens length (max_batch_size 64 + 2)


def graph_time_us(fn, reps: int = 20, rounds: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Median µs of one `fn()` over `rounds` replays of a graph of `reps` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return float(np.median(times))


def cudnn_attention(q, k, v, cu, longest, causal):  # type: ignore[no-untyped-def]
    """cuDNN's fused attention on the packed tokens (ragged offsets from `cu`)."""
    return torch.ops.aten._cudnn_attention_forward(
        q, k, v, None, cu, cu, longest, longest, False, 0.0, causal, False,
        scale=q.shape[-1] ** -0.5,
    )[0]  # fmt: skip


def eager_time_us(fn, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
    """Mean µs of one `fn()` launched eagerly `reps` times (launch overhead included)."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / reps


def first_call(fn):  # type: ignore[no-untyped-def]
    """`fn()`'s result and its ms, synchronized (a first call may build or compile)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, (time.perf_counter() - start) * 1e3


def refusal(exc: Exception) -> str:
    return str(exc).splitlines()[0][:200]


def measure_cudnn(q, k, v, cu, live, longest, causal, reference):  # type: ignore[no-untyped-def]
    """cuDNN's (µs per call, max abs difference to `reference`, how it ran and its first
    call's ms: a new shape builds a cuDNN plan), or None where it refuses the shape. Tried
    in a CUDA graph with the graph's empty tail sequences first (as the engine would run
    it), then eagerly with them, then eagerly without them (`live` = the offsets of the real
    sequences only), so the table says which part cuDNN refuses."""
    tries = (
        ("graph", cu, graph_time_us),
        ("eager", cu, eager_time_us),
        ("eager, no empty tail", live, eager_time_us),
    )
    for how, offsets, timer in tries:
        try:
            out, first_ms = first_call(
                lambda o=offsets: cudnn_attention(q, k, v, o, longest, causal)
            )
            error = (out.float() - reference.float()).abs().max().item()
            us = timer(lambda o=offsets: cudnn_attention(q, k, v, o, longest, causal))
            return us, error, f"{how}, first call {first_ms:.1f} ms"
        except RuntimeError as exc:
            print(f"cuDNN refused ({how}): {refusal(exc)}", flush=True)
    return None


def fa4_attention(q, k, v, cu, longest, causal):  # type: ignore[no-untyped-def]
    out = fa4_varlen(
        q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest,
        causal=causal, softmax_scale=q.shape[-1] ** -0.5,
    )  # fmt: skip
    return out[0] if isinstance(out, tuple) else out


def measure_fa4(q, k, v, cu, longest, causal, reference):  # type: ignore[no-untyped-def]
    """FlashAttention 4's (µs per replayed call, max abs difference to `reference`, first
    call's ms), or a line saying why it did not run."""
    if fa4_varlen is None:
        return "not installed"
    try:
        out, first_ms = first_call(lambda: fa4_attention(q, k, v, cu, longest, causal))
        error = (out.float() - reference.float()).abs().max().item()
        return graph_time_us(lambda: fa4_attention(q, k, v, cu, longest, causal)), error, first_ms
    except Exception as exc:  # a beta package: report any refusal, do not stop the sweep
        print(f"FlashAttention 4 failed: {refusal(exc)}", flush=True)
        return "fails"


def fa4_cell(fa4) -> str:  # type: ignore[no-untyped-def]
    if isinstance(fa4, str):
        return fa4
    us, error, first_ms = fa4
    return f"{us:.1f} ({error:.1e}, first call {first_ms:.0f} ms)"


def measure_batch(
    heads: tuple[int, int, int, bool], lengths: list[int], with_cudnn: bool
) -> tuple[float, tuple[float, float, str] | None, object, dict[Blocks, tuple[float, float]]]:
    """FlashAttention 2's µs per call, cuDNN's (µs, max abs difference), FlashAttention
    4's, and per Triton tiling its µs and max abs difference."""
    hq, hkv, dim, causal = heads
    tokens, longest = sum(lengths), max(lengths)
    ends = np.cumsum(lengths).tolist()
    cu_list = [0, *ends] + [tokens] * (GRAPH_SLOTS - len(lengths) - 1)
    cu = torch.tensor(cu_list, device="cuda", dtype=torch.int32)
    live = cu[: len(lengths) + 1].clone()
    q = torch.randn(tokens, hq, dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(tokens, hkv, dim, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    meta = attention.AttentionMetadata(cu_seqlens=cu, max_seqlen=longest)
    flash = attention._flash(q, k, v, meta, causal, None, None)
    flash_us = graph_time_us(lambda: attention._flash(q, k, v, meta, causal, None, None))
    cudnn = measure_cudnn(q, k, v, cu, live, longest, causal, flash) if with_cudnn else None
    fa4 = measure_fa4(q, k, v, cu, longest, causal, flash)
    results: dict[Blocks, tuple[float, float]] = {}
    for blocks in [default_blocks(longest, dim), *SWEEP]:
        # Query tiles past the longest sequence only add masked rows.
        if blocks.block_m > max(16, 1 << (longest - 1).bit_length()) or blocks in results:
            continue

        def run(blocks: Blocks = blocks) -> torch.Tensor:
            return triton_attention(
                q, k, v, cu, longest, causal=causal, sliding_window=None,
                scale=dim**-0.5, blocks=blocks,
            )  # fmt: skip

        error = (run().float() - flash.float()).abs().max().item()
        results[blocks] = (graph_time_us(run), error)
    return flash_us, cudnn, fa4, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default=",".join(HEADS))
    parser.add_argument("--no-cudnn", action="store_true", help="skip cuDNN (slow, refuses graphs)")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for shape in args.shapes.split(","):
        for batch_name, lengths in BATCHES.items():
            lengths = [int(n) for n in lengths]
            flash_us, cudnn, fa4, results = measure_batch(HEADS[shape], lengths, not args.no_cudnn)
            default = default_blocks(max(lengths), HEADS[shape][2])
            best = min(results, key=lambda b: results[b][0])
            tokens = sum(lengths)
            row = (
                shape, batch_name, tokens, flash_us, cudnn, fa4, results[default][0], best,
                results[best],
            )  # fmt: skip
            rows.append(row)
            print(
                f"{shape:11s} {batch_name:13s} flash {flash_us:8.1f} µs cudnn {cudnn} fa4 {fa4} | "
                + " ".join(
                    f"{b.block_m}x{b.block_n}w{b.num_warps}s{b.num_stages}:{t:.1f}"
                    for b, (t, _) in results.items()
                ),
                flush=True,
            )
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; µs per call, bf16")
    print(
        "| shape | batch | tokens | FlashAttention 2 | cuDNN (max abs diff vs FA2, how) "
        "| FlashAttention 4 (max abs diff vs FA2) | Triton (default tiles) | best tiles "
        "| best µs | max abs diff vs FA2 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape, name, tokens, flash_us, cudnn, fa4, default_us, best, (best_us, err) in rows:
        tiles = f"{best.block_m}x{best.block_n} w{best.num_warps} s{best.num_stages}"
        cudnn_cell = "–" if cudnn is None else f"{cudnn[0]:.1f} ({cudnn[1]:.1e}, {cudnn[2]})"
        print(
            f"| {shape} | {name} | {tokens} | {flash_us:.1f} | {cudnn_cell} | {fa4_cell(fa4)} "
            f"| {default_us:.1f} "
            f"| {tiles} | {best_us:.1f} | {err:.1e} |"
        )


if __name__ == "__main__":
    main()
