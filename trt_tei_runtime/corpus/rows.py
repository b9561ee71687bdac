"""Rows to vectors in three steps, each where it runs best: `screen` (no model: the Ray
driver runs it), `tokenize` (the thread running ahead of the model) and `embed` (the model's
own thread). Shared by the local job, the Ray job and the Ray Data callable."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import torch

from ..long_inputs import Windows, mean_of_windows
from ..pooling import finish_embeddings
from ..token_ids import TokenIds
from .options import Chunking
from .reader import Rows

K = TypeVar("K")

# Bad rows listed by id in the manifest (the counts are exact): the first of each shard, and
# the first overall at the top. The manifest is rewritten after every shard: it stays small.
MAX_BAD_ROW_SAMPLES_PER_SHARD = 100
MAX_BAD_ROW_SAMPLES = 1000


class EmbeddingModel(Protocol):
    """What a corpus job needs of `trt_tei_runtime.Model`."""

    def tokenize_ids(
        self, texts: Sequence[str], *, prompt_name: Optional[str] = None, truncate: bool = True
    ) -> TokenIds: ...

    def tokenize_windows(
        self,
        texts: Sequence[str],
        *,
        prompt_name: Optional[str] = None,
        overlap: int = 0,
        max_chunks: int = ...,
    ) -> Windows: ...

    def embed_ids(
        self,
        ids: TokenIds,
        normalize: bool = True,
        dimensions: Optional[int] = None,
        show_progress_bar: Optional[bool] = None,
    ) -> np.ndarray: ...

    def embed_ids_stream(
        self,
        chunks: Iterable[tuple[K, TokenIds]],
        normalize: bool = True,
        dimensions: Optional[int] = None,
        prompt_name: Optional[str] = None,
    ) -> Iterator[tuple[K, np.ndarray]]: ...


@dataclass(frozen=True)
class BadRow:
    row: int  # ordinal in the input
    id: Any  # the row's id as JSON (None when the id itself is missing)
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"row": self.row, "id": self.id, "reason": self.reason}

    def describe(self) -> str:
        who = f"id {self.id!r} (row {self.row})" if self.id is not None else f"row {self.row}"
        return f"bad row {who}: {self.reason}"


@dataclass
class Screened:
    """Input rows `start .. stop` split into the usable ones (ids, texts and input ordinals)
    and the bad ones."""

    start: int
    stop: int
    ids: pa.Array
    texts: list[str]
    rows: list[int]
    bad: list[BadRow] = field(default_factory=list)

    def chunks(self, size: int) -> Iterator[Screened]:
        """Pieces of at most `size` usable rows (bad rows stay with this one)."""
        for a in range(0, len(self.texts), size):
            b = min(a + size, len(self.texts))
            yield Screened(
                self.rows[a],
                self.rows[b - 1] + 1,
                self.ids.slice(a, b - a),
                self.texts[a:b],
                self.rows[a:b],
            )

    @classmethod
    def concat(cls, parts: Sequence[Screened]) -> Screened:
        return cls(
            parts[0].start,
            parts[-1].stop,
            pa.concat_arrays([p.ids for p in parts]),
            [t for p in parts for t in p.texts],
            [r for p in parts for r in p.rows],
            [b for p in parts for b in p.bad],
        )


@dataclass(frozen=True)
class WindowLayout:
    """Which of a chunk's sequences are windows of which row (`--long-input chunk`): `counts[i]`
    windows for row i, in order, each weighted by its own tokens of the text."""

    counts: np.ndarray
    weights: np.ndarray

    def rows(self, vectors: np.ndarray, dim: int) -> np.ndarray:
        """Each row's vector from its windows' raw pooled vectors, as the server's `long_input:
        chunk` makes it: the weighted mean, cut to `dim` (Matryoshka), L2-normalized."""
        mean = mean_of_windows(torch.from_numpy(vectors), self.counts, self.weights)
        cut = dim if dim < mean.shape[1] else None
        return finish_embeddings(mean, normalize=True, dimensions=cut).numpy()


@dataclass
class Tokenized:
    start: int
    stop: int
    ids: pa.Array
    token_ids: TokenIds  # one sequence per row, or per window of a row (`windows`)
    bad: list[BadRow] = field(default_factory=list)
    windows: Optional[WindowLayout] = None

    @property
    def num_tokens(self) -> int:
        return self.token_ids.num_tokens

    @property
    def row_tokens(self) -> np.ndarray:
        """The tokens the model read for each row (all of its windows')."""
        if self.windows is None:
            return self.token_ids.lengths
        return _per_row(self.token_ids.lengths, self.windows.counts)


def _per_row(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    rows = np.repeat(np.arange(counts.size), counts.astype(np.int64))
    return np.bincount(rows, weights=values, minlength=counts.size).astype(np.int64)


def output_schema(id_type: pa.DataType, dim: int) -> pa.Schema:
    """A shard's columns: the input's id, the vector (float32 whatever the compute dtype),
    and the tokens the model read (prompt and special tokens included, after truncation)."""
    return pa.schema(
        [
            pa.field("id", id_type),
            pa.field("embedding", pa.list_(pa.float32(), dim), nullable=False),
            pa.field("num_tokens", pa.int32(), nullable=False),
        ]
    )


def json_id(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def text_problem(text: Any) -> Optional[str]:
    if text is None:
        return "missing or null text"
    if not isinstance(text, str):
        return f"text is a {type(text).__name__}, not a string"
    if not text.strip():
        return "empty text" if not text else "text is only whitespace"
    return None


def screen(rows: Rows, problem: Callable[[Any], Optional[str]] = text_problem) -> Screened:
    """`rows` split into usable and bad ones: those the reader could not read, and those
    whose value `problem` finds fault with (`image_rows.image_problem` for images)."""
    good: list[int] = []
    bad: list[BadRow] = []
    id_values: Optional[list[Any]] = None
    for k, text in enumerate(rows.texts):
        reason = rows.problems.get(k) or problem(text)
        if reason is None:
            good.append(k)
            continue
        if id_values is None:  # only rows with a problem need their id as a Python value
            id_values = rows.ids.to_pylist()
        bad.append(BadRow(rows.start + k, json_id(id_values[k]), reason))
    ordinals = [rows.start + k for k in good]
    if len(good) == len(rows):
        return Screened(rows.start, rows.stop, rows.ids, rows.texts, ordinals, bad)
    ids = rows.ids.take(pa.array(good, type=pa.int64()))
    return Screened(rows.start, rows.stop, ids, [rows.texts[k] for k in good], ordinals, bad)


def tokenize(
    model: EmbeddingModel,
    screened: Screened,
    prompt_name: Optional[str],
    chunking: Optional[Chunking] = None,
) -> Tokenized:
    if chunking is not None:
        return tokenize_windows(model, screened, prompt_name, chunking)
    token_ids = model.tokenize_ids(screened.texts, prompt_name=prompt_name)
    empty = np.flatnonzero(token_ids.lengths == 0)
    if not empty.size:
        return Tokenized(screened.start, screened.stop, screened.ids, token_ids, screened.bad)
    # Possible for tokenizers that add no special tokens (some decoders): a text of only
    # characters the vocabulary drops.
    id_values = screened.ids.to_pylist()
    bad = list(screened.bad)
    for k in empty.tolist():
        bad.append(BadRow(screened.rows[k], json_id(id_values[k]), "no tokens after tokenization"))
    keep = np.flatnonzero(token_ids.lengths > 0)
    bad.sort(key=lambda b: b.row)
    return Tokenized(
        screened.start,
        screened.stop,
        screened.ids.take(pa.array(keep, type=pa.int64())),
        token_ids.take(keep),
        bad,
    )


def tokenize_windows(
    model: EmbeddingModel, screened: Screened, prompt_name: Optional[str], chunking: Chunking
) -> Tokenized:
    """`tokenize` for `--long-input chunk`: every row cut into windows. A row needing more
    than `max_chunks` windows, or with no token of its own, is a bad row."""
    # Unbounded here, so that one long row is a bad row rather than the chunk's error.
    windows = model.tokenize_windows(
        screened.texts, prompt_name=prompt_name, overlap=chunking.overlap, max_chunks=2**31
    )
    counts, weights = windows.counts, windows.weights
    too_many = counts > chunking.max_chunks
    empty = _per_row(weights, counts) == 0
    if not (too_many.any() or empty.any()):
        layout = WindowLayout(counts, weights)
        return Tokenized(
            screened.start, screened.stop, screened.ids, windows.ids, screened.bad, layout
        )
    id_values = screened.ids.to_pylist()
    bad = list(screened.bad)
    for k in np.flatnonzero(too_many | empty).tolist():
        reason = (
            f"needs {counts[k]} windows of the model's input limit, more than --max-chunks "
            f"({chunking.max_chunks})"
            if too_many[k]
            else "no tokens after tokenization"
        )
        bad.append(BadRow(screened.rows[k], json_id(id_values[k]), reason))
    bad.sort(key=lambda b: b.row)
    keep = ~(too_many | empty)
    kept_windows = np.flatnonzero(np.repeat(keep, counts.astype(np.int64)))
    return Tokenized(
        screened.start,
        screened.stop,
        screened.ids.take(pa.array(np.flatnonzero(keep), type=pa.int64())),
        windows.ids.take(kept_windows),
        bad,
        WindowLayout(counts[keep], weights[kept_windows]),
    )


def embed(
    model: EmbeddingModel, tokenized: Tokenized, dimensions: Optional[int], schema: pa.Schema
) -> pa.RecordBatch:
    """The shard rows of a tokenized chunk: float32 vectors, L2-normalized."""
    dim = schema.field("embedding").type.list_size
    if len(tokenized.token_ids):
        chunked = tokenized.windows is not None
        # The job draws its own bar; one per chunk from the model would garble it.
        vectors = model.embed_ids(
            tokenized.token_ids,
            normalize=not chunked,
            dimensions=None if chunked else dimensions,
            show_progress_bar=False,
        )
    else:
        vectors = np.zeros((0, dim), dtype=np.float32)
    return shard_rows(tokenized, vectors, schema)


class ShardChunk(Protocol):
    """What `shard_rows` reads of a chunk: a `Tokenized` one, or an `ImageChunk`."""

    @property
    def ids(self) -> pa.Array: ...

    @property
    def windows(self) -> Optional[WindowLayout]: ...

    @property
    def row_tokens(self) -> np.ndarray: ...


def shard_rows(tokenized: ShardChunk, vectors: np.ndarray, schema: pa.Schema) -> pa.RecordBatch:
    """A tokenized chunk's rows with their vectors, as the shards store them. With windows,
    `vectors` are the windows' raw ones, averaged here into their rows'."""
    dim = schema.field("embedding").type.list_size
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if tokenized.windows is not None:
        vectors = tokenized.windows.rows(vectors, dim)
    if vectors.shape != (len(tokenized.ids), dim):
        raise RuntimeError(
            f"the model returned vectors of shape {vectors.shape}, expected "
            f"({len(tokenized.ids)}, {dim})"
        )
    return pa.record_batch(
        [
            tokenized.ids.cast(schema.field("id").type),
            pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim),
            pa.array(tokenized.row_tokens, type=pa.int32()),
        ],
        schema=schema,
    )
