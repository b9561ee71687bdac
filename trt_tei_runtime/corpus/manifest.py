"""The output folder's `manifest.json`: what was asked, and which shards are finished.

A shard is finished only once it is listed here; the listing is written after the shard's
file is in place (store.py), so a shard file the manifest does not list is redone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .errors import CorpusError
from .rows import MAX_BAD_ROW_SAMPLES

FORMAT = "trt-tei-embed/1"
MANIFEST_NAME = "manifest.json"


def shard_file_name(index: int) -> str:
    return f"shard-{index:06d}.parquet"


@dataclass
class ShardEntry:
    index: int
    file: str
    start: int  # first input row (ordinal)
    stop: int  # one past the last input row
    rows: int  # rows stored: stop - start less bad rows
    bad_rows: int
    num_tokens: int
    bytes: int
    sha256: str
    bad_row_samples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardEntry:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class Manifest:
    model: str
    options: dict[str, Any]  # output-affecting options (JobOptions.output_identity less model)
    input: dict[str, Any]  # InputReader.fingerprint()
    embedding_dim: int
    id_type: str
    shards: dict[int, ShardEntry] = field(default_factory=dict)
    total_rows: Optional[int] = None  # known once the whole input has been read
    complete: bool = False
    last_run: Optional[dict[str, Any]] = None
    tool_version: str = ""

    @property
    def num_shards(self) -> Optional[int]:
        if self.total_rows is None:
            return None
        rows = int(self.options["shard_rows"])
        return -(-self.total_rows // rows)

    def as_dict(self) -> dict[str, Any]:
        shards = [self.shards[i] for i in sorted(self.shards)]
        samples: list[dict[str, Any]] = []
        for entry in shards:
            samples.extend(entry.bad_row_samples[: MAX_BAD_ROW_SAMPLES - len(samples)])
        return {
            "format": FORMAT,
            "tool_version": self.tool_version,
            "model": self.model,
            "input": self.input,
            "options": self.options,
            "embedding_dim": self.embedding_dim,
            "columns": {
                "id": self.id_type,
                "embedding": f"fixed_size_list<float32>[{self.embedding_dim}]",
                "num_tokens": "int32",
            },
            "complete": self.complete,
            "total_rows": self.total_rows,
            "num_shards": self.num_shards,
            "rows": sum(e.rows for e in shards),
            "bad_rows": {"count": sum(e.bad_rows for e in shards), "rows": samples},
            "shards": [e.as_dict() for e in shards],
            "last_run": self.last_run,
        }

    def to_json(self) -> bytes:
        return (json.dumps(self.as_dict(), indent=1) + "\n").encode()

    @classmethod
    def load(cls, path: Path) -> Manifest:
        try:
            data = json.loads(path.read_bytes())
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT!r}")
            return cls(
                model=data["model"],
                options=data["options"],
                input=data["input"],
                embedding_dim=int(data["embedding_dim"]),
                id_type=data["columns"]["id"],
                shards={int(e["index"]): ShardEntry.from_dict(e) for e in data.get("shards", [])},
                total_rows=data.get("total_rows"),
                complete=bool(data.get("complete")),
                last_run=data.get("last_run"),
                tool_version=data.get("tool_version", ""),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CorpusError(
                f"{path} is not a readable trt-tei-embed manifest ({exc}); pass --overwrite "
                "to start the job over"
            ) from exc


def mismatches(
    manifest: Manifest, model: str, options: dict[str, Any], input_fp: dict[str, Any]
) -> list[str]:
    """How an existing job differs from the one asked for, one line per difference."""
    found = []
    if manifest.model != model:
        found.append(f"model: {manifest.model!r} in the output, {model!r} now")
    for key in sorted(set(manifest.options) | set(options)):
        old, new = manifest.options.get(key), options.get(key)
        if old != new:
            found.append(f"{key}: {old!r} in the output, {new!r} now")
    for key in ("path", "size", "mtime_ns"):
        old, new = manifest.input.get(key), input_fp.get(key)
        if old != new:
            found.append(f"input {key}: {old!r} in the output, {new!r} now")
    return found
