"""CUDA graphs for a ladder of token-count buckets.

A batch of T tokens runs as one replay of the graph captured for the smallest bucket
≥ T: its tokens are copied into static buffers, the rest of the bucket is one junk
sequence (its own `cu_seqlens` entry, so it attends to nothing real), and unused sequence
slots are empty sequences at the end. Every buffer is allocated once, at capture; graphs
share one memory pool, captured largest first. Only the network runs in the graph;
pooling and heads run on the real `cu_seqlens` afterwards.

Each bucket's graph sees only as many sequence slots as a batch of its size can fill
(`bucket_slots`): attention launches a program per (query block, sequence slot, head),
and programs of empty slots still cost scheduling time. With 258 slots in every graph, a
24-token query's attention took 114 µs of bert-large's GPU time and 181 µs of
qwen3-0.6b's; with 34 slots, 78 and 110 µs (H200, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import logging
import time

import torch

from ..batch import PackedBatch
from ..layers import AttentionMetadata

log = logging.getLogger(__name__)

# Graphs pay off where launches dominate: small batches. Above this many tokens a batch
# runs eagerly — measured on an H200 (benchmarks/RESULTS.md): with graphs up to 16k tokens,
# qwen3-0.6b backfill fell from 352k to 272k tok/s, because one graph's attention must be
# launched for the bucket's worst-case sequence length, not the batch's.
MAX_GRAPH_TOKENS = 2048


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
    ) -> None:
        self.network = network
        self.device = device
        self.max_num_tokens = max_num_tokens
        self.max_batch_size = max_batch_size
        self.max_seqlen = max_seqlen
        self.buckets = buckets or bucket_ladder(max_num_tokens)
        # Token ids, type ids and positions as rows of one buffer: a batch arrives in one
        # host-to-device copy from a pinned staging buffer of the same shape.
        self._token_inputs = torch.zeros((3, max_num_tokens), dtype=torch.int64, device=device)
        self._token_staging = torch.zeros((3, max_num_tokens), dtype=torch.int64).pin_memory()
        self.input_ids, self.token_type_ids, self.position_ids = self._token_inputs.unbind(0)
        # Set once the copies out of the staging buffers ran: only then may they be reused.
        self._staging_free = torch.cuda.Event()
        # n real sequences + 1 junk sequence + empty slots; a fixed length for every replay.
        self.cu_seqlens = torch.zeros(max_batch_size + 2, dtype=torch.int32, device=device)
        self._cu_host = torch.zeros(max_batch_size + 2, dtype=torch.int32).pin_memory()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def can_run(self, batch: PackedBatch) -> bool:
        return batch.num_tokens <= self.max_num_tokens and batch.num_seqs <= self.max_batch_size

    def _static_batch(self, bucket: int) -> tuple[PackedBatch, AttentionMetadata]:
        batch = PackedBatch(
            input_ids=self.input_ids[:bucket],
            token_type_ids=self.token_type_ids[:bucket],
            position_ids=self.position_ids[:bucket],
            cu_seqlens=self.cu_seqlens[: bucket_slots(bucket, self.max_batch_size)],
            max_seqlen=min(bucket, self.max_seqlen),
        )
        return batch, AttentionMetadata(cu_seqlens=batch.cu_seqlens, max_seqlen=batch.max_seqlen)

    @torch.inference_mode()
    def capture(self) -> None:
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        for bucket in sorted(self.buckets, reverse=True):
            self.cu_seqlens.fill_(bucket)
            self.cu_seqlens[0] = 0
            batch, meta = self._static_batch(bucket)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):  # warm-up: kernels selected, workspaces sized
                self.network(batch, meta)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bucket] = self.network(batch, meta)
            self.graphs[bucket] = graph
        torch.cuda.synchronize(self.device)
        log.info(
            "captured %d CUDA graphs (%s tokens) in %.1f s",
            len(self.graphs),
            ",".join(map(str, sorted(self.graphs))),
            time.perf_counter() - started,
        )

    def run(self, batch: PackedBatch) -> tuple[torch.Tensor, PackedBatch]:
        """Hidden states `[T, H]` of a host-side batch and the batch's device-side views
        (for pooling and heads); both valid until the next `run`."""
        tokens, n = batch.num_tokens, batch.num_seqs
        bucket = next(
            b
            for b in sorted(self.graphs)
            if b >= tokens and bucket_slots(b, self.max_batch_size) >= n + 2
        )
        self._staging_free.synchronize()
        staging = self._token_staging
        staging[0, :tokens] = batch.input_ids
        staging[1, :tokens] = batch.token_type_ids
        staging[2, :tokens] = batch.position_ids
        cu = self._cu_host
        cu.fill_(bucket)
        cu[: n + 1] = batch.cu_seqlens
        self._token_inputs[:, :tokens].copy_(staging[:, :tokens], non_blocking=True)
        self.cu_seqlens.copy_(cu, non_blocking=True)
        self._staging_free.record()
        self.graphs[bucket].replay()
        on_device = PackedBatch(
            input_ids=self.input_ids[:tokens],
            token_type_ids=self.token_type_ids[:tokens],
            position_ids=self.position_ids[:tokens],
            cu_seqlens=self.cu_seqlens[: n + 1],
            max_seqlen=batch.max_seqlen,
        )
        return self.outputs[bucket][:tokens], on_device
