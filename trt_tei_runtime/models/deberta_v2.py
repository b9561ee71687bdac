"""DeBERTa-v2/v3: BERT's post-norm layer with disentangled attention.

Each layer's attention scores add, to content·content, content→position (c2p: a query
against the relative-position embedding of its distance to each key) and position→content
(p2c: each key against the embedding of its distance to the query), all divided by
sqrt(head_dim * (1 + number of those terms)). The relative embeddings are one table
(`encoder.rel_embeddings`, optionally LayerNorm-ed) shared by the layers and projected per
layer by the layer's own key/query projections (`share_att_key`, v3) or by separate
`pos_key_proj`/`pos_query_proj`. Distances are log-bucketed past `position_buckets / 2`.

The c2p/p2c terms depend on each sequence's q and k, so they are computed on padded
tensors in torch and added as a per-sequence bias (`varlen_attention(bias=...)`, padded
eager attention on every device; no packed kernel has them, so no CUDA graphs either).
Classification: `pooler.dense` + `pooler_hidden_act` + `classifier` on the first token.
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
from ..layers import AttentionMetadata, LayerNorm, Linear, varlen_attention
from ..layers.attention import pad_heads
from ..weights import WeightReader
from .base import TaskHead
from .bert import BertConfig, BertLayer, BertModel, EncoderNames, take_embedding, take_layer_norm
from .config import ConfigReader
from .heads import FirstTokenClassifier
from .linears import take_linear

NAMES = EncoderNames(
    qkv=("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj")
)


@dataclass
class DebertaV2Config(BertConfig):
    position_biased_input: bool = True
    relative_attention: bool = False
    position_buckets: int = -1
    max_relative_positions: int = -1
    c2p: bool = False
    p2c: bool = False
    share_att_key: bool = False
    norm_rel_ebd: bool = False
    pooler_hidden_act: str = "gelu"

    @property
    def att_span(self) -> int:
        """Half the number of relative embeddings a layer reads."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions


def _pos_att_type(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [x.strip() for x in value.lower().split("|") if x.strip()]
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return [x.strip().lower() for x in value]
    raise CheckpointError(f"config.json: pos_att_type must be a string or list, got {value!r}")


def parse_config(data: dict[str, Any]) -> DebertaV2Config:
    cfg = ConfigReader(data)
    if cfg.int("conv_kernel_size", 0) > 0:
        raise CheckpointError(
            "config.json: conv_kernel_size > 0 (DeBERTa-v2's convolution layer) is not supported"
        )
    hidden = cfg.int("hidden_size")
    if cfg.int("pooler_hidden_size", hidden) != hidden:
        raise CheckpointError("config.json: pooler_hidden_size must equal hidden_size")
    att = _pos_att_type(data.get("pos_att_type"))
    unknown = set(att) - {"c2p", "p2c"}
    if unknown:
        raise CheckpointError(f"config.json: pos_att_type {sorted(unknown)} is not supported")
    max_positions = cfg.int("max_position_embeddings", 512)
    max_rel = cfg.int("max_relative_positions", -1)
    norm_rel = data.get("norm_rel_ebd", "none")
    if not isinstance(norm_rel, str):
        raise CheckpointError("config.json: norm_rel_ebd must be a string")
    return DebertaV2Config(
        vocab_size=cfg.int("vocab_size"),
        hidden_size=hidden,
        num_hidden_layers=cfg.int("num_hidden_layers"),
        num_attention_heads=cfg.int("num_attention_heads"),
        intermediate_size=cfg.int("intermediate_size"),
        hidden_act=cfg.str("hidden_act", "gelu"),
        layer_norm_eps=cfg.float("layer_norm_eps", 1e-7),
        max_position_embeddings=max_positions,
        type_vocab_size=cfg.int("type_vocab_size", 0),
        pad_token_id=cfg.int("pad_token_id", 0),
        embedding_size=cfg.int("embedding_size", hidden),
        position_biased_input=cfg.bool("position_biased_input", True),
        relative_attention=cfg.bool("relative_attention", False),
        position_buckets=cfg.int("position_buckets", -1),
        max_relative_positions=max_rel if max_rel >= 1 else max_positions,
        c2p="c2p" in att,
        p2c="p2c" in att,
        share_att_key=cfg.bool("share_att_key", False),
        norm_rel_ebd="layer_norm" in [x.strip() for x in norm_rel.lower().split("|")],
        pooler_hidden_act=cfg.str("pooler_hidden_act", "gelu"),
    ).checked()  # type: ignore[return-value]


def log_bucket_position(
    relative: torch.Tensor, bucket_size: int, max_position: int
) -> torch.Tensor:
    """DeBERTa's buckets: exact distances below `bucket_size / 2`, logarithmic beyond, in the
    same float32 steps as transformers (the ceil makes the boundaries exact-arithmetic)."""
    sign = torch.sign(relative)
    mid = bucket_size // 2
    near = (relative < mid) & (relative > -mid)
    abs_pos = torch.where(near, torch.tensor(mid - 1).type_as(relative), relative.abs())
    log_pos = (
        torch.ceil(
            torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)
        )
        + mid
    )
    return torch.where(abs_pos <= mid, relative.type_as(log_pos), log_pos * sign).long()


def relative_positions(length: int, config: DebertaV2Config, device: torch.device) -> torch.Tensor:
    """`[L, L]`: bucketed (query position - key position)."""
    ids = torch.arange(length, device=device)
    relative = ids[:, None] - ids[None, :]
    if config.position_buckets > 0 and config.max_relative_positions > 0:
        relative = log_bucket_position(
            relative, config.position_buckets, config.max_relative_positions
        )
    return relative


class DebertaV2Embeddings(nn.Module):
    """word (+ absolute position, if `position_biased_input`) (+ token type) embeddings,
    projected (`embed_proj`, no bias) where narrower than the layers, then LayerNorm."""

    position: nn.Parameter | None
    token_type: nn.Parameter | None
    project: Linear | None

    def __init__(self, config: DebertaV2Config, reader: WeightReader) -> None:
        super().__init__()
        h = config.hidden_size
        e = config.embedding_size or h
        self.word = take_embedding(reader, "embeddings.word_embeddings", config.vocab_size, e)
        self.position = None
        if config.position_biased_input:
            self.position = take_embedding(
                reader, "embeddings.position_embeddings", config.max_position_embeddings, e
            )
        self.token_type = None
        if config.type_vocab_size > 0:
            self.token_type = take_embedding(
                reader, "embeddings.token_type_embeddings", config.type_vocab_size, e
            )
        self.project = None
        if e != h:
            self.project = take_linear(reader, "embeddings.embed_proj", h, e, bias=False)
        self.norm = take_layer_norm(reader, "embeddings.LayerNorm", h, config.layer_norm_eps)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = F.embedding(batch.input_ids, self.word)
        if self.position is not None:
            x = x + F.embedding(batch.position_ids, self.position)
        if self.token_type is not None:
            x = x + F.embedding(batch.token_type_ids, self.token_type)
        if self.project is not None:
            x = self.project(x)
        # transformers also multiplies by the attention mask: all ones on packed tokens.
        return self.norm(x)


class DebertaV2Layer(BertLayer):
    """BERT's layer; `attend` adds the disentangled terms. `context` is the (normalized)
    relative-embedding table `[2 * att_span, H]`."""

    def __init__(
        self, config: BertConfig, reader: WeightReader, index: int, names: EncoderNames
    ) -> None:
        super().__init__(config, reader, index, names)
        assert isinstance(config, DebertaV2Config)
        self.config = config
        h = config.hidden_size
        p = f"{names.layer.format(i=index)}.attention.self"
        self.pos_key_proj = self.pos_query_proj = None
        if config.relative_attention and not config.share_att_key:
            if config.c2p:
                self.pos_key_proj = take_linear(reader, f"{p}.pos_key_proj", h, h)
            if config.p2c:
                self.pos_query_proj = take_linear(reader, f"{p}.pos_query_proj", h, h)
        # transformers counts the terms `pos_att_type` names even without relative attention.
        terms = 1 + int(config.c2p) + int(config.p2c)
        self.scale = 1.0 / math.sqrt(self.head_dim * terms)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """`[P, H*D]` → `[H, P, D]`."""
        return x.view(x.shape[0], self.num_heads, self.head_dim).transpose(0, 1)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        context: torch.Tensor | None,
    ) -> torch.Tensor:
        config = self.config
        if context is None:
            return varlen_attention(q, k, v, meta, scale=self.scale)
        span = config.att_span
        h = config.hidden_size
        pos_query: torch.Tensor | None = None
        pos_key: torch.Tensor | None = None
        if config.share_att_key:
            pos = self.qkv(context)
            pos_query, pos_key = self._heads(pos[:, :h]), self._heads(pos[:, h : 2 * h])
        else:
            if self.pos_key_proj is not None:
                pos_key = self._heads(self.pos_key_proj(context))
            if self.pos_query_proj is not None:
                pos_query = self._heads(self.pos_query_proj(context))
        length = meta.max_seqlen
        relative = relative_positions(length, config, q.device)  # [L(query), L(key)]
        n = meta.cu_seqlens.numel() - 1
        bias = q.new_zeros((n, self.num_heads, length, length))
        if config.c2p and pos_key is not None:
            qp = pad_heads(q, meta)  # [n, H, L, D]
            c2p = torch.einsum("nhid,hpd->nhip", qp, pos_key)
            index = torch.clamp(relative + span, 0, 2 * span - 1)
            bias = bias + torch.gather(c2p, -1, index.expand(n, self.num_heads, length, length))
        if config.p2c and pos_query is not None:
            kp = pad_heads(k, meta)
            p2c = torch.einsum("nhjd,hpd->nhjp", kp, pos_query)
            index = torch.clamp(-relative + span, 0, 2 * span - 1)
            p2c = torch.gather(p2c, -1, index.expand(n, self.num_heads, length, length))
            bias = bias + p2c.transpose(-1, -2)
        return varlen_attention(q, k, v, meta, scale=self.scale, bias=bias * self.scale)


class DebertaV2Model(BertModel):
    unused: ClassVar[tuple[str, ...]] = (
        r"position_ids$",
        r"^lm_predictions\.",
        r"^mask_predictions\.",
    )
    prefixes: ClassVar[tuple[str, ...]] = ("", "deberta.")
    names: ClassVar[EncoderNames] = NAMES
    layer_cls: ClassVar[type[BertLayer]] = DebertaV2Layer
    packed_attention: ClassVar[bool] = False
    # DeBERTa-v3 has no token-type embeddings (its pair ids are ignored, as transformers
    # does); with them (`type_vocab_size` > 0) the ids are used, just not range-checked.
    uses_token_types: ClassVar[bool] = False
    lora_unsupported: ClassVar[str | None] = (
        "its relative-position table goes through the same query/key projections as the "
        "tokens, shared by every sequence of a batch, so a per-request adapter cannot apply"
    )
    rel_embeddings: nn.Parameter | None
    rel_norm: LayerNorm | None

    def __init__(self, config: BertConfig, reader: WeightReader) -> None:
        super().__init__(config, reader)
        assert isinstance(config, DebertaV2Config)
        self.rel_embeddings = None
        self.rel_norm = None
        if config.relative_attention:
            self.rel_embeddings = take_embedding(
                reader, "encoder.rel_embeddings", 2 * config.att_span, config.hidden_size
            )
        if config.norm_rel_ebd:  # transformers builds it with or without relative attention
            self.rel_norm = take_layer_norm(
                reader, "encoder.LayerNorm", config.hidden_size, config.layer_norm_eps
            )

    def build_embeddings(self, config: BertConfig, reader: WeightReader) -> nn.Module:
        assert isinstance(config, DebertaV2Config)
        return DebertaV2Embeddings(config, reader)

    @classmethod
    def parse_config(cls, data: dict[str, Any]) -> BertConfig:
        return parse_config(data)

    def attention_context(self, meta: AttentionMetadata) -> torch.Tensor | None:
        if self.rel_embeddings is None:
            return None
        table = self.rel_embeddings
        return table if self.rel_norm is None else self.rel_norm(table)

    def classification_head(
        self, config: dict[str, Any], reader: WeightReader, num_labels: int
    ) -> TaskHead:
        assert isinstance(self.config, DebertaV2Config)
        return FirstTokenClassifier(
            reader,
            dense="pooler.dense",
            out="classifier",
            hidden_size=self.hidden_size,
            num_labels=num_labels,
            activation=self.config.pooler_hidden_act,
        )
