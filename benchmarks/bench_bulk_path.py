"""How much of the engine's backfill speed survives the router's way of calling it.

    python benchmarks/bench_bulk_path.py --shapes bert-large,qwen3-0.6b [--reps 3] \
        [--bulk-graphs on,off]

The router's bulk thread calls `Backend.embed` with one batch of uint32 buffers and waits
for its rows on the host before it takes the next batch. The engine benchmark launches
batch after batch and waits once at the end. The difference is the time the GPU idles
between two bulk batches: the host's readback, the return to the router and the next
batch's unpacking, copy and first launch. Rows (tokens/s, median of `--reps` runs of the
whole corpus, interleaved):

- engine: `Executor.embed` on batches already unpacked, no readback, one synchronize;
- router: `Backend.embed` on the router's buffers, each batch's rows read back before the
  next batch starts (what the bulk thread does today);
- pipelined: the same buffers through `runtime.dispatch.run_jobs`, which launches batch
  k+1 before it waits for batch k's rows (what `Model.embed` does).

`--bulk-graphs on,off` builds the backend twice per shape, with and without the bulk
lane's CUDA graphs above 2,048 tokens (TRT_TEI_BULK_GRAPHS), and also prints each build's
start-up time and the GPU memory it holds. Batches are packed in arrival order up to
16,384 tokens, as the router's queue packs them; document lengths are docs/performance.md's
backfill (64–512 tokens, seed 0). Random weights in bf16. Reports only; needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from bench_engine import backfill_lengths
from shapes import BF16_LIMIT_TOKENS_PER_S, write_random_checkpoint

from trt_tei_runtime.backend import Backend
from trt_tei_runtime.batch import HostArrays, PackedBatch
from trt_tei_runtime.runtime.dispatch import Job, run_jobs
from trt_tei_runtime.runtime.executor import DEFAULT_MAX_NUM_TOKENS, Executor

Buffers = tuple[bytes, bytes, bytes, bytes]
MAX_BATCH_TOKENS = DEFAULT_MAX_NUM_TOKENS


def router_batches(lengths: list[int], max_tokens: int, vocab: int) -> list[Buffers]:
    """Documents packed in order into batches of at most `max_tokens`, as uint32 buffers."""
    rng = np.random.default_rng(1)
    batches: list[Buffers] = []
    current: list[int] = []
    for length in [*lengths, None]:
        if length is None or (current and sum(current) + length > max_tokens):
            cu = np.concatenate([[0], np.cumsum(current)]).astype(np.uint32)
            ids = rng.integers(1000, vocab - 1, size=int(cu[-1])).astype(np.uint32)
            positions = np.concatenate([np.arange(n) for n in current]).astype(np.uint32)
            types = np.zeros_like(ids)
            batches.append((ids.tobytes(), types.tobytes(), positions.tobytes(), cu.tobytes()))
            current = []
        if length is not None:
            current.append(length)
    return batches


def engine_run(executor: Executor, batches: list[PackedBatch]) -> Callable[[], None]:
    def run() -> None:
        with executor.bulk.active():
            for batch in batches:
                executor.embed(batch, executor.bulk)
        torch.cuda.synchronize()

    return run


def router_run(backend: Backend, batches: list[Buffers]) -> Callable[[], None]:
    def run() -> None:
        for buffers in batches:
            backend.embed(*buffers)

    return run


def pipelined_run(executor: Executor, batches: list[Buffers]) -> Callable[[], None]:
    def jobs() -> Iterator[Job]:
        for i, buffers in enumerate(batches):
            yield Job(i, HostArrays.check(*buffers).packed())

    def run() -> None:
        for _ in run_jobs([executor], jobs(), Executor.embed):
            pass

    return run


def bench_shape(
    shape: str, folder: Path, args: argparse.Namespace, bulk_graphs: str
) -> dict[str, float]:
    # The runtime's default batch limit is the router's (16,384 tokens); passing it would
    # also require the decoders' 32k-token inputs to fit in one batch.
    os.environ["TRT_TEI_BULK_GRAPHS"] = "1" if bulk_graphs == "on" else "0"
    torch.cuda.synchronize()
    began = time.perf_counter()
    backend = Backend(str(folder), dtype="bfloat16")
    startup_s = time.perf_counter() - began
    executor = backend.executors[0]
    assert (executor.bulk.large_graphs is not None) == (bulk_graphs == "on")
    vocab = int(executor.model.network.vocab_size)
    lengths = backfill_lengths(shape)
    buffers = router_batches(lengths, MAX_BATCH_TOKENS, vocab)
    unpacked = [HostArrays.check(*b).packed() for b in buffers]
    tokens = sum(lengths)
    runs = {
        "engine": engine_run(executor, unpacked),
        "router": router_run(backend, buffers),
        "pipelined": pipelined_run(executor, buffers),
    }
    for run in runs.values():
        run()  # warm-up: every path once
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.reps):
        for name, run in runs.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    row = {name: tokens / statistics.median(t) for name, t in times.items()}
    row["batches"] = len(buffers)
    row["tokens"] = tokens
    row["startup_s"] = startup_s
    row["reserved_gib"] = torch.cuda.memory_reserved() / 2**30
    del backend, executor
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="bert-large,qwen3-0.6b")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--bulk-graphs", default="on", help="comma-separated builds: on, off (default: on)"
    )
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            folder = write_random_checkpoint(shape, Path(tmp) / shape)
            for bulk_graphs in args.bulk_graphs.split(","):
                rows[shape, bulk_graphs] = bench_shape(shape, folder, args, bulk_graphs)
    print(f"device: {torch.cuda.get_device_name()}; bf16, batches of ≤ {MAX_BATCH_TOKENS}")
    print(
        "| shape | bulk graphs | batches | engine tok/s | router-style tok/s (of engine) "
        "| pipelined (of engine) | start-up s | GPU memory reserved GiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (shape, bulk_graphs), r in rows.items():
        limit = BF16_LIMIT_TOKENS_PER_S.get(shape)
        of_limit = f" ({r['engine'] / limit:.0%} of limit)" if limit else ""
        print(
            f"| {shape} | {bulk_graphs} | {r['batches']:.0f} | {r['engine']:,.0f}{of_limit} "
            f"| {r['router']:,.0f} ({r['router'] / r['engine']:.1%}) "
            f"| {r['pipelined']:,.0f} ({r['pipelined'] / r['engine']:.1%}) "
            f"| {r['startup_s']:.1f} | {r['reserved_gib']:.2f} |"
        )


if __name__ == "__main__":
    main()
