"""SPLADE pooling: per-token vocabulary logits → one sparse vector per sequence.

sentence-transformers' `SpladePooling` computes, per sequence, `reduce_t act(logits[t])`
with `act = log1p(relu(x))` ("relu") or `log1p(log1p(relu(x)))` ("log1p_relu") and `reduce`
max or sum over the tokens. The logits are `[tokens, vocab]` (30522 columns for BERT), the
largest tensor of the whole pass, so:

- they are computed a group of whole sequences at a time (`CHUNK_TOKENS`), never for the
  whole packed batch at once, and never padded;
- for max pooling the activation is applied after the reduction: it is monotonic, so
  `max_t act(x_t) = act(max_t x_t)` exactly (the same element is picked), and the
  elementwise work shrinks from `[tokens, vocab]` to `[sequences, vocab]`;
- the result leaves the device as (index, value) pairs of the active dimensions only
  (`top_active`), at most `max_active_dims` per sequence when set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from .errors import CheckpointError, InputError

# Tokens whose vocabulary logits are alive at once: 4096 x 30522 in bfloat16 is 250 MB.
CHUNK_TOKENS = 4096
STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")


@dataclass(frozen=True)
class SpladeConfig:
    """A `SpladePooling` module's config (its folder's config.json)."""

    pooling_strategy: Literal["max", "sum"] = "max"
    activation_function: Literal["relu", "log1p_relu"] = "relu"

    @classmethod
    def from_dict(cls, data: dict[str, object], source: str) -> SpladeConfig:
        strategy = data.get("pooling_strategy", "max")
        activation = data.get("activation_function", "relu")
        if strategy not in STRATEGIES:
            raise CheckpointError(
                f"{source}: pooling_strategy {strategy!r} is not supported; supported: max, sum"
            )
        if activation not in ACTIVATIONS:
            raise CheckpointError(
                f"{source}: activation_function {activation!r} is not supported; "
                "supported: relu, log1p_relu"
            )
        return cls(strategy, activation)  # type: ignore[arg-type]


def activate(x: torch.Tensor, activation: str) -> torch.Tensor:
    """`log1p(relu(x))`, once more `log1p` for "log1p_relu"; in place on a fresh tensor."""
    x = x.relu_().log1p_()
    return x.log1p_() if activation == "log1p_relu" else x


def sequence_groups(cu_seqlens: list[int], chunk_tokens: int) -> list[tuple[int, int]]:
    """Consecutive sequences `[first, end)` grouped up to `chunk_tokens` tokens (a longer
    sequence is a group of its own)."""
    count = len(cu_seqlens) - 1
    groups: list[tuple[int, int]] = []
    first = 0
    for i in range(count):
        if i > first and cu_seqlens[i + 1] - cu_seqlens[first] > chunk_tokens:
            groups.append((first, i))
            first = i
    if count > 0:
        groups.append((first, count))
    return groups


def splade_pool(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    cu_seqlens: list[int],
    config: SpladeConfig,
    chunk_tokens: int = CHUNK_TOKENS,
) -> torch.Tensor:
    """Sparse vectors `[n, vocab]` float32 (mostly zeros) from hidden states `[T, H]`;
    `head(hidden_chunk)` gives the chunk's vocabulary logits."""
    pooled: list[torch.Tensor] = []
    for first, end in sequence_groups(cu_seqlens, chunk_tokens):
        a, b = cu_seqlens[first], cu_seqlens[end]
        logits = head(hidden[a:b])
        lengths = torch.tensor(
            [cu_seqlens[i + 1] - cu_seqlens[i] for i in range(first, end)], device=logits.device
        )
        if config.pooling_strategy == "max":
            # In the model's dtype: the max picks an element, no rounding to fear.
            pooled.append(torch.segment_reduce(logits, "max", lengths=lengths, axis=0).float())
        else:
            summed = activate(logits.float(), config.activation_function)
            pooled.append(torch.segment_reduce(summed, "sum", lengths=lengths, axis=0))
    out = torch.cat(pooled)
    if config.pooling_strategy == "max":
        out = activate(out, config.activation_function)
    return out


def top_active(pooled: torch.Tensor, max_active_dims: int | None) -> torch.Tensor:
    """The active dimensions of each row as `[n, 2k]` float32: k (vocabulary index, value)
    pairs in index order, the index an integral float (exact below 2**24); k is the most
    active dimensions of any row, capped at `max_active_dims` (the largest values are kept,
    as sentence-transformers' `select_max_active_dims`). Rows with fewer active dimensions
    hold pairs of value 0, which readers drop: so blocks of different k can also be
    right-padded with zeros to one width."""
    if max_active_dims is not None and max_active_dims <= 0:
        raise InputError(f"max_active_dims must be a positive integer, got {max_active_dims}")
    vocab = pooled.shape[-1]
    # One host sync: the width of what comes back depends on the data.
    k = int((pooled > 0).sum(dim=-1).max()) if pooled.numel() else 0
    k = max(1, min(k, max_active_dims or vocab, vocab))
    values, indices = torch.topk(pooled, k, dim=-1, sorted=False)
    indices, order = indices.sort(dim=-1)
    values = values.gather(-1, order)
    return torch.stack([indices.float(), values], dim=-1).reshape(pooled.shape[0], 2 * k)


def unpack_active(row: torch.Tensor) -> dict[int, float]:
    """One row of `top_active` as {vocabulary index: value}, zeros dropped."""
    flat = row.tolist()
    return {int(i): v for i, v in zip(flat[0::2], flat[1::2]) if v > 0}
