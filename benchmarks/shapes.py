"""The model shapes of BENCHMARKS.md, as `transformers` configs with random weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

# bf16 tokens/s physical limits on an H200 (BENCHMARKS.md): 2 x non-embedding params FLOP/token.
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
    raise SystemExit(f"unknown shape {name!r}; known: bert-large, minilm, qwen3-0.6b, qwen3-8b")


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
