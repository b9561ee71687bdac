"""Activation functions by their Hugging Face `hidden_act` names."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import CheckpointError

Activation = Callable[[torch.Tensor], torch.Tensor]

_ACTIVATIONS: dict[str, Activation] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
    # OpenAI CLIP's GELU approximation.
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}


def get_activation(name: str) -> Activation:
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise CheckpointError(
            f"config.json: unsupported hidden_act {name!r}; supported: {sorted(_ACTIVATIONS)}"
        ) from None


# Gated MLPs run act(gate) * up as one fused kernel; these are the activations it knows.
_GATED = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
}


def gated_activation_name(name: str) -> str:
    try:
        return _GATED[name]
    except KeyError:
        raise CheckpointError(
            f"config.json: unsupported activation {name!r} for a gated MLP; "
            f"supported: {sorted(_GATED)}"
        ) from None
