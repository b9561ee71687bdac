"""Loading a checkpoint into a ready-to-run model and running packed batches through it.

`InferenceModel` is what both the Python API (`Model`) and the router's `Backend` use:
it owns the network, its pooling and sentence-transformers head, the device and dtype.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .batch import PackedBatch
from .checkpoint import (
    SentenceTransformersConfig,
    read_json,
    read_sentence_transformers_config,
    resolve_model_dir,
)
from .dense import DenseLayer
from .engine.graphs import MAX_GRAPH_TOKENS, CudaGraphRunner
from .engine.load import load_engine_network, read_engine_manifest
from .engine.preemption import LayerGate
from .errors import CheckpointError, InputError
from .layers import AttentionMetadata
from .layers.attention import flash_available
from .models import Task, TransformerModel, architecture_class
from .pooling import canonical_pooling, pool, score_activation
from .templates import PairTemplate
from .weights import WeightReader, load_checkpoint_tensors

log = logging.getLogger(__name__)

# Largest batch the CUDA graphs cover unless an engine manifest or the caller says otherwise.
DEFAULT_MAX_NUM_TOKENS = 16384
DEFAULT_MAX_BATCH_SIZE = 256

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def parse_dtype(name: str | torch.dtype | None, device: torch.device, checkpoint: str | None):
    """Explicit dtype wins; else float32 on CPU and, on GPU, the checkpoint's own half
    precision (bfloat16 if it was saved so, float16 otherwise, as TEI does)."""
    if isinstance(name, torch.dtype):
        return name
    if name is not None:
        try:
            return _DTYPES[name.lower()]
        except KeyError:
            raise InputError(
                f"unknown dtype {name!r}; supported: float32, float16, bfloat16"
            ) from None
    if device.type == "cpu":
        return torch.float32
    return torch.bfloat16 if checkpoint == "bfloat16" else torch.float16


def parse_device(name: str | torch.device | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {str(name)!r} requested but no CUDA GPU is available")
    return device


@dataclass
class ModelInfo:
    """What callers need to know to feed the model and read its output."""

    architecture: str
    task: Task
    model_dir: Path
    hidden_size: int  # of the pooled embedding, after any Dense module
    max_input_length: int
    position_offset: int
    pooling: str | None
    num_labels: int = 0
    id2label: dict[str, str] = field(default_factory=dict)
    score_activation: str = "softmax"
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    # Set for models trained on one prompt per (query, document) pair (yes/no rerankers).
    pair_template: PairTemplate | None = None

    @property
    def model_type(self) -> str:
        if self.task is Task.EMBEDDING:
            return "embedding"
        return "reranker" if self.num_labels == 1 else "classifier"


@dataclass
class InteractiveLane:
    """Where small latency-bound batches run while a bulk batch may be running: a CUDA
    stream of the highest priority, so the GPU schedules the query's thread blocks ahead of
    the bulk batch's waiting ones instead of after the whole bulk batch, and CUDA graphs
    with their own buffers and memory pool, so both lanes can replay at the same time.
    Each lane is driven by one host thread. `gate` pauses eager bulk batches between layers
    while an interactive batch is in flight (see `engine.preemption`)."""

    stream: torch.cuda.Stream
    graphs: CudaGraphRunner
    gate: LayerGate


class InferenceModel:
    def __init__(
        self,
        network: TransformerModel,
        info: ModelInfo,
        dense: list[DenseLayer],
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.network = network
        self.info = info
        self.dense = dense
        self.device = device
        self.dtype = dtype
        self._use_flash = flash_available(device, dtype)
        # Name → shape of every checkpoint tensor the network was built from (an engine
        # records it), and the engine manifest when loaded from an engine directory.
        self.checkpoint_tensors: dict[str, tuple[int, ...]] = {}
        self.engine_manifest: dict[str, Any] | None = None
        self.graphs: CudaGraphRunner | None = None  # the bulk lane's
        self.interactive: InteractiveLane | None = None

    def enable_cuda_graphs(self, max_num_tokens: int, max_batch_size: int) -> bool:
        """Captures CUDA graphs for batches up to these sizes, and the interactive lane's;
        False where they cannot run (CPU, or fp32, whose attention path has data-dependent
        shapes)."""
        if not self._use_flash:
            return False
        self._warm_up(max_num_tokens)
        max_seqlen = min(self.info.max_input_length, max_num_tokens)
        self.graphs = CudaGraphRunner(
            self.network,
            self.device,
            max_num_tokens=min(max_num_tokens, MAX_GRAPH_TOKENS),
            max_batch_size=max_batch_size,
            max_seqlen=max_seqlen,
        )
        self.graphs.capture()
        _, highest_priority = torch.cuda.Stream.priority_range()  # type: ignore[call-arg]
        # The same ladder as the bulk lane's: under many concurrent small requests the
        # interactive batches grow (64 clients of 24 tokens: ~1,500 tokens), and an eager
        # pass of a small model is launch-bound (measured: MiniLM at 64 clients fell from
        # 35.7k to 13.6k requests/s with graphs only up to 512 tokens).
        interactive_graphs = CudaGraphRunner(
            self.network,
            self.device,
            max_num_tokens=min(max_num_tokens, MAX_GRAPH_TOKENS),
            max_batch_size=max_batch_size,
            max_seqlen=max_seqlen,
        )
        interactive_graphs.capture()
        gate = LayerGate()
        gate.attach(self.network.layers)  # after capture: graphs hold no host-side hooks
        self.interactive = InteractiveLane(
            torch.cuda.Stream(self.device, priority=highest_priority), interactive_graphs, gate
        )
        return True

    @contextlib.contextmanager
    def lane(self, interactive: bool) -> Iterator[None]:
        """Runs what is inside on the interactive lane's stream (when asked for and the model
        has one), else on the current stream. Reading results back to the host belongs
        inside too: the copy must follow the lane's own work, not the other lane's."""
        if not interactive or self.interactive is None:
            yield
            return
        with self.interactive.gate.interactive(), torch.cuda.stream(self.interactive.stream):
            yield

    def _warm_up(self, max_num_tokens: int) -> None:
        """One eager pass over the largest batch: the caching allocator then holds every
        block a batch of up to `max_num_tokens` needs, so no request calls cudaMalloc."""
        length = min(self.info.max_input_length, max_num_tokens)
        sequences = [[1] * length] * max(1, max_num_tokens // length)
        self.hidden_states(
            PackedBatch.from_sequences(sequences, position_offset=self.info.position_offset)
        )
        torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def hidden_states(self, batch: PackedBatch, *, interactive: bool = False) -> torch.Tensor:
        """Per-token last hidden states `[T, H]` in the model dtype, on the device."""
        with self.lane(interactive):
            return self._forward(batch, interactive)[0]

    def _forward(self, batch: PackedBatch, interactive: bool) -> tuple[torch.Tensor, PackedBatch]:
        """Hidden states and the batch as it lies on the device (one copy either way), with
        the bulk lane's graphs or the interactive one's; the caller holds `lane`."""
        self._check_tokens(batch)
        graphs = self.interactive.graphs if interactive and self.interactive else self.graphs
        if graphs is not None and graphs.can_run(batch):
            return graphs.run(batch)
        if interactive or self.interactive is None:
            return self._eager(batch)
        with self.interactive.gate.bulk():
            return self._eager(batch)

    def _eager(self, batch: PackedBatch) -> tuple[torch.Tensor, PackedBatch]:
        batch = batch.to(self.device)
        meta = AttentionMetadata.build(
            batch.cu_seqlens, batch.max_seqlen, use_flash=self._use_flash
        )
        return self.network(batch, meta), batch

    # The methods below return device tensors. `interactive=True` runs them on the
    # interactive lane; read their results inside `with model.lane(True):`.

    @torch.inference_mode()
    def embed(self, batch: PackedBatch, *, interactive: bool = False) -> torch.Tensor:
        """Pooled embeddings `[n, dim]` in float32, not normalized."""
        if self.info.pooling is None:
            raise InputError(
                f"{self.info.architecture} is a {self.info.model_type}: use predict, not embed"
            )
        with self.lane(interactive):
            hidden, on_device = self._forward(batch, interactive)
            pooled = pool(hidden, on_device.cu_seqlens, self.info.pooling)
            for layer in self.dense:
                pooled = layer(pooled)
            return pooled

    @torch.inference_mode()
    def embed_tokens(self, batch: PackedBatch, *, interactive: bool = False) -> torch.Tensor:
        """Per-token embeddings `[T, H]` in float32 (TEI's /embed_all)."""
        with self.lane(interactive):
            return self._forward(batch, interactive)[0].float()

    @torch.inference_mode()
    def predict(self, batch: PackedBatch, *, interactive: bool = False) -> torch.Tensor:
        """Raw logits `[n, num_labels]` in float32."""
        if self.info.task is not Task.CLASSIFICATION:
            raise InputError(
                f"{self.info.architecture} is an embedding model: use embed, not predict"
            )
        with self.lane(interactive):
            hidden, on_device = self._forward(batch, interactive)
            return self.network.logits(hidden, on_device).float()

    def _check_tokens(self, batch: PackedBatch) -> None:
        # An out-of-range index on the GPU poisons the whole CUDA context: check on the host.
        net = self.network
        if batch.num_tokens and int(batch.input_ids.max()) >= net.vocab_size:
            raise InputError(
                f"token id {int(batch.input_ids.max())} is outside the vocabulary "
                f"({net.vocab_size})"
            )
        if (
            net.uses_token_types
            and batch.num_tokens
            and int(batch.token_type_ids.max()) >= net.type_vocab_size
        ):
            raise InputError(
                f"token type id {int(batch.token_type_ids.max())} is outside the model's "
                f"{net.type_vocab_size} token types"
            )
        if batch.max_seqlen > self.info.max_input_length:
            raise InputError(
                f"a sequence of {batch.max_seqlen} tokens exceeds the model's maximum input "
                f"length {self.info.max_input_length}"
            )


def load_inference_model(
    model_id: str | os.PathLike[str],
    *,
    revision: str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    pooling: str | None = None,
    task: str | None = None,
    cuda_graphs: bool | None = None,
    max_num_tokens: int | None = None,
    max_batch_size: int | None = None,
    full_length_must_fit: bool = False,
) -> InferenceModel:
    """Loads a checkpoint folder, hub id or engine directory.

    `full_length_must_fit` (the router's case: it never splits a sequence) refuses a
    `max_num_tokens` below the model's input limit, before the slow part of loading.

    On CUDA, CUDA graphs are captured for batches of up to `max_num_tokens` tokens and
    `max_batch_size` sequences (an engine's manifest gives both) unless `cuda_graphs` is
    False or TRT_TEI_CUDA_GRAPHS=0.
    `task` loads a checkpoint for a task other than its architecture's (see
    `models.TASKS`), e.g. "rerank-yes-no" for Qwen3-Reranker's `Qwen3ForCausalLM`."""
    model_dir = resolve_model_dir(model_id, revision)
    config = read_json(model_dir / "config.json")
    assert config is not None
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise CheckpointError(f"config.json in {model_dir}: missing field 'architectures'")
    arch_name = str(architectures[0])
    arch = architecture_class(arch_name, task)
    st = read_sentence_transformers_config(model_dir)
    torch_device = parse_device(device)
    torch_dtype = parse_dtype(dtype, torch_device, config.get("torch_dtype") or config.get("dtype"))

    manifest = read_engine_manifest(model_dir)
    if manifest is not None:
        # An engine is built for one dtype (and maybe FP8): it loads as it was built.
        built = parse_dtype(manifest["dtype"], torch_device, None)
        if dtype is not None and parse_dtype(dtype, torch_device, None) != built:
            raise InputError(f"engine {model_dir} was built for {manifest['dtype']}, not {dtype}")
        torch_dtype = built
        network = load_engine_network(arch, config, model_dir, manifest, torch_device)
        checkpoint_tensors = {k: tuple(v) for k, v in manifest["checkpoint_tensors"].items()}
    else:
        reader = WeightReader(
            load_checkpoint_tensors(model_dir),
            prefixes=arch.prefixes,
            ignore=arch.unused,
            source=str(model_dir),
        )
        network = arch.from_checkpoint(config, reader, model_dir)
        reader.finish()
        checkpoint_tensors = reader.taken
    dense = [DenseLayer(spec).eval() for spec in st.dense]
    info = _model_info(arch_name, network, model_dir, st, dense, pooling)
    # Before the slow part (moving to the GPU, warming up, capturing graphs).
    too_small = max_num_tokens is not None and info.max_input_length > max_num_tokens
    if full_length_must_fit and too_small:
        raise InputError(
            f"max_batch_tokens ({max_num_tokens}) must be at least the model's max input "
            f"length ({info.max_input_length}): one full-length input must fit in a batch"
        )
    if manifest is None:
        network.to(device=torch_device, dtype=torch_dtype).eval()
    dense = [layer.to(torch_device, torch.float32) for layer in dense]
    log.info(
        "loaded %s (%s) from %s on %s in %s",
        arch_name,
        info.model_type,
        model_dir,
        torch_device,
        torch_dtype,
    )
    model = InferenceModel(network, info, dense, torch_device, torch_dtype)
    model.checkpoint_tensors = checkpoint_tensors
    model.engine_manifest = manifest
    if cuda_graphs is None:
        cuda_graphs = os.environ.get("TRT_TEI_CUDA_GRAPHS", "1") != "0"
    if cuda_graphs and torch_device.type == "cuda":
        limits = manifest or {}
        model.enable_cuda_graphs(
            max_num_tokens=max_num_tokens or limits.get("max_num_tokens", DEFAULT_MAX_NUM_TOKENS),
            max_batch_size=max_batch_size or limits.get("max_batch_size", DEFAULT_MAX_BATCH_SIZE),
        )
    return model


def _model_info(
    arch_name: str,
    network: TransformerModel,
    model_dir: Path,
    st: SentenceTransformersConfig,
    dense: list[DenseLayer],
    pooling: str | None,
) -> ModelInfo:
    max_length = network.max_positions
    if st.max_seq_length is not None:
        max_length = min(max_length, st.max_seq_length)
    else:
        tok_cfg = read_json(model_dir / "tokenizer_config.json", required=False) or {}
        limit = tok_cfg.get("model_max_length")
        if isinstance(limit, int) and 0 < limit < max_length:
            max_length = limit
    info = ModelInfo(
        architecture=arch_name,
        task=network.task,
        model_dir=model_dir,
        hidden_size=dense[-1].linear.out_features if dense else network.hidden_size,
        max_input_length=max_length,
        position_offset=network.position_offset,
        pooling=None,
        prompts=st.prompts,
        default_prompt_name=st.default_prompt_name,
        pair_template=network.pair_template,
    )
    if network.task is Task.EMBEDDING:
        info.pooling = canonical_pooling(pooling or st.pooling or network.default_pooling)
    else:
        if pooling is not None:
            raise InputError(f"{arch_name} is a classifier: pooling does not apply to it")
        assert network.classifier is not None
        info.num_labels = network.classifier.num_labels
        info.id2label = network.classifier.id2label
        info.score_activation = score_activation(
            network.classifier.num_labels, network.classifier.problem_type
        )
    return info
