"""How the tiny checkpoints draw their weights. Each scheme randomizes norms and biases
too, so a tensor loaded into the wrong place, a norm with the wrong offset or a missing bias
cannot hide behind zeros and ones. Each draws from torch's global generator, in the order
given, after the caller's `torch.manual_seed`."""

from __future__ import annotations

import torch


def perturb(model: torch.nn.Module) -> None:
    """The tests' encoders: transformers' own initialization, plus noise on norms and
    biases, and relative attention biases made to count."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
            if "relative_attention_bias" in name:
                # Initialized near zero, it would barely move a score: make it count.
                param.add_(torch.randn_like(param))


def redraw(model: torch.nn.Module, *, norm_center: float = 1.0) -> None:
    """The tests' decoders and issue-15 families: every parameter drawn afresh, norm weights
    around `norm_center` (0 for Gemma's 1 + weight norms)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight"):
                param.copy_(norm_center + 0.3 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.08)


def redraw_sorted(model: torch.nn.Module) -> None:
    """The snapshots: parameters by name, vectors (norms, biases) moved by 0.2 sigma,
    matrices drawn afresh, every tensor large enough that a misplaced one changes the
    outputs well past tolerance."""
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.dim() == 1:
                param.add_(0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.1)
