"""The output folder: one writer at a time (a lock file), the manifest, finished shards.

Commit order is what makes a job resumable: a shard's file is renamed into place first, the
manifest listing it is replaced second. A run killed between the two leaves a file the
manifest does not list: it is redone. Temporary files of killed runs are removed on open.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import pyarrow as pa

from .errors import CorpusError, OutputMismatchError
from .manifest import MANIFEST_NAME, Manifest, ShardEntry, mismatches
from .shards import ShardWriter, atomic_write, is_temp, verify_shard

LOCK_NAME = ".trt-tei-embed.lock"
SHARD_GLOB = "shard-*.parquet"


class OutputStore:
    def __init__(self, directory: Path, warn: Callable[[str], None]) -> None:
        self.directory = directory
        self.warn = warn
        self.manifest: Optional[Manifest] = None
        self._lock_fd: Optional[int] = None

    @classmethod
    def open(cls, path: Path, *, overwrite: bool, warn: Callable[[str], None]) -> OutputStore:
        directory = Path(path).expanduser().resolve()
        if directory.exists() and not directory.is_dir():
            raise CorpusError(f"output {directory} exists and is not a directory")
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CorpusError(f"cannot create the output directory {directory}: {exc}") from exc
        store = cls(directory, warn)
        store._lock()
        try:
            store._clean_temporaries()
            if overwrite:
                store._remove_job()
            store._load()
        except BaseException:
            store.close()
            raise
        return store

    def _lock(self) -> None:
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise CorpusError(
                f"another trt-tei-embed is writing to {self.directory} (it holds {LOCK_NAME})"
            ) from exc
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the lock
            self._lock_fd = None

    def _clean_temporaries(self) -> None:
        for path in self.directory.iterdir():
            if is_temp(path):
                path.unlink(missing_ok=True)

    def _remove_job(self) -> None:
        (self.directory / MANIFEST_NAME).unlink(missing_ok=True)
        for path in self.directory.glob(SHARD_GLOB):
            path.unlink()

    def _load(self) -> None:
        path = self.directory / MANIFEST_NAME
        if path.exists():
            self.manifest = Manifest.load(path)
        elif any(self.directory.glob(SHARD_GLOB)):
            raise CorpusError(
                f"{self.directory} holds shard files but no {MANIFEST_NAME}; pass --overwrite "
                "to replace them, or pick another --output"
            )

    def check(self, model: str, options: dict[str, Any], input_fp: dict[str, Any]) -> None:
        """Fails if the folder holds another job (before the model is loaded: fast)."""
        if self.manifest is None:
            return
        found = mismatches(self.manifest, model, options, input_fp)
        if found:
            raise OutputMismatchError(
                f"{self.directory} holds a job with other output-affecting settings:\n  "
                + "\n  ".join(found)
                + "\npass --overwrite to start over, or pick another --output"
            )

    def begin(
        self,
        model: str,
        options: dict[str, Any],
        input_fp: dict[str, Any],
        embedding_dim: int,
        id_type: pa.DataType,
        tool_version: str,
    ) -> Manifest:
        self.check(model, options, input_fp)
        if self.manifest is not None:
            if self.manifest.embedding_dim != embedding_dim or self.manifest.id_type != str(
                id_type
            ):
                raise OutputMismatchError(
                    f"{self.directory}: the output has {self.manifest.embedding_dim}-dim vectors "
                    f"and ids of type {self.manifest.id_type}; this run makes {embedding_dim}-dim "
                    f"and {id_type} (did the model's files or the input change?); pass "
                    "--overwrite to start over"
                )
            return self.manifest
        self.manifest = Manifest(
            model=model,
            options=options,
            input=input_fp,
            embedding_dim=embedding_dim,
            id_type=str(id_type),
            tool_version=tool_version,
        )
        self._save()
        return self.manifest

    def finished_shards(self, full: bool) -> set[int]:
        """Indices of shards that are listed and whose files check out. A shard that fails
        its check is dropped from the manifest and its file removed: it will be redone."""
        manifest = self._manifest()
        dropped = False
        for index in sorted(manifest.shards):
            entry = manifest.shards[index]
            reason = verify_shard(self.directory, entry, full)
            if reason is not None:
                self.warn(f"shard {index} ({entry.file}): {reason}; redoing it")
                del manifest.shards[index]
                (self.directory / entry.file).unlink(missing_ok=True)
                manifest.complete = False
                dropped = True
        if dropped:
            self._save()
        return set(manifest.shards)

    def writer(self, index: int, start: int, schema: pa.Schema) -> ShardWriter:
        return ShardWriter(self.directory, index, start, schema)

    def commit(self, entry: ShardEntry) -> None:
        self._manifest().shards[entry.index] = entry
        self._save()

    def finish(self, total_rows: int, last_run: dict[str, Any]) -> None:
        manifest = self._manifest()
        manifest.total_rows = total_rows
        manifest.last_run = last_run
        expected = set(range(manifest.num_shards or 0))
        manifest.complete = set(manifest.shards) == expected
        if not manifest.complete:
            raise RuntimeError(
                f"input read to the end, but shards {sorted(expected - set(manifest.shards))} "
                "are not finished"
            )
        self._save()

    def record_run(self, last_run: dict[str, Any]) -> None:
        """A summary for a run that did not finish (it failed, or was interrupted)."""
        if self.manifest is not None:
            self.manifest.last_run = last_run
            self._save()

    def _manifest(self) -> Manifest:
        if self.manifest is None:
            raise RuntimeError("OutputStore.begin was not called")
        return self.manifest

    def _save(self) -> None:
        atomic_write(self.directory / MANIFEST_NAME, self._manifest().to_json())
