"""Mistral: Llama's decoder with bias-free projections and, when the config sets
`sliding_window` (Mistral-7B-v0.1), that window on every layer."""

from __future__ import annotations

from typing import Any, ClassVar

from .base import ConfigReader
from .llama import (
    DecoderSequenceClassification,
    LlamaConfig,
    LlamaModel,
    YesNoReranker,
    optional_positive_int,
)


class MistralConfig(LlamaConfig):
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlamaConfig:
        layers = ConfigReader(data).int("num_hidden_layers")
        # transformers' MistralConfig defaults the window to 4096 when the key is absent.
        window = optional_positive_int(data, "sliding_window", 4096)
        return cls.parse(data, sliding_windows=(window,) * layers)


class MistralModel(LlamaModel):
    config_cls: ClassVar[type[LlamaConfig]] = MistralConfig


class MistralForCausalLM(MistralModel):
    unused: ClassVar[tuple[str, ...]] = (*MistralModel.unused, r"^lm_head\.")


class MistralForSequenceClassification(DecoderSequenceClassification, MistralModel):
    pass


class MistralYesNoReranker(YesNoReranker, MistralModel):
    pass
