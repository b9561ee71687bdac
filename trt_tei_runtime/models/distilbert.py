"""DistilBERT: BERT's post-norm encoder with DistilBERT's own config keys and tensor names,
no token-type embeddings, and, for classification, `pre_classifier` + ReLU + `classifier` on
the first token; `DistilBertForMaskedLM` (SPLADE encoders) `vocab_transform` + activation +
`vocab_layer_norm` + `vocab_projector`."""

from __future__ import annotations

from typing import Any, ClassVar

from ..weights import WeightReader
from .base import TaskHead, TokenLogitsHead
from .bert import BertConfig, BertModel, EncoderNames
from .config import ConfigReader
from .heads import FirstTokenClassifier, MaskedLMHead


class DistilBertModel(BertModel):
    unused: ClassVar[tuple[str, ...]] = (
        r"position_ids$",
        r"^vocab_(transform|layer_norm|projector)\.",
    )
    prefixes: ClassVar[tuple[str, ...]] = ("", "distilbert.")
    uses_token_types: ClassVar[bool] = False
    names: ClassVar[EncoderNames] = EncoderNames(
        layer="transformer.layer.{i}",
        qkv=("attention.q_lin", "attention.k_lin", "attention.v_lin"),
        attn_out="attention.out_lin",
        attn_norm="sa_layer_norm",
        up="ffn.lin1",
        down="ffn.lin2",
        ffn_norm="output_layer_norm",
    )

    @classmethod
    def parse_config(cls, data: dict[str, Any]) -> BertConfig:
        cfg = ConfigReader(data)
        return BertConfig(
            vocab_size=cfg.int("vocab_size"),
            hidden_size=cfg.int("dim", 768),
            num_hidden_layers=cfg.int("n_layers", 6),
            num_attention_heads=cfg.int("n_heads", 12),
            intermediate_size=cfg.int("hidden_dim", 3072),
            hidden_act=cfg.str("activation", "gelu"),
            layer_norm_eps=1e-12,  # fixed in transformers' DistilBERT, not a config field
            max_position_embeddings=cfg.int("max_position_embeddings", 512),
            type_vocab_size=0,
            pad_token_id=cfg.int("pad_token_id", 0),
        ).checked()

    def classification_head(
        self, config: dict[str, Any], reader: WeightReader, num_labels: int
    ) -> TaskHead:
        return FirstTokenClassifier(
            reader,
            dense="pre_classifier",
            out="classifier",
            hidden_size=self.hidden_size,
            num_labels=num_labels,
            activation="relu",
        )

    def masked_lm_head(self, config: dict[str, Any], reader: WeightReader) -> TokenLogitsHead:
        return MaskedLMHead(
            reader,
            dense="vocab_transform",
            norm="vocab_layer_norm",
            decoder="vocab_projector",
            bias="vocab_projector.bias",
            hidden_size=self.hidden_size,
            vocab_size=self.vocab_size,
            activation=self.config.hidden_act,
            eps=self.config.layer_norm_eps,
            word_embeddings=self.word_embedding_matrix(),
        )
