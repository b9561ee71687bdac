"""ModernBERT (answerdotai/ModernBERT-*, Alibaba-NLP/gte-modernbert-base): a pre-norm
encoder with rotary positions, a gated MLP and attention that alternates between global
layers and local ones (a sliding window of `local_attention / 2` tokens each side), each
kind with its own rotary base (`rope_parameters` per layer type; 160k global, 10k local by
default). No token types, no position embeddings; biases and LayerNorm offsets only where
the config asks for them. The first layer has no attention norm (the embeddings are
normalized already).

Packed like every model here (ModernBERT's "unpadded" mode is what the runtime always does),
with the windows applied by the shared varlen attention (Triton kernel on the GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..batch import PackedBatch
from ..errors import CheckpointError
from ..layers import (
    AttentionMetadata,
    LayerNorm,
    RopeAngles,
    RopeConfig,
    RotaryEmbedding,
    add_into_stream,
    apply_rotary_qk,
    gated_activation,
    gated_activation_name,
    get_activation,
    varlen_attention,
)
from ..pooling import pool
from ..weights import WeightReader
from .base import TaskHead, TransformerModel
from .config import ConfigReader
from .linears import take_linear

FULL, SLIDING = "full_attention", "sliding_attention"
_DEFAULT_THETA = {FULL: 160_000.0, SLIDING: 10_000.0}
_OLD_THETA_KEYS = {FULL: "global_rope_theta", SLIDING: "local_rope_theta"}


@dataclass
class ModernBertConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    hidden_activation: str
    max_position_embeddings: int
    norm_eps: float
    norm_bias: bool
    attention_bias: bool
    mlp_bias: bool
    layer_types: list[str]
    ropes: dict[str, RopeConfig]
    window: int  # tokens each side a local layer sees: local_attention // 2
    classifier_pooling: str
    classifier_bias: bool
    classifier_activation: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModernBertConfig:
        cfg = ConfigReader(data)
        layers = cfg.int("num_hidden_layers", 22)
        hidden = cfg.int("hidden_size", 768)
        heads = cfg.int("num_attention_heads", 12)
        if hidden % heads:
            raise CheckpointError(
                f"config.json: hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {heads}"
            )
        every = cfg.int("global_attn_every_n_layers", 3)
        types = data.get("layer_types") or [SLIDING if i % every else FULL for i in range(layers)]
        if not isinstance(types, list) or len(types) != layers or set(types) - {FULL, SLIDING}:
            raise CheckpointError(
                f"config.json: layer_types must list {FULL!r} or {SLIDING!r} for each of the "
                f"{layers} layers, got {types!r}"
            )
        max_positions = cfg.int("max_position_embeddings", 8192)
        params = data.get("rope_parameters") or {}
        if not isinstance(params, dict):
            raise CheckpointError("config.json: rope_parameters must be an object")
        ropes = {}
        for kind in (FULL, SLIDING):
            own = dict(params.get(kind) or {})
            own.setdefault("rope_theta", data.get(_OLD_THETA_KEYS[kind], _DEFAULT_THETA[kind]))
            ropes[kind] = RopeConfig.from_config({"rope_parameters": own}, max_positions)
        pooling = cfg.str("classifier_pooling", "cls")
        if pooling not in ("cls", "mean"):
            raise CheckpointError(
                f"config.json: classifier_pooling must be cls or mean, got {pooling!r}"
            )
        return cls(
            vocab_size=cfg.int("vocab_size"),
            hidden_size=hidden,
            intermediate_size=cfg.int("intermediate_size", 1152),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            hidden_activation=cfg.str("hidden_activation", "gelu"),
            max_position_embeddings=max_positions,
            norm_eps=cfg.float("norm_eps", 1e-5),
            norm_bias=cfg.bool("norm_bias", False),
            attention_bias=cfg.bool("attention_bias", False),
            mlp_bias=cfg.bool("mlp_bias", False),
            layer_types=list(types),
            ropes=ropes,
            window=cfg.int("local_attention", 128) // 2,
            classifier_pooling=pooling,
            classifier_bias=cfg.bool("classifier_bias", False),
            classifier_activation=cfg.str("classifier_activation", "gelu"),
        )


def _norm(reader: WeightReader, name: str, config: ModernBertConfig) -> LayerNorm:
    h = config.hidden_size
    weight = reader.take(f"{name}.weight", (h,))
    # Bias-free LayerNorms (the default) are LayerNorms with a zero bias.
    bias = reader.take(f"{name}.bias", (h,)) if config.norm_bias else torch.zeros_like(weight)
    return LayerNorm(weight, bias, config.norm_eps)


class ModernBertLayer(nn.Module):
    def __init__(self, config: ModernBertConfig, reader: WeightReader, index: int) -> None:
        super().__init__()
        p = f"layers.{index}"
        h, ffn = config.hidden_size, config.intermediate_size
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        self.attn_norm = None if index == 0 else _norm(reader, f"{p}.attn_norm", config)
        self.wqkv = take_linear(reader, f"{p}.attn.Wqkv", 3 * h, h, config.attention_bias)
        self.wo = take_linear(reader, f"{p}.attn.Wo", h, h, config.attention_bias)
        self.mlp_norm = _norm(reader, f"{p}.mlp_norm", config)
        # Wi's output is [input | gate]: act(input) * gate, our fused kernel's order.
        self.wi = take_linear(reader, f"{p}.mlp.Wi", 2 * ffn, h, config.mlp_bias)
        self.wo_mlp = take_linear(reader, f"{p}.mlp.Wo", h, ffn, config.mlp_bias)
        self.activation = gated_activation_name(config.hidden_activation)
        self.kind = config.layer_types[index]
        self.window = config.window if self.kind == SLIDING else None
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def forward(self, x: torch.Tensor, rope: RopeAngles, meta: AttentionMetadata) -> torch.Tensor:
        tokens = x.shape[0]
        h = x if self.attn_norm is None else self.attn_norm(x)
        qkv = self.wqkv(h).view(tokens, 3, self.num_heads, self.head_dim)
        q, k = apply_rotary_qk(qkv[:, 0], qkv[:, 1], rope)
        attn = varlen_attention(q, k, qkv[:, 2], meta, sliding_window=self.window, scale=self.scale)
        # The output projections add into the residual `x` (`add_into_stream`).
        x = add_into_stream(self.wo, attn.reshape(tokens, -1), x)
        hidden = gated_activation(self.wi(self.mlp_norm(x)), self.activation)
        return add_into_stream(self.wo_mlp, hidden, x)


class ModernBertModel(TransformerModel):
    default_pooling: ClassVar[str] = "cls"
    prefixes: ClassVar[tuple[str, ...]] = ("", "model.")
    unused: ClassVar[tuple[str, ...]] = (r"inv_freq$",)
    uses_token_types: ClassVar[bool] = False

    def __init__(self, config: ModernBertConfig, reader: WeightReader) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.hidden_size = h
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_position_embeddings
        self.tok_embeddings = nn.Parameter(
            reader.take("embeddings.tok_embeddings.weight", (config.vocab_size, h)),
            requires_grad=False,
        )
        self.embed_norm = _norm(reader, "embeddings.norm", config)
        head_dim = h // config.num_attention_heads
        self.rotary = nn.ModuleDict(
            {kind: RotaryEmbedding(rope, head_dim) for kind, rope in config.ropes.items()}
        )
        self.layers = nn.ModuleList(
            ModernBertLayer(config, reader, i) for i in range(config.num_hidden_layers)
        )
        self.final_norm = _norm(reader, "final_norm", config)

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        x = self.embed_norm(F.embedding(batch.input_ids, self.tok_embeddings))
        ropes = {kind: rotary(batch.position_ids) for kind, rotary in self.rotary.items()}
        for kind, layer in zip(self.config.layer_types, self.layers):
            x = layer(x, ropes[kind], meta)
        return self.final_norm(x)

    def classification_head(
        self, config: dict[str, Any], reader: WeightReader, num_labels: int
    ) -> TaskHead:
        return ModernBertClassifierHead(self.config, reader, num_labels)

    @classmethod
    def load(cls, config: dict[str, Any], reader: WeightReader) -> TransformerModel:
        return cls(ModernBertConfig.from_dict(config), reader)


class ModernBertClassifierHead(TaskHead):
    """`*ForSequenceClassification`: the first token's state (or the sequence mean,
    `classifier_pooling`) through the prediction head (dense, activation, norm) and a
    linear classifier."""

    def __init__(self, config: ModernBertConfig, reader: WeightReader, num_labels: int) -> None:
        super().__init__()
        h = config.hidden_size
        self.pooling = config.classifier_pooling
        self.dense = take_linear(reader, "head.dense", h, h, config.classifier_bias)
        self.act = get_activation(config.classifier_activation)
        self.norm = _norm(reader, "head.norm", config)
        self.out = take_linear(reader, "classifier", num_labels, h)

    def forward(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        if self.pooling == "mean":
            pooled = pool(hidden, batch.cu_seqlens, "mean").to(hidden.dtype)
        else:
            pooled = hidden[batch.cu_seqlens[:-1].long()]
        return self.out(self.norm(self.act(self.dense(pooled))))
