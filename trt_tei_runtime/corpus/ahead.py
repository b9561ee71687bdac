"""Runs a generator in a background thread, a bounded number of items ahead of its consumer.

A corpus job's source generator reads, screens and tokenizes; wrapped in `ahead`, all of that
happens while the model embeds the previous chunk (pyarrow and tokenizers release the GIL).
The queue's bound keeps memory bounded however far the reader could run ahead.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

_POLL_S = 0.1


class _Done:
    pass


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def ahead(source: Iterable[T], depth: int = 2, name: str = "corpus-reader") -> Iterator[T]:
    """Yields `source`'s items in order, produced up to `depth` items ahead in a thread. An
    exception in `source` is raised here; leaving the loop early stops the thread."""
    items: queue.Queue[object] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in source:
                if not put(item):
                    return
            put(_Done())
        except BaseException as exc:  # handed to the consumer, who decides
            put(_Failed(exc))

    # A daemon: a consumer that dies (SIGINT) must not wait for a tokenizer call to end.
    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if isinstance(item, _Done):
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join(timeout=5.0)
