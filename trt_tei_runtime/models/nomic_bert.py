"""NomicBERT (nomic-ai/nomic-embed-text-v1.5), and the rotary post-norm encoder it shares
with jina-embeddings-v3 (`jina_v3.py`), as transformers writes both.

BERT's post-norm layout without position embeddings: word + token-type embeddings and a
LayerNorm, then per layer rotary (rotate-half) self-attention over all tokens of the
sequence → residual → LayerNorm, MLP → residual → LayerNorm. NomicBERT's MLP is gated
(SwiGLU: `down(silu(gate(x)) * up(x))`, no biases anywhere); Jina's is BERT's
`fc2(gelu(fc1(x)))` with biases. Query, key and value run as one GEMM, as do gate and up.
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
    Linear,
    RopeAngles,
    RopeConfig,
    RotaryEmbedding,
    add_to_stream,
    apply_rotary_qk,
    gated_activation_name,
    gated_hidden,
    get_activation,
    linear_activation,
    varlen_attention,
)
from ..weights import WeightReader
from .base import Task, TransformerModel
from .config import ConfigReader
from .linears import take_fused_linear, take_linear


@dataclass
class RotaryEncoderConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int
    rope: RopeConfig
    bias: bool  # on every projection (Jina) or none (Nomic)
    gated_mlp: bool

    @classmethod
    def parse(
        cls,
        data: dict[str, Any],
        *,
        default_theta: float,
        bias: bool,
        gated_mlp: bool,
        **defaults: Any,
    ) -> RotaryEncoderConfig:
        cfg = ConfigReader(data)
        hidden = cfg.int("hidden_size", defaults.get("hidden_size"))
        heads = cfg.int("num_attention_heads", defaults.get("num_attention_heads"))
        head_dim = data.get("head_dim")
        if head_dim is None:
            if hidden % heads:
                raise CheckpointError(
                    f"config.json: hidden_size {hidden} is not a multiple of "
                    f"num_attention_heads {heads}"
                )
            head_dim = hidden // heads
        else:
            head_dim = cfg.int("head_dim")
        max_positions = cfg.int("max_position_embeddings", defaults.get("max_position_embeddings"))
        # transformers fills a missing theta with the family's own default, not 10000.
        rope_data = dict(data)
        params = rope_data.get("rope_parameters") or rope_data.get("rope_scaling")
        if "rope_theta" not in rope_data and not (
            isinstance(params, dict) and "rope_theta" in params
        ):
            rope_data["rope_theta"] = default_theta
        return cls(
            vocab_size=cfg.int("vocab_size"),
            hidden_size=hidden,
            num_hidden_layers=cfg.int("num_hidden_layers", defaults.get("num_hidden_layers")),
            num_attention_heads=heads,
            head_dim=head_dim,
            intermediate_size=cfg.int("intermediate_size", defaults.get("intermediate_size")),
            hidden_act=cfg.str("hidden_act", defaults.get("hidden_act")),
            layer_norm_eps=cfg.float("layer_norm_eps", defaults.get("layer_norm_eps")),
            max_position_embeddings=max_positions,
            type_vocab_size=cfg.int("type_vocab_size", defaults.get("type_vocab_size")),
            rope=RopeConfig.from_config(rope_data, max_positions),
            bias=bias,
            gated_mlp=gated_mlp,
        )


def _pick(reader: WeightReader, *names: str) -> str:
    """The first of `names` the checkpoint has: transformers saves these families under
    their original names (`encoder.layers.0.attn.Wqkv`), and loads them renamed
    (`layers.0.self_attn.q_proj`); both are read."""
    for name in names:
        if reader.has(f"{name}.weight"):
            return name
    return names[0]


def _norm(reader: WeightReader, name: str, size: int, eps: float) -> LayerNorm:
    return LayerNorm(
        reader.take(f"{name}.weight", (size,)), reader.take(f"{name}.bias", (size,)), eps
    )


class RotaryEncoderLayer(nn.Module):
    # The original checkpoints' name of the attention block ("attn" Nomic, "mixer" Jina).
    attention_name: ClassVar[str] = "attn"

    def __init__(self, config: RotaryEncoderConfig, reader: WeightReader, index: int) -> None:
        super().__init__()
        old, new = f"encoder.layers.{index}", f"layers.{index}"
        h, d, ffn = config.hidden_size, config.head_dim, config.intermediate_size
        self.num_heads = config.num_attention_heads
        self.head_dim = d
        inner = self.num_heads * d
        wqkv = f"{old}.{self.attention_name}.Wqkv"
        if reader.has(f"{wqkv}.weight"):  # already fused, rows [q; k; v]
            self.qkv: nn.Module = take_linear(reader, wqkv, 3 * inner, h, config.bias)
        else:
            self.qkv = take_fused_linear(
                reader, [f"{new}.self_attn.{n}_proj" for n in "qkv"], [inner] * 3, h, config.bias
            )
        out = _pick(reader, f"{old}.{self.attention_name}.out_proj", f"{new}.self_attn.o_proj")
        self.o_proj: nn.Module = take_linear(reader, out, h, inner, config.bias)
        norm1 = _pick(reader, f"{old}.norm1", f"{new}.post_attention_layernorm")
        self.attn_norm = _norm(reader, norm1, h, config.layer_norm_eps)
        self.gated = config.gated_mlp
        if self.gated:
            # Nomic's fc11 is transformers' up_proj, fc12 its gate_proj.
            gate = _pick(reader, f"{old}.mlp.fc12", f"{new}.mlp.gate_proj")
            up = _pick(reader, f"{old}.mlp.fc11", f"{new}.mlp.up_proj")
            self.up: nn.Module = take_fused_linear(reader, [gate, up], [ffn, ffn], h, config.bias)
            down = _pick(reader, f"{old}.mlp.fc2", f"{new}.mlp.down_proj")
            self.gated_name = gated_activation_name(config.hidden_act)
        else:
            fc1 = _pick(reader, f"{old}.mlp.fc1", f"{new}.mlp.fc1")
            self.up = take_linear(reader, fc1, ffn, h, config.bias)
            down = _pick(reader, f"{old}.mlp.fc2", f"{new}.mlp.fc2")
        self.down: nn.Module = take_linear(reader, down, h, ffn, config.bias)
        self._name_lora_parts(new, h, inner, ffn)
        self.act_name = config.hidden_act
        self.act = get_activation(config.hidden_act)
        norm2 = _pick(reader, f"{old}.norm2", f"{new}.post_mlp_layernorm")
        self.mlp_norm = _norm(reader, norm2, h, config.layer_norm_eps)
        self.scale = 1.0 / math.sqrt(d)

    def _name_lora_parts(self, new: str, h: int, inner: int, ffn: int) -> None:
        """transformers loads the original checkpoints (`encoder.layers.{i}.mixer.Wqkv`, ...)
        into modules of its own names (`layers.{i}.self_attn.q_proj`, ...), and PEFT
        adapters name those: the linears' parts take them, whichever layout was read."""
        attn, mlp = f"{new}.self_attn", f"{new}.mlp"
        names: list[tuple[nn.Module, tuple[tuple[str, int], ...]]] = [
            (self.qkv, tuple((f"{attn}.{n}_proj", inner) for n in "qkv")),
            (self.o_proj, ((f"{attn}.o_proj", h),)),
        ]
        if self.gated:
            names.append((self.up, ((f"{mlp}.gate_proj", ffn), (f"{mlp}.up_proj", ffn))))
            names.append((self.down, ((f"{mlp}.down_proj", h),)))
        else:
            names.append((self.up, ((f"{mlp}.fc1", ffn),)))
            names.append((self.down, ((f"{mlp}.fc2", h),)))
        for linear, parts in names:
            assert isinstance(linear, Linear)
            linear.parts = parts

    def forward(self, x: torch.Tensor, rope: RopeAngles, meta: AttentionMetadata) -> torch.Tensor:
        tokens = x.shape[0]
        qkv = self.qkv(x).view(tokens, 3, self.num_heads, self.head_dim)
        q, k = apply_rotary_qk(qkv[:, 0], qkv[:, 1], rope)
        attn = varlen_attention(q, k, qkv[:, 2], meta, scale=self.scale)
        # As in BERT: the output projections add into the residual `x`.
        pending, x = add_to_stream(self.o_proj, attn.reshape(tokens, -1), x)
        x = self.attn_norm(x, residual=pending)
        if self.gated:
            hidden = gated_hidden(x, self.up, self.gated_name)
        else:
            hidden = linear_activation(self.up, x, self.act_name, self.act)
        pending, x = add_to_stream(self.down, hidden, x)
        return self.mlp_norm(x, residual=pending)


class RotaryEncoderModel(TransformerModel):
    """The shared encoder: per-token hidden states after the last layer."""

    task: ClassVar[Task] = Task.EMBEDDING
    default_pooling: ClassVar[str] = "mean"
    # Only the first position is a real pooler input; rotary frequencies are recomputed.
    unused: ClassVar[tuple[str, ...]] = (r"(^|\.)pooler\.", r"inv_freq$", r"position_ids$")
    layer_cls: ClassVar[type[RotaryEncoderLayer]] = RotaryEncoderLayer

    def __init__(self, config: RotaryEncoderConfig, reader: WeightReader) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.hidden_size = h
        self.vocab_size = config.vocab_size
        self.type_vocab_size = config.type_vocab_size
        self.max_positions = config.max_position_embeddings
        self.word = nn.Parameter(
            reader.take("embeddings.word_embeddings.weight", (config.vocab_size, h)),
            requires_grad=False,
        )
        self.token_type = nn.Parameter(
            reader.take("embeddings.token_type_embeddings.weight", (config.type_vocab_size, h)),
            requires_grad=False,
        )
        emb_norm = _pick(reader, "emb_ln", "embeddings.LayerNorm")
        self.embed_norm = _norm(reader, emb_norm, h, config.layer_norm_eps)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim)
        self.layers = nn.ModuleList(
            self.layer_cls(config, reader, i) for i in range(config.num_hidden_layers)
        )

    def embed(self, batch: PackedBatch) -> torch.Tensor:
        x = F.embedding(batch.input_ids, self.word)
        return x + F.embedding(batch.token_type_ids, self.token_type)

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        x = self.embed_norm(self.embed(batch))
        rope = self.rotary(batch.position_ids)
        for layer in self.layers:
            x = layer(x, rope, meta)
        return x


class NomicBertModel(RotaryEncoderModel):
    prefixes: ClassVar[tuple[str, ...]] = ("", "nomic_bert.")

    @classmethod
    def load(cls, config: dict[str, Any], reader: WeightReader) -> NomicBertModel:
        # transformers' NomicBertConfig defaults (nomic-embed-text-v1.5's values).
        parsed = RotaryEncoderConfig.parse(
            config,
            default_theta=1000.0,
            bias=False,
            gated_mlp=True,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            hidden_act="silu",
            layer_norm_eps=1e-12,
            max_position_embeddings=2048,
            type_vocab_size=2,
        )
        return cls(parsed, reader)
