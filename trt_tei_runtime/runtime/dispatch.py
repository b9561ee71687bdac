"""Running a stream of batches over several executors, each kept busy.

A feeder thread pulls jobs from the caller's iterator (which may tokenize as it goes: that
work then overlaps the devices'), and one worker thread per executor takes the next job
whenever its device can take one. A worker launches batch k+1 before it waits for batch
k's result to reach the host (a non-blocking copy into pinned memory), so the device never
idles while the host reads back or builds the next batch. Results come back as they finish,
each with its job's key; the caller puts them in order.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from ..batch import PackedBatch
from .executor import Executor

Method = Callable[[Executor, PackedBatch], torch.Tensor]
# What a job's method takes: a packed batch of tokens, or an image batch's pixels.
B = TypeVar("B")


@dataclass
class Job(Generic[B]):
    key: Any  # the caller's: e.g. which rows the batch holds
    batch: B


@dataclass
class _Done:
    job: Job[Any]
    result: torch.Tensor
    device: torch.device


_END = object()
# How often a waiting thread looks whether the caller stopped.
POLL_S = 0.05


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def run_jobs(
    executors: list[Executor],
    jobs: Iterable[Job[B]],
    method: Callable[[Executor, B], torch.Tensor],
) -> Iterator[tuple[Job[B], torch.Tensor, torch.device]]:
    """Yields `(job, host result, device it ran on)` for every job, in completion order.
    The first exception (from the iterator or a device) stops the feeding and is raised."""
    todo: queue.Queue[Any] = queue.Queue(maxsize=2 * len(executors))
    done: queue.Queue[Any] = queue.Queue()
    stop = threading.Event()

    def put(item: Any) -> bool:
        """Queues `item` unless the caller stopped; never blocks past a stop."""
        while not stop.is_set():
            try:
                todo.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def feed() -> None:
        try:
            for job in jobs:
                if not put(job):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            done.put(_Failure(exc))
        finally:
            for _ in executors:
                put(_END)

    def work(executor: Executor) -> None:
        pending: tuple[Job[B], torch.Tensor, Callable[[], None]] | None = None

        def deliver() -> None:
            nonlocal pending
            if pending is not None:
                pending[2]()
                done.put(_Done(pending[0], pending[1], executor.device))
                pending = None

        try:
            while not stop.is_set():
                try:
                    job = todo.get(timeout=POLL_S)
                except queue.Empty:
                    deliver()  # nothing to launch meanwhile: hand the last result over
                    continue
                if job is _END:
                    deliver()
                    break
                with executor.bulk.active():
                    host, wait = to_host(method(executor, job.batch))
                deliver()
                pending = (job, host, wait)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            done.put(_Failure(exc))
        finally:
            done.put(_END)

    threads = [threading.Thread(target=feed, name="dispatch-feed", daemon=True)]
    threads += [
        threading.Thread(target=work, args=(ex,), name=f"dispatch-{ex.device}", daemon=True)
        for ex in executors
    ]
    for thread in threads:
        thread.start()
    workers_left = len(executors)
    try:
        while workers_left:
            item = done.get()
            if item is _END:
                workers_left -= 1
            elif isinstance(item, _Failure):
                raise item.exc
            else:
                yield item.job, item.result, item.device
    finally:
        # Every thread sees the stop within POLL_S or once its current batch (or the
        # caller's iterator step) returns; none may still use an executor after this call.
        stop.set()
        for thread in threads:
            thread.join()


def to_host(tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
    """The tensor's host copy and a function that waits until it is complete; call it on
    the tensor's device's lane."""
    if tensor.device.type != "cuda":
        return tensor, _nothing
    host = tensor.to("cpu", non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready.synchronize


def _nothing() -> None:
    return None
