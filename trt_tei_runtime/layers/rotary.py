"""Rotary position embeddings (RoPE) over packed tokens.

`RopeConfig.from_config` reads both spellings Hugging Face has used: `rope_theta` +
`rope_scaling` (transformers 4.x checkpoints) and `rope_parameters` (5.x). Supported rope
types: `default`, `linear` and `llama3` (Llama 3.1+); any other type is refused by name
rather than silently run as plain RoPE.

Frequencies and angles are computed in float32 from the packed `position_ids`, so every
sequence of a batch gets its own positions; the rotation itself also runs in float32 and
is cast back to the activations' dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError
from ..kernels import rotary_qk

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_DEFAULT_THETA = 10_000.0


@dataclass(frozen=True)
class RopeConfig:
    theta: float = _DEFAULT_THETA
    rope_type: str = "default"
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, data: dict[str, Any], max_position_embeddings: int) -> RopeConfig:
        # transformers gives `rope_scaling` priority over `rope_parameters`.
        params = data.get("rope_scaling") or data.get("rope_parameters") or {}
        if not isinstance(params, dict):
            raise CheckpointError(f"config.json: rope_scaling must be an object, got {params!r}")
        params = dict(params)
        if any(isinstance(v, dict) for v in params.values()):
            raise CheckpointError(
                "config.json: per-layer-type rope_parameters are not supported for this model"
            )
        theta = params.get("rope_theta", data.get("rope_theta", _DEFAULT_THETA))
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise CheckpointError(
                f"config.json: rope type {rope_type!r} is not supported; supported: "
                + ", ".join(SUPPORTED_ROPE_TYPES)
            )
        partial = params.get("partial_rotary_factor", data.get("partial_rotary_factor", 1.0))
        if partial not in (None, 1, 1.0):
            raise CheckpointError(
                f"config.json: partial_rotary_factor {partial!r} is not supported (only 1.0)"
            )
        if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
            raise CheckpointError(
                f"config.json: rope_theta must be a positive number, got {theta!r}"
            )
        if rope_type == "llama3":
            params.setdefault("original_max_position_embeddings", max_position_embeddings)
            _require(params, rope_type, ("factor", "low_freq_factor", "high_freq_factor"))
            if params["high_freq_factor"] <= params["low_freq_factor"]:
                raise CheckpointError(
                    "config.json: llama3 rope needs high_freq_factor > low_freq_factor, got "
                    f"{params['high_freq_factor']} and {params['low_freq_factor']}"
                )
        elif rope_type == "linear":
            _require(params, rope_type, ("factor",))
        return cls(theta=float(theta), rope_type=rope_type, params=params)

    def inv_freq(self, head_dim: int) -> torch.Tensor:
        """Inverse frequencies `[head_dim / 2]` in float32, as transformers computes them."""
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
        inv_freq = 1.0 / (self.theta**exponents)
        if self.rope_type == "linear":
            return inv_freq / float(self.params["factor"])
        if self.rope_type == "llama3":
            return _llama3_scaling(inv_freq, self.params)
        return inv_freq


def _require(params: dict[str, Any], rope_type: str, keys: tuple[str, ...]) -> None:
    for key in keys:
        value = params.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CheckpointError(
                f"config.json: rope type {rope_type!r} needs a number {key!r} in rope_scaling, "
                f"got {value!r}"
            )


def _llama3_scaling(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling: long wavelengths divided by `factor`, short
    ones kept, a smooth interpolation in between."""
    factor = float(params["factor"])
    low = float(params["low_freq_factor"])
    high = float(params["high_freq_factor"])
    old_context = float(params["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low
    high_freq_wavelen = old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Computes `cos`/`sin` `[T, head_dim]` (float32) once per batch from the position ids."""

    def __init__(self, config: RopeConfig, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        # Kept in float32 whatever dtype the model is cast to (see `_apply`).
        self.register_buffer("inv_freq", config.inv_freq(head_dim), persistent=False)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # `model.to(dtype=bfloat16)` must not round the frequencies: keep them float32.
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(self.inv_freq.device, torch.float32)
        return self

    def forward(self, position_ids: torch.Tensor) -> RopeAngles:
        return RopeAngles(position_ids, self.inv_freq)


@dataclass
class RopeAngles:
    """What every layer needs to rotate q and k: the fused kernel computes the angles
    `positions * inv_freq` itself (float32), so no `[T, head_dim]` tables are stored."""

    positions: torch.Tensor  # [T] int64
    inv_freq: torch.Tensor  # [head_dim / 2] float32


def apply_rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    rope: RopeAngles,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half RoPE on q `[T, Hq, D]` and k `[T, Hk, D]`, after optional per-head
    RMSNorms (Qwen3), in one fused pass each."""
    return rotary_qk(q, k, rope.positions, rope.inv_freq, q_norm, k_norm, eps)
