"""The executor: runs packed batches of one loaded model on one device, through its lanes.

One executor per device; the router and `Model` hold one per device they serve. Every
method returns device tensors and takes the lane it runs on (the bulk lane by default);
run it, and read its result back, inside `lane.active()`.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..batch import HostArrays, PackedBatch
from ..errors import InputError
from ..late_interaction import packed_maxsim, rows_per_sequence
from ..layers.attention import packed_attention_available
from ..models import Task
from ..models.base import ImageTower
from ..pooling import pool
from ..sparse import splade_pool, top_active
from .blas import preferred_blas, query_blas_library
from .devices import DeviceSpec, parse_device, parse_devices
from .graphs import MAX_GRAPH_TOKENS, CudaGraphRunner, ForwardPass, Pooler, bulk_ladder
from .image_graphs import ImageGraphRunner
from .lanes import InteractiveLane, Lane, on_device
from .loader import LoadedModel, ModelInfo, load_model
from .memory import (
    DeviceMemory,
    DeviceMemoryError,
    check_fits,
    estimate_for_loading,
    out_of_memory,
)
from .preemption import (
    DEFAULT_MAX_STEP_MS,
    BulkPlan,
    LayerGate,
    QueriesInFlight,
    largest_linear_share,
)
from .query_path import QueryPath
from .staging import InputStaging

log = logging.getLogger(__name__)

# Largest batch the CUDA graphs cover unless an engine manifest or the caller says otherwise.
DEFAULT_MAX_NUM_TOKENS = 16384
DEFAULT_MAX_BATCH_SIZE = 256
# The document length a bulk layer is timed over (what a backfill mostly sends).
TYPICAL_DOCUMENT_TOKENS = 512
# Bulk batches replay CUDA graphs where a layer over a full batch takes at most this long.
# Graphs save the launches between kernels, ~0.1 ms a layer; a longer layer has nothing to
# save and pays its bucket's padding (H100, qwen3-8b's 10 ms layers: -1.8 % backfill;
# bert-large's 0.8 ms: +7.6 %, docs/journal/results-log.md).
BULK_GRAPHS_MAX_LAYER_MS = 2.0


@dataclass(frozen=True)
class LayerTime:
    """One layer's GPU time over a bulk batch of `tokens` tokens."""

    tokens: int
    ms: float


class Executor:
    def __init__(
        self,
        model: LoadedModel,
        *,
        cuda_graphs: bool = True,
        max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        interactive_lane: bool = True,
        max_bulk_step_ms: float | None = DEFAULT_MAX_STEP_MS,
        bulk_graphs: bool = True,
    ) -> None:
        """With `cuda_graphs` on a device where the attention runs on packed tokens (CUDA,
        half precision), warms the allocator up and captures the bulk lane's graphs for
        batches up to these sizes, and with `interactive_lane` builds the interactive lane
        and gates bulk batches for it; else one eager lane. A query waits for steps of bulk
        work of about `max_bulk_step_ms` (`preemption.BulkPlan`); None or 0: for whole
        layers. Without `bulk_graphs`, batches above `MAX_GRAPH_TOKENS` run eagerly.

        Without interactive traffic (`Model`, corpus jobs) leave the interactive lane out:
        the gate keeps at most one layer of a bulk batch queued on the GPU, so the host
        would have to launch each layer in lockstep with the GPU."""
        self.model = model
        self.info: ModelInfo = model.info
        self.device = model.device
        self.dtype = model.dtype
        packed = model.network.packed_attention and packed_attention_available(
            self.device, self.dtype
        )
        self.bulk = Lane(
            model.network,
            self.device,
            packed_attention=packed,
            inputs=self._input_staging(max_num_tokens),
        )
        self.interactive: InteractiveLane | None = None
        if cuda_graphs and packed:
            with on_device(self.device):
                self._warm_up(max_num_tokens)
                self.bulk.graphs = self._capture(
                    min(max_num_tokens, MAX_GRAPH_TOKENS), max_batch_size
                )
                self.bulk.image_graphs = self._capture_images(
                    min(max_num_tokens, MAX_GRAPH_TOKENS), max_batch_size
                )
                # One layer's time over a full bulk batch, where bulk batches outgrow
                # the graphs above: it plans the gate's steps and the bulk graphs.
                layer = None
                if max_num_tokens > MAX_GRAPH_TOKENS and (interactive_lane or bulk_graphs):
                    layer = self._time_layer(max_num_tokens)
                gate = None
                if interactive_lane:
                    gate = self._add_interactive_lane(
                        max_num_tokens, max_batch_size, layer, max_bulk_step_ms
                    )
                if bulk_graphs and layer is not None and layer.ms <= BULK_GRAPHS_MAX_LAYER_MS:
                    if gate is None or gate.max_part_tokens is None:
                        self._capture_large(max_num_tokens, max_batch_size, gate)
                if gate is not None:
                    # After every capture: graphs hold no host-side hooks.
                    gate.attach(model.network.layers)
                    if model.network.image_tower is not None:
                        gate.attach(model.network.image_tower.layers)

    def _add_interactive_lane(
        self,
        max_num_tokens: int,
        max_batch_size: int,
        layer: LayerTime | None,
        max_bulk_step_ms: float | None,
    ) -> LayerGate:
        """The interactive lane's graphs and stream, and the gate between the lanes (not
        attached yet). `layer`: None where every bulk batch is one graph replay."""
        model = self.model
        gate = LayerGate(
            plan=BulkPlan() if layer is None else self._bulk_plan(layer, max_bulk_step_ms),
            queries=QueriesInFlight.on(self.device),
        )
        self.bulk.gate = gate
        # The same ladder as the bulk lane's: under many concurrent small requests the
        # interactive batches grow (64 clients of 24 tokens: ~1,500 tokens), and an eager
        # pass of a small model is launch-bound (measured: MiniLM at 64 clients fell from
        # 35.7k to 13.6k requests/s with graphs only up to 512 tokens).
        with preferred_blas(query_blas_library()):
            graphs = self._capture(min(max_num_tokens, MAX_GRAPH_TOKENS), max_batch_size)
        self.interactive = InteractiveLane(
            model.network,
            self.device,
            graphs=graphs,
            gate=gate,
            inputs=self._input_staging(max_num_tokens),
        )
        self.interactive.add_query_path()
        return gate

    def _capture_large(
        self, max_num_tokens: int, max_batch_size: int, gate: LayerGate | None
    ) -> None:
        """The bulk lane's graphs above `MAX_GRAPH_TOKENS`, in segments cut where the gate
        stops (one graph per bucket without a gate). Their buckets differ only in token
        counts, with the same sequence slots and the block-table attention's fixed tiles,
        so they launch the same kernels and an eager pass before the first capture warms
        them all (~15 ms of start-up saved per bucket). Eager bulk passes
        then run only for batches with more sequences than the graphs' slots, so the blocks
        the warm-up left in the allocator's cache go back to the device."""
        buckets = bulk_ladder(max_num_tokens)
        if not buckets:
            return
        runner = self._capture(
            max_num_tokens,
            max_batch_size,
            buckets=buckets,
            block_table=True,
            segment_at=() if gate is None else gate.stops(self.model.network.layers),
            warm_up_each_bucket=False,
        )
        self.bulk.large_graphs = runner
        torch.cuda.empty_cache()

    def max_images(self, max_num_tokens: int, max_batch_size: int | None = None) -> int:
        """Images a batch of `max_num_tokens` tokens (and at most `max_batch_size`
        sequences) holds: at least one."""
        images = max_num_tokens // self._image_tower().tokens_per_image
        if max_batch_size is not None:
            images = min(images, max_batch_size)
        return max(1, images)

    def _capture_images(self, max_num_tokens: int, max_batch_size: int) -> ImageGraphRunner | None:
        """The vision tower's graphs for batches of up to `max_num_tokens` tokens, where the
        model has one whose images are all one length (not SigLIP 2's). As for texts, larger
        batches run eagerly: their launches cost little next to their work, and an eager
        bulk pass stops at the gate between layers."""
        tower = self.model.network.image_tower
        if tower is None or tower.variable_length:
            return None
        runner = ImageGraphRunner(
            tower, self.device, self.max_images(max_num_tokens, max_batch_size)
        )
        runner.capture()
        return runner

    def _input_staging(self, max_num_tokens: int) -> InputStaging | None:
        """A lane's own buffers for eager batches of up to `max_num_tokens` (CUDA only):
        every sequence holds a token, so that many sequences at most."""
        if self.device.type != "cuda":
            return None
        return InputStaging(self.device, max_tokens=max_num_tokens, slots=max_num_tokens + 1)

    def _time_layer(self, max_num_tokens: int) -> LayerTime:
        """One layer's time over a full bulk batch of typical documents, measured here
        (once to compile, once timed), eagerly."""
        length = min(self.info.max_input_length, TYPICAL_DOCUMENT_TOKENS, max_num_tokens)
        batch = self._full_batch(length, max_num_tokens)
        self.hidden_states(batch)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.hidden_states(batch)
        end.record()
        end.synchronize()
        return LayerTime(batch.num_tokens, start.elapsed_time(end) / len(self.model.network.layers))

    def _bulk_plan(self, layer: LayerTime, max_step_ms: float | None) -> BulkPlan:
        """Where gated bulk batches stop for queries and how large their parts are."""
        share = largest_linear_share(self.model.network.layers[0])
        plan = BulkPlan.for_layer(layer.tokens, layer.ms, share, max_step_ms)
        if plan.within_layers:
            log.info(
                "a bulk layer over %d tokens takes %.1f ms: queries may also pass between its "
                "linears%s, so that they wait for steps of about %.1f ms",
                layer.tokens,
                layer.ms,
                ""
                if plan.max_part_tokens is None
                else f", and bulk batches run in parts of up to {plan.max_part_tokens} tokens",
                max_step_ms,
            )
        return plan

    def _full_batch(self, length: int, max_num_tokens: int) -> PackedBatch:
        """As many sequences of `length` tokens as fit in `max_num_tokens` (at least one)."""
        sequences = [[1] * length] * max(1, max_num_tokens // length)
        return PackedBatch.from_sequences(sequences, position_offset=self.info.position_offset)

    def lane(self, interactive: bool) -> Lane:
        """The interactive lane when asked for and built, else the bulk lane."""
        if interactive and self.interactive is not None:
            return self.interactive
        return self.bulk

    def _capture(self, max_num_tokens: int, max_batch_size: int, **options: Any) -> CudaGraphRunner:
        """Graphs for batches up to these sizes, captured; `options`: `CudaGraphRunner`'s
        (the bulk graphs' `buckets`, `block_table`, `segment_at`)."""
        graphs = CudaGraphRunner(
            self.model.network,
            self.device,
            max_num_tokens=max_num_tokens,
            max_batch_size=max_batch_size,
            max_seqlen=min(self.info.max_input_length, max_num_tokens),
            pooler=self._graph_pooler(),
            **options,
        )
        graphs.capture()
        return graphs

    def _graph_pooler(self) -> Pooler | None:
        """An embedding model's pooling and Dense layers, for its graphs to run too."""
        if self.info.pooling is None or self.info.splade is not None:
            return None
        return self._pool

    def _pool(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        assert self.info.pooling is not None
        pooled = self.model.network.project_pooled(pool(hidden, cu_seqlens, self.info.pooling))
        for layer in self.model.dense:
            pooled = layer(pooled)
        return pooled

    def _warm_up(self, max_num_tokens: int) -> None:
        """One eager pass over the largest batch: the caching allocator then holds every
        block a batch of up to `max_num_tokens` needs, so no request calls cudaMalloc."""
        batch = self._full_batch(min(self.info.max_input_length, max_num_tokens), max_num_tokens)
        if self.info.splade is not None:
            self.embed_sparse(batch)  # also the vocabulary logits' chunk
        else:
            self.hidden_states(batch)
        tower = self.model.network.image_tower
        if tower is not None:
            images = max(1, max_num_tokens // tower.tokens_per_image)
            self.embed_images(tower.blank_pixels(images))
        torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def hidden_states(self, batch: PackedBatch, lane: Lane | None = None) -> torch.Tensor:
        """Per-token last hidden states `[T, H]` in the model dtype."""
        return self._forward(batch, lane).hidden

    @torch.inference_mode()
    def embed(self, batch: PackedBatch, lane: Lane | None = None) -> torch.Tensor:
        """Pooled embeddings `[n, dim]` in float32, not normalized."""
        if self.info.splade is not None:
            raise InputError(
                f"{self.info.architecture} is a SPLADE (sparse) model: use embed_sparse "
                "(/embed_sparse), not embed"
            )
        if self.info.late_interaction is not None:
            raise InputError(
                f"{self.info.architecture} is a late-interaction (ColBERT) model: it gives "
                "one vector per token (embed_multivector, /embed_multivector), not one per input"
            )
        if self.info.pooling is None:
            raise InputError(
                f"{self.info.architecture} is a {self.info.model_type}: use predict, not embed"
            )
        out = self._forward(batch, lane)
        if out.pooled is not None:
            return out.pooled
        return self._pool(out.hidden, out.batch.cu_seqlens)

    @torch.inference_mode()
    def embed_images(self, pixels: torch.Tensor, lane: Lane | None = None) -> torch.Tensor:
        """Image embeddings `[n, dim]` in float32, not normalized, of preprocessed pixels
        `[n, C, H, W]` (`ModelInfo.image_input`, `images.ImagePreprocessor`)."""
        tower = self._image_tower()
        expected = (tower.channels, *tower.image_size)
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != expected or not pixels.shape[0]:
            raise InputError(
                f"pixels must be [n, {', '.join(map(str, expected))}] with n >= 1, got "
                f"{list(pixels.shape)}"
            )
        if not pixels.is_floating_point():
            raise InputError(f"pixels must be floating point, got {pixels.dtype}")
        return (lane or self.bulk).forward_images(pixels, tower).float()

    def _image_tower(self) -> ImageTower:
        tower = self.model.network.image_tower
        if tower is None:
            raise InputError(
                f"{self.info.architecture} embeds texts only: it takes no images "
                "(image models: CLIPModel, SiglipModel, Siglip2Model)"
            )
        return tower

    @torch.inference_mode()
    def embed_sparse(
        self, batch: PackedBatch, lane: Lane | None = None, max_active_dims: int | None = None
    ) -> torch.Tensor:
        """A SPLADE model's sparse vectors as `[n, 2k]` float32 (`sparse.top_active`: k
        (vocabulary index, value) pairs per row), at most `max_active_dims` (default: the
        model's) per sequence."""
        splade = self.info.splade
        if splade is None:
            raise InputError(
                f"{self.info.architecture} is not a SPLADE model: embed_sparse needs a "
                "masked-LM checkpoint (BertForMaskedLM) with SpladePooling"
            )
        hidden = self._forward(batch, lane).hidden
        cu_seqlens = [int(x) for x in batch.cu_seqlens.tolist()]
        pooled = splade_pool(self.model.network.token_logits, hidden, cu_seqlens, splade)
        return top_active(pooled, max_active_dims or self.info.max_active_dims)

    @torch.inference_mode()
    def embed_tokens(self, batch: PackedBatch, lane: Lane | None = None) -> torch.Tensor:
        """Per-token embeddings `[T, H]` in float32 (TEI's /embed_all)."""
        return self._forward(batch, lane).hidden.float()

    @torch.inference_mode()
    def embed_multivector(self, batch: PackedBatch, lane: Lane | None = None) -> torch.Tensor:
        """A late-interaction (ColBERT) model's normalized token vectors as float32
        `[n, max_input_length, D]`, each sequence's from row 0 and zeros after its end."""
        if self.info.late_interaction is None:
            raise InputError(
                f"{self.info.architecture} is not a late-interaction (ColBERT) model: it has "
                "no per-token vectors to give"
            )
        out = self._forward(batch, lane)
        return rows_per_sequence(
            out.hidden.float(), out.batch.cu_seqlens, self.info.max_input_length
        )

    @torch.inference_mode()
    def maxsim(
        self,
        batch: PackedBatch,
        queries: torch.Tensor,
        query_spans: torch.Tensor,
        lane: Lane | None = None,
    ) -> torch.Tensor:
        """A late-interaction model's MaxSim score of each document of `batch` against its
        own query, float32 `[n, 1]`: `queries` `[R, D]` every query's vectors end to end,
        `query_spans` `[n, 2]` (host) the [start, end) rows of document i's query. The
        documents' vectors, their skiplist tokens dropped, never leave the device."""
        late = self.info.late_interaction
        if late is None:
            raise InputError(
                f"{self.info.architecture} is not a late-interaction (ColBERT) model: it has "
                "no MaxSim to score by"
            )
        spans = query_spans.to(torch.int64).reshape(-1, 2)
        if spans.shape[0] != batch.num_seqs:
            raise InputError(f"query_spans: {spans.shape[0]} spans for {batch.num_seqs} documents")
        if queries.ndim != 2 or queries.shape[1] != late.embedding_size:
            raise InputError(
                f"queries: expected rows of {late.embedding_size} values, got shape "
                f"{tuple(queries.shape)}"
            )
        if spans.numel() and (
            bool((spans[:, 0] > spans[:, 1]).any())
            or int(spans.min()) < 0
            or int(spans.max()) > queries.shape[0]
        ):
            raise InputError(f"query_spans: a span outside the {queries.shape[0]} query rows")
        query_width = int((spans[:, 1] - spans[:, 0]).max()) if spans.numel() else 0
        out = self._forward(batch, lane)
        device = out.hidden.device
        kept = ~torch.isin(out.batch.input_ids.long(), self._skiplist)
        scores = packed_maxsim(
            out.hidden,
            out.batch.cu_seqlens,
            kept,
            queries.to(device, non_blocking=True),
            spans.to(device, non_blocking=True),
            batch.max_seqlen,
            query_width,
        )
        return scores[:, None]

    @functools.cached_property
    def _skiplist(self) -> torch.Tensor:
        """The late-interaction skiplist's token ids on the device."""
        late = self.info.late_interaction
        ids = sorted(late.skiplist_ids) if late is not None else []
        return torch.tensor(ids, dtype=torch.int64, device=self.device)

    @torch.inference_mode()
    def predict(self, batch: PackedBatch, lane: Lane | None = None) -> torch.Tensor:
        """Raw logits `[n, num_labels]` in float32."""
        if self.info.task is not Task.CLASSIFICATION:
            raise InputError(
                f"{self.info.architecture} is an embedding model: use embed, not predict"
            )
        out = self._forward(batch, lane)
        return self.model.network.logits(out.hidden, out.batch).float()

    def query_rows(self, batch: HostArrays) -> np.ndarray | None:
        """An embedding query's pooled rows `[n, D]` float32 by the interactive lane's
        direct path (`query_path`); None where that path does not take the batch (no such
        lane, a model without pooled graphs, a batch above the lane's graphs)."""
        path = self._query_path_for(batch)
        return None if path is None else path.embed(batch)

    def warm_query(self, batch: HostArrays) -> None:
        """`query_rows`' host steps on `batch` without running the model (`QueryPath.warm`);
        nothing where that path would not take the batch."""
        path = self._query_path_for(batch)
        if path is not None:
            path.warm(batch)

    def _query_path_for(self, batch: HostArrays) -> QueryPath | None:
        """The interactive lane's direct path where it takes `batch`, the batch checked
        against the model's limits; else None."""
        path = None if self.interactive is None else self.interactive.query_path
        if path is None or not path.fits(batch):
            return None
        self._check_limits(batch.max_seqlen, batch.input_ids, batch.token_type_ids)
        return path

    def health(self) -> None:
        """Runs one tiny forward pass to the end; raises if the model cannot run."""
        batch = PackedBatch.from_sequences([[0, 0]], position_offset=self.info.position_offset)
        with self.bulk.active():
            self.hidden_states(batch)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

    def _forward(self, batch: PackedBatch, lane: Lane | None) -> ForwardPass:
        self._check_tokens(batch)
        return (lane or self.bulk).forward(batch)

    def _check_tokens(self, batch: PackedBatch) -> None:
        self._check_limits(batch.max_seqlen, _host(batch.input_ids), _host(batch.token_type_ids))

    def _check_limits(self, max_seqlen: int, input_ids: Any, token_type_ids: Any) -> None:
        """`InputError` where a batch's ids are outside the model's limits. An out-of-range
        index on the GPU poisons the whole CUDA context: check on the host (numpy's max: a
        torch operation costs several times as long)."""
        if max_seqlen > self.info.max_input_length:
            raise InputError(
                f"a sequence of {max_seqlen} tokens exceeds the model's maximum input "
                f"length {self.info.max_input_length}"
            )
        net = self.model.network
        if not input_ids.size:
            return
        largest_id = int(input_ids.max())
        if largest_id >= net.vocab_size:
            raise InputError(f"token id {largest_id} is outside the vocabulary ({net.vocab_size})")
        # With LoRA adapters the type ids carry each token's adapter (`models.lora`).
        if net.uses_token_types or net.adapter_names:
            largest_type = int(token_type_ids.max())
            if largest_type >= net.type_vocab_size:
                raise InputError(
                    f"token type id {largest_type} is outside the model's "
                    f"{net.type_vocab_size} token types"
                )


def _host(tensor: torch.Tensor) -> Any:
    """A host tensor as numpy (no copy); a device tensor as itself."""
    return tensor.numpy() if tensor.device.type == "cpu" else tensor


def graphs_enabled(cuda_graphs: bool | None) -> bool:
    """`cuda_graphs` when given, else on unless TRT_TEI_CUDA_GRAPHS=0."""
    if cuda_graphs is not None:
        return cuda_graphs
    return os.environ.get("TRT_TEI_CUDA_GRAPHS", "1") != "0"


def bulk_graphs_enabled(bulk_graphs: bool | None) -> bool:
    """`bulk_graphs` when given, else on unless TRT_TEI_BULK_GRAPHS=0."""
    if bulk_graphs is not None:
        return bulk_graphs
    return os.environ.get("TRT_TEI_BULK_GRAPHS", "1") != "0"


def load_executor(
    model_id: str | os.PathLike[str],
    *,
    device: str | torch.device | None = None,
    cuda_graphs: bool | None = None,
    max_num_tokens: int | None = None,
    max_batch_size: int | None = None,
    interactive_lane: bool = True,
    max_bulk_step_ms: float | None = DEFAULT_MAX_STEP_MS,
    bulk_graphs: bool | None = None,
    memory_fraction: float | None = None,
    **load_options: object,
) -> Executor:
    """`load_model` and an executor on one device. Graph sizes: the arguments, else an
    engine's manifest, else the defaults. With `memory_fraction`, the model must fit that
    share of the device less what is in use already (`runtime.memory`), and running out of
    memory while loading says so with the figures."""
    estimate = None
    if memory_fraction is not None:
        device = parse_device(device)  # type: ignore[arg-type]
        revision, dtype = load_options.get("revision"), load_options.get("dtype")
        estimate = estimate_for_loading(
            model_id,
            device,
            revision=revision if isinstance(revision, str) else None,
            dtype=dtype if isinstance(dtype, str) else None,
            max_num_tokens=max_num_tokens or DEFAULT_MAX_NUM_TOKENS,
            # The interactive lane has batch buffers of its own, and exists only with graphs.
            lanes=2 if interactive_lane and device.type == "cuda" else 1,
        )
        check_fits(str(model_id), device, estimate, DeviceMemory.of(device), memory_fraction)
    try:
        return _build_executor(
            model_id,
            device,
            cuda_graphs,
            max_num_tokens,
            max_batch_size,
            interactive_lane,
            max_bulk_step_ms,
            bulk_graphs,
            load_options,
        )
    except torch.OutOfMemoryError as exc:
        if estimate is None or not isinstance(device, torch.device):
            raise
        raise DeviceMemoryError(out_of_memory(str(model_id), device, estimate)) from exc


def _build_executor(
    model_id: str | os.PathLike[str],
    device: str | torch.device | None,
    cuda_graphs: bool | None,
    max_num_tokens: int | None,
    max_batch_size: int | None,
    interactive_lane: bool,
    max_bulk_step_ms: float | None,
    bulk_graphs: bool | None,
    load_options: dict[str, object],
) -> Executor:
    model = load_model(model_id, device=device, max_num_tokens=max_num_tokens, **load_options)  # type: ignore[arg-type]
    limits = model.engine_manifest or {}
    return Executor(
        model,
        cuda_graphs=graphs_enabled(cuda_graphs),
        max_num_tokens=max_num_tokens or limits.get("max_num_tokens", DEFAULT_MAX_NUM_TOKENS),
        max_batch_size=max_batch_size or limits.get("max_batch_size", DEFAULT_MAX_BATCH_SIZE),
        interactive_lane=interactive_lane,
        max_bulk_step_ms=max_bulk_step_ms,
        bulk_graphs=bulk_graphs_enabled(bulk_graphs),
    )


def load_executors(
    model_id: str | os.PathLike[str], *, devices: DeviceSpec = None, **options: object
) -> list[Executor]:
    """One executor per device of `devices` (see `devices.parse_devices`), each loading the
    checkpoint onto its own device."""
    return [
        load_executor(model_id, device=device, **options)  # type: ignore[arg-type]
        for device in parse_devices(devices)
    ]
