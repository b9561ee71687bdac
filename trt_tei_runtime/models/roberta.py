"""RoBERTa and XLM-RoBERTa: BERT's encoder with position ids offset past the padding index
and, for classification, a two-layer head on the first token."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..batch import PackedBatch
from ..weights import WeightReader
from .base import ClassifierInfo, ConfigReader, Task
from .bert import BertConfig, BertModel, take_linear


class RobertaModel(BertModel):
    unused: ClassVar[tuple[str, ...]] = (r"(^|\.)pooler\.", r"position_ids$", r"^lm_head\.")
    prefixes: ClassVar[tuple[str, ...]] = ("", "roberta.")

    @staticmethod
    def _position_offset(config: BertConfig) -> int:
        # RoBERTa numbers real tokens from padding_idx + 1 (fairseq's convention).
        return config.pad_token_id + 1


class RobertaForSequenceClassification(RobertaModel):
    task: ClassVar[Task] = Task.CLASSIFICATION
    unused: ClassVar[tuple[str, ...]] = (r"position_ids$",)

    def __init__(self, config: BertConfig, reader: WeightReader, info: ClassifierInfo) -> None:
        super().__init__(config, reader)
        h = config.hidden_size
        self.classifier = info
        self.dense = take_linear(reader, "classifier.dense", h, h)
        self.out_proj = take_linear(reader, "classifier.out_proj", info.num_labels, h)

    def logits(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        first = hidden[batch.cu_seqlens[:-1].long()]
        return self.out_proj(torch.tanh(self.dense(first)))

    @classmethod
    def load(cls, config: dict[str, Any], reader: WeightReader) -> RobertaForSequenceClassification:
        info = ClassifierInfo.from_config(ConfigReader(config))
        return cls(BertConfig.from_dict(config), reader, info)
