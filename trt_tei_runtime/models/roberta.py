"""RoBERTa and XLM-RoBERTa: BERT's encoder with position ids offset past the padding index
and, for classification, a two-layer head on the first token."""

from __future__ import annotations

from typing import Any, ClassVar

from ..weights import WeightReader
from .base import TaskHead, TokenLogitsHead
from .bert import BertConfig, BertModel
from .heads import FirstTokenClassifier, MaskedLMHead


class RobertaModel(BertModel):
    unused: ClassVar[tuple[str, ...]] = (r"(^|\.)pooler\.", r"position_ids$", r"^lm_head\.")
    prefixes: ClassVar[tuple[str, ...]] = ("", "roberta.")

    @staticmethod
    def _position_offset(config: BertConfig) -> int:
        # RoBERTa numbers real tokens from padding_idx + 1 (fairseq's convention).
        return config.pad_token_id + 1

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

    def masked_lm_head(self, config: dict[str, Any], reader: WeightReader) -> TokenLogitsHead:
        # RoBERTa's LM head applies GELU whatever `hidden_act` says.
        return MaskedLMHead(
            reader,
            dense="lm_head.dense",
            norm="lm_head.layer_norm",
            decoder="lm_head.decoder",
            bias="lm_head.bias",
            hidden_size=self.hidden_size,
            vocab_size=self.vocab_size,
            activation="gelu",
            eps=self.config.layer_norm_eps,
            word_embeddings=self.word_embedding_matrix(),
        )
