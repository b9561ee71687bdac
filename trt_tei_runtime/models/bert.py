"""BERT: a post-norm encoder over packed tokens with absolute position and token-type
embeddings. `*ForSequenceClassification` reads the pooler (dense + tanh on [CLS]) and a
linear classifier; `*ForMaskedLM` (SPLADE encoders) the masked-LM head."""

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
    add_to_stream,
    get_activation,
    linear_activation,
    varlen_attention,
)
from ..weights import WeightReader
from .base import TaskHead, TokenLogitsHead, TransformerModel
from .config import ConfigReader
from .heads import FirstTokenClassifier, MaskedLMHead
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
    type_vocab_size: int  # 0: no token-type embeddings (DistilBERT, MPNet)
    pad_token_id: int
    # Width of the embeddings when it differs from the layers' (ELECTRA's `embedding_size`,
    # projected up by `embeddings_project`).
    embedding_size: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BertConfig:
        cfg = ConfigReader(data)
        kind = data.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise CheckpointError(
                f"config.json: position_embedding_type {kind!r} is not supported (only 'absolute')"
            )
        return cls(
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
        ).checked()

    def checked(self) -> BertConfig:
        if self.hidden_size % self.num_attention_heads:
            raise CheckpointError(
                f"config.json: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        return self


@dataclass(frozen=True)
class EncoderNames:
    """Where a BERT-layout family keeps each tensor (relative to its base-model prefix);
    `{i}` in `layer` is the layer index. The defaults are BERT's."""

    word: str = "embeddings.word_embeddings"
    position: str = "embeddings.position_embeddings"
    token_type: str = "embeddings.token_type_embeddings"
    embed_norm: str = "embeddings.LayerNorm"
    embed_project: str = "embeddings_project"  # only read with `embedding_size`
    layer: str = "encoder.layer.{i}"
    qkv: tuple[str, str, str] = (
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
    )
    attn_out: str = "attention.output.dense"
    attn_norm: str = "attention.output.LayerNorm"
    up: str = "intermediate.dense"
    down: str = "output.dense"
    ffn_norm: str = "output.LayerNorm"


def take_layer_norm(reader: WeightReader, name: str, size: int, eps: float) -> LayerNorm:
    return LayerNorm(
        reader.take(f"{name}.weight", (size,)), reader.take(f"{name}.bias", (size,)), eps
    )


def take_embedding(reader: WeightReader, name: str, rows: int, dim: int) -> nn.Parameter:
    return nn.Parameter(reader.take(f"{name}.weight", (rows, dim)), requires_grad=False)


class BertEmbeddings(nn.Module):
    """word + absolute position (+ token type) embeddings, LayerNorm, and a projection to
    the layers' width where the embeddings are narrower (ELECTRA)."""

    token_type: nn.Parameter | None
    project: Linear | None

    def __init__(self, config: BertConfig, reader: WeightReader, names: EncoderNames) -> None:
        super().__init__()
        h = config.hidden_size
        e = config.embedding_size or h
        self.word = take_embedding(reader, names.word, config.vocab_size, e)
        self.position = take_embedding(reader, names.position, config.max_position_embeddings, e)
        self.token_type = None
        if config.type_vocab_size > 0:
            self.token_type = take_embedding(reader, names.token_type, config.type_vocab_size, e)
        self.norm = take_layer_norm(reader, names.embed_norm, e, config.layer_norm_eps)
        self.project = None
        if e != h:
            self.project = take_linear(reader, names.embed_project, h, e)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = F.embedding(batch.input_ids, self.word)
        x = x + F.embedding(batch.position_ids, self.position)
        if self.token_type is not None:
            x = x + F.embedding(batch.token_type_ids, self.token_type)
        x = self.norm(x)
        return x if self.project is None else self.project(x)


class BertLayer(nn.Module):
    """Post-norm encoder layer with the query/key/value projections fused into one GEMM."""

    def __init__(
        self, config: BertConfig, reader: WeightReader, index: int, names: EncoderNames
    ) -> None:
        super().__init__()
        h, ffn, eps = config.hidden_size, config.intermediate_size, config.layer_norm_eps
        p = names.layer.format(i=index)
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        self.qkv = take_fused_linear(reader, [f"{p}.{n}" for n in names.qkv], [h] * 3, h)
        self.attn_out = take_linear(reader, f"{p}.{names.attn_out}", h, h)
        self.attn_norm = take_layer_norm(reader, f"{p}.{names.attn_norm}", h, eps)
        self.up = take_linear(reader, f"{p}.{names.up}", ffn, h)
        self.down = take_linear(reader, f"{p}.{names.down}", h, ffn)
        self.ffn_norm = take_layer_norm(reader, f"{p}.{names.ffn_norm}", h, eps)
        self.act_name = config.hidden_act
        self.act = get_activation(config.hidden_act)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def forward(
        self, x: torch.Tensor, meta: AttentionMetadata, context: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`context`: per-batch input to `attend`, made once by the model for all layers."""
        tokens = x.shape[0]
        qkv = self.qkv(x).view(tokens, 3, self.num_heads, self.head_dim)
        attn = self.attend(qkv[:, 0], qkv[:, 1], qkv[:, 2], meta, context)
        # The residual `x` is read by nothing else: the output projections add into it.
        pending, x = add_to_stream(self.attn_out, attn.reshape(tokens, -1), x)
        x = self.attn_norm(x, residual=pending)
        hidden = linear_activation(self.up, x, self.act_name, self.act)
        pending, x = add_to_stream(self.down, hidden, x)
        return self.ffn_norm(x, residual=pending)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        context: torch.Tensor | None,
    ) -> torch.Tensor:
        """Attention over the packed q/k/v `[T, H, D]`; `context` is what the model's
        `attention_context` made for this batch (a shared bias, or none)."""
        return varlen_attention(q, k, v, meta, scale=self.scale, bias=context)


class BertModel(TransformerModel):
    default_pooling: ClassVar[str] = "cls"
    # Tensors a BertModel checkpoint may carry that an embedder does not use.
    unused: ClassVar[tuple[str, ...]] = (r"(^|\.)pooler\.", r"position_ids$", r"^cls\.")
    prefixes: ClassVar[tuple[str, ...]] = ("", "bert.")
    names: ClassVar[EncoderNames] = EncoderNames()
    layer_cls: ClassVar[type[BertLayer]] = BertLayer

    def __init__(self, config: BertConfig, reader: WeightReader) -> None:
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.type_vocab_size = max(config.type_vocab_size, 1)
        self.position_offset = self._position_offset(config)
        self.max_positions = config.max_position_embeddings - self.position_offset
        self.embeddings = self.build_embeddings(config, reader)
        self.layers = nn.ModuleList(
            self.layer_cls(config, reader, i, self.names) for i in range(config.num_hidden_layers)
        )

    def build_embeddings(self, config: BertConfig, reader: WeightReader) -> nn.Module:
        """A module from the packed batch to the first layer's input `[T, H]`."""
        return BertEmbeddings(config, reader, self.names)

    @staticmethod
    def _position_offset(config: BertConfig) -> int:
        return 0

    @classmethod
    def parse_config(cls, data: dict[str, Any]) -> BertConfig:
        return BertConfig.from_dict(data)

    def attention_context(self, meta: AttentionMetadata) -> torch.Tensor | None:
        """What every layer's `attend` gets for this batch: MPNet's relative-position bias,
        DeBERTa's relative embeddings; nothing for BERT."""
        return None

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        x = self.embeddings(batch)
        context = self.attention_context(meta)
        for layer in self.layers:
            x = layer(x, meta, context)
        return x

    @classmethod
    def load(cls, config: dict[str, Any], reader: WeightReader) -> BertModel:
        return cls(cls.parse_config(config), reader)

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

    def word_embedding_matrix(self) -> nn.Parameter:
        """The word embedding matrix, which masked-LM decoders are tied to."""
        word = self.embeddings.word
        if not isinstance(word, nn.Parameter):
            raise CheckpointError(f"{type(self).__name__} has no word embedding matrix")
        return word

    def masked_lm_head(self, config: dict[str, Any], reader: WeightReader) -> TokenLogitsHead:
        return MaskedLMHead(
            reader,
            dense="cls.predictions.transform.dense",
            norm="cls.predictions.transform.LayerNorm",
            decoder="cls.predictions.decoder",
            bias="cls.predictions.bias",
            hidden_size=self.hidden_size,
            vocab_size=self.vocab_size,
            activation=self.config.hidden_act,
            eps=self.config.layer_norm_eps,
            word_embeddings=self.word_embedding_matrix(),
        )
