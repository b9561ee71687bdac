"""The device worker process of a local job (`--device-workers processes`): one `Model` on
one device, fed token ids by the driver (worker_pool.py), answering each chunk's vectors.

Why a process: the device threads of one `Model` share one interpreter lock (see
device_workers.py); here each device has an interpreter of its own, and does nothing but run
the model: the driver reads, screens, tokenizes and writes. The chunks a worker holds run as
one `Model.embed_ids_stream`, so its device does not drain between them.

Wire, over two one-way pipes (pickled tuples; token ids and vectors as numpy arrays):
  driver → worker: `(seq, shard, TokenIds)` per chunk; `None`: no more chunks, exit.
  worker → driver: `("ready", info)` once the model is loaded; `("done", seq, vectors)` per
  chunk, in the order received; `("error", seq or None, exception)` then exit.
A worker that dies says nothing: the driver sees its pipe close and retries its chunks.
Answers go out on a sender thread: the model's thread hands a chunk's vectors over and goes
on with the next batches even while the driver is busy elsewhere.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Optional

from ..token_ids import TokenIds
from .crash_hook import maybe_crash
from .loading import load_model

# How long the model's thread may hold the interpreter before the chunk receiver gets it.
# A chunk arrives in 64 KiB pieces; at the default 5 ms per hand-over, a busy model thread
# would keep each piece waiting, and the driver's `send` with it (one driver feeds every
# worker, so that wait is every device's). The server's backend runs its lanes at this.
SWITCH_INTERVAL_S = 0.0002

Task = Optional[tuple[int, int, TokenIds]]  # (seq, shard, token ids); None: stop


@dataclass(frozen=True)
class WorkerSettings:
    """What every worker of a job loads and runs (picklable: it crosses to the process)."""

    model: str
    dtype: Optional[str]
    prompt_name: Optional[str]
    dimensions: Optional[int]
    # False when the driver averages windows (`--long-input chunk`) before normalizing.
    normalize: bool = True
    # Torch's threads per worker: the host's cores shared out, so that N workers' thread
    # pools (each the size of the host by default) do not fight over the same cores.
    cpu_threads: Optional[int] = None


def worker_main(
    settings: WorkerSettings, device: str, tasks: Connection, results: Connection
) -> None:
    """The process's entry point (multiprocessing, spawn)."""
    # Ctrl-C reaches the whole process group: the driver stops the workers itself, and a
    # traceback per worker would bury its message.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    seq: Optional[int] = None
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    sender = _Sender(results)
    try:
        import torch

        if settings.cpu_threads:
            torch.set_num_threads(settings.cpu_threads)
        if device.startswith("cuda"):
            # The current device too, so nothing (a library's handle) lands on cuda:0.
            torch.cuda.set_device(torch.device(device))
        model = load_model(settings.model, device, settings.dtype, settings.prompt_name)
        sender.send(("ready", {"info": model.info, "device": str(model.device)}))
        stream = model.embed_ids_stream(
            _chunks(tasks),
            normalize=settings.normalize,
            dimensions=settings.dimensions,
            prompt_name=settings.prompt_name,
        )
        for (seq, shard), vectors in stream:
            maybe_crash(shard)  # test hook: dies with part of a shard embedded
            sender.send(("done", seq, vectors))
    except BaseException as exc:  # reported, then the process ends: the driver decides
        sender.close()  # what was answered goes first
        _report(results, seq, exc)
        return
    sender.close()


class _Sender:
    """Sends answers on a thread of its own, in order. The driver bounds how many chunks a
    worker holds, so the answers waiting here are bounded too."""

    def __init__(self, results: Connection) -> None:
        self._outbox: queue.Queue[Optional[tuple[Any, ...]]] = queue.Queue()
        self._thread = threading.Thread(
            target=self._run, args=(results,), name="answer-sender", daemon=True
        )
        self._thread.start()

    def send(self, message: tuple[Any, ...]) -> None:
        self._outbox.put(message)

    def close(self) -> None:
        """Returns once everything sent before is out (or the driver is gone)."""
        self._outbox.put(None)
        self._thread.join()

    def _run(self, results: Connection) -> None:
        try:
            while (message := self._outbox.get()) is not None:
                results.send(message)
        except OSError:  # the driver is gone: nobody to answer
            pass


def _chunks(tasks: Connection) -> Iterator[tuple[tuple[int, int], TokenIds]]:
    """The driver's chunks, received on a thread that always reads: the driver's `send`
    never waits for the model (it would not read vectors meanwhile, and the worker would
    wait to send them: a deadlock). The driver bounds how many are in flight."""
    inbox: queue.Queue[Task] = queue.Queue()

    def receive() -> None:
        try:
            while True:
                task = tasks.recv()
                inbox.put(task)
                if task is None:
                    return
        except (EOFError, OSError):  # the driver is gone: finish what is here, then stop
            inbox.put(None)

    threading.Thread(target=receive, name="chunk-receiver", daemon=True).start()
    while (task := inbox.get()) is not None:
        seq, shard, ids = task
        yield (seq, shard), ids


def _report(results: Connection, seq: Optional[int], exc: BaseException) -> None:
    """Sends the exception as is when it pickles (the driver raises the same class: a bad
    checkpoint stays bad input, a lost GPU a `DeviceError`), else as text."""
    try:
        results.send(("error", seq, exc))
    except Exception:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            results.send(("error", seq, RuntimeError(f"device worker pid {os.getpid()}: {text}")))
        except Exception:
            pass  # the driver is gone too
