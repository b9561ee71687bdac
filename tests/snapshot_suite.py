"""Reads the committed snapshot suite (tests/snapshots/) and compares the runtime with it;
shared by the CPU checks (tests/test_snapshots.py) and the GPU ones (test_snapshots_gpu.py).

Nothing here imports `transformers` or sentence-transformers: the references are the
stored outputs, and the checkpoints load through `Model` only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from trt_tei_runtime import Model

ROOT = Path(__file__).parent / "snapshots"
GENERATOR = ROOT / "generate.py"
MANIFEST = ROOT / "manifest.json"
MINILM = "all-MiniLM-L6-v2"
REGENERATE = "run `make snapshots` (tests/snapshots/generate.py) and commit the result"


@dataclass(frozen=True)
class SnapshotCheck:
    name: str  # the folder under tests/snapshots
    task: str | None
    # "embed", "scores", "sparse", "embed_images", "multivector" or "maxsim"
    # (tests/snapshots/references.py's Check)
    kind: str
    inputs: list[Any]
    expected: np.ndarray
    # Embeddings stored normalized (a Normalize module), compared normalized.
    normalize: bool = False
    # The output's name in outputs.safetensors.
    key: str = "default"

    @property
    def id(self) -> str:
        return f"{self.name}[{self.key}]"


def manifest() -> dict[str, Any]:
    return json.loads(MANIFEST.read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot_names() -> list[str]:
    return sorted(manifest()["snapshots"])


def load_checks(name: str) -> list[SnapshotCheck]:
    meta = json.loads((ROOT / name / "snapshot.json").read_text())
    outputs = load_file(str(ROOT / name / "outputs.safetensors"))
    checks = []
    for c in meta["checks"]:
        key = c.get("key") or c["task"] or "default"
        checks.append(
            SnapshotCheck(
                name, c["task"], c["kind"], c["inputs"], outputs[key], c["normalize"], key
            )
        )
    return checks


def all_checks() -> list[SnapshotCheck]:
    return [check for name in snapshot_names() for check in load_checks(name)]


def model_dir(check: SnapshotCheck, minilm_dir: Path) -> Path:
    return minilm_dir if check.name == MINILM else ROOT / check.name / "checkpoint"


def run(model: Model, check: SnapshotCheck) -> np.ndarray:
    """The runtime's output for the check's inputs: unnormalized embeddings or raw logits."""
    if check.kind == "embed":
        return model.embed(check.inputs, normalize=check.normalize)
    if check.kind == "scores":
        items = [tuple(item) if isinstance(item, list) else item for item in check.inputs]
        return model.predict(items, raw_scores=True)
    if check.kind == "embed_images":
        from checkpoints.vision import png_image

        images = [png_image(*spec) for spec in check.inputs]
        return model.embed_images(images, normalize=check.normalize)
    if check.kind == "multivector":
        rows = [
            vectors
            for input_type in ("query", "document")
            for vectors in model.embed_multivector(check.inputs, input_type)
        ]
        return np.concatenate(rows)
    if check.kind == "maxsim":
        query, *documents = check.inputs
        return model.maxsim_scores(query, documents).reshape(-1, 1)
    if check.kind == "sparse":
        sparse = model.embed_sparse(check.inputs, sparse_tensor=True)  # type: ignore[attr-defined]
        return sparse.to_dense().numpy()
    raise AssertionError(f"{check.id}: unknown kind {check.kind!r}; teach tests/snapshot_suite.py")


def cosines(ours: np.ndarray, expected: np.ndarray) -> np.ndarray:
    a, b = ours.astype(np.float64), expected.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
