"""Normalization layers. `residual` lets callers fuse the skip connection into the norm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import add_layer_norm, add_rms_norm


class LayerNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if residual is not None:
            return add_layer_norm(x, residual, self.weight, self.bias, self.eps)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """Llama's RMSNorm: normalized in float32, cast back to the input dtype, then scaled by
    the weight in the weight's dtype (`w * x.to(dtype)`), the rounding order of Llama,
    Mistral and Qwen checkpoints."""

    gemma = False

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return add_rms_norm(x, None, self.weight, self.eps, self.gemma)[0]

    def add_and_norm(
        self, x: torch.Tensor | None, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual) in one pass: the pre-norm residual stream.
        Either may be None: nothing pending (`add_to_stream` added it in its GEMM), or no
        stream yet. `x` may be a row `[H]` added to every token (a pending bias)."""
        if x is None or x.dim() == 1:
            assert residual is not None
            x, residual = residual, x
        return add_rms_norm(x, residual, self.weight, self.eps, self.gemma)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the checkpoint stores `w - 1`; `(1 + w) * x` is computed in float32
    and only then cast back to the input dtype."""

    gemma = True
