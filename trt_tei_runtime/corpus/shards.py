"""Shard files: written to a temporary file in the output folder, fsynced, then renamed into
place, so a shard file under its final name is always whole; and checked again on resume."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from .manifest import ShardEntry, shard_file_name
from .rows import MAX_BAD_ROW_SAMPLES_PER_SHARD, BadRow

TEMP_MARK = ".tmp-"
_HASH_BLOCK = 8 << 20


def temp_path(final: Path) -> Path:
    """A hidden sibling of `final` that names no other writer's file (pid + random)."""
    return final.with_name(f".{final.name}{TEMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def is_temp(path: Path) -> bool:
    return path.name.startswith(".") and TEMP_MARK in path.name


def fsync_dir(directory: Path) -> None:
    """Makes a rename in `directory` durable (the entry, not only the file's bytes)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


class ShardWriter:
    """Shard `index`, written chunk by chunk (one Parquet row group each) so that memory holds
    one chunk, not a whole shard."""

    def __init__(self, directory: Path, index: int, start: int, schema: pa.Schema) -> None:
        self.index = index
        self.start = start
        self.path = directory / shard_file_name(index)
        self._tmp = temp_path(self.path)
        self._writer = pq.ParquetWriter(
            self._tmp,
            schema,
            # Float vectors do not compress; ids and token counts do.
            compression={"id": "zstd", "embedding": "none", "num_tokens": "zstd"},
            use_dictionary=["id"],
            write_statistics=["id", "num_tokens"],
        )
        self.rows = 0
        self.num_tokens = 0
        self.bad: list[BadRow] = []
        self.bad_count = 0

    def write(self, batch: pa.RecordBatch | pa.Table, bad: list[BadRow], num_tokens: int) -> None:
        if batch.num_rows:
            if isinstance(batch, pa.RecordBatch):
                self._writer.write_batch(batch)
            else:
                self._writer.write_table(batch)
        self.rows += batch.num_rows
        self.num_tokens += num_tokens
        self.bad_count += len(bad)
        self.bad.extend(bad[: MAX_BAD_ROW_SAMPLES_PER_SHARD - len(self.bad)])

    def commit(self, stop: int) -> ShardEntry:
        """Closes, fsyncs and renames the file into place; returns its manifest entry (which
        the caller must still write: until then the shard counts as unfinished)."""
        expected = stop - self.start - self.bad_count
        if self.rows != expected:
            self.abort()
            raise RuntimeError(
                f"shard {self.index}: {self.rows} rows written, expected {expected} "
                f"(rows {self.start}..{stop} less {self.bad_count} bad)"
            )
        self._writer.close()
        fsync_file(self._tmp)
        entry = ShardEntry(
            index=self.index,
            file=self.path.name,
            start=self.start,
            stop=stop,
            rows=self.rows,
            bad_rows=self.bad_count,
            num_tokens=self.num_tokens,
            bytes=self._tmp.stat().st_size,
            sha256=sha256_file(self._tmp),
            bad_row_samples=[b.as_dict() for b in self.bad],
        )
        os.replace(self._tmp, self.path)
        fsync_dir(self.path.parent)
        return entry

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:
            self._tmp.unlink(missing_ok=True)


def verify_shard(directory: Path, entry: ShardEntry, full: bool) -> Optional[str]:
    """Why a finished shard cannot be trusted, or None. `full` also re-hashes the file."""
    path = directory / entry.file
    if not path.is_file():
        return "its file is missing"
    size = path.stat().st_size
    if size != entry.bytes:
        return f"its file has {size} bytes, the manifest says {entry.bytes}"
    try:
        rows = pq.read_metadata(path).num_rows
    except (pa.ArrowException, OSError) as exc:
        return f"its file is not readable Parquet ({exc})"
    if rows != entry.rows:
        return f"its file has {rows} rows, the manifest says {entry.rows}"
    if full and sha256_file(path) != entry.sha256:
        return "its sha256 differs from the manifest's"
    return None
