"""The interactive lane's CUDA graphs captured with torch's BLAS choice against cuBLASLt
(`runtime.blas`, `TRT_TEI_QUERY_BLAS`): a 24-token query's GPU time and its
`Backend.embed(..., interactive=True)` as the router calls it.

    python benchmarks/experiments/bench_query_blas.py --shapes minilm,bert-large,qwen3-0.6b,qwen3-8b

Per shape, one checkpoint and two backends in this process, one per library; their calls
alternate rep by rep. GPU time: the query's graph replayed back to back between two CUDA
events on the lane's stream. `Backend.embed`: back to back and after a 20 ms sleep, host
clock. Also the largest difference between the two backends' rows, and the bulk lane's
library after loading (the switch must not outlive the capture). p50 / p99 ms, printed last.
CUDA only; reports only.
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
from bench_engine import percentiles
from query_graphs import graph_gpu_seconds, in_turn, router_arrays
from shapes import write_random_checkpoint

from trt_tei_runtime.backend import Backend
from trt_tei_runtime.runtime.blas import QUERY_BLAS_ENV

LIBRARIES = ("torch", "cublaslt")
PAUSES = (0.0, 0.020)  # back to back, and a query every 20 ms


def load(folder: Path, library: str) -> Backend:
    os.environ[QUERY_BLAS_ENV] = library
    try:
        return Backend(str(folder), device="cuda", dtype="bfloat16", pooling="mean")
    finally:
        del os.environ[QUERY_BLAS_ENV]


def bench(shape: str, reps: int) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_random_checkpoint(shape, Path(tmp) / shape)
        backends = {library: load(folder, library) for library in LIBRARIES}
    after_load = str(torch.backends.cuda.preferred_blas_library())
    arrays = router_arrays(backends[LIBRARIES[0]])
    rows = {lib: b.embed(*arrays, interactive=True) for lib, b in backends.items()}
    difference = float(np.abs(rows["torch"] - rows["cublaslt"]).max())
    gpu = in_turn(
        {lib: functools.partial(graph_gpu_seconds, backends[lib]) for lib in LIBRARIES}, reps
    )

    def embed_after(library: str, pause: float) -> float:
        if pause:
            time.sleep(pause)
        began = time.perf_counter()
        out = backends[library].embed(*arrays, interactive=True)
        seconds = time.perf_counter() - began
        assert np.array_equal(out, rows[library])
        return seconds

    calls = {
        pause: in_turn({lib: functools.partial(embed_after, lib, pause) for lib in LIBRARIES}, reps)
        for pause in PAUSES
    }

    out = []
    for library in LIBRARIES:
        cells = [percentiles(gpu[library])] + [percentiles(calls[p][library]) for p in PAUSES]
        text = " | ".join(f"{a:.3f} / {b:.3f}" for a, b in cells)
        out.append(f"| {shape} | {library} | {text} | {difference:.2e} | {after_load} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="minilm,bert-large,qwen3-0.6b,qwen3-8b")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        rows += bench(shape, args.reps)
        gc.collect()
        torch.cuda.empty_cache()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; p50 / p99 ms")
    print(
        "\n| shape | interactive graphs' BLAS | query graph, GPU time | Backend.embed, back to "
        "back | Backend.embed, after 20 ms | rows' largest difference | library after loading |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
