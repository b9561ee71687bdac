"""Corpora for the corpus-job tests, and reading a job's output back."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
# Words both all-MiniLM-L6-v2 and the tiny checkpoints' WordPiece vocabulary know.
WORDS = (
    "the a an of to and in is it that for on with as was at by be this are from or have not "
    "query document search engine embedding fast model text sentence long short cat dog "
    "paris france city river water blue green red house tree book read write server"
).split()


def make_texts(n: int, seed: int = 0, max_words: int = 24) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, max_words))) for _ in range(n)]


def write_corpus(path: Path, records: list[dict[str, Any]], *, row_group_size: int = 300) -> Path:
    """Writes `records` in the format `path`'s extension names (JSONL keeps Python types as
    they are, bad values included)."""
    if path.suffix == ".jsonl":
        with open(path, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)
    elif path.suffix == ".csv":
        pa_csv.write_csv(pa.Table.from_pylist(records), path)
    else:
        raise ValueError(path)
    return path


def read_output(directory: Path) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """Ids, vectors (n, dim) and token counts of every shard the manifest lists, in order."""
    manifest = json.loads((directory / "manifest.json").read_text())
    tables = [pq.read_table(directory / s["file"]) for s in manifest["shards"]]
    table = pa.concat_tables(tables)
    dim = manifest["embedding_dim"]
    vectors = table.column("embedding").combine_chunks().flatten().to_numpy()
    return (
        table.column("id").to_pylist(),
        vectors.reshape(-1, dim),
        table.column("num_tokens").to_numpy(),
    )


def manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "manifest.json").read_text())


def cli_command(*args: Any) -> list[str]:
    return [sys.executable, "-m", "trt_tei_runtime.corpus.cli", *map(str, args)]


def kill_at_first_shard(
    args: Sequence[Any], out: Path, seen: Callable[[int], None] | None = None
) -> int:
    """Runs trt-tei-embed with `args` and SIGKILLs it as soon as its first shard is in `out`
    (after calling `seen` with its pid, if given); returns its exit status."""
    proc = subprocess.Popen(
        cli_command(*args),
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "shard-000000.parquet").exists():
            assert proc.poll() is None, "the job ended before its first shard"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        if seen is not None:
            seen(proc.pid)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    return proc.returncode


def run_cli(*args: Any, env: dict[str, str] | None = None, timeout: float = 300):  # type: ignore[no-untyped-def]
    """Runs trt-tei-embed as a subprocess (stderr is a pipe: JSON progress lines)."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        cli_command(*args),
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def json_lines(stderr: str) -> list[dict[str, Any]]:
    out = []
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).min())
