"""Tiny random-weight checkpoints made with `transformers`, with a small WordPiece tokenizer.

Each builder writes a folder the runtime loads exactly like a real checkpoint: config.json,
model.safetensors, tokenizer.json and, where asked, the sentence-transformers files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

WORDS = (
    "the a an of to and in is it that for on with as was at by be this are from or have not "
    "query document search engine embedding fast model text sentence long short cat dog "
    "paris france city river water blue green red house tree book read write server"
).split()
LETTERS = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'")


def wordpiece_tokenizer(style: str = "bert") -> tuple[Tokenizer, dict[str, int]]:
    """A WordPiece tokenizer in BERT style ([CLS] x [SEP]) or RoBERTa style (<s> x </s>)."""
    if style == "bert":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        cls_tok, sep_tok, unk = "[CLS]", "[SEP]", "[UNK]"
    else:
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        cls_tok, sep_tok, unk = "<s>", "</s>", "<unk>"
    vocab = {tok: i for i, tok in enumerate(specials)}
    for piece in WORDS + LETTERS + ["##" + c for c in LETTERS]:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    c, s = vocab[cls_tok], vocab[sep_tok]
    if style == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls_tok} $A {sep_tok}",
            pair=f"{cls_tok} $A {sep_tok} $B:1 {sep_tok}:1",
            special_tokens=[(cls_tok, c), (sep_tok, s)],
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls_tok} $A {sep_tok}",
            pair=f"{cls_tok} $A {sep_tok} {sep_tok} $B {sep_tok}",
            special_tokens=[(cls_tok, c), (sep_tok, s)],
        )
    # Like real checkpoints (all-MiniLM-L6-v2), the file carries its own truncation and
    # padding; the runtime must ignore both.
    tok.enable_truncation(max_length=8)
    tok.enable_padding(length=16, pad_id=vocab[specials[0] if style == "bert" else "<pad>"])
    return tok, vocab


def _small(config_cls, **overrides):  # type: ignore[no-untyped-def]
    base = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    base.update(overrides)
    return config_cls(**base)


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
    if architecture.startswith("MPNet"):
        config = _small(
            transformers.MPNetConfig,
            vocab_size=len(vocab),
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            max_position_embeddings=130,
            **config_overrides,
        )
    elif architecture.startswith("DistilBert"):
        fields = dict(
            vocab_size=len(vocab),
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=128,
            dropout=0.0,
            attention_dropout=0.0,
            pad_token_id=0,
        )
        fields.update(config_overrides)
        config = transformers.DistilBertConfig(**fields)
    elif architecture.startswith("DebertaV2"):
        # DeBERTa-v3's layout (microsoft/deberta-v3-*): relative attention only, shared
        # key projections, log buckets (8 here, so the test lengths pass them), normalized
        # relative embeddings; overrides give v2's separate projections and absolute input.
        fields = dict(
            vocab_size=len(vocab),
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
        fields.update(config_overrides)
        config = _small(transformers.DebertaV2Config, **fields)
    elif architecture.startswith("Electra"):
        config = _small(
            transformers.ElectraConfig,
            vocab_size=len(vocab),
            embedding_size=16,  # narrower than hidden_size: the projection is exercised
            pad_token_id=0,
            **config_overrides,
        )
    elif roberta:
        config_cls = (
            transformers.XLMRobertaConfig
            if architecture.startswith("XLM")
            else transformers.RobertaConfig
        )
        config = _small(
            config_cls,
            vocab_size=len(vocab),
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            type_vocab_size=1,
            max_position_embeddings=130,
            **config_overrides,
        )
    else:
        config = _small(
            transformers.BertConfig, vocab_size=len(vocab), pad_token_id=0, **config_overrides
        )
    if architecture.endswith("ForSequenceClassification"):
        config.num_labels = num_labels
        config.id2label = {i: f"label_{i}" for i in range(num_labels)}
        config.label2id = {v: k for k, v in config.id2label.items()}
        config.problem_type = problem_type
    model = getattr(transformers, architecture)(config).eval()
    # Random biases and norms too, so a wrongly loaded tensor cannot hide behind zeros/ones.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
            if "relative_attention_bias" in name:
                # Initialized near zero, it would barely move a score: make it count.
                param.add_(torch.randn_like(param))
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


def write_sentence_transformers_files(
    folder: Path,
    *,
    hidden: int,
    pooling: str | None = None,
    max_seq_length: int | None = None,
    normalize: bool = False,
    dense_out: int | None = None,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    seed: int = 0,
) -> None:
    """modules.json and the files of each module sentence-transformers would write."""
    if pooling is None and max_seq_length is None and not normalize and prompts is None:
        return
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
    ]
    if pooling is not None:
        (folder / "1_Pooling").mkdir(exist_ok=True)
        flags = {
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_lasttoken": pooling == "lasttoken",
        }
        (folder / "1_Pooling" / "config.json").write_text(
            json.dumps({"word_embedding_dimension": hidden, **flags})
        )
        modules.append(
            {
                "idx": 1,
                "name": "1",
                "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling",
            }
        )
    if dense_out is not None:
        from safetensors.torch import save_file

        gen = torch.Generator().manual_seed(seed + 1)
        dense_dir = folder / "2_Dense"
        dense_dir.mkdir(exist_ok=True)
        (dense_dir / "config.json").write_text(
            json.dumps(
                {
                    "in_features": hidden,
                    "out_features": dense_out,
                    "bias": True,
                    "activation_function": "torch.nn.modules.activation.Tanh",
                }
            )
        )
        save_file(
            {
                "linear.weight": torch.randn(dense_out, hidden, generator=gen) * 0.2,
                "linear.bias": torch.randn(dense_out, generator=gen) * 0.1,
            },
            str(dense_dir / "model.safetensors"),
        )
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
        )
    if normalize:
        modules.append(
            {
                "idx": 3,
                "name": "3",
                "path": "3_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (folder / "modules.json").write_text(json.dumps(modules))
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
        )
    if prompts is not None:
        (folder / "config_sentence_transformers.json").write_text(
            json.dumps({"prompts": prompts, "default_prompt_name": default_prompt_name})
        )


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
    modules = [
        {
            "idx": 0,
            "name": "0",
            "path": "",
            "type": "sentence_transformers.sparse_encoder.models.MLMTransformer",
        },
        {
            "idx": 1,
            "name": "1",
            "path": "1_SpladePooling",
            "type": "sentence_transformers.sparse_encoder.models.SpladePooling",
        },
    ]
    (folder / "1_SpladePooling").mkdir(exist_ok=True)
    (folder / "1_SpladePooling" / "config.json").write_text(
        json.dumps(
            {
                "pooling_strategy": pooling_strategy,
                "activation_function": activation_function,
                "word_embedding_dimension": None,
            }
        )
    )
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"model_type": "SparseEncoder", "similarity_fn_name": "dot"})
    )
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
        )
    return folder
