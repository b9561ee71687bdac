"""What every architecture provides to the runtime, and the config helpers they share."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..batch import PackedBatch
from ..errors import CheckpointError
from ..layers import AttentionMetadata
from ..templates import PairTemplate
from ..weights import WeightReader


class Task(str, Enum):
    EMBEDDING = "embedding"
    CLASSIFICATION = "classification"


class ConfigReader:
    """Typed access to config.json fields; a missing or mistyped field names itself."""

    def __init__(self, data: dict[str, Any], source: str = "config.json") -> None:
        self.data = data
        self.source = source

    def int(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "an integer", value)
        return value

    def float(self, key: str, default: float | None = None) -> float:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._bad(key, "a number", value)
        return float(value)

    def str(self, key: str, default: str | None = None) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise self._bad(key, "a string", value)
        return value

    def _bad(self, key: builtins.str, kind: builtins.str, value: Any) -> CheckpointError:
        if key not in self.data:
            return CheckpointError(f"{self.source}: missing field {key!r}")
        return CheckpointError(f"{self.source}: field {key!r} must be {kind}, got {value!r}")


@dataclass
class ClassifierInfo:
    """Label facts of a `*ForSequenceClassification` checkpoint."""

    num_labels: int
    id2label: dict[str, str]
    problem_type: str | None

    @classmethod
    def from_config(cls, cfg: ConfigReader) -> ClassifierInfo:
        raw = cfg.data.get("id2label") or {}
        if not isinstance(raw, dict):
            raise CheckpointError(f"{cfg.source}: id2label must be an object")
        id2label = {str(k): str(v) for k, v in raw.items()}
        num_labels = cfg.data.get("num_labels") or len(id2label) or 2
        if not id2label:
            id2label = {str(i): f"LABEL_{i}" for i in range(num_labels)}
        if len(id2label) != num_labels:
            raise CheckpointError(
                f"{cfg.source}: num_labels {num_labels} disagrees with id2label ({len(id2label)})"
            )
        return cls(num_labels, id2label, cfg.data.get("problem_type"))


class TransformerModel(nn.Module):
    """A model that maps a packed batch to per-token hidden states, and, for
    classification checkpoints, those states to logits per sequence."""

    task: ClassVar[Task]
    default_pooling: ClassVar[str]
    hidden_size: int
    vocab_size: int
    max_positions: int  # longest sequence the position embeddings / config allow
    # The transformer blocks, run in order by `forward`; the engine may pause between them
    # (runtime.preemption).
    layers: nn.ModuleList
    position_offset: int = 0
    type_vocab_size: int = 1
    classifier: ClassifierInfo | None = None
    # Names the base model may be stored under inside a task checkpoint ("bert.", "model.").
    prefixes: ClassVar[tuple[str, ...]] = ("",)
    # Patterns of checkpoint tensors this class knowingly leaves unused (MLM heads, buffers).
    unused: ClassVar[tuple[str, ...]] = ()
    # Decoders have no token-type embeddings: their token type ids are ignored, not checked.
    uses_token_types: ClassVar[bool] = True
    # "encoder" (bidirectional, BERT-like) or "decoder" (Llama-like): what an engine's
    # builder config names as `base_model`.
    base_model: ClassVar[str] = "encoder"
    # How (query, document) pairs become one prompt, for models trained on a template.
    pair_template: PairTemplate | None = None

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        raise CheckpointError(f"{type(self).__name__} has no classification head")

    @classmethod
    def load(cls, config: dict[str, Any], reader: WeightReader) -> TransformerModel:
        raise NotImplementedError

    @classmethod
    def from_checkpoint(
        cls, config: dict[str, Any], reader: WeightReader, model_dir: Path
    ) -> TransformerModel:
        """`load`, for classes that also read other files of the folder (tokenizer.json)."""
        return cls.load(config, reader)
