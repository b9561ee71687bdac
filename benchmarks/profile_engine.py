"""Where an engine forward spends its GPU time, per kernel family. Prints tables.

    python benchmarks/profile_engine.py --shapes bert-large,qwen3-0.6b

For each shape: one backfill batch (`--batch-tokens`, documents of 64–512 tokens) and one
24-token query, both with CUDA graphs as the server runs them, profiled with
`torch.profiler`. Kernels are grouped (GEMM, attention, norm, rotary, activation, copy,
other) with their share of the GPU time, then the slowest kernels are listed. Reports
only; CUDA only.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections import defaultdict
from pathlib import Path

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


def profile_call(fn, reps: int) -> list[tuple[str, float, int]]:  # type: ignore[no-untyped-def]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        total = event.device_time_total if hasattr(event, "device_time_total") else 0
        if total > 0 and event.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((event.key, total / reps, event.count // reps))
    return rows


def report(title: str, rows: list[tuple[str, float, int]], top: int) -> None:
    total = sum(t for _, t, _ in rows)
    by_family: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, t, n in rows:
        by_family[family(name)][0] += t
        by_family[family(name)][1] += n
    print(f"\n== {title}: {total:,.0f} µs of GPU time per call, {sum(n for *_, n in rows)} kernels")
    for name, (t, n) in sorted(by_family.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:<11} {t:>10,.0f} µs {t / total:>6.1%}  {int(n):>5} kernels")
    print("  slowest kernels (µs per call, launches per call):")
    for name, t, n in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"    {t:>9,.0f} {n:>4}  {name[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="bert-large")
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--top", type=int, default=12)
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
            rows = profile_call(lambda m=model, b=backfill: m.embed(b), reps=5)
            report(f"{shape} backfill batch of {total} tokens", rows, args.top)
            rows = profile_call(lambda m=model, q=query: m.embed(q), reps=50)
            report(f"{shape} query of 24 tokens (graph replay)", rows, args.top)
            del model
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
