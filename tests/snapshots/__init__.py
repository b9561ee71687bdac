"""The snapshot suite: one folder per row (a tiny checkpoint, its inputs, the reference
outputs), written by generate.py from rows.py (the checkpoints) and references.py (the
inputs and reference outputs), and manifest.json, which records every file's sha256 and the
generator's (`generator_sha256`). Read by tests/snapshot_suite.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
# The files whose code decides the snapshots' bytes, relative to tests/: the generator and
# the modules of tests/checkpoints/ it builds with.
GENERATOR_FILES = [
    "snapshots/__init__.py",
    "snapshots/generate.py",
    "snapshots/references.py",
    "snapshots/rows.py",
    "checkpoints/colbert.py",
    "checkpoints/configs.py",
    "checkpoints/st_modules.py",
    "checkpoints/vision.py",
    "checkpoints/vocab.py",
    "checkpoints/weights.py",
]


def generator_sha256() -> str:
    """The sha256 of `sha256sum GENERATOR_FILES`'s output (run in tests/)."""
    listing = "".join(
        f"{hashlib.sha256((TESTS / name).read_bytes()).hexdigest()}  {name}\n"
        for name in GENERATOR_FILES
    )
    return hashlib.sha256(listing.encode()).hexdigest()
