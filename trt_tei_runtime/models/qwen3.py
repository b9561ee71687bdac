"""Qwen3: Qwen2's layout without the projection biases (unless `attention_bias`), with
RMSNorms on each query and key head before RoPE (`q_norm`, `k_norm`)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..layers import RMSNorm
from ..weights import WeightReader
from .config import ConfigReader
from .decoder import DecoderAttention, DecoderConfig, DecoderLayer, DecoderModel
from .qwen2 import qwen_sliding_windows


class Qwen3Config(DecoderConfig):
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecoderConfig:
        bias = ConfigReader(data).bool("attention_bias", False)
        return cls.parse(
            data,
            default_head_dim=128,  # transformers' Qwen3Config default
            qkv_bias=bias,
            o_bias=bias,
            sliding_windows=qwen_sliding_windows(data),
        )


class Qwen3Attention(DecoderAttention):
    def __init__(
        self, config: DecoderConfig, reader: WeightReader, prefix: str, layer: int
    ) -> None:
        super().__init__(config, reader, prefix, layer)
        d = config.head_dim
        self.q_norm = RMSNorm(reader.take(f"{prefix}.q_norm.weight", (d,)), config.rms_norm_eps)
        self.k_norm = RMSNorm(reader.take(f"{prefix}.k_norm.weight", (d,)), config.rms_norm_eps)

    def qk_norms(self) -> tuple[torch.Tensor | None, torch.Tensor | None, float]:
        return self.q_norm.weight, self.k_norm.weight, self.q_norm.eps


class Qwen3DecoderLayer(DecoderLayer):
    attention_cls: ClassVar[type[DecoderAttention]] = Qwen3Attention


class Qwen3Model(DecoderModel):
    config_cls: ClassVar[type[DecoderConfig]] = Qwen3Config
    layer_cls: ClassVar[type[DecoderLayer]] = Qwen3DecoderLayer
