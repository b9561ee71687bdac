"""BERT: a post-norm encoder over packed tokens with absolute position and token-type
embeddings. `*ForSequenceClassification` reads the pooler (dense + tanh on [CLS]) and a
linear classifier."""

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
    get_activation,
    linear_activation,
    varlen_attention,
)
from ..weights import WeightReader
from .base import TaskHead, TransformerModel
from .config import ConfigReader
from .heads import FirstTokenClassifier
from .linears import take_fused_linear, take_linear


@dataclass
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int
    pad_token_id: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BertConfig:
        cfg = ConfigReader(data)
        kind = data.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise CheckpointError(
                f"config.json: position_embedding_type {kind!r} is not supported (only 'absolute')"
            )
        config = cls(
            vocab_size=cfg.int("vocab_size"),
            hidden_size=cfg.int("hidden_size"),
            num_hidden_layers=cfg.int("num_hidden_layers"),
            num_attention_heads=cfg.int("num_attention_heads"),
            intermediate_size=cfg.int("intermediate_size"),
            hidden_act=cfg.str("hidden_act", "gelu"),
            layer_norm_eps=cfg.float("layer_norm_eps", 1e-12),
            max_position_embeddings=cfg.int("max_position_embeddings", 512),
            type_vocab_size=cfg.int("type_vocab_size", 2),
            pad_token_id=cfg.int("pad_token_id", 0),
        )
        if config.hidden_size % config.num_attention_heads:
            raise CheckpointError(
                f"config.json: hidden_size {config.hidden_size} is not a multiple of "
                f"num_attention_heads {config.num_attention_heads}"
            )
        return config


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig, reader: WeightReader) -> None:
        super().__init__()
        h = config.hidden_size
        self.word = nn.Parameter(
            reader.take("embeddings.word_embeddings.weight", (config.vocab_size, h)),
            requires_grad=False,
        )
        self.position = nn.Parameter(
            reader.take(
                "embeddings.position_embeddings.weight", (config.max_position_embeddings, h)
            ),
            requires_grad=False,
        )
        self.token_type = nn.Parameter(
            reader.take("embeddings.token_type_embeddings.weight", (config.type_vocab_size, h)),
            requires_grad=False,
        )
        self.norm = LayerNorm(
            reader.take("embeddings.LayerNorm.weight", (h,)),
            reader.take("embeddings.LayerNorm.bias", (h,)),
            config.layer_norm_eps,
        )

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = F.embedding(batch.input_ids, self.word)
        x = x + F.embedding(batch.position_ids, self.position)
        x = x + F.embedding(batch.token_type_ids, self.token_type)
        return self.norm(x)


class BertLayer(nn.Module):
    """Post-norm encoder layer with the query/key/value projections fused into one GEMM."""

    def __init__(self, config: BertConfig, reader: WeightReader, index: int) -> None:
        super().__init__()
        h, ffn = config.hidden_size, config.intermediate_size
        p = f"encoder.layer.{index}"
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        self.qkv = take_fused_linear(
            reader, [f"{p}.attention.self.{n}" for n in ("query", "key", "value")], [h] * 3, h
        )
        self.attn_out = take_linear(reader, f"{p}.attention.output.dense", h, h)
        self.attn_norm = LayerNorm(
            reader.take(f"{p}.attention.output.LayerNorm.weight", (h,)),
            reader.take(f"{p}.attention.output.LayerNorm.bias", (h,)),
            config.layer_norm_eps,
        )
        self.up = take_linear(reader, f"{p}.intermediate.dense", ffn, h)
        self.down = take_linear(reader, f"{p}.output.dense", h, ffn)
        self.ffn_norm = LayerNorm(
            reader.take(f"{p}.output.LayerNorm.weight", (h,)),
            reader.take(f"{p}.output.LayerNorm.bias", (h,)),
            config.layer_norm_eps,
        )
        self.act_name = config.hidden_act
        self.act = get_activation(config.hidden_act)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        tokens = x.shape[0]
        qkv = self.qkv(x).view(tokens, 3, self.num_heads, self.head_dim)
        attn = varlen_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], meta, scale=self.scale)
        x = self.attn_norm(self.attn_out(attn.reshape(tokens, -1)), residual=x)
        hidden = linear_activation(self.up, x, self.act_name, self.act)
        return self.ffn_norm(self.down(hidden), residual=x)


class BertModel(TransformerModel):
    default_pooling: ClassVar[str] = "cls"
    # Tensors a BertModel checkpoint may carry that an embedder does not use.
    unused: ClassVar[tuple[str, ...]] = (r"(^|\.)pooler\.", r"position_ids$", r"^cls\.")
    prefixes: ClassVar[tuple[str, ...]] = ("", "bert.")

    def __init__(self, config: BertConfig, reader: WeightReader) -> None:
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.type_vocab_size = config.type_vocab_size
        self.position_offset = self._position_offset(config)
        self.max_positions = config.max_position_embeddings - self.position_offset
        self.embeddings = BertEmbeddings(config, reader)
        self.layers = nn.ModuleList(
            BertLayer(config, reader, i) for i in range(config.num_hidden_layers)
        )

    @staticmethod
    def _position_offset(config: BertConfig) -> int:
        return 0

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        x = self.embeddings(batch)
        for layer in self.layers:
            x = layer(x, meta)
        return x

    @classmethod
    def load(cls, config: dict[str, Any], reader: WeightReader) -> BertModel:
        return cls(BertConfig.from_dict(config), reader)

    def classification_head(
        self, config: dict[str, Any], reader: WeightReader, num_labels: int
    ) -> TaskHead:
        return FirstTokenClassifier(
            reader,
            dense="pooler.dense",
            out="classifier",
            hidden_size=self.hidden_size,
            num_labels=num_labels,
            activation="tanh",
        )
