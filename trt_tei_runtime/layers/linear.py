"""The linear layer every model uses. Quantized variants (FP8) replace its strategy, not the
model code."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels


class Linear(nn.Module):
    """y = x W^T + b with weights loaded from a checkpoint (no init cost)."""

    # The checkpoint projections whose rows this layer stacks, as (Hugging Face module
    # name, rows) in order; set where it is built from a checkpoint (`models.linears`), so
    # that a LoRA adapter naming one of them lands on its slice (`models.lora`).
    parts: tuple[tuple[str, int], ...] = ()

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def forward(
        self,
        x: torch.Tensor,
        into: torch.Tensor | None = None,
        with_bias: bool = True,
        gelu: bool = False,
    ) -> torch.Tensor:
        """`x W^T + b`. With `into` (a residual stream `[T, out]`): `into + x W^T + b`,
        written into `into` and returned; the GEMM reads the stream as its C operand
        (beta = 1), so the norm after it reads one tensor instead of two.
        `with_bias=False` leaves `b` out, for a caller that adds it in a pass it makes
        anyway (a post-norm adds it as a broadcast row). `gelu`: tanh-GELU of `x W^T + b`
        in the GEMM's epilogue (cuBLASLt; `linear_activation` says when)."""
        if gelu:
            assert self.bias is not None, "cuBLASLt's GELU epilogue takes a bias"
            x2 = x.reshape(-1, x.shape[-1])
            out = torch._addmm_activation(self.bias, x2, self.weight.t(), use_gelu=True)
            return out.reshape(*x.shape[:-1], -1)
        bias = self.bias if with_bias else None
        if into is None:
            return F.linear(x, self.weight, bias)
        stream = into.view(-1, into.shape[-1])
        stream.addmm_(x.reshape(-1, x.shape[-1]), self.weight.t())
        if bias is not None:
            stream.add_(bias)
        return into


def add_to_stream(
    linear: nn.Module, x: torch.Tensor, stream: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The residual add `stream + linear(x)`, as (pending, stream) for the norm after it,
    which adds `pending` (a tensor, a row, or None) in the pass it makes anyway.

    A plain `Linear` adds its product into `stream` in the GEMM itself (cuBLAS reads the
    stream as its C operand), leaving only its bias pending as a row: the norm then reads
    one tensor instead of two. Other linears (FP8: `_scaled_mm` has no C operand; LoRA)
    return their whole output pending, and the norm adds it as it did before."""
    if type(linear) is Linear:
        linear(x, into=stream, with_bias=False)  # through __call__: the preemption gate's hooks
        return linear.bias, stream
    return linear(x), stream


def add_into_stream(linear: nn.Module, x: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
    """`stream + linear(x)`, written into `stream`: for a stream no norm reads next."""
    pending, stream = add_to_stream(linear, x, stream)
    return stream if pending is None else stream.add_(pending)


# Activations cuBLASLt can apply in the GEMM's epilogue. Its GELU is the tanh form; BERT's
# exact (erf) GELU differs from it by at most ~3e-4, ten times below bf16's rounding step
# at the same magnitude, so on half precision the fused form is used for both.
_EPILOGUE_GELU = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def linear_activation(
    linear: nn.Module,
    x: torch.Tensor,
    activation: str,
    fallback: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """`fallback(linear(x))`, as one GEMM with a bias+GELU epilogue where the platform has
    one (CUDA, fp16/bf16, a plain `Linear` with bias): one kernel instead of two."""
    if (
        type(linear) is Linear
        and linear.bias is not None
        and activation in _EPILOGUE_GELU
        and x.is_cuda
        and x.dtype in (torch.float16, torch.bfloat16)
    ):
        return linear(x, gelu=True)  # through __call__: the preemption gate's hooks
    return fallback(linear(x))


def gated_hidden(x: torch.Tensor, gate_up: nn.Module, activation: str) -> torch.Tensor:
    """act(gate) * up of a fused gate/up projection (`kernels.gated_activation`'s
    activations): for a large batch through a plain bias-free `Linear`, one Triton GEMM
    where it measured faster (`kernels.gated_matmul`), else the projection, then the
    activation kernel."""
    if type(gate_up) is Linear and gate_up.bias is None:
        hidden = kernels.gated_matmul(x, gate_up.weight, activation)
        if hidden is not None:
            return hidden
    return kernels.gated_activation(gate_up(x), activation)
