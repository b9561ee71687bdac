"""The one corpus-job driver: checks the options, the input and the output folder before any
model loads, writes (or checks) the manifest, and records the run, whichever executor
embeds the shards: `LocalShardExecutor` (local_executor.py: one `Model` in this process, or
a worker process per device) or `RayShardExecutor` (ray_executor.py: model actors on a Ray
cluster).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import pyarrow as pa

from .. import __version__
from .device_workers import DEVICE_WORKER_MODES
from .errors import BadRowError, CorpusError
from .options import BAD_ROW_POLICIES, LONG_INPUT_MODES, VERIFY_MODES, JobOptions
from .progress import Progress, Summary
from .reader import InputReader, open_input
from .rows import BadRow, output_schema
from .store import OutputStore

PREFETCH_CHUNKS = 2  # tokenized chunks waiting for the model: bounds memory


@dataclass
class JobRun:
    """One run of a job, as the driver hands it to an executor: where rows come from and go,
    the shards already done, and the progress and summary the executor updates."""

    reader: InputReader
    store: OutputStore
    schema: pa.Schema
    finished: set[int]
    progress: Progress
    summary: Summary
    total: Optional[int]  # the input's rows, if known


class ShardExecutor(Protocol):
    """What embeds a job's unfinished shards, for `run_job`."""

    def open(self, options: JobOptions) -> tuple[int, JobOptions]:
        """Loads the model (or starts the workers) and checks the prompt name; returns the
        model's hidden size and the options as the executor runs them, which the manifest
        records. `close` runs after it whether it returns or raises."""

    def embed(self, run: JobRun) -> None:
        """Embeds and commits every unfinished shard of `run`."""

    def count_devices(self, summary: Summary, progress: Progress) -> None:
        """Sets the summary's tokens per device, if the executor did not as it went."""

    def close(self) -> None: ...


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
    if options.device_workers not in DEVICE_WORKER_MODES:
        raise CorpusError(f"--device-workers must be one of {DEVICE_WORKER_MODES}")
    if options.long_input not in LONG_INPUT_MODES:
        raise CorpusError(f"--long-input must be one of {LONG_INPUT_MODES}")
    if options.chunk_overlap < 0:
        raise CorpusError(f"--chunk-overlap must be at least 0, got {options.chunk_overlap}")
    if options.max_chunks < 1:
        raise CorpusError(f"--max-chunks must be at least 1, got {options.max_chunks}")
    if options.ray_actors is not None and options.ray_actors <= 0:
        raise CorpusError(f"--ray-actors must be positive, got {options.ray_actors}")


def open_job(options: JobOptions, progress: Progress) -> tuple[InputReader, OutputStore]:
    """Checks arguments, the input and the output folder, all before a model loads."""
    check_options(options)
    reader = open_input(
        options.input,
        options.input_column,
        options.id_column,
        images=options.image_column is not None,
    )
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


def bad_row_error(bad: list[BadRow]) -> BadRowError:
    """The fail policy's error, naming the first bad row."""
    return BadRowError(
        f"{bad[0].describe()}. Finished shards are kept: fix the input (a new input "
        "starts over) or run again with --on-bad-row skip to resume, skipping bad rows"
    )


def check_bad_rows(bad: list[BadRow], options: JobOptions, progress: Progress) -> None:
    for row in bad:
        progress.bad_row(row)
    if bad and options.on_bad_row == "fail":
        raise bad_row_error(bad)


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


def run_job(options: JobOptions, progress: Progress, executor: ShardExecutor) -> Summary:
    """Runs the job with `executor` embedding the shards; returns its summary."""
    reader, store = open_job(options, progress)
    try:
        try:
            hidden_size, options = executor.open(options)
            dim = embedding_dim(options, hidden_size)
            schema, finished = begin_output(options, reader, store, dim)
            summary = Summary(output=str(store.directory))
            summary.resumed_rows = finished_rows(store, finished)
            try:
                _embed(executor, reader, store, schema, finished, progress, summary)
            except BaseException as exc:
                _finish_summary(executor, summary, progress)
                store.record_run({**summary.as_dict(), "error": f"{type(exc).__name__}: {exc}"})
                progress.close()
                raise
            _finish_summary(executor, summary, progress)
            if summary.complete:
                store.finish(summary.total_rows or 0, summary.as_dict())
            progress.summary(summary)
            return summary
        finally:
            executor.close()
    finally:
        store.close()


def _embed(
    executor: ShardExecutor,
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
    executor.embed(JobRun(reader, store, schema, finished, progress, summary, total))


def _finish_summary(executor: ShardExecutor, summary: Summary, progress: Progress) -> None:
    summary.rows = progress.rows - summary.bad_rows
    summary.tokens, summary.seconds = progress.tokens, progress.elapsed
    executor.count_devices(summary, progress)
