"""Gemma 3 text (`Gemma3TextModel`), as EmbeddingGemma (google/embeddinggemma-300m) uses it:
Gemma 2's layer (sandwich `(1 + w)` RMSNorms, GELU-tanh gated MLP, embeddings scaled by
sqrt(hidden_size), attention scaled by `query_pre_attn_scalar ** -0.5`) plus `(1 + w)`
RMSNorms on each query and key head, no soft-capping by default, five sliding-window
layers to one global layer (`layer_types`), and a rotary base per layer type
(`rope_parameters`: 1M global, 10k local by default).

With `use_bidirectional_attention` (EmbeddingGemma) every layer attends both ways and a
local layer sees `sliding_window // 2` tokens each side (transformers halves the configured
window in that mode). The sentence-transformers `Dense` modules that follow EmbeddingGemma's
mean pooling are applied by the runtime after pooling (`dense.py`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..batch import PackedBatch
from ..errors import CheckpointError
from ..layers import AttentionMetadata, GemmaRMSNorm, RopeConfig, RotaryEmbedding
from ..weights import WeightReader
from .config import ConfigReader
from .decoder import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    DecoderAttention,
    DecoderConfig,
    DecoderLayer,
    layer_windows,
)
from .gemma2 import Gemma2DecoderLayer, Gemma2Model

_DEFAULT_THETA = {FULL_ATTENTION: 1_000_000.0, SLIDING_ATTENTION: 10_000.0}
_OLD_THETA_KEYS = {FULL_ATTENTION: "rope_theta", SLIDING_ATTENTION: "rope_local_base_freq"}


def gemma3_ropes(data: dict[str, Any], max_positions: int) -> dict[str, RopeConfig]:
    """One rope per layer type, from `rope_parameters` (5.x) or the older flat keys
    (`rope_theta`, `rope_local_base_freq`, `rope_scaling` for the global layers only)."""
    params = data.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise CheckpointError("config.json: rope_parameters must be an object")
    if params and not any(isinstance(v, dict) for v in params.values()):
        params = {FULL_ATTENTION: params}  # one flat dict: the global layers'
    ropes = {}
    for kind in (FULL_ATTENTION, SLIDING_ATTENTION):
        own = dict(params.get(kind) or {})
        if kind == FULL_ATTENTION and isinstance(data.get("rope_scaling"), dict):
            own.update(data["rope_scaling"])
        own.setdefault("rope_theta", data.get(_OLD_THETA_KEYS[kind], _DEFAULT_THETA[kind]))
        ropes[kind] = RopeConfig.from_config({"rope_parameters": own}, max_positions)
    return ropes


class Gemma3Config(DecoderConfig):
    ropes: dict[str, RopeConfig]
    layer_types: list[str]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecoderConfig:
        cfg = ConfigReader(data)
        layers = cfg.int("num_hidden_layers")
        pattern = cfg.int("sliding_window_pattern", 6)
        default = [
            SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(layers)
        ]
        window = cfg.optional_int("sliding_window", 4096)
        bidirectional = cfg.bool("use_bidirectional_attention", False)
        if bidirectional and window is not None:
            # transformers' bidirectional mask: |query - key| < window // 2 + 1.
            window = window // 2
        ropes = gemma3_ropes(data, cfg.int("max_position_embeddings", 131072))
        flat = {k: v for k, v in data.items() if k not in ("rope_parameters", "rope_scaling")}
        bias = cfg.bool("attention_bias", False)
        config = cls.parse(
            flat,
            default_head_dim=256,
            act_key="hidden_activation",
            default_act="gelu_pytorch_tanh",
            default_tie=True,
            qkv_bias=bias,
            o_bias=bias,
            sliding_windows=layer_windows(data, layers, window, default),
            attention_scale=cfg.float("query_pre_attn_scalar", 256) ** -0.5,
            attn_logit_softcapping=cfg.optional_float("attn_logit_softcapping", None),
            final_logit_softcapping=cfg.optional_float("final_logit_softcapping", None),
        )
        config.rope = ropes[FULL_ATTENTION]
        assert isinstance(config, Gemma3Config)
        config.ropes = ropes
        config.layer_types = [
            SLIDING_ATTENTION if w is not None else FULL_ATTENTION for w in config.sliding_windows
        ]
        if data.get("layer_types"):
            config.layer_types = list(data["layer_types"])
        return config


class Gemma3Attention(DecoderAttention):
    """Gemma's `(1 + w)` RMSNorm on every query and key head before RoPE."""

    def __init__(
        self, config: DecoderConfig, reader: WeightReader, prefix: str, layer: int
    ) -> None:
        super().__init__(config, reader, prefix, layer)
        d = config.head_dim
        self.q_norm = GemmaRMSNorm(
            reader.take(f"{prefix}.q_norm.weight", (d,)), config.rms_norm_eps
        )
        self.k_norm = GemmaRMSNorm(
            reader.take(f"{prefix}.k_norm.weight", (d,)), config.rms_norm_eps
        )

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = super().project(x)
        d = self.head_dim
        q = self.q_norm(q.reshape(-1, d)).view(q.shape)
        k = self.k_norm(k.reshape(-1, d)).view(k.shape)
        return q, k, v


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    attention_cls: ClassVar[type[DecoderAttention]] = Gemma3Attention


class Gemma3TextModel(Gemma2Model):
    config_cls: ClassVar[type[DecoderConfig]] = Gemma3Config
    layer_cls: ClassVar[type[DecoderLayer]] = Gemma3DecoderLayer
    unused: ClassVar[tuple[str, ...]] = (r"inv_freq$",)

    def __init__(self, config: DecoderConfig, reader: WeightReader) -> None:
        super().__init__(config, reader)
        assert isinstance(config, Gemma3Config)
        self.layer_types = config.layer_types
        self.rotaries = torch.nn.ModuleDict(
            {kind: RotaryEmbedding(rope, config.head_dim) for kind, rope in config.ropes.items()}
        )

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        x: torch.Tensor | None = self.embed(batch.input_ids)
        ropes = {kind: rotary(batch.position_ids) for kind, rotary in self.rotaries.items()}
        residual = None
        for kind, layer in zip(self.layer_types, self.layers):
            x, residual = layer(x, residual, ropes[kind], meta)
        return self.norm.add_and_norm(x, residual)[0]
