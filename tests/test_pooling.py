"""Pooling over `cu_seqlens` with empty sequences at the end, as a CUDA graph's unused
sequence slots have them (each starts and ends at the token count T)."""

from __future__ import annotations

import pytest
import torch

from trt_tei_runtime.pooling import pool

LENGTHS = [3, 1, 4]


def _hidden_and_cu() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens = sum(LENGTHS)
    hidden = torch.randn(tokens, 8, generator=torch.Generator().manual_seed(0))
    real = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    padded = torch.tensor([0, 3, 4, 8, 8, 8], dtype=torch.int32)  # two empty slots
    return hidden, real, padded


@pytest.mark.parametrize("mode", ["cls", "mean", "last-token"])
def test_empty_tail_sequences_leave_the_real_rows_unchanged(mode: str) -> None:
    hidden, real, padded = _hidden_and_cu()
    pooled = pool(hidden, padded, mode)
    assert pooled.shape == (len(padded) - 1, hidden.shape[1])
    assert torch.isfinite(pooled).all()
    torch.testing.assert_close(pooled[: len(LENGTHS)], pool(hidden, real, mode))


def test_real_rows_are_what_each_mode_reads() -> None:
    hidden, real, _ = _hidden_and_cu()
    torch.testing.assert_close(pool(hidden, real, "cls"), hidden[[0, 3, 4]])
    torch.testing.assert_close(pool(hidden, real, "last-token"), hidden[[2, 3, 7]])
    means = torch.stack([hidden[0:3].mean(0), hidden[3:4].mean(0), hidden[4:8].mean(0)])
    torch.testing.assert_close(pool(hidden, real, "mean"), means)
