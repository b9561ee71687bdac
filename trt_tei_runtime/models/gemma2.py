"""Gemma 2: embeddings scaled by sqrt(hidden_size), `(1 + w)` RMSNorms, sandwich norms
around attention and MLP, GELU-tanh gated MLP, attention scaled by
`query_pre_attn_scalar ** -0.5` with soft-capped logits, sliding-window attention on every
other layer (the even ones, unless `layer_types` says otherwise), tied LM head with
soft-capped final logits."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from ..layers import AttentionMetadata, GemmaRMSNorm, RMSNorm, RopeAngles
from ..weights import WeightReader
from .config import ConfigReader
from .decoder import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    DecoderConfig,
    DecoderLayer,
    DecoderModel,
    layer_windows,
)


class Gemma2Config(DecoderConfig):
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecoderConfig:
        cfg = ConfigReader(data)
        layers = cfg.int("num_hidden_layers")
        window = cfg.optional_int("sliding_window", 4096)
        default = [SLIDING_ATTENTION if i % 2 == 0 else FULL_ATTENTION for i in range(layers)]
        bias = cfg.bool("attention_bias", False)
        return cls.parse(
            data,
            default_head_dim=256,
            act_key="hidden_activation",
            default_act="gelu_pytorch_tanh",
            default_tie=True,
            qkv_bias=bias,
            o_bias=bias,
            sliding_windows=layer_windows(data, layers, window, default),
            attention_scale=cfg.float("query_pre_attn_scalar", 256) ** -0.5,
            attn_logit_softcapping=cfg.optional_float("attn_logit_softcapping", 50.0),
            final_logit_softcapping=cfg.optional_float("final_logit_softcapping", 30.0),
        )


class Gemma2DecoderLayer(DecoderLayer):
    norm_cls: ClassVar[type[RMSNorm]] = GemmaRMSNorm

    def __init__(self, config: DecoderConfig, reader: WeightReader, index: int) -> None:
        super().__init__(config, reader, index)
        p = f"layers.{index}"
        self.pre_feedforward_layernorm = self.norm(reader, f"{p}.pre_feedforward_layernorm", config)
        self.post_feedforward_layernorm = self.norm(
            reader, f"{p}.post_feedforward_layernorm", config
        )

    def forward(
        self,
        x: torch.Tensor | None,
        residual: torch.Tensor | None,
        rope: RopeAngles,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Sandwich norms: each block's output is normalized before it joins the stream."""
        h, residual = self.input_layernorm.add_and_norm(x, residual)
        h = self.post_attention_layernorm(self.self_attn(h, rope, meta))
        h, residual = self.pre_feedforward_layernorm.add_and_norm(h, residual)
        return self.post_feedforward_layernorm(self.mlp(h)), residual


class Gemma2Model(DecoderModel):
    config_cls: ClassVar[type[DecoderConfig]] = Gemma2Config
    layer_cls: ClassVar[type[DecoderLayer]] = Gemma2DecoderLayer
    embed_scale: torch.Tensor

    def __init__(self, config: DecoderConfig, reader: WeightReader) -> None:
        super().__init__(config, reader)
        self.register_buffer("embed_scale", torch.tensor(config.hidden_size**0.5), persistent=False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # sqrt(hidden_size) rounded to the model dtype first, exactly as transformers does.
        scale = self.embed_scale.to(self.embed_tokens.dtype)
        return F.embedding(input_ids, self.embed_tokens) * scale
