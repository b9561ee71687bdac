"""The config builders of the tiny checkpoints, shared by the tests' factories and the
snapshot generator (tests/snapshots/): a config is a stack of field layers, later layers
winning, so each factory only states what it does differently.

The layers here are the ones both sides use; the values one side alone uses (the tests'
wider decoders, the snapshots' narrower sliding windows) stay with that side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def config(config_class: str, *layers: Mapping[str, Any]) -> Any:
    """`transformers.<config_class>` made of the layers' fields, later layers winning."""
    import transformers

    fields: dict[str, Any] = {}
    for layer in layers:
        fields.update(layer)
    return getattr(transformers, config_class)(**fields)


def rope(theta: float) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": theta}


# --- encoders ---------------------------------------------------------------------------------

# Every tiny encoder's shape: 2 layers, 32 wide, 4 heads.
ENCODER = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=128,
)
# BERT-lineage dropout fields, off.
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# RoBERTa's special ids (<s> = 0, <pad> = 1, </s> = 2), as the "roberta" WordPiece style has
# them; with positions offset past the padding id (MPNet, RoBERTa) and one token type.
ROBERTA_SPECIALS = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)
ROBERTA_IDS = dict(**ROBERTA_SPECIALS, max_position_embeddings=130)
ROBERTA = dict(**ROBERTA_IDS, type_vocab_size=1)
# A factorized embedding (16 wide) projected to the 32-wide encoder.
ELECTRA = dict(pad_token_id=0, embedding_size=16)
# DeBERTa-v3's layout (microsoft/deberta-v3-*): relative attention only, shared key
# projections, log buckets (8 here, so the test lengths pass them), normalized relative
# embeddings, no absolute positions.
DEBERTA_V3 = dict(
    pad_token_id=0,
    type_vocab_size=0,
    relative_attention=True,
    position_buckets=8,
    max_relative_positions=64,
    pos_att_type="p2c|c2p",
    share_att_key=True,
    norm_rel_ebd="layer_norm",
    position_biased_input=False,
    layer_norm_eps=1e-7,
)
# Four layers, every second one global (the local window is each side's own), biases on.
MODERNBERT = dict(
    num_hidden_layers=4,
    global_attn_every_n_layers=2,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=3,
    cls_token_id=2,
    sep_token_id=3,
    norm_bias=True,
    attention_bias=True,
    mlp_bias=True,
)


def encoder_config(config_class: str, vocab_size: int, *layers: Mapping[str, Any]) -> Any:
    """A 2-layer, 32-wide encoder config without dropout, then `layers`."""
    return config(config_class, {"vocab_size": vocab_size}, ENCODER, NO_DROPOUT, *layers)


# --- decoders ---------------------------------------------------------------------------------

# Every tiny decoder: grouped-query attention (4 heads, 2 KV heads), padding with the
# end-of-text id 0, no BOS, untied embeddings. The width is each side's own.
DECODER = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=0,
    tie_word_embeddings=False,
)
# Each decoder family's config class and what sets it apart.
DECODER_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "Llama": ("LlamaConfig", dict(attention_bias=True, mlp_bias=True)),
    "Mistral": ("MistralConfig", dict(sliding_window=None)),
    "Qwen2": ("Qwen2Config", {}),
    "Qwen3": ("Qwen3Config", {}),
    "Gemma2": (
        "Gemma2Config",
        dict(
            num_hidden_layers=3,
            sliding_window=8,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=1.5,
            final_logit_softcapping=2.0,
            tie_word_embeddings=True,
        ),
    ),
}
# Gemma3 (EmbeddingGemma's base): heads wider than hidden_size / heads, a query scale of its
# own, fast rotary frequencies on the sliding layers.
GEMMA3 = dict(
    head_dim=16,
    query_pre_attn_scalar=24,
    rope_parameters={"full_attention": rope(5000.0), "sliding_attention": rope(100.0)},
)


def family_of(architecture: str) -> str:
    """The decoder family (a DECODER_FAMILIES key) `architecture` belongs to."""
    for family in sorted(DECODER_FAMILIES, key=len, reverse=True):
        if architecture.startswith(family):
            return family
    raise ValueError(architecture)


def decoder_config(architecture: str, vocab_size: int, *layers: Mapping[str, Any]) -> Any:
    """The config of `architecture`'s decoder family (DECODER, the family's fields), then
    `layers`."""
    config_class, family = DECODER_FAMILIES[family_of(architecture)]
    return config(config_class, {"vocab_size": vocab_size}, DECODER, family, *layers)


# --- heads ------------------------------------------------------------------------------------


def set_labels(config: Any, num_labels: int, problem_type: str | None = None) -> None:
    """A sequence classifier's labels: label_0, label_1, ..."""
    config.num_labels = num_labels
    config.id2label = {i: f"label_{i}" for i in range(num_labels)}
    config.label2id = {v: k for k, v in config.id2label.items()}
    config.problem_type = problem_type
