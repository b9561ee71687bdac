"""The driver's side of `--device-workers processes`: one worker process per device
(worker_process.py), chunks of token ids handed out as workers have room, vectors handed
back in input order.

`WorkerPool` stands in for the `Model` of a local job (it has what `LocalShardExecutor`
uses: `info`, `tokenize_ids`, `embed_ids_stream`, `tokens_per_device`), so shards are still
assembled, written and committed in order by that one code path: the pool changes where
chunks are embedded, not what the job does with them. Tokenizing stays here, in the
driver's reader thread (the tokenizer releases the interpreter lock and runs on every core),
so a worker only runs its model.

The driver's main thread never blocks on a pipe a worker fills: each worker's answers are
read by a receiver thread of its own into one inbox, so a worker sends its vectors as soon
as they are ready, whatever the driver is doing (tokenizing the next chunk, waiting for a
write), and its device never waits for the driver to come round.

A worker that dies (killed, out of memory, a crash of the process) loses no row: its pipe
closes, the chunks it held go back to the front of the queue for the workers still alive,
and a new process is started on its device (`WORKER_RESTARTS` times per device). A chunk is
answered once, by whichever worker finished it. An exception a worker reports (a bad
checkpoint, a device error) fails the job as it would in one process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any, Optional, TypeAlias, TypeVar

import numpy as np

from ..errors import DeviceError
from ..long_inputs import DEFAULT_MAX_CHUNKS, Windows
from ..runtime import ModelInfo
from ..token_ids import TokenIds
from ..tokenization import TextTokenizer
from .worker_process import WorkerSettings, worker_main

K = TypeVar("K")

WORKER_RESTARTS = 3  # per device; a device whose worker dies once more is left out
# One chunk running, the next queued behind it in the worker's own stream (its device does
# not drain between chunks), one more in the pipe: a worker never waits for the driver.
CHUNKS_IN_FLIGHT_PER_WORKER = 3
STOP_WAIT_S = 10.0  # a worker with nothing left to do exits at once; this is a backstop
# How often the driver, while no answer comes, checks that its workers are still alive (a
# dead worker's pipe closes at once; this catches one whose pipe a child process holds open).
LIVENESS_CHECK_S = 1.0


@dataclass
class _Task:
    seq: int  # position in the stream: answers are yielded in this order
    shard: int  # for the test hook only
    ids: TokenIds


# Every worker's answers, as (worker, message); message None: that worker's pipe closed.
Inbox: TypeAlias = "queue.Queue[tuple[_Worker, Optional[tuple[Any, ...]]]]"


class _Worker:
    """The driver's handle on one worker process and the chunks it holds."""

    def __init__(
        self,
        ctx: Any,
        index: int,
        name: str,
        device: str,
        settings: WorkerSettings,
        inbox: Inbox,
    ) -> None:
        self.index, self.name, self.device = index, name, device
        tasks_in, tasks_out = ctx.Pipe(duplex=False)
        results_in, results_out = ctx.Pipe(duplex=False)
        self.tasks: Connection = tasks_out
        self.results: Connection = results_in
        self.process = ctx.Process(
            target=worker_main,
            args=(settings, device, tasks_in, results_out),
            name=f"trt-tei-embed worker {name}",
            daemon=True,  # never outlives the driver's interpreter
        )
        self.process.start()
        # The worker's ends: closed here, so that its death closes the pipe (EOF).
        tasks_in.close()
        results_out.close()
        self.ready = False
        self.in_flight: dict[int, _Task] = {}
        self._receiver = threading.Thread(
            target=self._receive, args=(inbox,), name=f"results-{name}", daemon=True
        )
        self._receiver.start()

    def _receive(self, inbox: Inbox) -> None:
        """Every answer into the driver's inbox as it arrives; `None` once the pipe closes
        (the worker exited or died)."""
        try:
            while True:
                inbox.put((self, self.results.recv()))
        except (EOFError, OSError):
            inbox.put((self, None))

    def stop(self, graceful: bool) -> Optional[int]:
        """Ends the process (asked to, if it is idle; else killed); returns its exit code."""
        if graceful:
            try:
                self.tasks.send(None)
            except OSError:
                pass
            self.process.join(STOP_WAIT_S)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.tasks.close()
        # Its end closed by the exit: the receiver has seen EOF or is about to.
        self._receiver.join(STOP_WAIT_S)
        self.results.close()
        return self.process.exitcode


def worker_names(devices: Sequence[str]) -> list[str]:
    """A device's name, numbered when a device repeats (`cpu,cpu`): the summary's keys."""
    return [d if devices.count(d) == 1 else f"{d}#{i}" for i, d in enumerate(devices)]


class WorkerPool:
    """Worker processes, one per device of `devices`, each with its own `Model`."""

    def __init__(
        self, settings: WorkerSettings, devices: Sequence[str], warn: Callable[[str], None]
    ) -> None:
        if settings.cpu_threads is None:
            # Each worker's torch thread pool is the size of the host by default, and N of
            # them contend for the same cores. CPU workers run the model there: they share
            # the cores. A GPU worker's host work is copies (assembling and normalizing a
            # chunk's vectors), memory-bound: a few threads each, half the cores left to
            # the driver's tokenizer. (On 4 H200s with 64 cores and full pools, the workers'
            # main threads spent most of their time in those copies.)
            cores = os.cpu_count() or 1
            cpus = sum(1 for d in devices if d.startswith("cpu"))
            share = cores // cpus if cpus else cores // (2 * len(devices))
            settings = replace(settings, cpu_threads=max(1, share))
        self.settings = settings
        self.devices = list(devices)
        self.names = worker_names(self.devices)
        self._warn = warn
        self._ctx = mp.get_context("spawn")  # a fresh interpreter: no CUDA state inherited
        self._restarts = [0] * len(self.devices)
        self._queue: deque[_Task] = deque()  # chunks to hand out; retries go first
        self._inbox: Inbox = queue.Queue()
        self._tokens: Counter[str] = Counter()
        self._workers: list[Optional[_Worker]] = []
        self._infos: list[ModelInfo] = []  # each ready worker's
        try:
            self._workers = [self._start(i) for i in range(len(self.devices))]
            while not all(w is None or w.ready for w in self._workers):
                self._collect({})
        except BaseException:
            self.close()
            raise
        self.info = info = self._infos[0]  # the model's: every worker loads the same
        self._tokenizer = TextTokenizer(
            info.model_dir,
            info.max_input_length,
            prompts=info.prompts,
            default_prompt_name=info.default_prompt_name,
            pair_template=info.pair_template,
            adapters=info.adapters,
            padding=info.text_padding,
        )

    def tokenize_ids(
        self, texts: Sequence[str], *, prompt_name: Optional[str] = None, truncate: bool = True
    ) -> TokenIds:
        """`Model.tokenize_ids`, in the driver (the workers' model's own tokenizer rules)."""
        ids, _ = self._tokenizer.encode_ids(list(texts), prompt_name or None, truncate=truncate)
        return ids

    def tokenize_windows(
        self,
        texts: Sequence[str],
        *,
        prompt_name: Optional[str] = None,
        overlap: int = 0,
        max_chunks: int = DEFAULT_MAX_CHUNKS,
    ) -> Windows:
        """`Model.tokenize_windows`, in the driver."""
        return self._tokenizer.encode_windows(
            list(texts), prompt_name or None, overlap=overlap, max_chunks=max_chunks
        )

    def tokens_per_device(self) -> dict[str, int]:
        return {name: self._tokens[name] for name in self.names}

    def embed_ids_stream(
        self,
        chunks: Iterable[tuple[K, TokenIds]],
        normalize: bool = True,
        dimensions: Optional[int] = None,
        prompt_name: Optional[str] = None,
    ) -> Iterator[tuple[K, np.ndarray]]:
        """`Model.embed_ids_stream` over the workers: `(key, vectors)` per chunk, in order. A
        key's `shard` attribute, if any, is what the test hook matches. The workers were
        started with the dimensions and prompt: they must be the same here."""
        settings = self.settings
        wanted = (settings.normalize, settings.dimensions, settings.prompt_name)
        if (normalize, dimensions, prompt_name) != wanted:
            raise ValueError(
                f"the workers embed with normalize, dimensions, prompt_name = {wanted}"
            )
        empty = np.zeros((0, dimensions or self.info.hidden_size), dtype=np.float32)
        source = iter(chunks)
        keys: dict[int, K] = {}
        done: dict[int, np.ndarray] = {}
        # Answers held until the ones before them are in: bounds the vectors in memory.
        window = 2 * CHUNKS_IN_FLIGHT_PER_WORKER * len(self.devices)
        next_in = next_out = 0
        exhausted = False
        while True:
            # Read ahead only while a worker can take the chunk now.
            while not exhausted and not self._queue and next_in - next_out < window:
                if self._free_worker() is None:
                    break
                try:
                    key, ids = next(source)
                except StopIteration:
                    exhausted = True
                    break
                keys[next_in] = key
                if len(ids):
                    self._queue.append(_Task(next_in, getattr(key, "shard", -1), ids))
                    self._dispatch()
                else:  # a chunk of no rows (or a marker): passes through in its place
                    done[next_in] = empty
                next_in += 1
            while next_out in done:
                yield keys.pop(next_out), done.pop(next_out)
                next_out += 1
            if exhausted and next_out == next_in:
                return
            self._collect(done)

    def close(self) -> None:
        """Stops every worker: those idle are asked to exit, the rest are killed."""
        workers, self._workers = self._workers, []
        for worker in workers:
            if worker is not None:
                worker.stop(graceful=worker.ready and not worker.in_flight)

    def _start(self, index: int) -> _Worker:
        device = self.devices[index]
        return _Worker(self._ctx, index, self.names[index], device, self.settings, self._inbox)

    def _free_worker(self) -> Optional[_Worker]:
        """The ready worker holding the fewest chunks, if it has room for one more."""
        ready = [w for w in self._workers if w is not None and w.ready]
        if not ready:
            return None
        worker = min(ready, key=lambda w: len(w.in_flight))
        return worker if len(worker.in_flight) < CHUNKS_IN_FLIGHT_PER_WORKER else None

    def _dispatch(self) -> None:
        while self._queue:
            worker = self._free_worker()
            if worker is None:
                return
            task = self._queue.popleft()
            try:
                worker.tasks.send((task.seq, task.shard, task.ids))
            except OSError:  # died since its last answer
                self._queue.appendleft(task)
                self._lost(worker)
                continue
            worker.in_flight[task.seq] = task

    def _collect(self, done: dict[int, np.ndarray]) -> None:
        """Waits for any worker to answer or die, and handles all that is there."""
        try:
            arrivals = [self._inbox.get(timeout=LIVENESS_CHECK_S)]
        except queue.Empty:
            # Nothing for a while: a worker that exited while a child of its own holds its
            # pipe open (so its receiver sees no EOF) is found here.
            for worker in self._workers:
                if worker is not None and worker.process.exitcode is not None:
                    self._lost(worker)
            arrivals = []
        while True:
            try:
                arrivals.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for worker, message in arrivals:
            if self._workers[worker.index] is not worker:
                continue  # from a worker already found dead
            if message is None:
                self._lost(worker)
            else:
                self._handle(worker, message, done)
        self._dispatch()

    def _handle(self, worker: _Worker, message: tuple[Any, ...], done: dict[int, Any]) -> None:
        kind = message[0]
        if kind == "ready":
            worker.ready = True
            self._infos.append(message[1]["info"])
        elif kind == "done":
            _, seq, vectors = message
            task = worker.in_flight.pop(seq, None)
            if task is not None:
                done[seq] = vectors
                self._tokens[worker.name] += task.ids.num_tokens
        elif kind == "error":
            raise message[2]
        else:
            raise RuntimeError(f"device worker {worker.name}: unexpected message {kind!r}")

    def _lost(self, worker: _Worker) -> None:
        """A worker died: its chunks go first to whoever is free, and its device gets a new
        process unless it has died too often."""
        held = sorted(worker.in_flight.values(), key=lambda t: t.seq)
        self._queue.extendleft(reversed(held))
        worker.in_flight.clear()
        pid = worker.process.pid
        code = worker.stop(graceful=False)
        index = worker.index
        self._restarts[index] += 1
        what = (
            f"device worker {worker.name} (pid {pid}) died (exit code {code}) holding "
            f"{len(held)} chunk(s), which are embedded again"
        )
        if self._restarts[index] <= WORKER_RESTARTS:
            self._warn(f"{what}; restarting it ({self._restarts[index]} of {WORKER_RESTARTS})")
            self._workers[index] = self._start(index)
            return
        self._workers[index] = None
        if all(w is None for w in self._workers):
            raise DeviceError(
                f"{what}; every device worker has died more than {WORKER_RESTARTS} times"
            )
        self._warn(f"{what}; it died {self._restarts[index]} times: its device is left out")
