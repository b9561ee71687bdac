"""CUDA graphs for a ladder of token-count buckets.

A batch of T tokens runs as one replay of the graph captured for the smallest bucket
≥ T: its tokens are copied into static buffers, the rest of the bucket is one junk
sequence (its own `cu_seqlens` entry, so it attends to nothing real), and unused sequence
slots are empty sequences at the end. Every buffer is allocated once, at capture; graphs
share one memory pool, captured largest first.

A query's time is mostly the host's: every small operation around the replay costs a
few microseconds, several times that on a host whose caches went cold while it idled
(docs/journal/results-log.md). So a batch's inputs travel in one host-to-device copy, and an
embedding model's pooling (and Dense layers) run inside the graph, over every sequence
slot; the caller keeps the rows of the real sequences. Other heads run on the real
`cu_seqlens` afterwards.

Each bucket's graph sees only as many sequence slots as a batch of its size can fill
(`bucket_slots`): attention launches a program per (query block, sequence slot, head),
and programs of empty slots still cost scheduling time. With 258 slots in every graph, a
24-token query's attention took 114 µs of bert-large's GPU time and 181 µs of
qwen3-0.6b's; with 34 slots, 78 and 110 µs (H200, docs/journal/results-log.md).

Bulk batches above `MAX_GRAPH_TOKENS` replay graphs of their own (`bulk_ladder`), built
for two things the small ones need not do:
- Their attention takes a block table (`triton_attention.fill_block_table`, filled with
  the inputs): a fixed set of persistent programs walks the batch's real query blocks,
  where a grid sized for the bucket's longest possible sequence would launch millions
  of empty programs (a 32k-token model) and one sized for the batch could not be replayed.
- Each bucket's forward pass may be captured as segments, cut before the modules the
  preemption gate stands before (`segment_at`); `run` replays them one by one and calls
  `between` before each segment after the first, where the gate waits for queries.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..batch import HostArrays, PackedBatch
from ..layers import AttentionMetadata
from .staging import InputStaging

log = logging.getLogger(__name__)

# Graphs pay off where launches dominate: small batches. Above this many tokens a batch
# runs eagerly — measured on an H200 (docs/journal/results-log.md): with graphs up to 16k tokens,
# qwen3-0.6b backfill fell from 352k to 272k tok/s, because one graph's attention must be
# launched for the bucket's worst-case sequence length, not the batch's.
MAX_GRAPH_TOKENS = 2048
# Bulk buckets above MAX_GRAPH_TOKENS, this many tokens apart, and closer in the top
# step: a router's bulk batch is filled to within a document of its token limit, and a
# batch of 16k tokens padded to the next 1,024 gave back most of what its graphs saved
# (H100, bert-large: +0.8 % backfill; docs/journal/results-log.md).
BULK_BUCKET_STEP = 1024
BULK_TOP_STEP = 128


# Pooled rows `[slots - 1, D]` of the hidden states `[bucket, H]` over a graph's `cu_seqlens`.
Pooler = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class ForwardPass:
    """What a lane's forward pass leaves on the device, valid until the lane's next pass."""

    hidden: torch.Tensor  # [T, H] in the model dtype
    batch: PackedBatch  # the batch as it lies on the device
    pooled: torch.Tensor | None = None  # [n, D] float32, where a graph pooled already


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a graph capture. A collection in the
    middle of one can free an executor dropped earlier, and freeing its pinned staging
    buffer records an event on the stream that last copied out of it: a CUDA call that
    invalidates the capture ("operation not permitted when stream is capturing"; seen in
    the GPU suite once several executors had come and gone)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def bucket_slots(bucket: int, max_batch_size: int) -> int:
    """`cu_seqlens` entries of a bucket's graph: every sequence has at least one token, so
    a bucket of B tokens holds at most B sequences; plus the junk sequence and the 0."""
    return min(bucket, max_batch_size) + 2


def bucket_ladder(max_num_tokens: int) -> list[int]:
    """Powers of two from 16 below `max_num_tokens`, then `max_num_tokens` itself."""
    ladder = []
    size = 16
    while size < max_num_tokens:
        ladder.append(size)
        size *= 2
    ladder.append(max_num_tokens)
    return ladder


def bulk_ladder(max_num_tokens: int) -> list[int]:
    """`BULK_BUCKET_STEP`s above `MAX_GRAPH_TOKENS`, `BULK_TOP_STEP`s over the last
    `BULK_BUCKET_STEP` below `max_num_tokens`, and `max_num_tokens`; empty where that is no
    more than `MAX_GRAPH_TOKENS`."""
    if max_num_tokens <= MAX_GRAPH_TOKENS:
        return []
    top = max(max_num_tokens - BULK_BUCKET_STEP, MAX_GRAPH_TOKENS)
    coarse = [*range(MAX_GRAPH_TOKENS + BULK_BUCKET_STEP, top, BULK_BUCKET_STEP), top]
    fine = range(max_num_tokens - BULK_TOP_STEP, top, -BULK_TOP_STEP)
    return sorted({*coarse, *fine, max_num_tokens} - {MAX_GRAPH_TOKENS})


class CudaGraphRunner:
    def __init__(
        self,
        network: torch.nn.Module,
        device: torch.device,
        *,
        max_num_tokens: int,
        max_batch_size: int,
        max_seqlen: int,
        buckets: list[int] | None = None,
        pooler: Pooler | None = None,
        block_table: bool = False,
        segment_at: Sequence[nn.Module] = (),
        warm_up_each_bucket: bool = True,
    ) -> None:
        """`pooler`, where given, is captured after the network in every graph.
        `block_table`: the attention runs from a block table (bulk graphs). `segment_at`:
        every bucket's pass is captured as segments, a new one starting before each of
        these modules is called. A bucket's capture follows an eager pass of the same
        bucket (kernels compiled and chosen), or without `warm_up_each_bucket` only the
        largest bucket's (and the largest one's of the other divisibility by 16): where
        the buckets launch the same kernels."""
        self.network = network
        self.device = device
        self.max_num_tokens = max_num_tokens
        self.max_batch_size = max_batch_size
        self.max_seqlen = max_seqlen
        self.buckets = buckets or bucket_ladder(max_num_tokens)
        self.pooler = pooler
        self.segment_at = segment_at
        self.warm_up_each_bucket = warm_up_each_bucket
        # A batch's inputs arrive in the graphs' static buffers in one host-to-device copy.
        self.inputs = InputStaging(
            device, max_tokens=max_num_tokens, slots=max_batch_size + 2, block_table=block_table
        )
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}  # a bucket's segments
        self.outputs: dict[int, torch.Tensor] = {}
        self.pooled: dict[int, torch.Tensor] = {}
        self._ladder: list[int] = []  # the captured buckets, smallest first

    def can_run(self, batch: PackedBatch | HostArrays) -> bool:
        return batch.num_tokens <= self.max_num_tokens and batch.num_seqs <= self.max_batch_size

    def _static_batch(self, bucket: int) -> tuple[PackedBatch, AttentionMetadata]:
        batch = PackedBatch(
            input_ids=self.inputs.input_ids[:bucket],
            token_type_ids=self.inputs.token_type_ids[:bucket],
            position_ids=self.inputs.position_ids[:bucket],
            cu_seqlens=self.inputs.cu_seqlens[: bucket_slots(bucket, self.max_batch_size)],
            max_seqlen=min(bucket, self.max_seqlen),
        )
        meta = AttentionMetadata(
            cu_seqlens=batch.cu_seqlens,
            max_seqlen=batch.max_seqlen,
            block_table=self.inputs.block_table,
        )
        return batch, meta

    def _pass(
        self, batch: PackedBatch, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden = self.network(batch, meta)
        if self.pooler is None:
            return hidden, None
        return hidden, self.pooler(hidden, batch.cu_seqlens)

    @torch.inference_mode()
    def capture(self) -> None:
        started = time.perf_counter()
        gc.collect()  # as torch.cuda.graph does before a capture (see `collector_paused`)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        warmed: set[bool] = set()
        for bucket in sorted(self.buckets, reverse=True):
            # Triton compiles an integer argument's kernel once per divisibility by 16.
            kind = bucket % 16 == 0
            with collector_paused():
                self._capture_bucket(
                    bucket, stream, pool, self.warm_up_each_bucket or kind not in warmed
                )
            warmed.add(kind)
        self._ladder = sorted(self.graphs)
        torch.cuda.synchronize(self.device)
        log.info(
            "captured %d CUDA graphs (%s tokens) in %.1f s",
            len(self.graphs),
            ",".join(map(str, self._ladder)),
            time.perf_counter() - started,
        )

    def _capture_bucket(
        self, bucket: int, stream: torch.cuda.Stream, pool: Any, warm_up: bool
    ) -> None:
        self.inputs.cu_seqlens.fill_(bucket)
        self.inputs.cu_seqlens[0] = 0
        if self.inputs.block_table is not None:
            self.inputs.block_table[0] = 0  # captured with no blocks; each batch lists its own
        batch, meta = self._static_batch(bucket)
        if warm_up:
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):  # kernels compiled and chosen
                self._pass(batch, meta)
            torch.cuda.current_stream(self.device).wait_stream(stream)
        segments = [torch.cuda.CUDAGraph()]

        def next_segment(module: nn.Module, args: Any) -> None:
            segments[-1].capture_end()
            segments.append(torch.cuda.CUDAGraph())
            segments[-1].capture_begin(pool=pool)

        hooks = [module.register_forward_pre_hook(next_segment) for module in self.segment_at]
        torch.cuda.synchronize(self.device)
        try:
            with torch.cuda.stream(stream):
                segments[0].capture_begin(pool=pool)
                try:
                    self.outputs[bucket], pooled = self._pass(batch, meta)
                finally:
                    segments[-1].capture_end()
        finally:
            for hook in hooks:
                hook.remove()
        if pooled is not None:
            self.pooled[bucket] = pooled
        self.graphs[bucket] = segments

    def bucket_for(self, tokens: int, sequences: int) -> int:
        """The smallest captured bucket that holds a batch of this size (`can_run`)."""
        return next(
            b
            for b in self._ladder
            if b >= tokens and bucket_slots(b, self.max_batch_size) >= sequences + 2
        )

    def run(self, batch: PackedBatch, between: Callable[[], None] | None = None) -> ForwardPass:
        """Replays the graphs of the smallest bucket that holds a host-side batch, calling
        `between` before each segment after the first; what it leaves is valid until the
        next `run`."""
        tokens, n = batch.num_tokens, batch.num_seqs
        bucket = self.bucket_for(tokens, n)
        on_device = self.inputs.send(batch, tail=bucket)
        first, *rest = self.graphs[bucket]
        first.replay()
        for segment in rest:
            if between is not None:
                between()
            segment.replay()
        pooled = self.pooled.get(bucket)
        return ForwardPass(
            self.outputs[bucket][:tokens], on_device, None if pooled is None else pooled[:n]
        )
