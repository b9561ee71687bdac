"""MPNet: BERT's post-norm encoder without token types, positions numbered from 2 (its
padding index is fixed at 1) and, in every layer, an additive attention bias from
T5-style relative position buckets (one learned value per bucket and head, shared by the
layers). The packed kernels take no bias, so MPNet runs padded attention
(`varlen_attention(bias=...)`). Classification: `classifier.dense` + tanh +
`classifier.out_proj` on the first token."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import CheckpointError
from ..layers import AttentionMetadata
from ..weights import WeightReader
from .base import TaskHead
from .bert import BertConfig, BertModel, EncoderNames
from .config import ConfigReader
from .heads import FirstTokenClassifier

# transformers' MPNetEncoder.compute_position_bias uses these whatever the config says
# (`relative_attention_num_buckets` only sizes the table).
NUM_BUCKETS = 32
MAX_DISTANCE = 128
PADDING_IDX = 1  # MPNetEmbeddings' padding_idx, hard-coded there


@dataclass
class MPNetConfig(BertConfig):
    relative_attention_num_buckets: int = NUM_BUCKETS


def relative_position_buckets(length: int, device: torch.device) -> torch.Tensor:
    """`[L, L]` bucket of (query i, key j): bidirectional T5 buckets of j - i, exact below
    8 positions, logarithmic up to `MAX_DISTANCE`."""
    pos = torch.arange(length, device=device)
    n = -(pos[None, :] - pos[:, None])  # i - j
    half = NUM_BUCKETS // 2
    bucket = (n < 0).long() * half
    n = n.abs()
    max_exact = half // 2
    large = (
        max_exact
        + (
            torch.log(n.float() / max_exact)
            / math.log(MAX_DISTANCE / max_exact)
            * (half - max_exact)
        ).long()
    )
    large = large.clamp(max=half - 1)
    return bucket + torch.where(n < max_exact, n, large)


class MPNetModel(BertModel):
    unused: ClassVar[tuple[str, ...]] = (r"(^|\.)pooler\.", r"position_ids$", r"^lm_head\.")
    prefixes: ClassVar[tuple[str, ...]] = ("", "mpnet.")
    uses_token_types: ClassVar[bool] = False
    packed_attention: ClassVar[bool] = False
    names: ClassVar[EncoderNames] = EncoderNames(
        qkv=("attention.attn.q", "attention.attn.k", "attention.attn.v"),
        attn_out="attention.attn.o",
        attn_norm="attention.LayerNorm",
    )

    def __init__(self, config: BertConfig, reader: WeightReader) -> None:
        super().__init__(config, reader)
        assert isinstance(config, MPNetConfig)
        shape = (config.relative_attention_num_buckets, config.num_attention_heads)
        self.relative_attention_bias = nn.Parameter(
            reader.take("encoder.relative_attention_bias.weight", shape), requires_grad=False
        )

    @staticmethod
    def _position_offset(config: BertConfig) -> int:
        return PADDING_IDX + 1

    @classmethod
    def parse_config(cls, data: dict[str, Any]) -> BertConfig:
        base = BertConfig.from_dict(data)
        buckets = ConfigReader(data).int("relative_attention_num_buckets", 32)
        if buckets < NUM_BUCKETS:
            raise CheckpointError(
                f"config.json: relative_attention_num_buckets {buckets} is below the "
                f"{NUM_BUCKETS} buckets MPNet's attention indexes"
            )
        fields = {**vars(base), "type_vocab_size": 0}
        return MPNetConfig(**fields, relative_attention_num_buckets=buckets)

    def attention_context(self, meta: AttentionMetadata) -> torch.Tensor:
        buckets = relative_position_buckets(meta.max_seqlen, self.relative_attention_bias.device)
        return self.relative_attention_bias[buckets].permute(2, 0, 1)

    def classification_head(
        self, config: dict[str, Any], reader: WeightReader, num_labels: int
    ) -> TaskHead:
        return FirstTokenClassifier(
            reader,
            dense="classifier.dense",
            out="classifier.out_proj",
            hidden_size=self.hidden_size,
            num_labels=num_labels,
            activation="tanh",
        )
