"""How a job cuts its input: shard boundaries, finished shards left out, and first chunks
small enough that the devices start soon."""

from __future__ import annotations

from corpus_util import make_texts, write_corpus

from trt_tei_runtime.corpus.plan import FIRST_CHUNK_ROWS, InputEnd, Piece, ShardEnd, plan
from trt_tei_runtime.corpus.reader import open_input


def test_chunks_ramp_up_and_respect_shards(tmp_path) -> None:  # type: ignore[no-untyped-def]
    texts = make_texts(5000)
    path = write_corpus(tmp_path / "c.parquet", [{"text": t} for t in texts], row_group_size=5000)
    items = list(plan(open_input(path, "text", None), 3000, 2048, set()))
    pieces = [(it.shard, it.rows.start, it.rows.stop) for it in items if isinstance(it, Piece)]
    first = FIRST_CHUNK_ROWS
    assert pieces[:3] == [(0, 0, first), (0, first, 3 * first), (0, 3 * first, 7 * first)]
    # Pieces never cross a shard boundary and cover every row once, in order.
    assert [p[1] for p in pieces[1:]] == [p[2] for p in pieces[:-1]]
    assert pieces[-1][2] == 5000 and all(p[0] == p[1] // 3000 == (p[2] - 1) // 3000 for p in pieces)
    assert max(p[2] - p[1] for p in pieces) <= 2048
    markers = [it for it in items if not isinstance(it, Piece)]
    assert [(type(m).__name__, getattr(m, "shard", None)) for m in markers] == [
        ("ShardEnd", 0),
        ("ShardEnd", 1),
        ("InputEnd", None),
    ]
    assert isinstance(markers[0], ShardEnd) and markers[0].stop == 3000
    assert isinstance(markers[-1], InputEnd) and markers[-1].total_rows == 5000


def test_finished_shards_are_left_out(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = write_corpus(tmp_path / "c.parquet", [{"text": t} for t in make_texts(900)])
    items = list(plan(open_input(path, "text", None), 300, 4096, {0, 2}))
    pieces = [(it.shard, it.rows.start, it.rows.stop) for it in items if isinstance(it, Piece)]
    assert pieces == [(1, 300, 300 + FIRST_CHUNK_ROWS), (1, 300 + FIRST_CHUNK_ROWS, 600)]
