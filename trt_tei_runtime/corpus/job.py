"""A corpus job on one machine: one `Model` (one device or several), input read and
tokenized in a thread one or two chunks ahead of it, shards committed as they finish.

Shard i holds input rows [i * shard_rows, (i + 1) * shard_rows) less bad rows, in input
order. A resumed run re-reads the input (Parquet skips finished shards' row groups, JSONL
counts their lines without parsing them) and embeds only unfinished shards.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Optional, Union

import numpy as np
import pyarrow as pa

from .. import __version__
from ..errors import InputError
from ..token_ids import TokenIds
from .ahead import ahead
from .errors import BadRowError, CorpusError
from .options import BAD_ROW_POLICIES, VERIFY_MODES, JobOptions
from .progress import Progress, Summary
from .reader import InputReader, Rows, open_input
from .rows import BadRow, EmbeddingModel, Tokenized, output_schema, screen, shard_rows, tokenize
from .shards import ShardWriter
from .store import OutputStore

PREFETCH_CHUNKS = 2  # tokenized chunks waiting for the model: bounds memory
# The devices start once the first chunk is read and tokenized: the first chunks are small
# and double up to `chunk_rows`, so a job (or a resumed one) does not open with an idle GPU.
FIRST_CHUNK_ROWS = 256
# Chunks of vectors waiting to be written (and shards to be committed) while the model
# runs the next chunk: the device does not idle while Parquet, fsync and sha256 run.
PENDING_WRITES = 2


@dataclass
class Piece:
    """Input rows of one shard, at most `chunk_rows` of them."""

    shard: int
    rows: Rows


@dataclass
class Chunk:
    shard: int
    tokenized: Tokenized


@dataclass
class ShardEnd:
    """Every row of `shard` has been handed on; its rows end at `stop`."""

    shard: int
    stop: int


@dataclass
class InputEnd:
    total_rows: int


PlanItem = Union[Piece, ShardEnd, InputEnd]
StreamItem = Union[Chunk, ShardEnd, InputEnd]
NO_IDS = TokenIds(np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64))


def check_options(options: JobOptions) -> None:
    """Argument checks that need no file and no model."""
    if options.shard_rows <= 0:
        raise CorpusError(
            f"--shard-rows must be a positive number of rows, got {options.shard_rows}"
        )
    if options.chunk_rows <= 0:
        raise CorpusError(f"--chunk-rows must be positive, got {options.chunk_rows}")
    if options.dimensions is not None and options.dimensions <= 0:
        raise CorpusError(f"--dimensions must be positive, got {options.dimensions}")
    if options.on_bad_row not in BAD_ROW_POLICIES:
        raise CorpusError(f"--on-bad-row must be one of {BAD_ROW_POLICIES}")
    if options.verify not in VERIFY_MODES:
        raise CorpusError(f"--verify must be one of {VERIFY_MODES}")
    if options.ray_actors is not None and options.ray_actors <= 0:
        raise CorpusError(f"--ray-actors must be positive, got {options.ray_actors}")


def open_job(options: JobOptions, progress: Progress) -> tuple[InputReader, OutputStore]:
    """Checks arguments, the input and the output folder, all before a model loads."""
    check_options(options)
    reader = open_input(options.input, options.text_column, options.id_column)
    store = OutputStore.open(options.output, overwrite=options.overwrite, warn=progress.warn)
    try:
        identity = options.output_identity()
        store.check(identity.pop("model"), identity, reader.fingerprint())
    except BaseException:
        store.close()
        raise
    return reader, store


def begin_output(
    options: JobOptions, reader: InputReader, store: OutputStore, embedding_dim: int
) -> tuple[pa.Schema, set[int]]:
    """Writes the manifest of a new job (or checks an existing one's) and returns the shard
    schema and the finished shards, each checked against its file."""
    identity = options.output_identity()
    model = identity.pop("model")
    store.begin(model, identity, reader.fingerprint(), embedding_dim, reader.id_type, __version__)
    finished = store.finished_shards(full=options.verify == "full")
    return output_schema(reader.id_type, embedding_dim), finished


def embedding_dim(options: JobOptions, hidden_size: int) -> int:
    if options.dimensions is None:
        return hidden_size
    if options.dimensions > hidden_size:
        raise CorpusError(
            f"--dimensions {options.dimensions} is more than the model's {hidden_size}"
        )
    return options.dimensions


def plan(
    reader: InputReader, shard_rows: int, chunk_rows: int, finished: set[int]
) -> Iterator[PlanItem]:
    """The input cut at shard boundaries and into chunks, finished shards left out, with a
    `ShardEnd` once a shard's last chunk is out and an `InputEnd` last. Chunks start at
    `FIRST_CHUNK_ROWS` rows and double up to `chunk_rows`."""

    def all_finished(start: int, stop: int) -> bool:
        return all(s in finished for s in range(start // shard_rows, (stop - 1) // shard_rows + 1))

    current: Optional[int] = None
    size = min(FIRST_CHUNK_ROWS, chunk_rows)
    for rows in reader.rows(skip=all_finished, batch_rows=chunk_rows):
        pos = rows.start
        while pos < rows.stop:
            shard = pos // shard_rows
            end = min(rows.stop, (shard + 1) * shard_rows)
            if shard in finished:
                pos = end
                continue
            if current is not None and shard != current:
                yield ShardEnd(current, (current + 1) * shard_rows)
            current = shard
            end = min(end, pos + size)
            size = min(2 * size, chunk_rows)
            yield Piece(shard, rows.slice(pos, end))
            pos = end
    total = reader.total_rows
    assert total is not None  # set by rows() at the end of the input
    if current is not None:
        yield ShardEnd(current, min((current + 1) * shard_rows, total))
    yield InputEnd(total)


def tokenized_plan(
    model: EmbeddingModel, items: Iterator[PlanItem], prompt_name: Optional[str]
) -> Iterator[Union[Chunk, ShardEnd, InputEnd]]:
    """What runs ahead of the model, in the reader thread: read, screen, tokenize."""
    for item in items:
        if isinstance(item, Piece):
            yield Chunk(item.shard, tokenize(model, screen(item.rows), prompt_name))
        else:
            yield item


def check_bad_rows(bad: list[BadRow], options: JobOptions, progress: Progress) -> None:
    for row in bad:
        progress.bad_row(row)
    if bad and options.on_bad_row == "fail":
        raise BadRowError(
            f"{bad[0].describe()}. Finished shards are kept: fix the input (a new input "
            "starts over) or run again with --on-bad-row skip to resume, skipping bad rows"
        )


def tokens_per_device(model: Any, tokens: int) -> dict[str, int]:
    """The model's own count per device when it keeps one (several devices), else all tokens
    on its one device."""
    counter = getattr(model, "tokens_per_device", None)
    if callable(counter):
        return {str(k): int(v) for k, v in counter().items()}
    return {str(getattr(model, "device", "unknown")): tokens}


def finished_rows(store: OutputStore, finished: set[int]) -> int:
    manifest = store.manifest
    assert manifest is not None
    return sum(manifest.shards[i].stop - manifest.shards[i].start for i in finished)


def is_complete(store: OutputStore, finished: set[int]) -> bool:
    manifest = store.manifest
    return bool(
        manifest is not None
        and manifest.num_shards is not None
        and finished == set(range(manifest.num_shards))
    )


def load_model(options: JobOptions) -> Any:
    from ..errors import CheckpointError
    from ..model import Model

    try:
        model = Model(options.model, device=options.devices, dtype=options.dtype)
    except (CheckpointError, InputError) as exc:
        raise CorpusError(f"cannot load model {options.model!r}: {exc}") from exc
    try:
        model.tokenize_ids(["x"], prompt_name=options.prompt_name)
    except InputError as exc:
        raise CorpusError(f"--prompt-name: {exc}") from exc
    return model


def run_local(options: JobOptions, progress: Progress, model: Any = None) -> Summary:
    """Runs the job; `model` is a loaded `Model` to use instead of loading `options.model`
    (which still names the model in the manifest)."""
    reader, store = open_job(options, progress)
    try:
        model = model if model is not None else load_model(options)
        dim = embedding_dim(options, model.info.hidden_size)
        schema, finished = begin_output(options, reader, store, dim)
        summary = Summary(output=str(store.directory))
        summary.resumed_rows = finished_rows(store, finished)
        try:
            _run(options, model, reader, store, schema, finished, progress, summary)
        except BaseException as exc:
            _finish_summary(summary, model, progress)
            store.record_run({**summary.as_dict(), "error": f"{type(exc).__name__}: {exc}"})
            progress.close()
            raise
        _finish_summary(summary, model, progress)
        if summary.complete:
            store.finish(summary.total_rows or 0, summary.as_dict())
        progress.summary(summary)
        return summary
    finally:
        store.close()


def _finish_summary(summary: Summary, model: Any, progress: Progress) -> None:
    summary.rows, summary.tokens = progress.rows - summary.bad_rows, progress.tokens
    summary.seconds = progress.elapsed
    summary.devices = tokens_per_device(model, progress.tokens)


def _commit(store: OutputStore, writer: ShardWriter, stop: int) -> None:
    store.commit(writer.commit(stop))


def _run(
    options: JobOptions,
    model: Any,
    reader: InputReader,
    store: OutputStore,
    schema: pa.Schema,
    finished: set[int],
    progress: Progress,
    summary: Summary,
) -> None:
    manifest = store.manifest
    assert manifest is not None
    total = reader.total_rows if reader.total_rows is not None else manifest.total_rows
    progress.start(total, summary.resumed_rows, len(finished))
    if is_complete(store, finished):
        summary.total_rows, summary.complete = manifest.total_rows, True
        return
    items = plan(reader, options.shard_rows, options.chunk_rows, finished)
    writer: Optional[ShardWriter] = None
    # One output thread, so writes and commits keep their order.
    output = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-output")
    pending: deque[Future[None]] = deque()

    def in_background(work: Callable[[], None]) -> None:
        pending.append(output.submit(work))
        while len(pending) > PENDING_WRITES:
            pending.popleft().result()

    def wait_for_output() -> None:
        while pending:
            pending.popleft().result()

    def keyed() -> Iterator[tuple[StreamItem, TokenIds]]:
        """Every plan item in order, with the ids to embed (none for the markers)."""
        for item in ahead(tokenized_plan(model, items, options.prompt_name), PREFETCH_CHUNKS):
            yield item, item.tokenized.token_ids if isinstance(item, Chunk) else NO_IDS

    try:
        # One stream for the whole job: the devices do not drain between chunks.
        # The prompt name also picks a task adapter (jina-embeddings-v3).
        stream = model.embed_ids_stream(
            keyed(), dimensions=options.dimensions, prompt_name=options.prompt_name
        )
        for item, vectors in stream:
            if isinstance(item, Chunk):
                tok = item.tokenized
                summary.bad_rows += len(tok.bad)
                check_bad_rows(tok.bad, options, progress)
                if writer is None:
                    writer = store.writer(item.shard, item.shard * options.shard_rows, schema)
                batch = shard_rows(tok, vectors, schema)
                in_background(partial(writer.write, batch, tok.bad, tok.num_tokens))
                progress.update(tok.stop - tok.start, tok.num_tokens)
                if total is None and reader.bytes_read:
                    progress.estimate_total(int(tok.stop * reader.size / reader.bytes_read))
            elif isinstance(item, ShardEnd):
                assert writer is not None and writer.index == item.shard
                in_background(partial(_commit, store, writer, item.stop))
                writer = None
                summary.shards += 1
                progress.shard_done()
            else:
                wait_for_output()
                summary.total_rows, summary.complete = item.total_rows, True
        wait_for_output()
    finally:
        # Nothing may write into a shard while it is aborted.
        output.shutdown(wait=True)
        if writer is not None:
            writer.abort()
