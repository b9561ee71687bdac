"""sentence-transformers `Dense` modules (a linear projection after pooling)."""

from __future__ import annotations

import torch
from torch import nn

from .checkpoint import DenseModule
from .errors import CheckpointError
from .layers import Linear
from .weights import WeightReader, load_checkpoint_tensors

_ACTIVATIONS = {
    "Identity": nn.Identity,
    "Tanh": nn.Tanh,
    "ReLU": nn.ReLU,
    "GELU": nn.GELU,
    "Sigmoid": nn.Sigmoid,
    "SiLU": nn.SiLU,
}


class DenseLayer(nn.Module):
    def __init__(self, spec: DenseModule) -> None:
        super().__init__()
        reader = WeightReader(load_checkpoint_tensors(spec.path), source=str(spec.path))
        weight = reader.take("linear.weight", (spec.out_features, spec.in_features))
        bias = reader.take("linear.bias", (spec.out_features,)) if spec.bias else None
        reader.finish()
        self.linear = Linear(weight, bias)
        name = spec.activation.rsplit(".", 1)[-1]
        if name not in _ACTIVATIONS:
            raise CheckpointError(
                f"{spec.path / 'config.json'}: unsupported activation_function "
                f"{spec.activation!r}; supported: {sorted(_ACTIVATIONS)}"
            )
        self.activation = _ACTIVATIONS[name]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Dense runs in float32 on pooled vectors: tiny, and keeps precision.
        return self.activation(self.linear(x))
