"""Inputs longer than the model's limit: `long_input="error"`, `"truncate"` or `"chunk"`.

With `"chunk"`, an input is cut into windows by the router's own rule (the Rust
`tokenization::chunk`, run through `FlatTokenizer.encode_windows`, so the server and the
Python API cut alike; docs/server.md "Long inputs" states it), every window runs as a
sequence of its own, and the input's vector is the mean of its windows' pooled vectors
weighted by each window's own token count. This module holds the choice of mode and the
weighted mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .errors import InputError
from .token_ids import TokenIds

LONG_INPUT_MODES = ("error", "truncate", "chunk")
DEFAULT_MAX_CHUNKS = 64


def long_input_mode(long_input: Optional[str], truncate: bool) -> str:
    """The mode a call asked for: `long_input` if given, else `truncate`'s."""
    if long_input is None:
        return "truncate" if truncate else "error"
    if long_input not in LONG_INPUT_MODES:
        raise InputError(f"long_input must be 'error', 'truncate' or 'chunk', got {long_input!r}")
    return long_input


def check_chunking(chunk_overlap: int, max_chunks: int) -> None:
    if chunk_overlap < 0:
        raise InputError(f"chunk_overlap must be at least 0, got {chunk_overlap}")
    if max_chunks < 1:
        raise InputError(f"max_chunks must be at least 1, got {max_chunks}")


@dataclass(frozen=True)
class Windows:
    """Every window of some texts end to end: their ids and type ids (None: all 0), how many
    windows each text has, and each window's weight (its own tokens of the text)."""

    ids: TokenIds
    type_ids: Optional[TokenIds]
    counts: np.ndarray
    weights: np.ndarray


def mean_of_windows(rows: torch.Tensor, counts: np.ndarray, weights: np.ndarray) -> torch.Tensor:
    """Each text's row: the mean of its windows' `rows` weighted by `weights`, in float64 as
    the router computes it, returned as float32."""
    texts = torch.repeat_interleave(
        torch.arange(counts.size), torch.from_numpy(counts.astype(np.int64))
    )
    w = torch.from_numpy(weights.astype(np.float64))
    sums = torch.zeros(counts.size, rows.shape[1], dtype=torch.float64)
    sums.index_add_(0, texts, rows.double().cpu() * w[:, None])
    totals = torch.zeros(counts.size, dtype=torch.float64).index_add_(0, texts, w)
    return (sums / totals.clamp(min=1)[:, None]).float()
