"""The interactive lane's CUDA graphs captured with torch's BLAS choice against cuBLASLt
(`runtime.blas`, `TRT_TEI_QUERY_BLAS`): a 24-token query's GPU time and its
`Backend.embed(..., interactive=True)` as the router calls it.

    python benchmarks/bench_query_blas.py --shapes minilm,bert-large,qwen3-0.6b,qwen3-8b

Per shape, one checkpoint and two backends in this process, one per library; their calls
alternate rep by rep. GPU time: the query's graph replayed back to back between two CUDA
events on the lane's stream. `Backend.embed`: back to back and after a 20 ms sleep, host
clock. Also the largest difference between the two backends' rows, and the bulk lane's
library after loading (the switch must not outlive the capture). p50 / p99 ms, printed last.
CUDA only; reports only.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_engine import percentiles, random_ids
from shapes import write_random_checkpoint

from trt_tei_runtime.backend import Backend
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.runtime.blas import QUERY_BLAS_ENV

QUERY_TOKENS = 24
LIBRARIES = ("torch", "cublaslt")


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
    first = backends[LIBRARIES[0]].model
    query = PackedBatch.from_sequences(
        random_ids([QUERY_TOKENS], first.model.network.vocab_size, seed=2),
        position_offset=first.info.position_offset,
    )
    arrays = tuple(
        t.numpy().astype("<u4").tobytes()
        for t in (query.input_ids, query.token_type_ids, query.position_ids, query.cu_seqlens)
    )
    rows = {lib: b.embed(*arrays, interactive=True) for lib, b in backends.items()}
    difference = float(np.abs(rows["torch"] - rows["cublaslt"]).max())

    gpu: dict[str, list[float]] = {lib: [] for lib in LIBRARIES}
    for i in range(2 * (reps + 10)):
        library = LIBRARIES[i % 2]
        lane = backends[library].model.interactive
        assert lane is not None
        graph = lane.graphs.graphs[lane.graphs.bucket_for(QUERY_TOKENS, 1)][0]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(lane.stream):
            start.record()
            graph.replay()
            end.record()
        end.synchronize()
        if i >= 20:
            gpu[library].append(start.elapsed_time(end) / 1e3)

    calls: dict[tuple[str, float], list[float]] = {}
    for pause in (0.0, 0.020):
        for i in range(2 * (reps + 10)):
            library = LIBRARIES[i % 2]
            if pause:
                time.sleep(pause)
            began = time.perf_counter()
            out = backends[library].embed(*arrays, interactive=True)
            seconds = time.perf_counter() - began
            assert np.array_equal(out, rows[library])
            if i >= 20:
                calls.setdefault((library, pause), []).append(seconds)

    out = []
    for library in LIBRARIES:
        cells = [percentiles(gpu[library])] + [percentiles(calls[library, p]) for p in (0.0, 0.020)]
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
