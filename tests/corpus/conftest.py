"""Models shared by the corpus-job tests: all-MiniLM-L6-v2 and a tiny random checkpoint
(fast: for the tests about files, resuming and bad rows rather than about numbers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkpoints import make_checkpoint

from trt_tei_runtime import Model


@pytest.fixture(scope="session")
def minilm(minilm_dir: Path) -> Model:
    return Model(minilm_dir, device="cpu")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(
        tmp_path_factory.mktemp("tiny"),
        "BertModel",
        pooling="mean",
        max_seq_length=48,
        normalize=True,
        prompts={"query": "query: ", "passage": "passage: "},
    )


@pytest.fixture(scope="session")
def tiny(tiny_dir: Path) -> Model:
    return Model(tiny_dir, device="cpu")
