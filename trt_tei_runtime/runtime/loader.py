"""Loading: a checkpoint folder, hub id or engine directory becomes a `LoadedModel`, the
network with its weights, pooling and sentence-transformers head on one device. Running it
is the executor's (`executor.py`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import (
    SentenceTransformersConfig,
    read_json,
    read_sentence_transformers_config,
    resolve_model_dir,
    transformer_folder,
)
from ..dense import DenseLayer
from ..errors import CheckpointError, InputError
from ..images import ImagePreprocessor
from ..late_interaction import LateInteraction, is_late_interaction_folder, read_late_interaction
from ..models import Task, TransformerModel, architecture_class
from ..models.base import ImageTower
from ..models.colbert import ColBERTNetwork, ExpansionHiddenColBERTNetwork
from ..models.lora import attach_adapters
from ..models.peft import LoraAdapter, read_adapter
from ..pooling import canonical_pooling, score_activation
from ..sparse import SpladeConfig
from ..templates import PairTemplate, TextPadding, Vocabulary
from ..weights import WeightReader, load_checkpoint_tensors
from .devices import parse_device, parse_dtype
from .engine_files import load_engine_network, read_engine_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageInput:
    """What a model that embeds images takes: `channels x height x width` float32 pixels
    per image, as `preprocessor` makes them from an encoded image; each image runs as
    `tokens_per_image` tokens (what it counts for in a batch's token budget)."""

    height: int
    width: int
    channels: int
    patch_size: int
    tokens_per_image: int
    preprocessor: ImagePreprocessor

    def as_dict(self) -> dict[str, Any]:
        return {
            "height": self.height,
            "width": self.width,
            "channels": self.channels,
            "patch_size": self.patch_size,
            "tokens_per_image": self.tokens_per_image,
            "steps": self.preprocessor.steps(),
        }


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
    # Prompt name -> adapter index for models whose prompts pick an adapter
    # (jina-embeddings-v3's tasks): the token type ids of a request's tokens.
    adapters: dict[str, int] = field(default_factory=dict)
    # Every LoRA adapter loaded (the checkpoint's own, then `lora_adapters`' in the order
    # given), by name -> its 1-based index. A token of token type t under adapter i carries
    # type id `i * adapter_type_stride + t` (0 for the base weights); the stride is the
    # number of token types the model reads, 1 for models that read none (decoders).
    lora_adapters: dict[str, int] = field(default_factory=dict)
    adapter_type_stride: int = 1

    # SPLADE models: how token logits are pooled, and the default cap on active dimensions.
    splade: SpladeConfig | None = None
    max_active_dims: int | None = None
    # Models that also embed images (CLIP, SigLIP): what their images must be.
    image_input: ImageInput | None = None
    # Models trained on padded texts (SigLIP): the length and pad token every text takes.
    text_padding: TextPadding | None = None
    # Late-interaction (ColBERT) models: their query and document rules; the network gives
    # one normalized vector of `hidden_size` per token.
    late_interaction: LateInteraction | None = None

    @property
    def model_type(self) -> str:
        if self.task is Task.EMBEDDING:
            return "embedding"
        if self.task is Task.SPARSE_EMBEDDING:
            return "sparse"
        return "reranker" if self.num_labels == 1 else "classifier"


@dataclass
class LoadedModel:
    """A network with its weights on `device`, ready for an executor."""

    network: TransformerModel
    info: ModelInfo
    dense: list[DenseLayer]
    device: torch.device
    dtype: torch.dtype
    # Name → shape of every checkpoint tensor the network was built from (an engine
    # records it), and the engine manifest when loaded from an engine directory.
    checkpoint_tensors: dict[str, tuple[int, ...]]
    engine_manifest: dict[str, Any] | None = None


def load_model(
    model_id: str | os.PathLike[str],
    *,
    revision: str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    pooling: str | None = None,
    task: str | None = None,
    max_num_tokens: int | None = None,
    full_length_must_fit: bool = False,
    max_active_dims: int | None = None,
    lora_adapters: Mapping[str, str | os.PathLike[str]] | None = None,
) -> LoadedModel:
    """Loads a checkpoint folder, hub id or engine directory.

    `full_length_must_fit` (the router's case: it never splits a sequence) refuses a
    `max_num_tokens` below the model's input limit, before the slow part of loading.
    `task` loads a checkpoint for a task other than its architecture's (see
    `models.TASKS`), e.g. "rerank-yes-no" for Qwen3-Reranker's `Qwen3ForCausalLM`.
    `max_active_dims` caps the active dimensions of a SPLADE model's sparse vectors (as
    sentence-transformers' `SparseEncoder(max_active_dims=...)`). `lora_adapters`: name ->
    PEFT LoRA folder, stacked onto the base weights and chosen per token (`models.lora`)."""
    if max_active_dims is not None and max_active_dims <= 0:
        raise InputError(f"max_active_dims must be a positive integer, got {max_active_dims}")
    root = resolve_model_dir(model_id, revision)
    model_dir = transformer_folder(root)
    config = read_json(model_dir / "config.json")
    assert config is not None
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise CheckpointError(f"config.json in {model_dir}: missing field 'architectures'")
    arch_name = str(architectures[0])
    arch = architecture_class(arch_name, task)
    st = read_sentence_transformers_config(root)
    torch_device = parse_device(device)
    torch_dtype = parse_dtype(dtype, torch_device, config.get("torch_dtype") or config.get("dtype"))

    manifest = read_engine_manifest(model_dir)
    if manifest is not None:
        # An engine is built for one dtype (and maybe FP8): it loads as it was built.
        built = parse_dtype(manifest["dtype"], torch_device, None)
        if dtype is not None and parse_dtype(dtype, torch_device, None) != built:
            raise InputError(f"engine {model_dir} was built for {manifest['dtype']}, not {dtype}")
        torch_dtype = built
        if lora_adapters:
            # An engine's linears may be FP8 and its module tree is rebuilt without
            # adapters: serve adapters from the checkpoint instead.
            raise InputError(
                f"lora_adapters are not supported with an engine directory ({model_dir}); "
                "load the checkpoint the engine was built from instead"
            )
        network = load_engine_network(arch, config, model_dir, manifest, torch_device)
        checkpoint_tensors = {k: tuple(v) for k, v in manifest["checkpoint_tensors"].items()}
    else:
        reader = WeightReader(
            load_checkpoint_tensors(model_dir),
            prefixes=arch.prefixes,
            ignore=arch.unused,
            source=str(model_dir),
        )
        network = arch.from_checkpoint(config, reader, Vocabulary(model_dir))
        reader.finish()
        checkpoint_tensors = reader.taken
        bundled = network.checkpoint_adapters()
        attach_adapters(network, bundled + _read_adapters(lora_adapters or {}))
    dense = [DenseLayer(spec).eval() for spec in st.dense]
    late = None
    if is_late_interaction_folder(root):
        if manifest is not None:
            raise InputError(f"{model_dir}: engine directories of ColBERT models are not supported")
        network, late = _late_interaction_network(root, model_dir, network, dense, pooling)
        dense = []
    info = _model_info(arch_name, network, model_dir, st, dense, pooling)
    if late is not None:
        # Every input is cut to its type's length, which the model must hold.
        longest = max(late.query_length, late.document_length)
        if longest > network.max_positions:
            raise CheckpointError(
                f"{root / 'config_sentence_transformers.json'}: query_length/document_length "
                f"{longest} exceed the model's {network.max_positions} positions"
            )
        info.max_input_length = longest
        info.late_interaction = late
    info.lora_adapters = {name: i for i, name in enumerate(network.adapter_names, 1)}
    info.adapter_type_stride = network.adapter_type_stride
    if max_active_dims is not None and info.splade is None:
        raise InputError(f"max_active_dims applies to SPLADE models; {arch_name} is not one")
    info.max_active_dims = max_active_dims
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
    return LoadedModel(
        network, info, dense, torch_device, torch_dtype, checkpoint_tensors, manifest
    )


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
    prompts, adapters = _adapter_prompts(network, st.prompts)
    info = ModelInfo(
        architecture=arch_name,
        task=network.task,
        model_dir=model_dir,
        hidden_size=dense[-1].linear.out_features if dense else network.pooled_size,
        max_input_length=max_length,
        position_offset=network.position_offset,
        pooling=None,
        prompts=prompts,
        default_prompt_name=st.default_prompt_name,
        pair_template=network.pair_template,
        adapters=adapters,
    )
    if network.task is Task.SPARSE_EMBEDDING:
        _sparse_info(info, arch_name, network, model_dir, st, dense, pooling)
    elif st.splade is not None:
        raise CheckpointError(
            f"{model_dir / 'modules.json'}: SpladePooling needs a masked-LM checkpoint "
            f"(BertForMaskedLM); config.json says {arch_name}"
        )
    elif isinstance(network, ColBERTNetwork):
        pass  # one vector per token: no pooling
    elif network.task is Task.EMBEDDING:
        if pooling is not None and pooling.lower() == "splade":
            raise InputError(
                f"pooling 'splade' needs a masked-LM checkpoint (BertForMaskedLM); "
                f"{arch_name} has no masked-LM head"
            )
        info.pooling = canonical_pooling(pooling or st.pooling or network.default_pooling)
        if network.image_tower is not None:
            _image_model_info(info, network, network.image_tower)
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


def _late_interaction_network(
    root: Path,
    model_dir: Path,
    network: TransformerModel,
    dense: list[DenseLayer],
    pooling: str | None,
) -> tuple[ColBERTNetwork, LateInteraction]:
    """A PyLate checkpoint's network (the base model, its Dense projections on every
    token) and its query/document rules."""
    if network.task is not Task.EMBEDDING or network.image_tower is not None:
        raise CheckpointError(
            f"{root}: a ColBERT checkpoint needs a text encoder base model, not "
            f"{type(network).__name__}"
        )
    if not dense:
        raise CheckpointError(
            f"{root / 'modules.json'}: a ColBERT checkpoint needs its Dense projection module"
        )
    if pooling is not None:
        raise InputError("a ColBERT model keeps every token's vector: pooling does not apply to it")
    late = read_late_interaction(root, model_dir, dense[-1].linear.out_features)
    if late.expand_queries and not late.attend_to_expansion:
        return ExpansionHiddenColBERTNetwork(network, dense, late.mask_token_id), late
    return ColBERTNetwork(network, dense), late


def _image_model_info(info: ModelInfo, network: TransformerModel, tower: ImageTower) -> None:
    """A text-and-image model: its fixed text pooling, its texts' padding, its images."""
    if info.pooling != network.default_pooling:
        raise InputError(
            f"{info.architecture} pools its texts as it was trained ({network.default_pooling}); "
            f"pooling {info.pooling!r} does not apply to it"
        )
    preprocessor = ImagePreprocessor.from_folder(info.model_dir)
    tower.fit_preprocessor(preprocessor, str(info.model_dir / "preprocessor_config.json"))
    info.image_input = ImageInput(
        height=tower.image_size[0],
        width=tower.image_size[1],
        channels=tower.channels,
        patch_size=tower.patch_size,
        tokens_per_image=tower.tokens_per_image,
        preprocessor=preprocessor,
    )
    if network.pads_texts and (info.model_dir / "tokenizer.json").is_file():
        token = _pad_token(info.model_dir)
        token_id = Vocabulary(info.model_dir).token_id(token, "padding texts to their length")
        info.text_padding = TextPadding(info.max_input_length, token_id)


def _pad_token(model_dir: Path) -> str:
    """The tokenizer's pad token (tokenizer_config.json, else special_tokens_map.json)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        value = (read_json(model_dir / name, required=False) or {}).get("pad_token")
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str) and value:
            return value
    raise CheckpointError(
        f"{model_dir}: the model pads its texts, but neither tokenizer_config.json nor "
        "special_tokens_map.json names a pad_token"
    )


def _read_adapters(folders: Mapping[str, str | os.PathLike[str]]) -> list[LoraAdapter]:
    adapters = []
    for name, folder in folders.items():
        if not isinstance(name, str) or not name.strip():
            raise InputError(
                f"lora_adapters: adapter names must be non-empty strings, got {name!r}"
            )
        adapters.append(read_adapter(Path(folder), name))
    return adapters


def _adapter_prompts(
    network: TransformerModel, prompts: dict[str, str]
) -> tuple[dict[str, str], dict[str, int]]:
    """The prompts, with every adapter reachable by a prompt name: the names of the
    checkpoint's prompts that match an adapter (jina-embeddings-v3's "retrieval.query" for
    its `retrieval_query/` adapter), and an empty prompt under the adapter's own name for
    an adapter no prompt names."""
    prompts = dict(prompts)
    adapters = {}
    for name in prompts:
        index = network.adapter_index(name)
        if index is not None:
            adapters[name] = index
    for index, name in enumerate(network.adapter_names, 1):
        # Only adapters a prompt may pick (the checkpoint's tasks); those given as
        # `lora_adapters` are chosen by name, apart from prompts (`ModelInfo.lora_adapters`).
        if index not in adapters.values() and network.adapter_index(name) == index:
            prompts.setdefault(name, "")
            adapters[name] = index
    return prompts, adapters


def _sparse_info(
    info: ModelInfo,
    arch_name: str,
    network: TransformerModel,
    model_dir: Path,
    st: SentenceTransformersConfig,
    dense: list[DenseLayer],
    pooling: str | None,
) -> None:
    """A SPLADE model: its vectors have one dimension per vocabulary entry. A masked-LM
    checkpoint without sentence-transformers files pools as SPLADE v2 does (max, relu)."""
    if pooling is not None and pooling.lower() != "splade":
        raise InputError(
            f"{arch_name} is a SPLADE (sparse) model: its pooling is 'splade', not {pooling!r}"
        )
    if dense or st.pooling is not None:
        raise CheckpointError(
            f"{model_dir / 'modules.json'}: a masked-LM (SPLADE) model takes SpladePooling, "
            "not Pooling or Dense modules"
        )
    info.pooling = "splade"
    info.splade = st.splade or SpladeConfig()
    info.hidden_size = network.vocab_size
