"""Pooling per-token hidden states into one vector per sequence, and what follows it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .errors import InputError
from .kernels import segment_mean

POOLING_MODES = ("cls", "mean", "last-token")
_ALIASES = {"lasttoken": "last-token", "last_token": "last-token", "last": "last-token"}


def canonical_pooling(mode: str) -> str:
    name = _ALIASES.get(mode.lower(), mode.lower())
    if name not in POOLING_MODES:
        raise InputError(f"unknown pooling {mode!r}; supported: {', '.join(POOLING_MODES)}")
    return name


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden `[T, H]` → `[n, H]` in float32 (means accumulate in float32). Empty
    sequences are allowed (a CUDA graph's unused slots, which start at T): their rows are
    junk, never an index out of range."""
    if mode == "cls":
        return hidden[cu_seqlens[:-1].long().clamp(max=hidden.shape[0] - 1)].float()
    if mode == "last-token":
        return hidden[cu_seqlens[1:].long() - 1].float()
    if mode == "mean":
        return segment_mean(hidden, cu_seqlens)
    raise InputError(f"unknown pooling {mode!r}; supported: {', '.join(POOLING_MODES)}")


def finish_embeddings(
    pooled: torch.Tensor, *, normalize: bool, dimensions: int | None
) -> torch.Tensor:
    """Matryoshka truncation to `dimensions` first, then optional L2 normalization."""
    if dimensions is not None:
        if dimensions <= 0 or dimensions > pooled.shape[-1]:
            raise InputError(
                f"dimensions must be between 1 and the model's size {pooled.shape[-1]}, "
                f"got {dimensions}"
            )
        pooled = pooled[..., :dimensions]
    if normalize:
        pooled = F.normalize(pooled, p=2.0, dim=-1)
    return pooled


def score_activation(num_labels: int, problem_type: str | None) -> str:
    """How TEI turns logits into scores: one label → sigmoid, several → softmax; checkpoints
    trained multi-label (independent labels) get a sigmoid per label."""
    if num_labels == 1 or problem_type == "multi_label_classification":
        return "sigmoid"
    return "softmax"


def apply_score_activation(logits: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "sigmoid":
        return torch.sigmoid(logits)
    return torch.softmax(logits, dim=-1)
