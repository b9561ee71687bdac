"""ELECTRA (discriminators: ms-marco cross-encoders): BERT's encoder with embeddings of
their own width (`embedding_size`) projected up to the layers', and, for classification,
`classifier.dense` + GELU + `classifier.out_proj` on the first token."""

from __future__ import annotations

from typing import Any, ClassVar

from ..weights import WeightReader
from .base import TaskHead
from .bert import BertConfig, BertModel
from .config import ConfigReader
from .heads import FirstTokenClassifier


class ElectraModel(BertModel):
    unused: ClassVar[tuple[str, ...]] = (
        r"position_ids$",
        r"token_type_ids$",
        r"^discriminator_predictions\.",
        r"^generator_(predictions|lm_head)\.",
    )
    prefixes: ClassVar[tuple[str, ...]] = ("", "electra.")

    @classmethod
    def parse_config(cls, data: dict[str, Any]) -> BertConfig:
        config = BertConfig.from_dict(data)
        config.embedding_size = ConfigReader(data).int("embedding_size", 128)
        return config

    def classification_head(
        self, config: dict[str, Any], reader: WeightReader, num_labels: int
    ) -> TaskHead:
        return FirstTokenClassifier(
            reader,
            dense="classifier.dense",
            out="classifier.out_proj",
            hidden_size=self.hidden_size,
            num_labels=num_labels,
            activation="gelu",  # ElectraClassificationHead's, whatever `hidden_act` says
        )
