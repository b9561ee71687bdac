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
from typing import Any

import torch

from ..batch import PackedBatch
from .executor import Executor

Method = Callable[[Executor, PackedBatch], torch.Tensor]


@dataclass
class Job:
    key: Any  # the caller's: e.g. which rows the batch holds
    batch: PackedBatch


@dataclass
class _Done:
    job: Job
    result: torch.Tensor
    device: torch.device


_END = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def run_jobs(
    executors: list[Executor], jobs: Iterable[Job], method: Method
) -> Iterator[tuple[Job, torch.Tensor, torch.device]]:
    """Yields `(job, host result, device it ran on)` for every job, in completion order.
    The first exception (from the iterator or a device) stops the feeding and is raised."""
    todo: queue.Queue[Any] = queue.Queue(maxsize=2 * len(executors))
    done: queue.Queue[Any] = queue.Queue()
    stop = threading.Event()

    def feed() -> None:
        try:
            for job in jobs:
                while not stop.is_set():
                    try:
                        todo.put(job, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            done.put(_Failure(exc))
        finally:
            for _ in executors:
                todo.put(_END)

    def work(executor: Executor) -> None:
        try:
            pending: tuple[Job, torch.Tensor, Callable[[], None]] | None = None
            while not stop.is_set():
                job = todo.get()
                if job is _END:
                    break
                with executor.bulk.active():
                    host, wait = _to_host(method(executor, job.batch))
                if pending is not None:
                    pending[2]()
                    done.put(_Done(pending[0], pending[1], executor.device))
                pending = (job, host, wait)
            if pending is not None and not stop.is_set():
                pending[2]()
                done.put(_Done(pending[0], pending[1], executor.device))
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
        stop.set()
        # Unblock a feeder waiting on a full queue and workers waiting for jobs.
        while True:
            try:
                todo.get_nowait()
            except queue.Empty:
                break
        for _ in executors:
            try:
                todo.put_nowait(_END)
            except queue.Full:
                break


def _to_host(tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
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
