"""The model shapes of docs/performance.md, as `transformers` configs with random weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

# bf16 tokens/s physical limits on an H200 (docs/performance.md): 2 x non-embedding params
# FLOP per token.
BF16_LIMIT_TOKENS_PER_S = {
    "bert-large": 1.31e6,
    "qwen3-0.6b": 0.90e6,
    "qwen3-8b": 57e3,
    "minilm": None,
}


def make_config(name: str):  # type: ignore[no-untyped-def]
    import transformers

    if name == "bert-large":
        return transformers.BertConfig(
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            vocab_size=30522,
            architectures=["BertModel"],
        )
    if name == "minilm":
        return transformers.BertConfig(
            hidden_size=384,
            num_hidden_layers=6,
            num_attention_heads=12,
            intermediate_size=1536,
            vocab_size=30522,
            architectures=["BertModel"],
        )
    if name == "qwen3-0.6b":
        return transformers.Qwen3Config(
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
            vocab_size=151669,
            architectures=["Qwen3Model"],
        )
    if name == "qwen3-8b":
        return transformers.Qwen3Config(
            hidden_size=4096,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=12288,
            vocab_size=151669,
            architectures=["Qwen3Model"],
        )
    family = FAMILY_SHAPES.get(name)
    if family is not None:
        config_class, architecture, fields = family
        return getattr(transformers, config_class)(architectures=[architecture], **fields)
    known = ", ".join(["bert-large", "minilm", "qwen3-0.6b", "qwen3-8b", *FAMILY_SHAPES])
    raise SystemExit(f"unknown shape {name!r}; known: {known}")


# The base sizes of the families beside BERT and the decoders, as their hub models ship
# them (config class, architecture, fields over the class defaults).
FAMILY_SHAPES: dict[str, tuple[str, str, dict[str, object]]] = {
    # sentence-transformers/all-mpnet-base-v2
    "mpnet-base": ("MPNetConfig", "MPNetModel", {"max_position_embeddings": 514}),
    # distilbert-base-uncased (msmarco-distilbert-base-v4 and the DistilBERT cross-encoders)
    "distilbert-base": ("DistilBertConfig", "DistilBertModel", {}),
    # microsoft/deberta-v3-base
    "deberta-v3-base": (
        "DebertaV2Config",
        "DebertaV2Model",
        {
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "vocab_size": 128100,
            "relative_attention": True,
            "position_buckets": 256,
            "max_relative_positions": -1,
            "pos_att_type": ["p2c", "c2p"],
            "norm_rel_ebd": "layer_norm",
            "share_att_key": True,
            "position_biased_input": False,
            "type_vocab_size": 0,
        },
    ),
    # cross-encoder/ms-marco-electra-base's encoder
    "electra-base": (
        "ElectraConfig",
        "ElectraModel",
        {
            "embedding_size": 768,
            "hidden_size": 768,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
        },
    ),
    # Alibaba-NLP/gte-modernbert-base
    "modernbert-base": ("ModernBertConfig", "ModernBertModel", {"vocab_size": 50368}),
    # nomic-ai/nomic-embed-text-v1.5
    "nomic-embed": ("NomicBertConfig", "NomicBertModel", {"vocab_size": 30528}),
    # jinaai/jina-embeddings-v3 (XLM-RoBERTa large with rotary and LoRA adapters)
    "jina-v3": ("JinaEmbeddingsV3Config", "JinaEmbeddingsV3Model", {}),
    # google/embeddinggemma-300m
    "embeddinggemma": (
        "Gemma3TextConfig",
        "Gemma3TextModel",
        {
            "hidden_size": 768,
            "num_hidden_layers": 24,
            "num_attention_heads": 3,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "intermediate_size": 1152,
            "vocab_size": 262144,
            "sliding_window": 512,
            "use_bidirectional_attention": True,
            "max_position_embeddings": 2048,
        },
    ),
}


def write_random_checkpoint(name: str, folder: Path) -> Path:
    """A random-weight checkpoint of shape `name` saved in bfloat16 (weights only, no tokenizer)."""
    import transformers

    config = make_config(name)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModel.from_config(config, dtype=torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    return folder


def with_tokenizer(folder: Path, tokenizer_dir: Path) -> Path:
    """Copies a real tokenizer (e.g. all-MiniLM-L6-v2's) into a random checkpoint."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, folder / name)
    return folder
