"""Shared by the scripts that compare two backends' query graphs (`bench_query_blas.py`,
`bench_query_tunable.py`): a query as the router sends it, a graph's GPU time, and
variants timed in turn; and by those that time a stack of kernels as one graph
(`bench_lt_algos.py`, `bench_query_persistent.py`)."""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers these experiments share with the maintained scripts live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import statistics
from collections.abc import Callable

import torch
from bench_engine import random_ids

from trt_tei_runtime.backend import Backend
from trt_tei_runtime.batch import PackedBatch

QUERY_TOKENS = 24


def router_arrays(backend: Backend, tokens: int = QUERY_TOKENS, seed: int = 2) -> tuple[bytes, ...]:
    """One random query of `tokens` tokens as the router's four uint32 buffers."""
    executor = backend.model
    query = PackedBatch.from_sequences(
        random_ids([tokens], executor.model.network.vocab_size, seed=seed),
        position_offset=executor.info.position_offset,
    )
    return tuple(
        t.numpy().astype("<u4").tobytes()
        for t in (query.input_ids, query.token_type_ids, query.position_ids, query.cu_seqlens)
    )


def replay_us(run: Callable[[], None], reps: int, warmup: int = 5) -> float:
    """Median µs of one replay of what `run` launches, captured as one CUDA graph on a side
    stream (after an eager call that compiles its kernels), timed between CUDA events after
    `warmup` replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            run()
    torch.cuda.synchronize()
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def graph_gpu_seconds(backend: Backend, tokens: int = QUERY_TOKENS) -> float:
    """One replay of the interactive graph that a one-sequence query of `tokens` tokens
    takes, timed between CUDA events on the lane's stream."""
    lane = backend.model.interactive
    assert lane is not None
    graph = lane.graphs.graphs[lane.graphs.bucket_for(tokens, 1)][0]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(lane.stream):
        start.record()
        graph.replay()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def in_turn(
    timers: dict[str, Callable[[], float]], reps: int, skip: int = 10
) -> dict[str, list[float]]:
    """Each timer `reps` times after `skip` untimed rounds, the timers taking turns."""
    names = list(timers)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(len(names) * (reps + skip)):
        name = names[i % len(names)]
        seconds = timers[name]()
        if i >= len(names) * skip:
            times[name].append(seconds)
    return times
