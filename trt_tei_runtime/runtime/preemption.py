"""Layer-boundary preemption: an interactive query runs alone on the GPU even while a large
bulk batch is part-way through its layers.

Why a stream priority is not enough (measured on an H200, benchmarks/RESULTS.md): with the
query on its own highest-priority stream, a 16k-token bert-large backfill batch still took a
24-token query from 1.06 ms to 9 ms p50 / 17 ms p99, the same as with a normal-priority
stream. The bulk batch's GEMMs are persistent kernels that hold every SM until they finish,
so the query advances about one kernel per bulk kernel. What helps is not having the bulk
work queued on the GPU in the first place.

So while it runs an eager bulk batch, the bulk thread keeps at most `depth` layers queued
behind the one the GPU is running (one event per layer) and, before it launches the next
layer, waits while any interactive batch is in flight. A query then waits for at most
`depth + 1` layers of bulk work, about 1 ms each for a 16k-token batch. CUDA-graph replays
(batches up to 2,048 tokens) are one launch each and are not split.

A large model's layer is long: a qwen3-8b layer over 16k tokens runs ~10 ms, so a query
waited ~19 ms for it under a backfill (3.7x its idle latency). Where a layer of the largest
bulk batch takes longer than `max_layer_ms`, the bulk lane runs its batches in parts of
whole sequences (`part_tokens`), one after the other, each gated layer by layer: the wait
shrinks with the part, and the parts' GEMMs are still large enough to run at full speed.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

# One layer queued keeps the GPU busy while the host launches the next (launching a layer
# takes ~0.1 ms of host time; a 16k-token layer runs ~1 ms on the GPU). Measured on an
# H200: two queued layers gave a query p99 of 4.2x its idle p50 under a bert-large backfill.
DEFAULT_DEPTH = 1

# A query waits for about two bulk layers at most; layers longer than this are split.
DEFAULT_MAX_LAYER_MS = 2.0
# Below this many tokens a part's GEMMs would no longer fill the GPU.
MIN_PART_TOKENS = 2048


def part_tokens(batch_tokens: int, layer_ms: float, max_layer_ms: float | None) -> int | None:
    """Tokens per part of a bulk batch, from one layer's time `layer_ms` over a batch of
    `batch_tokens`, so that a part's layer takes about `max_layer_ms`; None where batches
    need no splitting (or `max_layer_ms` is None or 0: never split)."""
    if not max_layer_ms or layer_ms <= max_layer_ms:
        return None
    tokens = max(MIN_PART_TOKENS, int(batch_tokens * max_layer_ms / layer_ms))
    return tokens if tokens < batch_tokens else None


class LayerGate:
    def __init__(self, depth: int = DEFAULT_DEPTH, max_part_tokens: int | None = None) -> None:
        self.depth = depth
        # Bulk batches above this many tokens run in parts (see the module's docstring).
        self.max_part_tokens = max_part_tokens
        self._lock = threading.Lock()
        self._in_flight = 0
        self._no_queries = threading.Event()
        self._no_queries.set()
        # The thread running a gated bulk batch: the hooks fire on every thread that runs
        # the network, and only that one may wait (an interactive batch that ran eagerly
        # would otherwise wait for itself).
        self._bulk_thread: int | None = None
        self._queued: deque[torch.cuda.Event] = deque()

    def attach(self, layers: nn.ModuleList) -> None:
        for layer in layers:
            layer.register_forward_pre_hook(self._before_layer)

    @contextlib.contextmanager
    def interactive(self) -> Iterator[None]:
        """Marks an interactive batch in flight, from before its launch until its results
        are on the host."""
        with self._lock:
            self._in_flight += 1
            self._no_queries.clear()
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._no_queries.set()

    @contextlib.contextmanager
    def bulk(self) -> Iterator[None]:
        """Around one eager bulk forward pass on the calling thread."""
        self._bulk_thread = threading.get_ident()
        try:
            yield
        finally:
            self._bulk_thread = None
            self._queued.clear()

    def _before_layer(self, module: nn.Module, args: Any) -> None:
        if self._bulk_thread != threading.get_ident():
            return
        event = torch.cuda.Event()
        event.record()
        self._queued.append(event)
        if len(self._queued) > self.depth:
            self._queued.popleft().synchronize()
        self._no_queries.wait()
