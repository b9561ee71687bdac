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
from tokenizers import Tokenizer

from checkpoints.configs import decoder_config, family_of, set_labels
from checkpoints.st_modules import write_sentence_transformers_files
from checkpoints.vocab import bpe
from checkpoints.weights import redraw

VOCAB_SIZE = 384
PAD_ID = 0  # <|endoftext|>
# The tests' decoders: 64 wide, heads 16 wide (wider than hidden_size / heads, as Qwen3 and
# Gemma2 checkpoints have them) except Qwen2's.
SIZE = dict(hidden_size=64, intermediate_size=96, max_position_embeddings=256)
HEAD_DIM = {"Llama": 16, "Mistral": 16, "Qwen3": 16, "Gemma2": 16}


@lru_cache(maxsize=1)
def bpe_tokenizer_json() -> str:
    """A byte-level BPE tokenizer (Qwen/Llama-3 style), trained on a few lines, with "yes"
    and "no" as single tokens and Qwen's chat special tokens."""
    tok = bpe(VOCAB_SIZE - 8)
    assert tok.get_vocab_size() <= VOCAB_SIZE
    return tok.to_str()


def tokenizer() -> Tokenizer:
    return Tokenizer.from_str(bpe_tokenizer_json())


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

    family = family_of(architecture)
    head_dim = {"head_dim": HEAD_DIM[family]} if family in HEAD_DIM else {}
    config = decoder_config(architecture, VOCAB_SIZE, SIZE, head_dim, config_overrides)
    if architecture.endswith("ForSequenceClassification"):
        set_labels(config, num_labels, problem_type)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    redraw(model, norm_center=0.0 if family == "Gemma2" else 1.0)
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
