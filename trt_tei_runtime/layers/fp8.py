"""FP8 (E4M3) linear layers: per-output-channel weight scales, per-token activation scales.

On Hopper the GEMM runs in FP8 through `torch._scaled_mm` with row-wise scales. Elsewhere
(CPU, older GPUs) the same numbers are emulated: activations are rounded through FP8 per
token and the weight is dequantized, so CPU tests see the quantization error the GPU has.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import quantize_fp8_rowwise
from ..kernels.reference import FP8
from .linear import Linear


def scaled_mm_supported(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


class Fp8Linear(nn.Module):
    def __init__(
        self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # FP8 [N, K]
        self.weight_scale = nn.Parameter(weight_scale, requires_grad=False)  # float32 [1, N]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_linear(cls, linear: Linear) -> Fp8Linear:
        if linear.weight.device.type == "meta":  # an engine skeleton, filled by load_state_dict
            n, k = linear.weight.shape
            return cls(
                torch.empty((n, k), dtype=FP8, device="meta"),
                torch.empty((1, n), dtype=torch.float32, device="meta"),
                linear.bias,
            )
        # Weights once, at build time: the same per-row rule gives per-output-channel scales.
        values, scale = quantize_fp8_rowwise(linear.weight.data)
        return cls(values, scale.reshape(1, -1), linear.bias)

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        xq, x_scale = quantize_fp8_rowwise(x2)
        if scaled_mm_supported(x.device) and x.dtype == torch.bfloat16:
            out = torch._scaled_mm(
                xq,
                self.weight.t(),
                scale_a=x_scale,
                scale_b=self.weight_scale,
                bias=self.bias,
                out_dtype=torch.bfloat16,
            )
        else:
            x_deq = (xq.float() * x_scale).to(x.dtype)
            w_deq = (self.weight.float() * self.weight_scale.t()).to(x.dtype)
            out = F.linear(x_deq, w_deq, self.bias)
        return out.reshape(*shape[:-1], -1)


def quantizable_linears(network: nn.Module, scope: str = "layers.") -> dict[str, Linear]:
    """Every `Linear` under `scope` (the transformer blocks; embeddings and heads stay in
    high precision), by module name."""
    return {
        name: module
        for name, module in network.named_modules()
        if isinstance(module, Linear) and name.startswith(scope)
    }


def quantize_linears(
    network: nn.Module, scope: str = "layers.", keep: Collection[str] = ()
) -> list[str]:
    """Replaces every `Linear` under `scope`, except those named in `keep`, with an
    `Fp8Linear`. Returns the names replaced."""
    replaced = []
    for name, module in quantizable_linears(network, scope).items():
        if name not in keep:
            set_submodule(network, name, Fp8Linear.from_linear(module))
            replaced.append(name)
    return replaced


def set_submodule(network: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    setattr(network.get_submodule(parent_name), attr, module)
