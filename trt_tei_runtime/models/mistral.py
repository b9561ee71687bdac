"""Mistral: Llama's decoder with bias-free projections and, when the config sets
`sliding_window` (Mistral-7B-v0.1), that window on every layer."""

from __future__ import annotations

from typing import Any, ClassVar

from .config import ConfigReader
from .decoder import DecoderConfig, DecoderModel


class MistralConfig(DecoderConfig):
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecoderConfig:
        cfg = ConfigReader(data)
        # transformers' MistralConfig defaults the window to 4096 when the key is absent.
        window = cfg.optional_int("sliding_window", 4096)
        return cls.parse(data, sliding_windows=(window,) * cfg.int("num_hidden_layers"))


class MistralModel(DecoderModel):
    config_cls: ClassVar[type[DecoderConfig]] = MistralConfig
