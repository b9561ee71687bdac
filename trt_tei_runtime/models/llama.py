"""Llama: the shared decoder as it is, with optional biases on the attention projections
(`attention_bias`) and on the MLP (`mlp_bias`)."""

from __future__ import annotations

from typing import Any, ClassVar

from .config import ConfigReader
from .decoder import DecoderConfig, DecoderModel


class LlamaConfig(DecoderConfig):
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecoderConfig:
        cfg = ConfigReader(data)
        attention_bias = cfg.bool("attention_bias", False)
        return cls.parse(
            data,
            qkv_bias=attention_bias,
            o_bias=attention_bias,
            mlp_bias=cfg.bool("mlp_bias", False),
        )


class LlamaModel(DecoderModel):
    config_cls: ClassVar[type[DecoderConfig]] = LlamaConfig
