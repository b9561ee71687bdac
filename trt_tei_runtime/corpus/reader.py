"""Streaming input: Parquet, JSONL or CSV, never the whole corpus in memory.

Each reader yields `Rows`: a run of consecutive input rows, their ids (the id column, or the
row's ordinal in the input) and their raw text values. Rows the reader itself cannot make
sense of (a JSONL line that is not JSON, a null id) carry a reason in `Rows.problems`; text
values are screened later (rows.py), so a bad row is always reported, never dropped here.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from .errors import CorpusError

FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
}
READ_BLOCK_BYTES = 8 << 20  # JSONL lines and CSV blocks are read this many bytes at a time
JSONL_SNIFF_LINES = 1000  # the id column's type and the columns' presence come from these

SkipRange = Callable[[int, int], bool]


def _never(start: int, stop: int) -> bool:
    return False


@dataclass
class Rows:
    """Input rows `start .. start + len(texts)`: ids, raw text values (any type, or None), and
    the reason for each row the reader could not read (offset within this run → reason)."""

    start: int
    ids: pa.Array
    texts: list[Any]
    problems: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def stop(self) -> int:
        return self.start + len(self.texts)

    def slice(self, begin: int, end: int) -> Rows:
        """Rows `begin .. end` in input ordinals (within this run)."""
        a, b = begin - self.start, end - self.start
        problems = {k - a: why for k, why in self.problems.items() if a <= k < b}
        return Rows(begin, self.ids.slice(a, b - a), self.texts[a:b], problems)


class InputReader:
    """One input file. `total_rows` is known up front for Parquet, and for JSONL and CSV
    once `rows()` has read to the end; until then `bytes_read` against `size` lets progress
    estimate it."""

    format = ""

    def __init__(
        self, path: Path, text_column: str, id_column: str | None, images: bool = False
    ) -> None:
        self.path = path
        self.text_column = text_column
        # The flag that names `text_column`: an image job's column holds images.
        self.column_flag = "--image-column" if images else "--text-column"
        self.id_column = id_column
        stat = path.stat()
        self.size = stat.st_size
        self.mtime_ns = stat.st_mtime_ns
        self.total_rows: int | None = None
        self.bytes_read = 0
        self.id_type: pa.DataType = pa.int64()

    def fingerprint(self) -> dict[str, Any]:
        """What says the input is the one a previous run read: path, size and mtime (hashing
        hundreds of GB to find out would take as long as reading them)."""
        return {
            "path": str(self.path),
            "format": self.format,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
        }

    def rows(self, skip: SkipRange = _never, batch_rows: int = 8192) -> Iterator[Rows]:
        """Every row in input order. A reader may leave out a block of rows `[a, b)` for which
        `skip(a, b)` is true (rows of shards already finished) without parsing it."""
        raise NotImplementedError

    def _ids(self, start: int, values: pa.Array | None, n: int) -> pa.Array:
        if values is None:
            return pa.array(range(start, start + n), type=pa.int64())
        return values

    def _missing_column(self, column: str, available: list[str]) -> CorpusError:
        return CorpusError(
            f"{self.path}: no column {column!r}; it has {sorted(available)}"
            + (f" (pick one with {self.column_flag})" if column == self.text_column else "")
        )


def open_input(
    path: Path, text_column: str, id_column: str | None, images: bool = False
) -> InputReader:
    """Opens and checks an input: the file exists, its format is known from its extension,
    and it has the text (and id) column; with `images`, `text_column` is the images' column
    (Parquet: binary, encoded images, or strings, their paths; other formats: paths)."""
    path = Path(path).expanduser().resolve()
    if not path.exists():
        raise CorpusError(f"input file {path} does not exist")
    if not path.is_file():
        raise CorpusError(f"input {path} is not a file")
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise CorpusError(
            f"input {path}: unknown extension {path.suffix!r}; expected one of "
            f"{', '.join(sorted(FORMATS))}"
        )
    if id_column is not None and id_column == text_column:
        flag = "--image-column" if images else "--text-column"
        raise CorpusError(f"--id-column and {flag} are both {text_column!r}")
    reader_cls: type[InputReader] = {
        "parquet": ParquetReader,
        "jsonl": JsonlReader,
        "csv": CsvReader,
    }[fmt]
    return reader_cls(path, text_column, id_column, images=images)


def _is_text_type(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _is_text_type(t.value_type)
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or _is_string_view(t))


def _is_binary_type(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
    )


def _is_string_view(t: pa.DataType) -> bool:
    return bool(getattr(pa.types, "is_string_view", lambda _: False)(t))


def _null_id_problems(ids: pa.Array) -> dict[int, str]:
    if ids.null_count == 0:
        return {}
    nulls = pc.is_null(ids).to_numpy(zero_copy_only=False)
    return {int(k): "null id" for k in nulls.nonzero()[0]}


class ParquetReader(InputReader):
    format = "parquet"

    def __init__(
        self, path: Path, text_column: str, id_column: str | None, images: bool = False
    ) -> None:
        super().__init__(path, text_column, id_column, images)
        try:
            self._file = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise CorpusError(f"{path} is not a readable Parquet file: {exc}") from exc
        schema = self._file.schema_arrow
        for column in [text_column] + ([id_column] if id_column else []):
            if column not in schema.names:
                raise self._missing_column(column, schema.names)
        text_type = schema.field(text_column).type
        if images and not (_is_text_type(text_type) or _is_binary_type(text_type)):
            raise CorpusError(
                f"{path}: column {text_column!r} has type {text_type}; the image column must "
                "hold encoded images (binary) or their paths (strings)"
            )
        if not images and not _is_text_type(text_type):
            raise CorpusError(
                f"{path}: column {text_column!r} has type {text_type}; the text column must "
                "hold strings"
            )
        if id_column:
            self.id_type = schema.field(id_column).type
        self.total_rows = self._file.metadata.num_rows

    def rows(self, skip: SkipRange = _never, batch_rows: int = 8192) -> Iterator[Rows]:
        columns = [self.text_column] + ([self.id_column] if self.id_column else [])
        offset = 0
        meta = self._file.metadata
        for group in range(meta.num_row_groups):
            n = meta.row_group(group).num_rows
            if skip(offset, offset + n):
                offset += n
                continue
            # One row group per call: its rows' ordinals are known from the metadata.
            for batch in self._file.iter_batches(
                batch_size=batch_rows, row_groups=[group], columns=columns
            ):
                texts = batch.column(self.text_column)
                if pa.types.is_dictionary(texts.type):
                    texts = texts.dictionary_decode()
                ids = self._ids(
                    offset, batch.column(self.id_column) if self.id_column else None, len(batch)
                )
                yield Rows(offset, ids, texts.to_pylist(), _null_id_problems(ids))
                offset += len(batch)


class CsvReader(InputReader):
    format = "csv"

    def __init__(
        self, path: Path, text_column: str, id_column: str | None, images: bool = False
    ) -> None:
        super().__init__(path, text_column, id_column, images)
        try:
            with pa_csv.open_csv(path) as probe:
                names = probe.schema.names
                types = dict(zip(names, probe.schema.types))
        except (pa.ArrowException, OSError) as exc:
            raise CorpusError(f"{path} is not a readable CSV file: {exc}") from exc
        for column in [text_column] + ([id_column] if id_column else []):
            if column not in names:
                raise self._missing_column(column, names)
        if id_column:
            # Inferred from the first block, as pyarrow's streaming reader fixes it.
            self.id_type = types[id_column]

    def rows(self, skip: SkipRange = _never, batch_rows: int = 8192) -> Iterator[Rows]:
        columns = [self.text_column] + ([self.id_column] if self.id_column else [])
        convert = pa_csv.ConvertOptions(
            column_types={self.text_column: pa.string()}, include_columns=columns
        )
        offset = 0
        with open(self.path, "rb") as raw:
            counted = _CountingFile(raw, self)
            with pa_csv.open_csv(
                counted,
                read_options=pa_csv.ReadOptions(block_size=READ_BLOCK_BYTES),
                convert_options=convert,
            ) as reader:
                while True:
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        self.total_rows = offset
                        return
                    except pa.ArrowInvalid as exc:
                        raise CorpusError(
                            f"{self.path}: cannot read the CSV after row {offset}: {exc}"
                        ) from exc
                    ids = self._ids(
                        offset,
                        batch.column(self.id_column) if self.id_column else None,
                        len(batch),
                    )
                    texts = batch.column(self.text_column).to_pylist()
                    yield Rows(offset, ids, texts, _null_id_problems(ids))
                    offset += len(batch)


class _CountingFile(io.RawIOBase):
    """A file whose reads add to `owner.bytes_read` (progress for CSV, whose total row count is
    unknown until the end)."""

    def __init__(self, raw: BinaryIO, owner: InputReader) -> None:
        self._raw = raw
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        self._owner.bytes_read += n or 0
        return n or 0


class JsonlReader(InputReader):
    """One JSON object per line; blank lines are not rows. Lines are read in blocks of
    `READ_BLOCK_BYTES` and parsed by pyarrow with a fixed schema; a block pyarrow refuses (a
    text that is not a string, a line that is not JSON) is parsed line by line in Python so
    each bad line is named."""

    format = "jsonl"

    def __init__(
        self, path: Path, text_column: str, id_column: str | None, images: bool = False
    ) -> None:
        super().__init__(path, text_column, id_column, images)
        seen: set[str] = set()
        first_ids: list[Any] = []
        with open(path, "rb") as f:
            for lineno, line in enumerate(f):
                if lineno >= JSONL_SNIFF_LINES:
                    break
                try:
                    obj = json.loads(line) if line.strip() else None
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    seen.update(obj)
                    if id_column and obj.get(id_column) is not None:
                        first_ids.append(obj[id_column])
        for column in [text_column] + ([id_column] if id_column else []):
            if column not in seen:
                raise CorpusError(
                    f"{path}: no record among the first {JSONL_SNIFF_LINES} lines has the key "
                    f"{column!r}; keys seen: {sorted(seen)}"
                )
        if id_column:
            try:
                self.id_type = pa.array(first_ids).type
            except (pa.ArrowException, TypeError) as exc:
                raise CorpusError(
                    f"{path}: the values of id column {id_column!r} do not share one type ({exc})"
                ) from exc
        fields = [(text_column, pa.string())]
        if id_column:
            fields.append((id_column, self.id_type))
        self._parse_options = pa_json.ParseOptions(
            explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore"
        )

    def rows(self, skip: SkipRange = _never, batch_rows: int = 8192) -> Iterator[Rows]:
        offset = 0
        for block in self._blocks():
            lines = [line for line in block.split(b"\n") if line.strip()]
            if not lines:
                continue
            if not skip(offset, offset + len(lines)):
                yield self._parse(offset, lines, block)
            offset += len(lines)
        self.total_rows = offset

    def _blocks(self) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            while True:
                block = f.read(READ_BLOCK_BYTES)
                if not block:
                    return
                if not block.endswith(b"\n"):
                    block += f.readline()  # whole lines only
                self.bytes_read += len(block)
                yield block

    def _parse(self, offset: int, lines: list[bytes], block: bytes) -> Rows:
        try:
            table = pa_json.read_json(
                io.BytesIO(block),
                read_options=pa_json.ReadOptions(block_size=len(block) + 1),
                parse_options=self._parse_options,
            )
        except pa.ArrowException:
            return self._parse_lines(offset, lines)
        if table.num_rows != len(lines):  # pyarrow and we disagree on a blank line: go slow
            return self._parse_lines(offset, lines)
        ids = self._ids(
            offset,
            table.column(self.id_column).combine_chunks() if self.id_column else None,
            table.num_rows,
        )
        texts = table.column(self.text_column).to_pylist()
        problems = {k: "missing or null text" for k, t in enumerate(texts) if t is None}
        problems.update(_null_id_problems(ids))
        return Rows(offset, ids, texts, problems)

    def _parse_lines(self, offset: int, lines: list[bytes]) -> Rows:
        texts: list[Any] = []
        raw_ids: list[Any] = []
        problems: dict[int, str] = {}
        for k, line in enumerate(lines):
            try:
                obj = json.loads(line)
            except ValueError as exc:
                obj, problems[k] = None, f"line is not JSON ({exc})"
            if obj is not None and not isinstance(obj, dict):
                obj, problems[k] = None, f"line is a JSON {type(obj).__name__}, not an object"
            obj = obj or {}
            texts.append(obj.get(self.text_column))
            raw_ids.append(obj.get(self.id_column) if self.id_column else None)
            if k not in problems and self.text_column not in obj:
                problems[k] = f"no key {self.text_column!r}"
        if not self.id_column:
            return Rows(offset, self._ids(offset, None, len(lines)), texts, problems)
        ids = self._id_array(offset, raw_ids)
        for k, why in _null_id_problems(ids).items():
            problems.setdefault(k, why)
        return Rows(offset, ids, texts, problems)

    def _id_array(self, offset: int, values: list[Any]) -> pa.Array:
        try:
            return pa.array(values, type=self.id_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass
        for k, value in enumerate(values):
            try:
                pa.array([value], type=self.id_type)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                raise CorpusError(
                    f"{self.path}: row {offset + k}: id {value!r} is not of the id column's "
                    f"type {self.id_type} (taken from the first lines): {exc}"
                ) from exc
        raise AssertionError("unreachable")  # pragma: no cover
