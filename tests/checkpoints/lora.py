"""Random PEFT LoRA adapters for the tiny checkpoints, and PEFT's own outputs with them
(the reference the runtime's per-token adapters are compared with)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from checkpoints.decoders import hf_model


def make_lora_adapter(
    base: Path,
    folder: Path,
    *,
    r: int,
    targets: Sequence[str],
    alpha: float = 8,
    seed: int = 0,
    std: float = 0.3,
    **config: Any,
) -> Path:
    """A LoRA adapter of the checkpoint in `base`, saved by PEFT into `folder`: A and B
    both random, of standard deviation `std` (PEFT starts B at zero, which would make the
    adapter a no-op)."""
    import peft

    torch.manual_seed(seed)
    model = hf_model(base)
    lora = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), **config)
    adapted = peft.get_peft_model(model, lora)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, std)
    adapted.save_pretrained(folder)
    return folder


def peft_model(base: Path, adapter: Path | None, *, merged: bool = False, **load: Any):  # type: ignore[no-untyped-def]
    """transformers' model of `base` with PEFT's adapter from `adapter` (None: none),
    unmerged, or merged into the weights with `merge_and_unload`."""
    import peft

    model = hf_model(base, **load)
    if adapter is None:
        return model
    adapted = peft.PeftModel.from_pretrained(model, str(adapter)).eval()
    return adapted.merge_and_unload().eval() if merged else adapted


def peft_hidden(model: Any, ids: Sequence[Sequence[int]], device: str = "cpu") -> torch.Tensor:
    """Last hidden states of every sequence, one at a time, laid end to end `[T, H]`."""
    outs = []
    with torch.no_grad():
        for seq in ids:
            out = model(input_ids=torch.tensor([list(seq)], device=device))
            outs.append(out.last_hidden_state[0].float().cpu())
    return torch.cat(outs)
