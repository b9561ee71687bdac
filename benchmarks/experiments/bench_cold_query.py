"""What keeps a query's host path fast between queries that come every 20 ms.

    python benchmarks/experiments/bench_cold_query.py \
        --shapes minilm,bert-large --tokenizer ../.carry/minilm-xz

A query after a 20 ms pause costs the host several times what it costs back to back
(docs/journal/results-log.md: tokenization ~0.13 against ~0.03 ms, the runtime's direct path
~0.37 against ~0.18 ms for MiniLM). The router's interactive thread already spins between
queries, so its core never halts; what is still cold is the code and data a query touches.
This script times a 24-token query, tokenization (`tokenizers`, the crate the router
uses) then `Backend.embed(..., interactive=True)` as the router calls it, after 20 ms of:

- nothing (back to back) — the floor;
- sleep — a thread that blocks;
- spin — a busy-wait, what the router's interactive thread does today;
- spin, warm runtime — the busy-wait calls `Backend.warm_query()` every millisecond: the
  direct path's host steps on the last query's arrays (the checks, the bucket, the pinned
  buffer's fill, the CUDA context, both copies and a wait on the lane's stream; no graph
  launch, no gate);
- spin, warm tokenizer — the busy-wait encodes a short text every millisecond;
- spin, warm both;
- spin, query every 1 ms — the whole query every millisecond, GPU included: the ceiling;
- sleep, `/dev/cpu_dma_latency` 0 — a PM QoS request that keeps idle cores out of deep
  sleep states, where the process may write it.

The variants take turns rep by rep. Prints the host's cpuidle driver and p50 / p99 ms last.
CUDA only; reports only.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers these experiments share with the maintained scripts live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import gc
import os
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from bench_engine import percentiles
from shapes import write_random_checkpoint
from tokenizers import Tokenizer

from trt_tei_runtime.backend import Backend

PAUSE_S = 0.020
WARM_EVERY_S = 0.001
QUERY = "how do I reset the password of my account when the recovery email no longer works"
WARM_TEXT = "a short text that keeps the tokenizer's tables in the cache"


def cpuidle() -> str:
    base = Path("/sys/devices/system/cpu/cpuidle")
    driver = (base / "current_driver").read_text().strip() if base.exists() else "none"
    states = sorted(Path("/sys/devices/system/cpu/cpu0/cpuidle").glob("state*"))
    names = [(s / "name").read_text().strip() for s in states]
    return f"cpuidle driver {driver}, cpu0 states {names}"


class LatencyRequest:
    """Holds a PM QoS CPU latency request of 0 µs while open (None where not permitted)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        try:
            self.fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
            os.write(self.fd, struct.pack("i", 0))
        except OSError as e:
            print(f"/dev/cpu_dma_latency: {e}")
            self.fd = None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def spin(seconds: float, every: Callable[[], None] | None = None) -> None:
    until = time.perf_counter() + seconds
    next_at = time.perf_counter()
    while (now := time.perf_counter()) < until:
        if every is not None and now >= next_at:
            every()
            next_at = now + WARM_EVERY_S


def bench(shape: str, tokenizer: Tokenizer, reps: int) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_random_checkpoint(shape, Path(tmp) / shape)
        backend = Backend(str(folder), device="cuda", dtype="bfloat16", pooling="mean")
    lane = backend.model.interactive
    assert lane is not None and lane.query_path is not None
    vocab = backend.model.model.network.vocab_size
    ids = [i % vocab for i in tokenizer.encode(QUERY).ids]
    n = len(ids)
    arrays = tuple(
        np.asarray(a, dtype="<u4").tobytes() for a in (ids, [0] * n, list(range(n)), [0, n])
    )
    backend.embed(*arrays, interactive=True)  # the query `warm_query` repeats

    def runtime_warm() -> None:
        backend.warm_query()

    def tokenizer_warm() -> None:
        tokenizer.encode(WARM_TEXT)

    def both_warm() -> None:
        runtime_warm()
        tokenizer_warm()

    def query_warm() -> None:
        tokenizer.encode(QUERY)
        backend.embed(*arrays, interactive=True)

    latency = LatencyRequest()
    variants: dict[str, Callable[[], None]] = {
        "back to back": lambda: None,
        "sleep": lambda: time.sleep(PAUSE_S),
        "spin": lambda: spin(PAUSE_S),
        "spin, warm runtime": lambda: spin(PAUSE_S, runtime_warm),
        "spin, warm tokenizer": lambda: spin(PAUSE_S, tokenizer_warm),
        "spin, warm both": lambda: spin(PAUSE_S, both_warm),
        "spin, query every 1 ms": lambda: spin(PAUSE_S, query_warm),
    }
    if latency.fd is not None:
        variants["sleep, cpu_dma_latency 0"] = lambda: time.sleep(PAUSE_S)
    reference = backend.embed(*arrays, interactive=True)
    times: dict[str, tuple[list[float], list[float]]] = {v: ([], []) for v in variants}
    try:
        for rep in range(reps + 10):
            for name, before in variants.items():
                if name.endswith("cpu_dma_latency 0"):
                    latency = LatencyRequest()
                before()
                began = time.perf_counter()
                tokenizer.encode(QUERY)
                tokenized = time.perf_counter()
                rows = backend.embed(*arrays, interactive=True)
                done = time.perf_counter()
                latency.close()
                assert np.array_equal(rows, reference)
                if rep >= 10:
                    times[name][0].append(tokenized - began)
                    times[name][1].append(done - tokenized)
    finally:
        latency.close()
    out = []
    for name, (tok, run) in times.items():
        cells = [
            percentiles(tok),
            percentiles(run),
            percentiles([a + b for a, b in zip(tok, run, strict=True)]),
        ]
        out.append(
            f"| {shape} | {name} | " + " | ".join(f"{a:.3f} / {b:.3f}" for a, b in cells) + " |"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="minilm,bert-large")
    parser.add_argument(
        "--tokenizer", type=Path, required=True, help="a folder with tokenizer.json"
    )
    parser.add_argument("--reps", type=int, default=150)
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    rows = []
    for shape in args.shapes.split(","):
        rows += bench(shape, tokenizer, args.reps)
        gc.collect()
        torch.cuda.empty_cache()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; {cpuidle()}")
    print("\n| shape | the 20 ms before the query | tokenize | Backend.embed | both |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
