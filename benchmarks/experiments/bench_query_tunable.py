"""Does torch's TunableOp find faster GEMMs for a query than cuBLAS's heuristics?

    python benchmarks/experiments/bench_query_tunable.py --shapes bert-large,qwen3-0.6b

A 24-token query's graph is mostly skinny GEMMs that read a few MB of weights each at a
fraction of HBM's bandwidth (docs/journal/results-log.md). torch's TunableOp
(`torch.cuda.tunable`) times the candidate implementations of a GEMM's shape the first time
it runs and keeps the fastest; the graphs' eager pass before each capture is that first
time. On CUDA (torch 2.11) its only candidate is torch's default call (hipBLASLt's
alternatives are registered on ROCm alone), so this cannot find another algorithm there:
`bench_lt_algos.py` asks cuBLASLt for its alternatives directly.

Per shape, one checkpoint and two backends in this process: one loaded as usual, one
loaded with TunableOp on (a rotating buffer larger than L2, so that each candidate reads its
weights from HBM as a query does, and a time limit per GEMM). Their query graphs then replay
alternately between CUDA events. Prints load times, the GEMMs tuned, the query graph's GPU
time p50 / p99 ms and the rows' largest difference. CUDA only; reports only.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers these experiments share with the maintained scripts live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import functools
import gc
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.cuda.tunable as tunable
from bench_engine import percentiles
from query_graphs import graph_gpu_seconds, in_turn, router_arrays
from shapes import write_random_checkpoint

from trt_tei_runtime.backend import Backend


def load(folder: Path) -> tuple[Backend, float]:
    """A backend without the bulk lane's graphs: they capture buckets that no eager pass ran
    before, and TunableOp would then tune inside a capture, which CUDA refuses."""
    os.environ["TRT_TEI_BULK_GRAPHS"] = "0"
    began = time.perf_counter()
    try:
        backend = Backend(str(folder), device="cuda", dtype="bfloat16", pooling="mean")
    finally:
        del os.environ["TRT_TEI_BULK_GRAPHS"]
    return backend, time.perf_counter() - began


def bench(shape: str, reps: int, tuning_ms: int, workdir: Path) -> list[str]:
    folder = write_random_checkpoint(shape, workdir / shape)
    plain, plain_s = load(folder)
    tunable.set_filename(str(workdir / f"tunableop_{shape}.csv"))
    tunable.set_rotating_buffer_size(256)
    tunable.set_max_tuning_duration(tuning_ms)
    tunable.set_max_tuning_iterations(100)
    tunable.enable(True)
    tunable.tuning_enable(True)
    try:
        tuned, tuned_s = load(folder)
        results = tunable.get_results()
    finally:
        tunable.tuning_enable(False)
        tunable.enable(False)
    arrays = router_arrays(plain)
    difference = float(
        np.abs(
            plain.embed(*arrays, interactive=True) - tuned.embed(*arrays, interactive=True)
        ).max()
    )
    backends = {"cuBLAS heuristics": plain, "TunableOp": tuned}
    times = in_turn(
        {name: functools.partial(graph_gpu_seconds, b) for name, b in backends.items()}, reps
    )
    rows = []
    for name, load_s in (("cuBLAS heuristics", plain_s), ("TunableOp", tuned_s)):
        p50, p99 = percentiles(times[name])
        tuned_count = len(results) if name == "TunableOp" else 0
        rows.append(
            f"| {shape} | {name} | {load_s:.1f} | {tuned_count} | {p50:.3f} / {p99:.3f} | "
            f"{difference:.2e} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="bert-large,qwen3-0.6b")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--tuning-ms", type=int, default=30, help="TunableOp's limit per GEMM")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            rows += bench(shape, args.reps, args.tuning_ms, Path(tmp))
            gc.collect()
            torch.cuda.empty_cache()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(
        "\n| shape | GEMMs | load s | GEMM shapes tuned | query graph GPU ms "
        "| rows' largest difference |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
