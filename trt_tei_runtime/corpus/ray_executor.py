"""`trt-tei-embed --ray ADDRESS`: the same job, shards embedded by model actors on a cluster.

This process (the driver) reads and screens the input, sends each unfinished shard's usable
texts to an actor (one `Model` each: one GPU, or one CPU on a cluster without GPUs), and
commits each returned shard itself, atomically, into the output folder, which therefore
needs to exist on the driver only. Actors restart and their task is retried when a worker
dies (`max_restarts`, `max_task_retries`): a shard is committed once, from whichever attempt
finished it, so a lost worker costs time, never a row. A killed driver resumes like a local
job: run it again.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pyarrow as pa

from .ahead import ahead
from .crash_hook import CRASH_ENV, maybe_crash
from .driver import PREFETCH_CHUNKS, JobRun, bad_row_error, check_bad_rows, run_job
from .errors import CorpusError
from .options import Chunking, JobOptions
from .plan import Piece, ShardEnd, plan
from .progress import Progress, Summary
from .reader import InputReader
from .rows import BadRow, Screened, screen, shard_rows, tokenize
from .store import OutputStore

ACTOR_RESTARTS = 3  # a worker dying this many times on one actor fails the job
TASKS_IN_FLIGHT_PER_ACTOR = 2  # one running, one queued: no actor waits for the driver


@dataclass
class ShardResult:
    shard: int
    table: pa.Table
    bad: list[BadRow]
    num_tokens: int
    worker: str  # host and device, for the per-device summary
    attempts: list[str] = field(default_factory=list)


class ShardEmbedder:
    """The actor: one model, one shard per call (tokenizing ahead of the model, as locally)."""

    def __init__(
        self,
        model: str,
        dtype: Optional[str],
        prompt_name: Optional[str],
        dimensions: Optional[int],
        chunk_rows: int,
        chunking: Optional[Chunking] = None,
    ) -> None:
        from ..model import Model
        from .ray_data import default_device

        self.model = Model(model, device=default_device(), dtype=dtype)
        self.prompt_name = prompt_name
        self.dimensions = dimensions
        self.chunk_rows = chunk_rows
        self.chunking = chunking
        self.worker = f"{socket.gethostname()}/{self.model.device}/pid{os.getpid()}"

    def describe(self) -> dict[str, Any]:
        return {"hidden_size": self.model.info.hidden_size, "worker": self.worker}

    def check_options(self) -> Optional[str]:
        """What is wrong with --prompt-name or --chunk-overlap for this model, if anything."""
        from ..errors import InputError
        from .loading import check_chunking

        try:
            self.model.tokenize_ids(["x"], prompt_name=self.prompt_name)
        except InputError as exc:
            return f"--prompt-name: {exc}"
        try:
            check_chunking(self.model, self.chunking)
        except CorpusError as exc:
            return str(exc)
        return None

    def embed_shard(self, shard: int, screened: Screened, schema: pa.Schema) -> ShardResult:
        batches: list[pa.RecordBatch] = []
        bad: list[BadRow] = list(screened.bad)
        tokens = 0
        pieces = (
            tokenize(self.model, part, self.prompt_name, self.chunking)
            for part in screened.chunks(self.chunk_rows)
        )
        keyed = ((tok, tok.token_ids) for tok in ahead(pieces, PREFETCH_CHUNKS, "shard-tokenizer"))
        chunked = self.chunking is not None
        stream = self.model.embed_ids_stream(
            keyed,
            normalize=not chunked,  # windows are averaged first (shard_rows)
            dimensions=None if chunked else self.dimensions,
            prompt_name=self.prompt_name,
        )
        for tok, vectors in stream:
            batches.append(shard_rows(tok, vectors, schema))
            maybe_crash(shard)  # test hook: dies with part of the shard embedded
            bad.extend(tok.bad)
            tokens += tok.num_tokens
        bad.sort(key=lambda b: b.row)
        return ShardResult(shard, pa.Table.from_batches(batches, schema), bad, tokens, self.worker)


@dataclass
class ShardInput:
    shard: int
    stop: int
    screened: Screened


def shard_inputs(
    reader: InputReader, options: JobOptions, finished: set[int]
) -> Iterator[ShardInput]:
    """Whole unfinished shards, screened (no model needed), in input order."""
    parts: list[Screened] = []
    for item in plan(reader, options.shard_rows, options.chunk_rows, finished):
        if isinstance(item, Piece):
            parts.append(screen(item.rows))
        elif isinstance(item, ShardEnd):
            yield ShardInput(item.shard, item.stop, Screened.concat(parts))
            parts = []


def run_ray(options: JobOptions, progress: Progress) -> Summary:
    return run_job(options, progress, RayShardExecutor())


class RayShardExecutor:
    """Shards embedded by model actors on the Ray cluster at `options.ray_address`, each
    committed here as it returns."""

    def __init__(self) -> None:
        try:
            import ray
        except ImportError as exc:
            raise CorpusError(
                "--ray needs Ray: pip install 'trt-tei-runtime[ray]' (ray[data])"
            ) from exc
        self.ray: Any = ray
        self.connected = False
        self.actors: list[Any] = []
        self.options: Optional[JobOptions] = None

    def open(self, options: JobOptions) -> tuple[int, JobOptions]:
        ray = self.ray
        try:
            ray.init(
                address=options.ray_address,
                logging_level=logging.WARNING,
                configure_logging=True,
                log_to_driver=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise CorpusError(
                f"cannot connect to the Ray cluster at {options.ray_address!r}: {exc}"
            ) from exc
        self.connected = True
        from ..model import Model  # noqa: F401  (fail here, not on every actor, if it cannot import)

        model_ref = options.model
        if Path(model_ref).expanduser().exists():
            # Actors may start in another working directory.
            options = _with_model(options, str(Path(model_ref).expanduser().resolve()))
        self.options = options
        self.actors = _start_actors(ray, options)
        first = ray.get(self.actors[0].describe.remote())
        problem = ray.get(self.actors[0].check_options.remote())
        if problem:
            raise CorpusError(problem)
        return int(first["hidden_size"]), options

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        if self.connected:
            self.ray.shutdown()  # disconnects; the cluster keeps running

    def count_devices(self, summary: Summary, progress: Progress) -> None:
        pass  # counted per actor as the shards come back

    def embed(self, run: JobRun) -> None:
        assert self.options is not None
        _embed_shards(self.ray, self.actors, self.options, run)


def _start_actors(ray: Any, options: JobOptions) -> list[Any]:
    gpus = int(ray.cluster_resources().get("GPU", 0))
    count = options.ray_actors
    if count is None:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        count = gpus or max(1, sum(1 for n in nodes if n["Resources"].get("CPU", 0) >= 1))
    extra: dict[str, Any] = {}
    if os.environ.get(CRASH_ENV):  # the test hook travels to the actors, and only there
        extra["runtime_env"] = {"env_vars": {CRASH_ENV: os.environ[CRASH_ENV]}}
    actor_cls = ray.remote(ShardEmbedder).options(
        num_gpus=1 if gpus else 0,
        num_cpus=0 if gpus else 1,
        max_restarts=ACTOR_RESTARTS,
        max_task_retries=ACTOR_RESTARTS,
        **extra,
    )
    return [
        actor_cls.remote(
            options.model,
            options.dtype,
            options.prompt_name,
            options.dimensions,
            options.chunk_rows,
            options.chunking,
        )
        for _ in range(count)
    ]


def _with_model(options: JobOptions, model: str) -> JobOptions:
    from dataclasses import replace

    return replace(options, model=model)


def _embed_shards(ray: Any, actors: list[Any], options: JobOptions, run: JobRun) -> None:
    reader, store, schema, finished = run.reader, run.store, run.schema, run.finished
    progress, summary = run.progress, run.summary
    pending: dict[Any, tuple[ShardInput, int]] = {}  # ref → (shard, actor index)
    load = [0] * len(actors)
    schema_ref = ray.put(schema)

    def collect(block: bool) -> None:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=None if block else 0)
        for ref in done:
            shard_input, actor = pending.pop(ref)
            load[actor] -= 1
            result: ShardResult = ray.get(ref)
            _commit(store, shard_input, result, schema, options, progress, summary, actor)

    for shard_input in ahead(shard_inputs(reader, options, finished), 1, name="shard-reader"):
        # Screened bad rows fail the job before any cluster time is spent on the shard.
        check_bad_rows_quietly(shard_input.screened.bad, options)
        while len(pending) >= TASKS_IN_FLIGHT_PER_ACTOR * len(actors):
            collect(block=True)
        actor = min(range(len(actors)), key=lambda i: load[i])
        ref = actors[actor].embed_shard.remote(shard_input.shard, shard_input.screened, schema_ref)
        pending[ref] = (shard_input, actor)
        load[actor] += 1
        if reader.total_rows is None and reader.bytes_read:
            progress.estimate_total(int(shard_input.stop * reader.size / reader.bytes_read))
    while pending:
        collect(block=True)
    summary.total_rows, summary.complete = reader.total_rows, True


def check_bad_rows_quietly(bad: list[BadRow], options: JobOptions) -> None:
    """The fail policy, before the shard is sent; the rows are reported when it returns."""
    if bad and options.on_bad_row == "fail":
        raise bad_row_error(bad)


def _commit(
    store: OutputStore,
    shard_input: ShardInput,
    result: ShardResult,
    schema: pa.Schema,
    options: JobOptions,
    progress: Progress,
    summary: Summary,
    actor: int,
) -> None:
    check_bad_rows(result.bad, options, progress)
    start = shard_input.shard * options.shard_rows
    writer = store.writer(shard_input.shard, start, schema)
    try:
        writer.write(result.table, result.bad, result.num_tokens)
        entry = writer.commit(shard_input.stop)
    except BaseException:
        writer.abort()
        raise
    store.commit(entry)
    summary.bad_rows += len(result.bad)
    summary.shards += 1
    name = f"actor {actor}: {result.worker.rsplit('/pid', 1)[0]}"
    summary.devices[name] = summary.devices.get(name, 0) + result.num_tokens
    progress.update(shard_input.stop - start, result.num_tokens)
    progress.shard_done()
