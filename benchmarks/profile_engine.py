"""Where an engine forward spends its GPU time, per kernel family. Prints tables.

    python benchmarks/profile_engine.py --shapes bert-large,qwen3-0.6b

For each shape: one backfill batch (`--batch-tokens`, documents of 64–512 tokens) and one
24-token query, both with CUDA graphs as the server runs them, profiled with
`torch.profiler`. Kernels are grouped (GEMM, attention, norm, rotary, activation, copy,
other) with their share of the GPU time, then the slowest kernels are listed. Each call's
wall time is printed beside its kernels' sum, each call read back to the host as the
router does, so that the GPU's idle share (launch gaps, the gate, the read-back) shows.
Reports only; CUDA only.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from bench_engine import random_ids
from shapes import write_random_checkpoint
from torch.profiler import ProfilerActivity, profile

from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.runtime import load_executor

# First match wins; kernel names as CUDA reports them.
FAMILIES = [
    ("attention", r"flash|fmha|attn|attention"),
    ("gemm", r"gemm|cutlass|sm90_xmma|nvjet|cublas|matmul|_scaled_mm"),
    ("norm", r"norm"),
    ("rotary", r"rotate"),
    ("activation", r"gated|gelu|silu|activation"),
    ("quantize", r"quantize"),
    ("pooling", r"segment_mean|pool"),
    ("copy", r"copy|memcpy|memset|fill"),
]


def family(name: str) -> str:
    lowered = name.lower()
    return next((f for f, pattern in FAMILIES if re.search(pattern, lowered)), "other")


@dataclass
class Profile:
    rows: list[tuple[str, float, int]]  # (kernel, µs per call, launches per call)
    gaps: dict[str, tuple[float, float]]  # kernel after a gap: (idle µs, gaps per call)


def profile_call(fn, reps: int) -> Profile:  # type: ignore[no-untyped-def]
    """Each call's result read back to the host, as the router does."""
    for _ in range(3):
        fn().cpu()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn().cpu()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        total = event.device_time_total if hasattr(event, "device_time_total") else 0
        if total > 0 and event.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((event.key, total / reps, event.count // reps))
    return Profile(rows, idle_gaps(prof, reps))


def idle_gaps(prof, reps: int) -> dict[str, tuple[float, float]]:  # type: ignore[no-untyped-def]
    """Where the GPU waits: each stretch with no kernel running, charged to the kernel
    that ends it (per call)."""
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    gaps: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    busy_until = spans[0][1] if spans else 0
    for start, end, name in spans[1:]:
        if start > busy_until:
            gaps[name][0] += (start - busy_until) / reps
            gaps[name][1] += 1 / reps
        busy_until = max(busy_until, end)
    return {name: (t, n) for name, (t, n) in gaps.items()}


def wall_us(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    """Median µs of one `fn()` whose result is copied to the host, as the router reads a
    batch back before it sends the next."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn().cpu()
        times.append((time.perf_counter() - start) * 1e6)
    return float(np.median(times))


def report(title: str, result: Profile, top: int, wall: float | None = None) -> None:
    rows = result.rows
    total = sum(t for _, t, _ in rows)
    by_family: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, t, n in rows:
        by_family[family(name)][0] += t
        by_family[family(name)][1] += n
    print(f"\n== {title}: {total:,.0f} µs of GPU time per call, {sum(n for *_, n in rows)} kernels")
    if wall is not None:
        print(
            f"  wall {wall:,.0f} µs per call read back: the GPU idle {1 - total / wall:.1%} of it"
        )
    for name, (t, n) in sorted(by_family.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:<11} {t:>10,.0f} µs {t / total:>6.1%}  {int(n):>5} kernels")
    print("  slowest kernels (µs per call, launches per call):")
    for name, t, n in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"    {t:>9,.0f} {n:>4}  {name[:110]}")
    idle = sum(t for t, _ in result.gaps.values())
    print(f"  idle stretches inside the trace: {idle:,.0f} µs per call, before (µs, stretches):")
    for name, (t, n) in sorted(result.gaps.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"    {t:>9,.1f} {n:>5.1f}  {name[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="bert-large")
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument(
        "--ungated",
        action="store_true",
        help="also profile the backfill batch on an executor without the interactive lane",
    )
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for shape in args.shapes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            folder = write_random_checkpoint(shape, Path(tmp) / shape)
            model = load_executor(
                folder, device="cuda", dtype="bfloat16", max_num_tokens=args.batch_tokens
            )
            vocab = model.model.network.vocab_size
            offset = model.info.position_offset
            lengths, total = [], 0
            gen = torch.Generator().manual_seed(0)
            while True:
                n = int(torch.randint(64, 513, (1,), generator=gen))
                if total + n > args.batch_tokens:
                    break
                lengths.append(n)
                total += n
            backfill = PackedBatch.from_sequences(
                random_ids(lengths, vocab), position_offset=offset
            )
            query = PackedBatch.from_sequences(
                random_ids([24], vocab, seed=2), position_offset=offset
            )
            executors = [("the server's executor", model)]
            if args.ungated:
                executors.append(
                    (
                        "no interactive lane (ungated)",
                        load_executor(
                            folder,
                            device="cuda",
                            dtype="bfloat16",
                            max_num_tokens=args.batch_tokens,
                            interactive_lane=False,
                        ),
                    )
                )
            for name, executor in executors:
                result = profile_call(lambda m=executor, b=backfill: m.embed(b), reps=5)
                wall = wall_us(lambda m=executor, b=backfill: m.embed(b), reps=10)
                report(f"{shape} backfill batch of {total} tokens, {name}", result, args.top, wall)
            result = profile_call(lambda m=model, q=query: m.embed(q), reps=50)
            wall = wall_us(lambda m=model, q=query: m.embed(q), reps=50)
            report(f"{shape} query of 24 tokens (graph replay)", result, args.top, wall)
            del executors
            del model
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
