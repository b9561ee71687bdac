"""Tiny random-weight encoder checkpoints (BERT, RoBERTa, XLM-R, MPNet, DistilBERT,
DeBERTa-v2, ELECTRA) made with `transformers`, with a small WordPiece tokenizer, and SPLADE
masked LMs saved as sentence-transformers SparseEncoders.

Each builder writes a folder the runtime loads exactly like a real checkpoint: config.json,
model.safetensors, tokenizer.json and, where asked, the sentence-transformers files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from checkpoints.configs import (
    DEBERTA_V3,
    ELECTRA,
    ROBERTA,
    ROBERTA_IDS,
    config,
    encoder_config,
    set_labels,
)
from checkpoints.st_modules import splade_files, write_sentence_transformers_files
from checkpoints.vocab import WORDPIECE_STYLES, WORDS, wordpiece
from checkpoints.weights import perturb

# DistilBERT names its fields its own way (dim, n_layers, ...): the same 2 x 32 shape.
DISTILBERT = dict(
    dim=32,
    n_layers=2,
    n_heads=4,
    hidden_dim=64,
    max_position_embeddings=128,
    dropout=0.0,
    attention_dropout=0.0,
    pad_token_id=0,
)


def wordpiece_tokenizer(style: str = "bert") -> tuple[Tokenizer, dict[str, int]]:
    """A WordPiece tokenizer in BERT style ([CLS] x [SEP]) or RoBERTa style (<s> x </s>)."""
    tok, vocab = wordpiece(style, WORDS)
    # Like real checkpoints (all-MiniLM-L6-v2), the file carries its own truncation and
    # padding; the runtime must ignore both.
    tok.enable_truncation(max_length=8)
    tok.enable_padding(length=16, pad_id=vocab[WORDPIECE_STYLES[style].pad])
    return tok, vocab


def _config(architecture: str, vocab_size: int, overrides: dict[str, Any]) -> Any:
    if architecture.startswith("MPNet"):
        return encoder_config("MPNetConfig", vocab_size, ROBERTA_IDS, overrides)
    if architecture.startswith("DistilBert"):
        return config("DistilBertConfig", {"vocab_size": vocab_size}, DISTILBERT, overrides)
    if architecture.startswith("DebertaV2"):
        # Overrides give v2's separate projections and absolute input.
        return encoder_config("DebertaV2Config", vocab_size, DEBERTA_V3, overrides)
    if architecture.startswith("Electra"):
        # embedding_size narrower than hidden_size: the projection is exercised.
        return encoder_config("ElectraConfig", vocab_size, ELECTRA, overrides)
    if "Roberta" in architecture:
        name = "XLMRobertaConfig" if architecture.startswith("XLM") else "RobertaConfig"
        return encoder_config(name, vocab_size, ROBERTA, overrides)
    return encoder_config("BertConfig", vocab_size, {"pad_token_id": 0}, overrides)


def make_checkpoint(
    folder: Path,
    architecture: str = "BertModel",
    *,
    seed: int = 0,
    num_labels: int = 1,
    problem_type: str | None = None,
    pooling: str | None = None,
    max_seq_length: int | None = None,
    normalize: bool = False,
    dense_out: int | None = None,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    **config_overrides: object,
) -> Path:
    """Saves a random `architecture` checkpoint (plus tokenizer) into `folder`."""
    import transformers

    torch.manual_seed(seed)
    # MPNet's tokenizer is RoBERTa-style (<s> a </s></s> b </s>, <pad> = 1).
    roberta = "Roberta" in architecture or architecture.startswith("MPNet")
    tok, vocab = wordpiece_tokenizer("roberta" if roberta else "bert")
    config = _config(architecture, len(vocab), config_overrides)
    if architecture.endswith("ForSequenceClassification"):
        set_labels(config, num_labels, problem_type)
    model = getattr(transformers, architecture)(config).eval()
    perturb(model)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    write_sentence_transformers_files(
        folder,
        hidden=config.hidden_size if hasattr(config, "hidden_size") else config.dim,
        pooling=pooling,
        max_seq_length=max_seq_length,
        normalize=normalize,
        dense_out=dense_out,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        seed=seed,
    )
    return folder


def make_splade_checkpoint(
    folder: Path,
    architecture: str = "BertForMaskedLM",
    *,
    pooling_strategy: str = "max",
    activation_function: str = "relu",
    seed: int = 0,
    max_seq_length: int | None = None,
    **config_overrides: object,
) -> Path:
    """A tiny random masked-LM checkpoint saved as a sentence-transformers `SparseEncoder`
    folder: the transformer at the root, then a `SpladePooling` module."""
    make_checkpoint(folder, architecture, seed=seed, **config_overrides)
    for path, value in splade_files(pooling_strategy, activation_function).items():
        (folder / path).parent.mkdir(exist_ok=True)
        (folder / path).write_text(json.dumps(value))
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
        )
    return folder
