"""Chunks of tokenized inputs through the devices as one stream, each chunk's results
handed back in chunk order as soon as all of its batches are done.

One stream serves a whole `Model.embed` call or a whole corpus job: the devices never drain
between chunks, because the next chunk's batches are packed and queued (by `run_jobs`'
feeder) while the current chunk's last batches still run.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Optional, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from ..batch import PackedBatch, token_budget_batches
from ..errors import InputError
from ..token_ids import TokenIds
from .dispatch import Job, Method, run_jobs
from .executor import Executor

K = TypeVar("K")


@dataclass
class Chunk(Generic[K]):
    """Inputs `first .. first + len(ids)` of a call (for error messages), under the caller's
    `key`; `type_ids` None means all zeros. A chunk of no inputs passes through in order."""

    key: K
    ids: TokenIds
    type_ids: Optional[TokenIds] = None
    first: int = 0


@dataclass
class _Pending(Generic[K]):
    key: K
    size: int
    batches: int
    parts: list[tuple[list[int], torch.Tensor]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.parts) == self.batches

    def assemble(self) -> Optional[torch.Tensor]:
        """The chunk's rows in input order (None for a chunk of no inputs). Each batch's
        rows are copied once, straight to their places: a chunk is thousands of rows, and
        its host copies run on the thread that hands every chunk back."""
        if not self.parts:
            return None
        first = self.parts[0][1]
        width = max(out.shape[1] for _, out in self.parts)
        result = first.new_empty((self.size, width, *first.shape[2:]))
        for rows, out in self.parts:
            index = torch.as_tensor(rows, dtype=torch.int64)
            result.index_copy_(0, index, _padded(out, width))
        return result


def cat_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """`torch.cat` of row blocks; blocks narrower than the widest are right-padded with
    zeros first. Only sparse (SPLADE) outputs vary in width: pairs of (index, value), where
    a zero pair is padding (`sparse.top_active`)."""
    width = max(part.shape[1] for part in parts)
    return torch.cat([_padded(part, width) for part in parts])


def _padded(part: torch.Tensor, width: int) -> torch.Tensor:
    """`part` right-padded with zeros to `width` columns; itself (no copy) if it has them."""
    return part if part.shape[1] == width else F.pad(part, (0, width - part.shape[1]))


# Called for each finished batch with (rows of its chunk, device, tokens).
BatchDone = Callable[[int, torch.device, int], None]


def run_chunks(
    executors: list[Executor],
    chunks: Iterable[Chunk[K]],
    method: Method,
    max_batch_tokens: int,
    position_offset: int,
    on_batch: Optional[BatchDone] = None,
) -> Iterator[tuple[K, Optional[torch.Tensor]]]:
    """Yields `(key, rows)` for every chunk, in chunk order. Each chunk's inputs run in
    token-budget batches (longest first) on whichever device is free; `chunks` is read on
    a feeder thread, so a generator that tokenizes overlaps the devices."""
    # Pinned on the packing thread, not by the thread that launches the batch.
    pin = any(executor.device.type == "cuda" for executor in executors)
    order: deque[_Pending[K]] = deque()
    lock = threading.Lock()

    def jobs() -> Iterator[Job[PackedBatch]]:
        for chunk in chunks:
            lengths = chunk.ids.lengths
            empty = np.flatnonzero(lengths == 0)
            if empty.size:
                raise InputError(f"input {chunk.first + int(empty[0])} is empty after tokenization")
            batches = token_budget_batches(lengths.tolist(), max_batch_tokens)
            pending = _Pending(chunk.key, len(chunk.ids), len(batches))
            with lock:
                order.append(pending)
            for rows in batches:
                packed = PackedBatch.from_token_ids(
                    chunk.ids, rows, chunk.type_ids, position_offset
                )
                yield Job((pending, rows), packed.pin_memory() if pin else packed)

    def finished() -> Iterator[tuple[K, Optional[torch.Tensor]]]:
        while True:
            with lock:
                if not order or not order[0].complete:
                    return
                pending = order.popleft()
            yield pending.key, pending.assemble()

    for job, out, device in run_jobs(executors, jobs(), method):
        pending, rows = job.key
        pending.parts.append((rows, out))
        if on_batch is not None:
            on_batch(len(rows), device, job.batch.num_tokens)
        yield from finished()
    yield from finished()
