"""The BLAS library the interactive lane's CUDA graphs are captured with.

torch runs a linear without a bias through cuBLAS, and with `preferred_blas_library
("cublaslt")` through cuBLASLt, whose kernels for a few rows (a query's GEMMs) are faster:
measured on an H200, a qwen3-8b 24-token query took 4.54–4.60 ms against 4.76–4.81 ms
(docs/journal/results-log.md). Process-wide, the same switch left the bf16 backfills as they were
but once ran a bert-large FP8 backfill 20 % slower. A graph keeps the kernels it was captured
with, so the switch is set only while the interactive lane's graphs are captured: queries
get cuBLASLt, bulk batches keep torch's choice. `TRT_TEI_QUERY_BLAS=torch` leaves the
interactive graphs with torch's choice too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

QUERY_BLAS_ENV = "TRT_TEI_QUERY_BLAS"
_CHOICES = ("cublaslt", "cublas", "torch")


def query_blas_library() -> str | None:
    """The library for the interactive lane's graphs; None: torch's own choice."""
    value = os.environ.get(QUERY_BLAS_ENV, "cublaslt").strip().lower()
    if value not in _CHOICES:
        raise ValueError(f"{QUERY_BLAS_ENV}={value!r}: expected one of {', '.join(_CHOICES)}")
    return None if value == "torch" else value


@contextlib.contextmanager
def preferred_blas(library: str | None) -> Iterator[None]:
    """torch's preferred BLAS library set to `library` inside, the previous one restored
    after; None leaves it alone."""
    if library is None:
        yield
        return
    previous = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(previous)
