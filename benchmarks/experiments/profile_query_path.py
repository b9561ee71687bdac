"""Where a single query's time goes between the router's Python call and its result.

    python benchmarks/experiments/profile_query_path.py --shapes minilm,bert-large [--model-dir DIR]

The router's inference time for one 24-token query is more than the GPU time of its CUDA
graph. This splits it, with the Backend the router uses (interactive lane included):
- `Backend.embed` as the router calls it (uint32 buffers in, float32 numpy out), on the
  interactive lane and on the bulk lane;
- `Executor.embed` plus the read back, without the Backend;
- the bulk lane's graph replay alone, until the GPU is done, and its GPU time from CUDA
  events.
Medians of `--reps` calls made in turn, in µs. Reports only; CUDA only.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers these experiments share with the maintained scripts live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
from trt_tei_runtime.batch import HostArrays


def interleaved_medians_us(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median µs of each function, calling them in turn so that drift (clocks, a shared
    machine) falls on all of them alike."""
    for fn in fns.values():
        for _ in range(10):
            fn()
    times: dict[str, list[float]] = {label: [] for label in fns}
    for _ in range(reps):
        for label, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) * 1e6 for label, t in times.items()}


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
    batch = HostArrays.check(*arrays).packed()
    graphs = model.bulk.graphs
    assert graphs is not None

    def replay_and_wait() -> None:
        graphs.run(batch)
        torch.cuda.synchronize()

    def lane_replay_and_wait() -> None:
        lane = model.interactive
        assert lane is not None
        assert lane.graphs is not None
        with torch.cuda.stream(lane.stream):
            lane.graphs.run(batch)
        lane.stream.synchronize()

    def model_embed(interactive: bool) -> None:
        lane = model.lane(interactive)
        with lane.active():
            model.embed(batch, lane).cpu()

    rows = interleaved_medians_us(
        {
            "Backend.embed, interactive lane": lambda: backend.embed(*arrays, interactive=True),
            "Backend.embed, bulk lane": lambda: backend.embed(*arrays),
            "model.embed + .cpu(), interactive lane": lambda: model_embed(True),
            "model.embed + .cpu(), bulk lane": lambda: model_embed(False),
            "HostArrays.check(...).packed()": lambda: HostArrays.check(*arrays).packed(),
            "bulk graph replay + synchronize": replay_and_wait,
            "interactive graph replay + synchronize": lane_replay_and_wait,
        },
        reps,
    )
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
        print(f"  {label:<40} {us:8.1f}")
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
