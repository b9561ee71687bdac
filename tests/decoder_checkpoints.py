"""Tiny random decoder checkpoints (Llama, Mistral, Qwen2, Qwen3, Gemma2) made with
`transformers`, a small byte-level BPE tokenizer, and transformers' own reference outputs.

Every parameter is randomized (norm weights and biases included), so a tensor loaded into
the wrong place, a norm with the wrong offset or a missing bias cannot hide.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from tiny_checkpoints import write_sentence_transformers_files
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 384
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
PAD_ID = 0  # <|endoftext|>
_CORPUS = [
    "the cat sat on the mat and the dog read a book about paris",
    "query document search engine embedding fast model text sentence long short",
    "yes no yes no maybe yes no",
    "Judge whether the Document meets the requirements based on the Query and the Instruct",
    'provided. Note that the answer can only be "yes" or "no".',
    "<Instruct>: Given a web search query, retrieve relevant passages that answer the query",
    "<Query>: what is the capital of france\n<Document>: paris is the capital of france",
    "system user assistant\n\n",
]

FAMILIES = {
    "Llama": "LlamaConfig",
    "Mistral": "MistralConfig",
    "Qwen2": "Qwen2Config",
    "Qwen3": "Qwen3Config",
    "Gemma2": "Gemma2Config",
}


@lru_cache(maxsize=1)
def bpe_tokenizer_json() -> str:
    """A byte-level BPE tokenizer (Qwen/Llama-3 style), trained on a few lines, with "yes"
    and "no" as single tokens and Qwen's chat special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 8,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens(["yes", "no"])
    assert tok.get_vocab_size() <= VOCAB_SIZE
    return tok.to_str()


def tokenizer() -> Tokenizer:
    return Tokenizer.from_str(bpe_tokenizer_json())


def family_of(architecture: str) -> str:
    for family in sorted(FAMILIES, key=len, reverse=True):
        if architecture.startswith(family):
            return family
    raise ValueError(architecture)


def decoder_config(architecture: str, **overrides: Any):  # type: ignore[no-untyped-def]
    import transformers

    family = family_of(architecture)
    base: dict[str, Any] = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        pad_token_id=PAD_ID,
        bos_token_id=None,
        eos_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    if family in ("Llama", "Mistral", "Qwen3", "Gemma2"):
        base["head_dim"] = 16
    if family == "Llama":
        base["attention_bias"] = True
        base["mlp_bias"] = True
    if family == "Mistral":
        base["sliding_window"] = None
    if family == "Gemma2":
        base.update(
            num_hidden_layers=3,
            sliding_window=8,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=1.5,
            final_logit_softcapping=2.0,
            tie_word_embeddings=True,
        )
    base.update(overrides)
    return getattr(transformers, FAMILIES[family])(**base)


def make_decoder_checkpoint(
    folder: Path,
    architecture: str,
    *,
    seed: int = 0,
    num_labels: int = 1,
    problem_type: str | None = None,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    pooling: str | None = None,
    **config_overrides: Any,
) -> Path:
    """Saves a random `architecture` checkpoint plus tokenizer.json into `folder`."""
    import transformers

    config = decoder_config(architecture, **config_overrides)
    if architecture.endswith("ForSequenceClassification"):
        config.num_labels = num_labels
        config.id2label = {i: f"label_{i}" for i in range(num_labels)}
        config.label2id = {v: k for k, v in config.id2label.items()}
        config.problem_type = problem_type
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    gemma = family_of(architecture) == "Gemma2"
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                center = 0.0 if gemma else 1.0
                param.copy_(center + 0.3 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.08)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_text(bpe_tokenizer_json())
    write_sentence_transformers_files(
        folder,
        hidden=config.hidden_size,
        pooling=pooling,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
    )
    return folder


def hf_model(folder: Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu"):  # type: ignore[no-untyped-def]
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    cls = getattr(transformers, config.architectures[0])
    model = cls.from_pretrained(folder, dtype=dtype, attn_implementation="eager")
    return model.to(device).eval()


def hf_decoder_outputs(
    folder: Path,
    ids: Sequence[Sequence[int]],
    *,
    yes_no: tuple[int, int] | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> list[torch.Tensor]:
    """transformers' outputs, one sequence at a time, no padding and no attention mask:
    last hidden states `[len, H]` (base models and causal LMs), logits `[labels]`
    (sequence classifiers) or, with `yes_no=(no, yes)`, the causal LM's
    logit(yes) - logit(no) at the last position `[1]`."""
    model = hf_model(folder, dtype=dtype, device=device)
    arch = type(model).__name__
    outs = []
    with torch.no_grad():
        for seq in ids:
            input_ids = torch.tensor([list(seq)], device=device)
            if yes_no is not None:
                logits = model(input_ids=input_ids).logits[0, -1].float()
                outs.append((logits[yes_no[1]] - logits[yes_no[0]]).reshape(1).cpu())
            elif arch.endswith("ForSequenceClassification"):
                outs.append(model(input_ids=input_ids).logits[0].float().cpu())
            elif arch.endswith("ForCausalLM"):
                hidden = model.model(input_ids=input_ids).last_hidden_state
                outs.append(hidden[0].float().cpu())
            else:
                outs.append(model(input_ids=input_ids).last_hidden_state[0].float().cpu())
    return outs


def random_ids(lengths: Sequence[int], seed: int = 0, low: int = 5) -> list[list[int]]:
    """Token ids that avoid the pad/special ids (0..4), for model-level comparisons."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(low, VOCAB_SIZE, (n,), generator=gen).tolist() for n in lengths]
