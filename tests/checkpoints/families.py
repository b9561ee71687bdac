"""Tiny random checkpoints of the issue-15 families (ModernBERT, NomicBERT,
jina-embeddings-v3 with LoRA task adapters, EmbeddingGemma), saved by `transformers` (and
`peft` for the adapters), with every parameter randomized."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from checkpoints.configs import (
    DECODER,
    ENCODER,
    GEMMA3,
    MODERNBERT,
    ROBERTA_SPECIALS,
    config,
    rope,
    set_labels,
)
from checkpoints.decoders import VOCAB_SIZE, bpe_tokenizer_json
from checkpoints.encoders import wordpiece_tokenizer
from checkpoints.st_modules import (
    ST,
    dense_config,
    module,
    write_sentence_transformers_files,
)
from checkpoints.weights import redraw

# jina-embeddings-v3's task adapters, as its -hf checkpoint names their folders.
JINA_TASKS = [
    "retrieval_query",
    "retrieval_passage",
    "separation",
    "classification",
    "text_matching",
]
# Its sentence-transformers prompts, which name the same tasks.
JINA_PROMPTS = {
    "retrieval.query": "Represent the query for retrieving evidence documents: ",
    "retrieval.passage": "Represent the document for retrieval: ",
    "separation": "",
    "classification": "",
    "text-matching": "",
}

# The encoders' shape with a narrower feed-forward layer.
_ENCODER = {**ENCODER, "intermediate_size": 48}
_LAYERS = {
    "ModernBert": (
        "ModernBertConfig",
        _ENCODER,
        MODERNBERT,
        dict(
            local_attention=16,  # 8 tokens each side: shorter than the test sequences
            rope_parameters={
                "full_attention": rope(1000.0),
                "sliding_attention": rope(50.0),
            },
        ),
    ),
    "NomicBert": (
        "NomicBertConfig",
        _ENCODER,
        dict(pad_token_id=0, rope_parameters=rope(100.0)),
    ),
    "JinaEmbeddingsV3": ("JinaEmbeddingsV3Config", _ENCODER, ROBERTA_SPECIALS),
    "Gemma3": (
        "Gemma3TextConfig",
        DECODER,
        GEMMA3,
        dict(
            hidden_size=64,
            intermediate_size=96,
            max_position_embeddings=128,
            num_hidden_layers=4,
            tie_word_embeddings=True,
            sliding_window=16,  # 8 each side in bidirectional mode
            layer_types=[
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "sliding_attention",
            ],
        ),
    ),
}


def _config(architecture: str, vocab: int, **overrides: Any):  # type: ignore[no-untyped-def]
    family = next(f for f in _LAYERS if architecture.startswith(f))
    config_class, *layers = _LAYERS[family]
    return config(config_class, {"vocab_size": vocab}, *layers, overrides)


def make_family_checkpoint(
    folder: Path,
    architecture: str,
    *,
    seed: int = 0,
    num_labels: int = 1,
    pooling: str | None = None,
    prompts: dict[str, str] | None = None,
    **overrides: Any,
) -> Path:
    import transformers

    torch.manual_seed(seed)
    gemma = architecture.startswith("Gemma3")
    if gemma:
        vocab_size = VOCAB_SIZE
    else:
        tok, vocab = wordpiece_tokenizer("roberta" if "Jina" in architecture else "bert")
        vocab_size = len(vocab)
    config = _config(architecture, vocab_size, **overrides)
    if architecture.endswith("ForSequenceClassification"):
        set_labels(config, num_labels)
    model = getattr(transformers, architecture)(config).eval()
    redraw(model, norm_center=0.0 if gemma else 1.0)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    if gemma:
        (folder / "tokenizer.json").write_text(bpe_tokenizer_json())
    else:
        tok.save(str(folder / "tokenizer.json"))
    write_sentence_transformers_files(
        folder, hidden=config.hidden_size, pooling=pooling, prompts=prompts
    )
    return folder


def add_jina_adapters(folder: Path, tasks: list[str] = JINA_TASKS, seed: int = 0) -> None:
    """PEFT LoRA adapters with random A and B, one folder per task (as the -hf checkpoint
    ships them). Each targets a different subset of modules, and one uses rsLoRA."""
    import peft
    import transformers

    targets = [
        ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2", "word_embeddings"],
        ["q_proj", "v_proj", "fc2"],
        ["k_proj", "o_proj", "word_embeddings"],
        ["fc1", "q_proj"],
        ["v_proj", "fc1", "fc2", "word_embeddings"],
    ]
    for i, task in enumerate(tasks):
        torch.manual_seed(seed + 100 + i)
        base = transformers.JinaEmbeddingsV3Model.from_pretrained(folder)
        config = peft.LoraConfig(
            r=2 + i % 3,
            lora_alpha=4 + i,
            target_modules=targets[i % len(targets)],
            use_rslora=i == 3,
        )
        model = peft.get_peft_model(base, config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.normal_(0.0, 0.3)
        model.save_pretrained(folder / task)


def hf_jina_outputs(folder: Path, ids: list[list[int]], task: str | None) -> list[torch.Tensor]:
    """transformers' last hidden states with `task`'s adapter set (None: none loaded)."""
    import transformers

    model = transformers.JinaEmbeddingsV3Model.from_pretrained(folder).eval()
    if task is not None:
        # What `load_adapter(hub_id, adapter_kwargs={"subfolder": task})` reads, locally.
        model.load_adapter(str(folder / task), adapter_name=task)
        model.set_adapter(task)
    with torch.no_grad():
        return [model(input_ids=torch.tensor([seq])).last_hidden_state[0] for seq in ids]


def add_embeddinggemma_modules(folder: Path, hidden: int, seed: int = 0) -> None:
    """EmbeddingGemma's sentence-transformers pipeline: mean pooling, Dense(h -> 4h),
    Dense(4h -> h) (both bias-free, identity activation), Normalize."""
    gen = torch.Generator().manual_seed(seed + 7)
    # Our test BPE tokenizer, not Gemma's SentencePiece one, for sentence-transformers too.
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": 128,
                "pad_token": "<|endoftext|>",
            }
        )
    )
    write_sentence_transformers_files(
        folder,
        hidden=hidden,
        pooling="mean",
        prompts={"query": "task: search result | query: ", "document": "title: none | text: "},
    )
    modules = json.loads((folder / "modules.json").read_text())
    modules = [m for m in modules if not m["type"].endswith("Normalize")]
    for i, (n_in, n_out) in enumerate([(hidden, 4 * hidden), (4 * hidden, hidden)]):
        path = f"{i + 2}_Dense"
        (folder / path).mkdir(exist_ok=True)
        (folder / path / "config.json").write_text(
            json.dumps(dense_config(n_in, n_out, bias=False, activation="linear.Identity"))
        )
        save_file(
            {"linear.weight": torch.randn(n_out, n_in, generator=gen) * n_in**-0.5},
            str(folder / path / "model.safetensors"),
        )
        modules.append(module(len(modules), path, f"{ST}.Dense"))
    modules.append(module(len(modules), f"{len(modules)}_Normalize", f"{ST}.Normalize"))
    (folder / f"{len(modules) - 1}_Normalize").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules))
