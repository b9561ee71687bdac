"""Reference outputs from `transformers` itself, one sequence at a time (no padding)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path

import torch


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)


def hf_encoder_outputs(
    folder: Path,
    ids: Sequence[Sequence[int]],
    type_ids: Sequence[Sequence[int]] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> list[torch.Tensor]:
    """Last hidden states `[len, H]` (base models) or logits `[labels]` (classifiers)."""
    import transformers

    model = transformers.AutoConfig.from_pretrained(folder)
    arch = model.architectures[0]
    hf = getattr(transformers, arch).from_pretrained(folder, dtype=dtype).to(device).eval()
    outs = []
    with torch.no_grad():
        for i, seq in enumerate(ids):
            input_ids = torch.tensor([list(seq)], device=device)
            kwargs = {}
            # DistilBERT and MPNet take no token types.
            if (
                type_ids is not None
                and "token_type_ids" in inspect.signature(hf.forward).parameters
            ):
                kwargs["token_type_ids"] = torch.tensor([list(type_ids[i])], device=device)
            out = hf(input_ids=input_ids, **kwargs)
            if arch.endswith("ForSequenceClassification"):
                outs.append(out.logits[0].float().cpu())
            else:
                outs.append(out.last_hidden_state[0].float().cpu())
    return outs
