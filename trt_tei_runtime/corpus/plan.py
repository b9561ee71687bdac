"""The input cut into shards and chunks, finished shards left out: what both executors
(local_executor.py, ray_executor.py) walk.

Shard i holds input rows [i * shard_rows, (i + 1) * shard_rows) less bad rows, in input
order. A resumed run re-reads the input (Parquet skips finished shards' row groups, JSONL
counts their lines without parsing them) and embeds only unfinished shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional, Union

from .reader import InputReader, Rows

# The devices start once the first chunk is read and tokenized: the first chunks are small
# and double up to `chunk_rows`, so a job (or a resumed one) does not open with an idle GPU.
FIRST_CHUNK_ROWS = 256


@dataclass
class Piece:
    """Input rows of one shard, at most `chunk_rows` of them."""

    shard: int
    rows: Rows


@dataclass
class ShardEnd:
    """Every row of `shard` has been handed on; its rows end at `stop`."""

    shard: int
    stop: int


@dataclass
class InputEnd:
    total_rows: int


PlanItem = Union[Piece, ShardEnd, InputEnd]


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
