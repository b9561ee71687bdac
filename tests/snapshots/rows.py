"""The snapshot suite's checkpoints: one `ROWS` entry per architecture (its config, its
tokenizer style, its sentence-transformers modules) and `build_checkpoint`, which saves the
row's tiny random checkpoint. Tokenizers, config layers, weight draws and module files come
from tests/checkpoints/, shared with the tests' own factories.

Every tensor is drawn from a seed of the row's name, so adding a row changes no other.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from checkpoints.colbert import make_colbert_checkpoint
from checkpoints.configs import (
    DEBERTA_V3,
    DECODER,
    ELECTRA,
    GEMMA3,
    MODERNBERT,
    ROBERTA,
    ROBERTA_IDS,
    ROBERTA_SPECIALS,
    config,
    decoder_config,
    encoder_config,
    rope,
    set_labels,
)
from checkpoints.st_modules import ST, dense_config, module, pooling_config, splade_files
from checkpoints.vision import preprocessor_config, text_tokenizer, tiny_config, tokenizer_config
from checkpoints.vocab import bpe, wordpiece
from checkpoints.weights import redraw_sorted
from safetensors.torch import save_file
from tokenizers import Tokenizer

from snapshots.references import (
    Check,
    colbert_checks,
    contrastive_text_reference,
    sparse_reference,
)

# --- tokenizers -------------------------------------------------------------------------------

# The tests' vocabulary (checkpoints.vocab.WORDS) plus "what" and "capital".
WORDS = (
    "the a an of to and in is it that for on with as was at by be this are from or have not "
    "what query document search engine embedding fast model text sentence long short cat dog "
    "paris france capital city river water blue green red house tree book read write server"
).split()


@dataclass(frozen=True)
class TokenizerStyle:
    build: Callable[[], Tokenizer]
    # tokenizer_config.json: PreTrainedTokenizerFast keeps tokenizer.json's own template
    # (model-specific classes such as LlamaTokenizerFast would rewrite it).
    config: dict[str, Any]


_FAST = {"tokenizer_class": "PreTrainedTokenizerFast"}
TOKENIZERS = {
    "bert": TokenizerStyle(
        lambda: wordpiece("bert", WORDS)[0],
        {
            **_FAST,
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        },
    ),
    "roberta": TokenizerStyle(
        lambda: wordpiece("roberta", WORDS)[0],
        {
            **_FAST,
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "cls_token": "<s>",
            "sep_token": "</s>",
            "mask_token": "<mask>",
            "model_input_names": ["input_ids", "attention_mask"],
        },
    ),
    # Byte-level BPE, for the decoders and the yes/no reranker template.
    "bpe": TokenizerStyle(
        lambda: bpe(320),
        {
            **_FAST,
            "pad_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>",
            "model_input_names": ["input_ids", "attention_mask"],
        },
    ),
    # Text-and-image models: `<end>` last (CLIP's end-of-text token is its largest id);
    # SigLIP's texts end with it, then pads.
    "clip": TokenizerStyle(lambda: text_tokenizer("CLIPModel"), tokenizer_config(16)),
    "siglip": TokenizerStyle(lambda: text_tokenizer("SiglipModel"), tokenizer_config(16)),
}

# --- config factories -------------------------------------------------------------------------


def encoder(config_class: str, **overrides: Any) -> Callable[[int], Any]:
    """A 2-layer, 32-wide encoder config of `transformers.<config_class>`."""
    return lambda vocab_size: encoder_config(config_class, vocab_size, overrides)


# 32 wide, with room for the yes/no reranker's long prompt template (rotary: no parameters).
DECODER_SIZE = dict(hidden_size=32, intermediate_size=48, max_position_embeddings=512)


def decoder(family: str, **overrides: Any) -> Callable[[int], Any]:
    """A 2-layer, 32-wide decoder config of `family` with grouped-query attention."""
    return lambda vocab_size: decoder_config(family, vocab_size, DECODER_SIZE, overrides)


# DistilBERT takes hidden_size & co. by their BERT names too.
DISTILBERT = dict(pad_token_id=0, hidden_dim=64)
# DeBERTa-v3 style with unbounded relative positions (log buckets only).
DEBERTA = {**DEBERTA_V3, "max_relative_positions": -1, "pos_att_type": ["p2c", "c2p"]}
ROPE_100 = rope(100.0)
# Four layers, every second one global, with a local window shorter than the longer inputs.
MODERNBERT_ROW = dict(
    **MODERNBERT,
    local_attention=8,
    rope_parameters={"full_attention": rope(1000.0), "sliding_attention": ROPE_100},
)


def gemma3(vocab_size: int) -> Any:
    return config(
        "Gemma3TextConfig",
        {"vocab_size": vocab_size},
        DECODER,
        DECODER_SIZE,
        GEMMA3,
        dict(
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            use_bidirectional_attention=True,
        ),
    )


DECODERS = {
    "Llama": decoder("Llama", head_dim=8),
    "Mistral": decoder("Mistral", head_dim=8),
    "Qwen2": decoder("Qwen2"),
    # Heads wider than hidden_size / heads, as Qwen3 and Gemma2 checkpoints have them.
    "Qwen3": decoder("Qwen3", head_dim=16),
    "Gemma2": decoder("Gemma2", head_dim=16, sliding_window=4),
}

# --- the table --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One architecture's snapshot: `config(vocab_size)` makes its transformers config."""

    config: Callable[[int], Any]
    tokenizer: str = "bert"
    # Embedding rows: sentence-transformers pooling written to 1_Pooling ("cls", "mean",
    # "lasttoken"); None for classifiers.
    pooling: str | None = None
    num_labels: int = 1
    # What the architecture's own task outputs (see references.Check.kind); default:
    # "embed" with a pooling, else "scores".
    kind: str | None = None
    # sentence_bert_config.json's input limit (the decoders' yes/no prompts are long).
    max_seq_length: int = 128
    # Output sizes of sentence-transformers Dense modules chained after pooling.
    dense: tuple[int, ...] = ()
    # The transformers class to instantiate (default: the architecture name).
    model_class: str | None = None
    # Called on the saved checkpoint folder, for what save_pretrained does not write
    # (adapters, extra modules); must be deterministic too.
    finish: Callable[[Path], None] | None = None
    # Replaces the default reference (sentence-transformers embeddings of TEXTS, or
    # transformers logits of CLASSIFIER_INPUTS) for the row's own task.
    reference: Callable[[Path], torch.Tensor] | None = None
    # Text-and-image models: also a check of image embeddings (references.IMAGES).
    images: bool = False
    # Rows that are a layout rather than an architecture (ColBERT: a BertModel in PyLate's
    # folder): writes the whole checkpoint into the folder, in place of the default build.
    build: Callable[[Path, int], None] | None = None
    # Such a row's checks, in place of the architecture's (references.Check).
    checks: Callable[[], list[Check]] | None = None


def splade_modules(folder: Path, strategy: str, activation: str) -> None:
    """sentence-transformers' SparseEncoder files: the masked LM, then SpladePooling."""
    for path, value in splade_files(strategy, activation).items():
        write_json(folder / path, value)
    write_json(folder / "sentence_bert_config.json", {"max_seq_length": 128})


def splade(strategy: str, activation: str, **kwargs: Any) -> Row:
    """A masked LM whose head's logits are pooled as a sentence-transformers SparseEncoder."""
    return Row(
        kind="sparse",
        finish=lambda folder: splade_modules(folder, strategy, activation),
        reference=sparse_reference,
        **kwargs,
    )


def contrastive(architecture: str, tokenizer: str) -> Row:
    """A text-and-image model: texts by `get_text_features`, images by
    `get_image_features`, its preprocessor_config.json written beside it."""
    return Row(
        lambda vocab_size: tiny_config(architecture, vocab_size),
        tokenizer,
        kind="embed",
        images=True,
        finish=lambda folder: write_json(
            folder / "preprocessor_config.json", preprocessor_config(architecture)
        ),
        reference=contrastive_text_reference,
    )


ROWS: dict[str, Row] = {
    "BertModel": Row(encoder("BertConfig", pad_token_id=0), pooling="mean"),
    "BertForSequenceClassification": Row(encoder("BertConfig", pad_token_id=0)),
    "RobertaModel": Row(encoder("RobertaConfig", **ROBERTA), "roberta", pooling="cls"),
    "XLMRobertaModel": Row(encoder("XLMRobertaConfig", **ROBERTA), "roberta", pooling="mean"),
    "RobertaForSequenceClassification": Row(
        encoder("RobertaConfig", **ROBERTA), "roberta", num_labels=3
    ),
    "XLMRobertaForSequenceClassification": Row(encoder("XLMRobertaConfig", **ROBERTA), "roberta"),
    # SPLADE: the masked-LM head's logits pooled as a sentence-transformers SparseEncoder.
    "BertForMaskedLM": splade("max", "log1p_relu", config=encoder("BertConfig", pad_token_id=0)),
    "RobertaForMaskedLM": splade(
        "sum", "relu", config=encoder("RobertaConfig", **ROBERTA), tokenizer="roberta"
    ),
    "XLMRobertaForMaskedLM": splade(
        "max", "relu", config=encoder("XLMRobertaConfig", **ROBERTA), tokenizer="roberta"
    ),
    "DistilBertForMaskedLM": splade(
        "sum", "log1p_relu", config=encoder("DistilBertConfig", **DISTILBERT)
    ),
    "MPNetModel": Row(encoder("MPNetConfig", **ROBERTA_IDS), "roberta", pooling="mean"),
    "MPNetForSequenceClassification": Row(encoder("MPNetConfig", **ROBERTA_IDS), "roberta"),
    "DistilBertModel": Row(encoder("DistilBertConfig", **DISTILBERT), pooling="mean"),
    "DistilBertForSequenceClassification": Row(encoder("DistilBertConfig", **DISTILBERT)),
    "ElectraModel": Row(encoder("ElectraConfig", **ELECTRA), pooling="cls"),
    "ElectraForSequenceClassification": Row(encoder("ElectraConfig", **ELECTRA)),
    "DebertaV2Model": Row(encoder("DebertaV2Config", **DEBERTA), pooling="mean"),
    "DebertaV2ForSequenceClassification": Row(encoder("DebertaV2Config", **DEBERTA), num_labels=3),
    "ModernBertModel": Row(encoder("ModernBertConfig", **MODERNBERT_ROW), pooling="mean"),
    "ModernBertForSequenceClassification": Row(encoder("ModernBertConfig", **MODERNBERT_ROW)),
    "NomicBertModel": Row(
        encoder("NomicBertConfig", pad_token_id=0, rope_parameters=ROPE_100), pooling="mean"
    ),
    "JinaEmbeddingsV3Model": Row(
        encoder("JinaEmbeddingsV3Config", **ROBERTA_SPECIALS), "roberta", pooling="mean"
    ),
    # EmbeddingGemma: bidirectional, mean pooling, then Dense(h -> 4h) and Dense(4h -> h).
    "Gemma3TextModel": Row(gemma3, "bpe", pooling="mean", dense=(128, 32), max_seq_length=512),
    "Gemma3ForCausalLM": Row(gemma3, "bpe", pooling="lasttoken", max_seq_length=512),
    # Decoders: the base model and the causal LM embed with last-token pooling; one of the
    # classifiers has two labels.
    **{
        f"{family}{suffix}": Row(make, "bpe", pooling="lasttoken", max_seq_length=512)
        for family, make in DECODERS.items()
        for suffix in ("Model", "ForCausalLM")
    },
    **{
        f"{family}ForSequenceClassification": Row(
            make, "bpe", num_labels=2 if family == "Llama" else 1
        )
        for family, make in DECODERS.items()
    },
    "CLIPModel": contrastive("CLIPModel", "clip"),
    "SiglipModel": contrastive("SiglipModel", "siglip"),
    "Siglip2Model": contrastive("Siglip2Model", "siglip"),
    # Late interaction: a BertModel, its Dense projection and prefixes in PyLate's layout.
    "ColBERT": Row(
        lambda vocab_size: None,
        build=lambda folder, seed: make_colbert_checkpoint(folder, seed=seed),
        checks=colbert_checks,
    ),
}

# Rows that are layouts, not architectures of `trt_tei_runtime.models`.
LAYOUT_ROWS = sorted(name for name, row in ROWS.items() if row.build is not None)

# --- building ---------------------------------------------------------------------------------


def seed(name: str) -> int:
    return zlib.crc32(name.encode())


def build_checkpoint(folder: Path, architecture: str, row: Row) -> None:
    """Saves `row`'s tiny random checkpoint of `architecture` into `folder` (which must not
    exist): weights, tokenizer, and the sentence-transformers modules of embedding rows."""
    import transformers

    if row.build is not None:
        row.build(folder, seed(architecture))
        return

    style = TOKENIZERS[row.tokenizer]
    tok = style.build()
    config = row.config(tok.get_vocab_size())
    config.architectures = [architecture]
    if architecture.endswith("ForSequenceClassification"):
        set_labels(config, row.num_labels)
    torch.manual_seed(seed(architecture))
    model = getattr(transformers, row.model_class or architecture)(config).eval()
    redraw_sorted(model)
    folder.mkdir(parents=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", style.config)
    if row.pooling is not None:
        _write_sentence_transformers_files(folder, architecture, config.hidden_size, row)
    if row.finish is not None:
        row.finish(folder)


def _write_sentence_transformers_files(
    folder: Path, architecture: str, hidden: int, row: Row
) -> None:
    modules = [module(0, "", f"{ST}.Transformer"), module(1, "1_Pooling", f"{ST}.Pooling")]
    write_json(folder / "1_Pooling" / "config.json", pooling_config(hidden, row.pooling))
    gen = torch.Generator().manual_seed(seed(architecture + "/dense"))
    width = hidden
    for i, out in enumerate(row.dense, start=2):
        path = f"{i}_Dense"
        write_json(
            folder / path / "config.json",
            dense_config(width, out, bias=False, activation="linear.Identity"),
        )
        weight = torch.randn(out, width, generator=gen) * 0.2
        save_file({"linear.weight": weight}, str(folder / path / "model.safetensors"))
        modules.append(module(i, path, f"{ST}.Dense"))
        width = out
    write_json(folder / "modules.json", modules)
    write_json(folder / "sentence_bert_config.json", {"max_seq_length": row.max_seq_length})


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
