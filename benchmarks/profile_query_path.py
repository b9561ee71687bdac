"""Where a single query's time goes between the router's Python call and its result.

    python benchmarks/profile_query_path.py --shapes minilm,bert-large [--model-dir DIR]

The router's inference time for one 24-token query is more than the GPU time of its CUDA
graph. This splits it, with the Backend the router uses (interactive lane included):
- `Backend.embed` as the router calls it (uint32 buffers in, float32 numpy out), on the
  interactive lane and on the bulk lane;
- `InferenceModel.embed` plus the read back, without the Backend;
- the graph replay alone (host time to launch it, then until the GPU is done) and the
  GPU time of the replay from CUDA events.
Medians of `--reps` calls, in µs. Reports only; CUDA only.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from shapes import write_random_checkpoint

from trt_tei_runtime.backend import Backend
from trt_tei_runtime.batch import PackedBatch


def median_us(fn: Callable[[], object], reps: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def profile(name: str, folder: Path, reps: int) -> dict[str, float]:
    backend = Backend(
        str(folder), device="cuda", dtype="bfloat16", pooling="mean", max_batch_tokens=16384
    )
    model = backend.model
    offset = model.info.position_offset
    ids = np.random.default_rng(0).integers(1000, 2000, 24).astype(np.uint32)
    arrays = (
        ids.tobytes(),
        np.zeros(24, np.uint32).tobytes(),
        (np.arange(24) + offset).astype(np.uint32).tobytes(),
        np.array([0, 24], np.uint32).tobytes(),
        24,
    )
    batch = PackedBatch.from_arrays(*arrays)
    graphs = model.graphs
    assert graphs is not None

    def replay_and_wait() -> None:
        graphs.run(batch)
        torch.cuda.synchronize()

    def replay_launch_only() -> None:
        graphs.run(batch)

    def model_embed() -> None:
        model.embed(batch).cpu()

    rows = {
        "Backend.embed, interactive lane": median_us(
            lambda: backend.embed(*arrays, interactive=True), reps
        ),
        "Backend.embed, bulk lane": median_us(lambda: backend.embed(*arrays), reps),
        "model.embed + .cpu(), bulk lane": median_us(model_embed, reps),
        "PackedBatch.from_arrays": median_us(lambda: PackedBatch.from_arrays(*arrays), reps),
        "graph replay + synchronize": median_us(replay_and_wait, reps),
        "graph replay, host side only": median_us(replay_launch_only, reps),
    }
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(reps):
        start.record()
        graphs.run(batch)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) * 1000)
    rows["graph replay, GPU time (events)"] = statistics.median(gpu)
    print(f"== {name}: 24-token query, µs (median of {reps})")
    for label, us in rows.items():
        print(f"  {label:<36} {us:8.1f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="minilm,bert-large")
    parser.add_argument("--model-dir", type=Path, help="a real checkpoint for the first shape")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, shape in enumerate(args.shapes.split(",")):
            folder = args.model_dir if (i == 0 and args.model_dir) else None
            folder = folder or write_random_checkpoint(shape, Path(tmp) / shape)
            results[shape] = profile(shape, folder, args.reps)
            torch.cuda.empty_cache()
    labels = list(next(iter(results.values())))
    print("\n| µs | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    for label in labels:
        print(f"| {label} | " + " | ".join(f"{r[label]:.0f}" for r in results.values()) + " |")


if __name__ == "__main__":
    main()
