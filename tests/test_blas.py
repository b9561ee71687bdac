"""The BLAS library switch around the interactive lane's graph capture (`runtime.blas`)."""

from __future__ import annotations

import pytest
import torch

from trt_tei_runtime.runtime.blas import QUERY_BLAS_ENV, preferred_blas, query_blas_library


def test_the_query_library_comes_from_the_environment(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(QUERY_BLAS_ENV, raising=False)
    assert query_blas_library() == "cublaslt"
    monkeypatch.setenv(QUERY_BLAS_ENV, " cuBLAS ")
    assert query_blas_library() == "cublas"
    monkeypatch.setenv(QUERY_BLAS_ENV, "torch")
    assert query_blas_library() is None
    monkeypatch.setenv(QUERY_BLAS_ENV, "mkl")
    with pytest.raises(ValueError, match="TRT_TEI_QUERY_BLAS='mkl': expected one of"):
        query_blas_library()


def test_the_switch_holds_inside_and_is_restored_after_even_on_errors():  # type: ignore[no-untyped-def]
    before = torch.backends.cuda.preferred_blas_library()
    with preferred_blas("cublaslt"):
        assert torch.backends.cuda.preferred_blas_library() == torch._C._BlasBackend.Cublaslt
    assert torch.backends.cuda.preferred_blas_library() == before
    with pytest.raises(RuntimeError, match="capture failed"), preferred_blas("cublaslt"):
        raise RuntimeError("capture failed")
    assert torch.backends.cuda.preferred_blas_library() == before
    with preferred_blas(None):
        assert torch.backends.cuda.preferred_blas_library() == before
