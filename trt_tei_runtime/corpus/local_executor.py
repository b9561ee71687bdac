"""A corpus job on one machine: one `Model` (one device or several) or one worker process
per device (worker_pool.py), input read and tokenized in a thread one or two chunks ahead
of them, shards committed in order as they finish.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Optional, Union

import numpy as np

from ..token_ids import TokenIds
from .ahead import ahead
from .device_workers import process_devices
from .driver import PREFETCH_CHUNKS, JobRun, check_bad_rows, run_job
from .errors import CorpusError
from .image_rows import ImageChunk, embed_images, image_problem, read_images
from .loading import check_chunking, load_model
from .options import JobOptions
from .plan import InputEnd, Piece, PlanItem, ShardEnd, plan
from .progress import Progress, Summary
from .rows import EmbeddingModel, Tokenized, screen, shard_rows, tokenize
from .shards import ShardWriter
from .store import OutputStore

# Chunks of vectors waiting to be written (and shards to be committed) while the model
# runs the next chunk: the device does not idle while Parquet, fsync and sha256 run.
PENDING_WRITES = 2


@dataclass
class Chunk:
    shard: int
    tokenized: Union[Tokenized, ImageChunk]


StreamItem = Union[Chunk, ShardEnd, InputEnd]
NO_IDS = TokenIds(np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64))
NO_VECTORS = np.zeros((0, 0), dtype=np.float32)


def tokenized_plan(
    model: EmbeddingModel, items: Iterator[PlanItem], options: JobOptions
) -> Iterator[Union[Chunk, ShardEnd, InputEnd]]:
    """What runs ahead of the model, in the reader thread: read, screen, tokenize."""
    for item in items:
        if isinstance(item, Piece):
            screened = screen(item.rows)
            tokenized = tokenize(model, screened, options.prompt_name, options.chunking)
            yield Chunk(item.shard, tokenized)
        else:
            yield item


def image_plan(
    items: Iterator[PlanItem], options: JobOptions, tokens_per_image: int
) -> Iterator[Union[Chunk, ShardEnd, InputEnd]]:
    """`tokenized_plan` of an image job: read, screen, read the images' files."""
    folder = options.images_folder()
    for item in items:
        if isinstance(item, Piece):
            screened = screen(item.rows, image_problem)
            yield Chunk(item.shard, read_images(screened, folder, tokens_per_image))
        else:
            yield item


def tokens_per_device(model: Any, tokens: int) -> dict[str, int]:
    """The model's own count per device when it keeps one (several devices), else all tokens
    on its one device."""
    counter = getattr(model, "tokens_per_device", None)
    if callable(counter):
        return {str(k): int(v) for k, v in counter().items()}
    return {str(getattr(model, "device", "unknown")): tokens}


def open_model(options: JobOptions, warn: Callable[[str], None]) -> Any:
    """One `Model` over `--devices` in this process, or a `WorkerPool` of one process per
    device (`--device-workers`, device_workers.py): the pool embeds chunks as the model
    would, so the rest of the job does not tell them apart."""
    devices = process_devices(options.device_workers, options.devices)
    if devices is not None and options.image_column is not None:
        raise CorpusError(
            "--image-column runs one model in this process: pass --device-workers threads "
            "(device worker processes embed texts only)"
        )
    if devices is None:
        return load_model(options.model, options.devices, options.dtype, options.prompt_name)
    from .worker_pool import WorkerPool
    from .worker_process import WorkerSettings

    settings = WorkerSettings(
        options.model,
        options.dtype,
        options.prompt_name,
        options.stream_dimensions,
        normalize=options.chunking is None,
    )
    return WorkerPool(settings, devices, warn)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def run_local(options: JobOptions, progress: Progress, model: Any = None) -> Summary:
    """Runs the job; `model` is a loaded `Model` to use instead of loading `options.model`
    (which still names the model in the manifest)."""
    return run_job(options, progress, LocalShardExecutor(model, warn=progress.warn))


class LocalShardExecutor:
    """Shards embedded in one stream (the devices do not drain between chunks) by one `Model`
    in this process or by a `WorkerPool` of device processes, written and committed on a
    thread of their own."""

    def __init__(self, model: Any = None, warn: Callable[[str], None] = _warn) -> None:
        self.model = model
        self.owned = False  # loaded here, so closed here (a pool's processes)
        self.warn = warn
        self.options: Optional[JobOptions] = None

    def open(self, options: JobOptions) -> tuple[int, JobOptions]:
        if self.model is None:
            self.model, self.owned = open_model(options, self.warn), True
        check_chunking(self.model, options.chunking)  # `close` follows if it raises
        if options.image_column is not None and self.model.info.image_input is None:
            raise CorpusError(
                f"--image-column: the model ({self.model.info.architecture}) embeds texts "
                "only; images need a text-and-image model (CLIPModel, SiglipModel, "
                "Siglip2Model)"
            )
        self.options = options
        return int(self.model.info.hidden_size), options

    def close(self) -> None:
        close = getattr(self.model, "close", None)
        if self.owned and callable(close):
            close()

    def count_devices(self, summary: Summary, progress: Progress) -> None:
        summary.devices = tokens_per_device(self.model, progress.tokens)

    def embed(self, run: JobRun) -> None:
        reader, store, schema, finished = run.reader, run.store, run.schema, run.finished
        progress, summary, total = run.progress, run.summary, run.total
        options, model = self.options, self.model
        assert options is not None
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
            tokenized = tokenized_plan(model, items, options)
            for item in ahead(tokenized, PREFETCH_CHUNKS):
                chunk = item.tokenized if isinstance(item, Chunk) else None
                yield item, chunk.token_ids if isinstance(chunk, Tokenized) else NO_IDS

        def images() -> Iterator[tuple[StreamItem, np.ndarray]]:
            """Every plan item in order, with its vectors (none for the markers); a chunk
            less the rows whose images turned out unreadable."""
            tokens = int(model.info.image_input.tokens_per_image)
            dim = schema.field("embedding").type.list_size
            for item in ahead(image_plan(items, options, tokens), PREFETCH_CHUNKS):
                if not isinstance(item, Chunk):
                    yield item, NO_VECTORS
                    continue
                assert isinstance(item.tokenized, ImageChunk)
                chunk, vectors = embed_images(model, item.tokenized, options.dimensions, dim)
                yield Chunk(item.shard, chunk), vectors

        try:
            if options.image_column is not None:
                stream: Iterator[tuple[StreamItem, np.ndarray]] = images()
            else:
                # One stream for the whole job: the devices do not drain between chunks.
                # The prompt name also picks a task adapter (jina-embeddings-v3).
                stream = model.embed_ids_stream(
                    keyed(),
                    normalize=options.chunking is None,
                    dimensions=options.stream_dimensions,
                    prompt_name=options.prompt_name,
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


def _commit(store: OutputStore, writer: ShardWriter, stop: int) -> None:
    store.commit(writer.commit(stop))
