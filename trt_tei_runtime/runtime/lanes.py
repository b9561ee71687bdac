"""Lanes: the two ways a batch goes through the model on one device.

The bulk lane runs large batches on the device's current stream; a bulk batch passes the
preemption gate between layers (between the segments of its CUDA graphs, or between the
layers of an eager pass), so that an interactive batch in flight runs without the bulk
batch's work queued ahead of it (see `preemption`). The interactive lane
has a stream of the highest priority and CUDA graphs with their own buffers, so that both
lanes can replay at the same time, each driven by its own host thread. Where there are no
graphs (CPU, fp32) there is one lane, the bulk one, and it is not gated.

A caller picks the lane once per call and runs everything of that call inside
`lane.active()`, reading results back to the host included: the copy must follow the
lane's own work, not the other lane's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..batch import PackedBatch
from ..layers import AttentionMetadata
from ..models import TransformerModel
from ..models.base import ImageTower
from .cuda_driver import CudaDriver
from .graphs import CudaGraphRunner, ForwardPass
from .image_graphs import ImageGraphRunner, image_cu_seqlens
from .preemption import LayerGate
from .query_path import QueryPath
from .staging import InputStaging


class Lane:
    """One lane's stream, graphs and place at the gate; `forward` runs the network."""

    name = "bulk"

    def __init__(
        self,
        network: TransformerModel,
        device: torch.device,
        *,
        packed_attention: bool,
        graphs: CudaGraphRunner | None = None,
        gate: LayerGate | None = None,
        inputs: InputStaging | None = None,
    ) -> None:
        """`graphs`: one replay for batches up to `MAX_GRAPH_TOKENS`. `inputs`: where eager
        batches that fit it are staged for one asynchronous copy to the device (CUDA); else
        they are copied as they are."""
        self.network = network
        self.device = device
        self.packed_attention = packed_attention
        self.graphs = graphs
        # Batches above `graphs`' sizes: segmented replays, the gate between segments.
        self.large_graphs: CudaGraphRunner | None = None
        # The vision tower's graphs (text-and-image models), for small image batches.
        self.image_graphs: ImageGraphRunner | None = None
        self.gate = gate
        self.inputs = inputs

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The bulk lane runs on its device's current stream. The device is made current:
        events, streams and graph captures follow the current device, not the tensors'."""
        with on_device(self.device):
            yield

    def forward(self, batch: PackedBatch) -> ForwardPass:
        """Hidden states `[T, H]` and the batch as it lies on the device (one copy either
        way), and the pooled rows where a graph pooled them: graph replays where they
        cover the batch, else an eager pass."""
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.run(batch)
        large = self.large_graphs
        if large is not None and not large.can_run(batch):
            large = None
        if self.gate is None:
            return self._eager(batch) if large is None else large.run(batch)
        with self.gate.bulk():
            if large is not None:
                return large.run(batch, between=self.gate.step)
            limit = self.gate.max_part_tokens
            if limit is None or batch.num_tokens <= limit:
                return self._eager(batch)
            return self._eager_in_parts(batch, limit)

    def forward_images(self, pixels: torch.Tensor, tower: ImageTower) -> torch.Tensor:
        """The tower's rows `[n, D]` (model dtype) for pixels `[n, C, H, W]`: a graph replay
        where the lane's image graphs hold the batch, else an eager pass (through the gate
        on a gated lane, which stops between the tower's layers as between the text's)."""
        images = pixels.shape[0]
        if self.image_graphs is not None and self.image_graphs.can_run(images):
            return self.image_graphs.run(pixels)
        t = tower.tokens_per_image
        meta = AttentionMetadata.build(
            image_cu_seqlens(images, t, self.device), t, packed=self.packed_attention
        )
        pixels = pixels.to(self.device, non_blocking=True)
        if self.gate is None:
            return tower(pixels, meta)
        with self.gate.bulk():
            return tower(pixels, meta)

    def _eager(self, batch: PackedBatch) -> ForwardPass:
        batch = self._to_device(batch)
        return ForwardPass(self._network(batch), batch)

    def _to_device(self, batch: PackedBatch) -> PackedBatch:
        if self.inputs is not None and self.inputs.fits(batch) and batch.input_ids.is_cpu:
            return self.inputs.send(batch)
        return batch.to(self.device)

    def _eager_in_parts(self, batch: PackedBatch, max_tokens: int) -> ForwardPass:
        """One pass per part of whole sequences, the hidden states laid end to end: what
        one pass over the batch gives, with shorter steps for a query to wait on. The parts
        are about equal: a small last part would run its GEMMs on a fraction of the GPU."""
        host_cu = batch.cu_seqlens.cpu().numpy()
        batch = self._to_device(batch)
        count = -(-batch.num_tokens // max_tokens)
        hidden = [self._network(part) for part in batch.parts(count, host_cu)]
        return ForwardPass(torch.cat(hidden), batch)

    def _network(self, batch: PackedBatch) -> torch.Tensor:
        meta = AttentionMetadata.build(
            batch.cu_seqlens, batch.max_seqlen, packed=self.packed_attention
        )
        return self.network(batch, meta)


class InteractiveLane(Lane):
    """Small latency-bound batches on a highest-priority stream, never gated themselves;
    while one is in flight, the gate holds eager bulk batches between layers."""

    name = "interactive"
    gate: LayerGate  # always set: the gate this lane holds bulk batches with
    graphs: CudaGraphRunner  # always set

    def __init__(
        self,
        network: TransformerModel,
        device: torch.device,
        *,
        graphs: CudaGraphRunner,
        gate: LayerGate,
        inputs: InputStaging | None = None,
    ) -> None:
        super().__init__(
            network, device, packed_attention=True, graphs=graphs, gate=gate, inputs=inputs
        )
        _, highest_priority = torch.cuda.Stream.priority_range()  # type: ignore[call-arg]
        self.stream = torch.cuda.Stream(device, priority=highest_priority)
        # Embedding queries that fit the graphs, without torch on their way (`query_path`).
        self.query_path: QueryPath | None = None

    def add_query_path(self) -> None:
        """The direct path for queries, where the graphs support it."""
        if QueryPath.supports(self.graphs):
            self.query_path = QueryPath(
                self.graphs, self.stream, self.gate, self.device, CudaDriver()
            )

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with on_device(self.device), self.gate.interactive(), torch.cuda.stream(self.stream):
            yield

    def forward(self, batch: PackedBatch) -> ForwardPass:
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.run(batch)
        return self._eager(batch)

    def forward_images(self, pixels: torch.Tensor, tower: ImageTower) -> torch.Tensor:
        """Never gated: an image query runs eagerly on this lane's stream."""
        t = tower.tokens_per_image
        meta = AttentionMetadata.build(
            image_cu_seqlens(pixels.shape[0], t, self.device), t, packed=True
        )
        return tower(pixels.to(self.device, non_blocking=True), meta)


def on_device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Makes a CUDA device current for what runs inside; nothing for other devices."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()
