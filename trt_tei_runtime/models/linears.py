"""Linear layers pulled from a checkpoint by Hugging Face name, alone or fused."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..layers import Linear
from ..weights import WeightReader


def take_linear(
    reader: WeightReader, name: str, out_f: int, in_f: int, bias: bool = True
) -> Linear:
    """`{name}.weight` `[out_f, in_f]` and, with `bias`, `{name}.bias`."""
    weight = reader.take(f"{name}.weight", (out_f, in_f))
    linear = Linear(weight, reader.take(f"{name}.bias", (out_f,)) if bias else None)
    linear.parts = ((name, out_f),)
    return linear


def take_fused_linear(
    reader: WeightReader, names: Sequence[str], outs: Sequence[int], in_f: int, bias: bool = True
) -> Linear:
    """One GEMM for several projections of the same input (q/k/v, gate/up): their weights
    (and biases) stacked in `names` order, so the output splits back by `outs`."""
    parts = [take_linear(reader, n, o, in_f, bias) for n, o in zip(names, outs, strict=True)]
    weight = torch.cat([p.weight.data for p in parts])
    biases = [p.bias.data for p in parts if p.bias is not None]
    fused = Linear(weight, torch.cat(biases) if bias else None)
    fused.parts = tuple(part for p in parts for part in p.parts)
    return fused
