"""Layer-boundary preemption: an interactive query runs alone on the GPU even while a large
bulk batch is part-way through its layers.

Why a stream priority is not enough (measured on an H200, docs/journal/results-log.md): with the
query on its own highest-priority stream, a 16k-token bert-large backfill batch still took a
24-token query from 1.06 ms to 9 ms p50 / 17 ms p99, the same as with a normal-priority
stream. The bulk batch's GEMMs are persistent kernels that hold every SM until they finish,
so the query advances about one kernel per bulk kernel. What helps is not having the bulk
work queued on the GPU in the first place.

So while it runs an eager bulk batch, the bulk thread keeps at most `depth` layers queued
behind the one the GPU is running (one event per layer) and, before it launches the next
layer, waits while any interactive batch is in flight on its device, of any model loaded
in the process (`QueriesInFlight.on`: one server may serve several models on one GPU, and a
query to one must not wait behind another's backfill). A query then waits for at most
`depth + 1` layers of bulk work, about 1 ms each for a 16k-token batch. A bulk batch that
replays CUDA graphs stops at the same places: above 2,048 tokens its graphs are captured
in segments cut there (`graphs.CudaGraphRunner`), and the gate's `step` runs between them;
a batch of up to 2,048 tokens is one replay and is not split.

A large model's layer is long: a qwen3-8b layer over 16k tokens runs ~10 ms, so a query
waited ~18 ms p50 for it under a backfill. The step a query waits for is bounded by
`max_step_ms`, from one layer's time measured at start-up (`BulkPlan.for_layer`): where a
layer is longer than `WITHIN_LAYER_MS` (0.5 ms: bert-large's and qwen3-0.6b's are too), the
gate stands before every linear inside the layers instead, and where
the largest linear is still longer, the bulk lane runs its batches in parts of whole
sequences, one after the other, about equal in size. Gates inside layers cost nothing on the GPU;
parts cost GEMM efficiency, so they are only as small as needed. Measured on an H100 with
qwen3-8b under a realistic backfill (docs/journal/results-log.md): whole layers gave a query p99
of 3.3x its idle p50; 6 ms steps (gates between linears, batches whole) 1.9x; 4 ms steps
(two parts of a 16k batch) 1.4-1.6x for 2-4 % less backfill; 2 ms steps (parts of ~5k
tokens) 1.3x for 5 % less.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..layers.fp8 import Fp8Linear
from ..layers.linear import Linear

LINEARS = (Linear, Fp8Linear)

# One layer queued keeps the GPU busy while the host launches the next (launching a layer
# takes ~0.1 ms of host time; a 16k-token layer runs ~1 ms on the GPU). Measured on an
# H200: two queued layers gave a query p99 of 4.2x its idle p50 under a bert-large backfill.
DEFAULT_DEPTH = 1

# A query waits for about two steps of bulk work at most; longer steps are split. 6 ms keeps
# qwen3-8b's batches whole (its largest linear, ~5 ms over 16k tokens, is one step) and its
# query under 2x its idle latency, within the 3x the product promises for large models.
DEFAULT_MAX_STEP_MS = 6.0
# Gates between a layer's linears cost the GPU nothing, so they stand there wherever a layer
# is longer than this, whatever the step limit. Measured on an H200 (docs/journal/results-log.md,
# fourteenth session): bert-large's and qwen3-0.6b's 16k-token layers (~0.6-1 ms) gated
# between linears took their queries' p99 under a realistic backfill from 2.3-2.8x to
# 1.6-1.8x their idle p50, the backfill within 1.3 %.
WITHIN_LAYER_MS = 0.5
# Below this many tokens a part's GEMMs would no longer fill the GPU.
MIN_PART_TOKENS = 2048


@dataclass(frozen=True)
class BulkPlan:
    """Where the gate stands in an eager bulk batch, and how large its parts are."""

    within_layers: bool = False  # before every linear, not only before every layer
    max_part_tokens: int | None = None  # None: batches run whole

    @classmethod
    def for_layer(
        cls,
        batch_tokens: int,
        layer_ms: float,
        largest_linear_share: float,
        max_step_ms: float | None,
    ) -> BulkPlan:
        """The plan for layers that take `layer_ms` over `batch_tokens`, the largest linear
        holding `largest_linear_share` of a layer's weights (its share of the time, near
        enough: the GEMMs are most of a large layer); None or 0 `max_step_ms`: per layer,
        whole batches. Layers longer than `WITHIN_LAYER_MS` (or than a smaller step limit)
        are gated between their linears; batches run in parts only where the largest
        linear is longer than the step limit."""
        if not max_step_ms or layer_ms <= min(max_step_ms, WITHIN_LAYER_MS):
            return cls()
        step_ms = layer_ms * largest_linear_share
        if step_ms <= max_step_ms:
            return cls(within_layers=True)
        tokens = max(MIN_PART_TOKENS, int(batch_tokens * max_step_ms / step_ms))
        return cls(within_layers=True, max_part_tokens=tokens if tokens < batch_tokens else None)


def largest_linear_share(layer: nn.Module) -> float:
    """The largest linear's share of the weights of a layer's linears."""
    sizes = [m.weight.numel() for m in layer.modules() if isinstance(m, LINEARS)]
    return max(sizes) / sum(sizes) if sizes else 1.0


class QueriesInFlight:
    """The interactive batches in flight on one device, whichever model runs them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self.none = threading.Event()
        self.none.set()

    @classmethod
    def on(cls, device: torch.device) -> QueriesInFlight:
        """The one for `device`, shared by every model's gate there: a bulk batch of any
        model stops for a query of any other."""
        with _REGISTRY_LOCK:
            return _QUERIES_BY_DEVICE.setdefault(device, cls())

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            self._count += 1
            self.none.clear()
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1
                if self._count == 0:
                    self.none.set()


_QUERIES_BY_DEVICE: dict[torch.device, QueriesInFlight] = {}
_REGISTRY_LOCK = threading.Lock()


class LayerGate:
    def __init__(
        self,
        depth: int = DEFAULT_DEPTH,
        plan: BulkPlan | None = None,
        queries: QueriesInFlight | None = None,
    ) -> None:
        """`queries`: the device's (`QueriesInFlight.on`) where other models may share it;
        by default the gate's own."""
        self.depth = depth
        self.plan = plan or BulkPlan()
        self.queries = queries or QueriesInFlight()
        # What a bulk step waits on (tests wrap it to count the stops).
        self._no_queries = self.queries.none
        # The thread running a gated bulk batch: the hooks fire on every thread that runs
        # the network, and only that one may wait (an interactive batch that ran eagerly
        # would otherwise wait for itself).
        self._bulk_thread: int | None = None
        self._queued: deque[torch.cuda.Event] = deque()

    @property
    def max_part_tokens(self) -> int | None:
        """Bulk batches above this many tokens run in parts."""
        return self.plan.max_part_tokens

    def stops(self, layers: nn.ModuleList) -> list[nn.Module]:
        """The modules a bulk batch stops before: every layer, or by the plan every linear
        inside them (a layer's first linear comes before anything long in it, so a stop
        at the layer too would add an empty step)."""
        if not self.plan.within_layers:
            return list(layers)
        return [m for layer in layers for m in layer.modules() if isinstance(m, LINEARS)]

    def attach(self, layers: nn.ModuleList) -> None:
        """Eager bulk passes stop at `stops(layers)`."""
        for module in self.stops(layers):
            module.register_forward_pre_hook(self._before_step)

    @contextlib.contextmanager
    def interactive(self) -> Iterator[None]:
        """Marks an interactive batch in flight, from before its launch until its results
        are on the host."""
        with self.queries.running():
            yield

    @contextlib.contextmanager
    def bulk(self) -> Iterator[None]:
        """Around one eager bulk forward pass on the calling thread."""
        self._bulk_thread = threading.get_ident()
        try:
            yield
        finally:
            self._bulk_thread = None
            self._queued.clear()

    def _before_step(self, module: nn.Module, args: Any) -> None:
        if self._bulk_thread == threading.get_ident():
            self.step()

    def step(self) -> None:
        """Before the bulk batch's next step: waits until at most `depth` steps are queued
        behind the one running, and while any interactive batch is in flight on the
        device."""
        event = torch.cuda.Event()
        event.record()
        self._queued.append(event)
        if len(self._queued) > self.depth:
            self._queued.popleft().synchronize()
        self._no_queries.wait()
