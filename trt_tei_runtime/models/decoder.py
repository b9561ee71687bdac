"""The pre-norm decoder that Llama, Mistral, Qwen2, Qwen3 and Gemma2 share.

Over packed tokens: token embeddings, N layers of (RMSNorm → GQA attention with RoPE →
residual, RMSNorm → gated MLP → residual), a final RMSNorm. Query, key and value
projections are fused into one GEMM, as are the MLP's gate and up projections. Attention is
causal unless the checkpoint's config says otherwise (`"is_causal": false` or
`"use_bidirectional_attention": true`); in either mode a sequence only ever sees its own
tokens. A family file sets the config class (its config.json conventions) and, where its
layers differ, the layer or attention class.

Task heads (`heads.py`, attached by `adapters.py`): `*ForSequenceClassification` reads
`score` at the last real token; yes/no rerankers read two rows of the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..batch import PackedBatch
from ..errors import CheckpointError
from ..layers import (
    AttentionMetadata,
    RMSNorm,
    RopeAngles,
    RopeConfig,
    RotaryEmbedding,
    add_to_stream,
    apply_rotary_qk,
    gated_activation_name,
    gated_hidden,
    varlen_attention,
)
from ..weights import WeightReader
from .base import TaskHead, TransformerModel
from .config import ConfigReader
from .heads import LastTokenScore, TokenPairScore
from .linears import take_fused_linear, take_linear

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


@dataclass
class DecoderConfig:
    """What the shared decoder pieces need; each family fills it from its own config.json
    conventions (`from_dict`)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    pad_token_id: int | None
    tie_word_embeddings: bool
    is_causal: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    # One entry per layer: the sliding window of that layer, or None for full attention.
    sliding_windows: tuple[int | None, ...] = ()
    attention_scale: float | None = None  # None: head_dim ** -0.5
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecoderConfig:
        """The family's reading of config.json (`parse` plus its own fields)."""
        return cls.parse(data)

    @classmethod
    def parse(
        cls,
        data: dict[str, Any],
        *,
        default_head_dim: int | None = None,
        act_key: str = "hidden_act",
        default_act: str = "silu",
        default_tie: bool = False,
        **fields: Any,
    ) -> DecoderConfig:
        """The fields every family reads the same way; `fields` holds the family's own."""
        cfg = ConfigReader(data)
        hidden = cfg.int("hidden_size")
        heads = cfg.int("num_attention_heads")
        kv_heads = data.get("num_key_value_heads")
        kv_heads = heads if kv_heads is None else cfg.int("num_key_value_heads")
        head_dim = data.get("head_dim")
        if head_dim is None:
            head_dim = default_head_dim if default_head_dim is not None else hidden // heads
        else:
            head_dim = cfg.int("head_dim")
        if default_head_dim is None and data.get("head_dim") is None and hidden % heads:
            raise CheckpointError(
                f"config.json: hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {heads}"
            )
        if heads % kv_heads:
            raise CheckpointError(
                f"config.json: num_attention_heads {heads} is not a multiple of "
                f"num_key_value_heads {kv_heads}"
            )
        max_positions = cfg.int("max_position_embeddings", 2048)
        pad = data.get("pad_token_id")
        if pad is not None:
            pad = cfg.int("pad_token_id")
        config = cls(
            vocab_size=cfg.int("vocab_size"),
            hidden_size=hidden,
            intermediate_size=cfg.int("intermediate_size"),
            num_hidden_layers=cfg.int("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            hidden_act=cfg.str(act_key, default_act),
            rms_norm_eps=cfg.float("rms_norm_eps", 1e-6),
            max_position_embeddings=max_positions,
            rope=RopeConfig.from_config(data, max_positions),
            pad_token_id=pad,
            tie_word_embeddings=cfg.bool("tie_word_embeddings", default_tie),
            # transformers' switch (`is_causal: false`) or Gemma's (`use_bidirectional_attention`).
            is_causal=cfg.bool("is_causal", True)
            and not cfg.bool("use_bidirectional_attention", False),
            **fields,
        )
        if not config.sliding_windows:
            config.sliding_windows = (None,) * config.num_hidden_layers
        if len(config.sliding_windows) != config.num_hidden_layers:
            raise CheckpointError(
                f"config.json: layer_types has {len(config.sliding_windows)} entries for "
                f"{config.num_hidden_layers} layers"
            )
        return config


def layer_windows(
    data: dict[str, Any], num_layers: int, window: int | None, default_types: list[str]
) -> tuple[int | None, ...]:
    """Per-layer windows from `layer_types` (or the family's default pattern)."""
    types = data.get("layer_types") or default_types
    if not isinstance(types, list) or any(
        t not in (FULL_ATTENTION, SLIDING_ATTENTION) for t in types
    ):
        raise CheckpointError(
            f"config.json: layer_types must list {FULL_ATTENTION!r} or {SLIDING_ATTENTION!r} "
            f"per layer, got {types!r}"
        )
    if len(types) != num_layers:
        raise CheckpointError(
            f"config.json: layer_types has {len(types)} entries for {num_layers} layers"
        )
    return tuple(window if t == SLIDING_ATTENTION else None for t in types)


class DecoderAttention(nn.Module):
    """Grouped-query attention with RoPE; fused q/k/v projection."""

    def __init__(
        self, config: DecoderConfig, reader: WeightReader, prefix: str, layer: int
    ) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = d
        self.q_size = self.num_heads * d
        self.kv_size = self.num_kv_heads * d
        self.qkv = take_fused_linear(
            reader,
            [f"{prefix}.q_proj", f"{prefix}.k_proj", f"{prefix}.v_proj"],
            [self.q_size, self.kv_size, self.kv_size],
            h,
            config.qkv_bias,
        )
        self.o_proj = take_linear(reader, f"{prefix}.o_proj", h, self.q_size, config.o_bias)
        self.causal = config.is_causal
        self.sliding_window = config.sliding_windows[layer]
        self.scale = config.attention_scale if config.attention_scale else d**-0.5
        self.softcap = config.attn_logit_softcapping

    def qk_norms(self) -> tuple[torch.Tensor | None, torch.Tensor | None, float]:
        """Per-head RMSNorm weights applied to q and k before RoPE (Qwen3 has them)."""
        return None, None, 0.0

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q `[T, Hq, D]`, k and v `[T, Hkv, D]` before RoPE."""
        tokens = x.shape[0]
        q, k, v = self.qkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return (
            q.view(tokens, self.num_heads, self.head_dim),
            k.view(tokens, self.num_kv_heads, self.head_dim),
            v.view(tokens, self.num_kv_heads, self.head_dim),
        )

    def forward(self, x: torch.Tensor, rope: RopeAngles, meta: AttentionMetadata) -> torch.Tensor:
        return self.o_proj(self.attend(x, rope, meta))

    def attend(self, x: torch.Tensor, rope: RopeAngles, meta: AttentionMetadata) -> torch.Tensor:
        """The attention's output `[T, Hq * D]`, before the output projection."""
        q, k, v = self.project(x)
        q, k = apply_rotary_qk(q, k, rope, *self.qk_norms())
        out = varlen_attention(
            q,
            k,
            v,
            meta,
            causal=self.causal,
            sliding_window=self.sliding_window,
            scale=self.scale,
            softcap=self.softcap,
        )
        return out.reshape(x.shape[0], self.q_size)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up fused into one GEMM."""

    def __init__(self, config: DecoderConfig, reader: WeightReader, prefix: str) -> None:
        super().__init__()
        h, ffn = config.hidden_size, config.intermediate_size
        self.ffn = ffn
        self.gate_up = take_fused_linear(
            reader, [f"{prefix}.gate_proj", f"{prefix}.up_proj"], [ffn, ffn], h, config.mlp_bias
        )
        self.down = take_linear(reader, f"{prefix}.down_proj", h, ffn, config.mlp_bias)
        self.activation = gated_activation_name(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.hidden(x))

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """`act(gate(x)) * up(x)`, the down projection's input."""
        return gated_hidden(x, self.gate_up, self.activation)


class DecoderLayer(nn.Module):
    attention_cls: ClassVar[type[DecoderAttention]] = DecoderAttention
    norm_cls: ClassVar[type[RMSNorm]] = RMSNorm

    def __init__(self, config: DecoderConfig, reader: WeightReader, index: int) -> None:
        super().__init__()
        p = f"layers.{index}"
        self.input_layernorm = self.norm(reader, f"{p}.input_layernorm", config)
        self.self_attn = self.attention_cls(config, reader, f"{p}.self_attn", index)
        self.post_attention_layernorm = self.norm(reader, f"{p}.post_attention_layernorm", config)
        self.mlp = GatedMLP(config, reader, f"{p}.mlp")

    def norm(self, reader: WeightReader, name: str, config: DecoderConfig) -> RMSNorm:
        weight = reader.take(f"{name}.weight", (config.hidden_size,))
        return self.norm_cls(weight, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor | None,
        residual: torch.Tensor | None,
        rope: RopeAngles,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Pre-norm block on the residual stream: takes and returns (pending, stream). Each
        norm adds what is pending into the stream in its own pass; the output projections
        add their products into the stream themselves where they can (`add_to_stream`)."""
        h, residual = self.input_layernorm.add_and_norm(x, residual)
        attn = self.self_attn.attend(h, rope, meta)
        pending, residual = add_to_stream(self.self_attn.o_proj, attn, residual)
        h, residual = self.post_attention_layernorm.add_and_norm(pending, residual)
        return add_to_stream(self.mlp.down, self.mlp.hidden(h), residual)


class DecoderModel(TransformerModel):
    """The decoder without a head: per-token final hidden states (after the last norm)."""

    default_pooling: ClassVar[str] = "last-token"
    prefixes: ClassVar[tuple[str, ...]] = ("", "model.")
    unused: ClassVar[tuple[str, ...]] = (r"rotary_emb\.inv_freq$",)
    uses_token_types: ClassVar[bool] = False
    base_model: ClassVar[str] = "decoder"
    config_cls: ClassVar[type[DecoderConfig]] = DecoderConfig
    layer_cls: ClassVar[type[DecoderLayer]] = DecoderLayer

    def __init__(self, config: DecoderConfig, reader: WeightReader) -> None:
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_position_embeddings
        self.embed_tokens = nn.Parameter(
            reader.take("embed_tokens.weight", (config.vocab_size, config.hidden_size)),
            requires_grad=False,
        )
        self.rotary = RotaryEmbedding(config.rope, config.head_dim)
        self.layers = nn.ModuleList(
            self.layer_cls(config, reader, i) for i in range(config.num_hidden_layers)
        )
        self.norm = self.layer_cls.norm_cls(
            reader.take("norm.weight", (config.hidden_size,)), config.rms_norm_eps
        )

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed_tokens)

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        x: torch.Tensor | None = self.embed(batch.input_ids)
        rope = self.rotary(batch.position_ids)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, rope, meta)
        return self.norm.add_and_norm(x, residual)[0]

    @classmethod
    def load(cls, config: dict[str, Any], reader: WeightReader) -> TransformerModel:
        return cls(cls.config_cls.from_dict(config), reader)

    def classification_head(
        self, config: dict[str, Any], reader: WeightReader, num_labels: int
    ) -> TaskHead:
        return LastTokenScore(reader, self.hidden_size, num_labels, self.config.pad_token_id)

    def token_pair_head(self, reader: WeightReader, token_ids: tuple[int, int]) -> TaskHead:
        config = self.config
        for tid in token_ids:
            if not 0 <= tid < config.vocab_size:
                raise CheckpointError(
                    f"yes/no token id {tid} is outside the model's vocabulary ({config.vocab_size})"
                )
        shape = (config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            reader.take_optional("lm_head.weight", shape)  # a stored copy of the embeddings
            head = self.embed_tokens.detach()
        else:
            head = reader.take("lm_head.weight", shape)
        # Two rows only: the rest of the vocabulary is never scored.
        return TokenPairScore(head[list(token_ids)].clone(), config.final_logit_softcapping)
