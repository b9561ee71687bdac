"""The snapshot suite on CPU in fp32: every architecture and task of `trt_tei_runtime.models`
has a committed tiny checkpoint with the outputs transformers/sentence-transformers gave
(tests/snapshots/, written by `make snapshots`), and the runtime reproduces them.

The checks load through `Model` only; a subprocess proves they need no `transformers`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from snapshot_suite import (
    GENERATOR,
    MINILM,
    REGENERATE,
    ROOT,
    SnapshotCheck,
    all_checks,
    cosines,
    manifest,
    model_dir,
    run,
    sha256,
)
from snapshots import generator_sha256
from snapshots.rows import LAYOUT_ROWS

from trt_tei_runtime import Model
from trt_tei_runtime.models import ARCHITECTURES, TASKS

CHECKS = all_checks()


def test_manifest_matches_the_generator():  # type: ignore[no-untyped-def]
    assert manifest()["generator_sha256"] == generator_sha256(), (
        "the snapshot generator (tests/snapshots/*.py or the tests/checkpoints/ modules it "
        f"builds with) changed since the snapshots were written: {REGENERATE}"
    )


def test_generator_files_name_the_whole_generator():  # type: ignore[no-untyped-def]
    """The generator's hash covers every module of tests/snapshots/ and every module of
    tests/checkpoints/ they import."""
    import ast

    from snapshots import GENERATOR_FILES

    names = {f"snapshots/{p.name}" for p in ROOT.glob("*.py")}
    for name in sorted(names):
        tree = ast.parse((ROOT.parent / name).read_text())
        names |= {
            node.module.replace(".", "/") + ".py"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and node.module is not None
            and node.module.startswith("checkpoints.")
        }
    assert names <= set(GENERATOR_FILES), sorted(names - set(GENERATOR_FILES))


def test_committed_files_match_the_manifest():  # type: ignore[no-untyped-def]
    snapshots = manifest()["snapshots"]
    on_disk = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert on_disk == set(snapshots), f"snapshot folders differ from manifest.json: {REGENERATE}"
    for name, entry in snapshots.items():
        folder = ROOT / name
        files = {
            p.relative_to(folder).as_posix(): sha256(p)
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        changed = sorted(
            f for f in set(files) | set(entry["files"]) if files.get(f) != entry["files"].get(f)
        )
        assert not changed, f"{name}: {changed} differ from manifest.json: {REGENERATE}"


def test_every_architecture_and_task_has_a_snapshot():  # type: ignore[no-untyped-def]
    snapshots = manifest()["snapshots"]
    missing = [
        arch
        for arch in sorted(ARCHITECTURES)
        if None not in snapshots.get(arch, {}).get("tasks", [])
    ]
    missing += [
        f"{arch} (task {task})"
        for task, table in sorted(TASKS.items())
        for arch in sorted(table)
        if task not in snapshots.get(arch, {}).get("tasks", [])
    ]
    missing += [f"{name} (layout)" for name in LAYOUT_ROWS if name not in snapshots]
    assert not missing, f"no snapshot for {missing}: add a ROWS entry and {REGENERATE}"
    assert MINILM in snapshots


@pytest.fixture(scope="module")
def models(minilm_dir):  # type: ignore[no-untyped-def]
    cache: dict[tuple[str, str | None], Model] = {}

    def get(check: SnapshotCheck) -> Model:
        key = (check.name, check.task)
        if key not in cache:
            cache[key] = Model(model_dir(check, minilm_dir), device="cpu", task=check.task)
        return cache[key]

    return get


@pytest.mark.parametrize("check", CHECKS, ids=[c.id for c in CHECKS])
def test_snapshot_fp32_cpu(models, check):  # type: ignore[no-untyped-def]
    model = models(check)
    assert model.dtype.is_floating_point and model.dtype.itemsize == 4
    ours = run(model, check)
    assert ours.shape == check.expected.shape
    if check.kind in ("embed", "embed_images", "multivector"):
        cos = cosines(ours, check.expected)
        assert cos.min() >= 0.99999, list(zip(check.inputs, cos))
        # Cosine misses a wrong scale (a missing norm weight, a Dense module skipped).
        norms = np.linalg.norm(ours, axis=1) / np.linalg.norm(check.expected, axis=1)
        np.testing.assert_allclose(norms, 1.0, rtol=1e-4)
    else:  # logits and sparse vectors, element by element
        assert np.abs(ours - check.expected).max() <= 1e-4, (ours, check.expected)


def test_a_wrong_output_fails_the_check(models):  # type: ignore[no-untyped-def]
    """The comparison is strict enough to see one layer's worth of difference."""
    check = next(c for c in CHECKS if c.name == "BertModel")
    ours = run(models(check), check)
    tweaked = check.expected.copy()
    tweaked[0, 0] += 0.01 * np.linalg.norm(tweaked[0])
    assert cosines(ours, check.expected).min() >= 0.99999
    assert cosines(ours, tweaked).min() < 0.99999


def test_checks_run_without_transformers():  # type: ignore[no-untyped-def]
    """A fresh interpreter that cannot import transformers loads and runs every snapshot."""
    script = (
        "import sys\n"
        "sys.modules['transformers'] = None\n"
        "sys.modules['sentence_transformers'] = None\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from snapshot_suite import MINILM, all_checks, run\n"
        "from trt_tei_runtime import Model\n"
        "for c in all_checks():\n"
        "    if c.name != MINILM:\n"
        "        folder = f'tests/snapshots/{c.name}/checkpoint'\n"
        "        out = run(Model(folder, device='cpu', task=c.task), c)\n"
        "        assert out.shape == c.expected.shape, c.id\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_generator_reproduces_committed_snapshots(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """`make snapshots` is deterministic: regenerating rows gives the committed checkpoint
    bytes, and outputs within float noise (BLAS may differ across machines)."""
    import importlib.util

    from safetensors.numpy import load_file

    spec = importlib.util.spec_from_file_location("snapshot_generator", GENERATOR)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, generator)  # dataclasses look it up
    spec.loader.exec_module(generator)
    entries = manifest()["snapshots"]
    for name in ("BertModel", "Qwen3ForCausalLM"):
        generator.generate_row(tmp_path / name, name)
        files = generator.snapshot_files(tmp_path / name)
        committed = entries[name]["files"]
        assert set(files) == set(committed), name
        for file, digest in files.items():
            if file != "outputs.safetensors":
                assert digest == committed[file], f"{name}/{file}: {REGENERATE}"
        fresh = load_file(str(tmp_path / name / "outputs.safetensors"))
        stored = load_file(str(ROOT / name / "outputs.safetensors"))
        assert fresh.keys() == stored.keys()
        for key in fresh:
            np.testing.assert_allclose(fresh[key], stored[key], rtol=1e-5, atol=1e-6)
