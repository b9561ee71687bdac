"""Streaming readers: ordinals, ids and texts exactly as in the file, in blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from corpus_util import write_corpus

from trt_tei_runtime.corpus import CorpusError, reader
from trt_tei_runtime.corpus.reader import open_input


def collect(r: reader.InputReader, **kw) -> tuple[list, list, dict]:  # type: ignore[no-untyped-def]
    ids, texts, problems = [], [], {}
    for rows in r.rows(**kw):
        assert rows.start == len(ids) or kw, "runs are consecutive"
        ids.extend(rows.ids.to_pylist())
        texts.extend(rows.texts)
        problems.update({rows.start + k: v for k, v in rows.problems.items()})
    return ids, texts, problems


def test_jsonl_fast_and_slow_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "READ_BLOCK_BYTES", 256)  # many blocks
    texts = [f'row {i}: déjà vu, "quoted", 東京 {"x" * (i % 7)}' for i in range(200)]
    lines = [json.dumps({"id": 1000 + i, "text": t, "extra": [i]}) for i, t in enumerate(texts)]
    lines[120] = '{"id": 1120, "text": broken'  # this block is parsed line by line
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines[:50]) + "\n\n   \n" + "\n".join(lines[50:]))  # no final \n
    r = open_input(path, "text", "id")
    ids, got, problems = collect(r)
    assert ids == [1000 + i if i != 120 else None for i in range(200)]
    assert got == [t if i != 120 else None for i, t in enumerate(texts)]
    assert list(problems) == [120] and problems[120].startswith("line is not JSON")
    assert r.total_rows == 200 and r.bytes_read == path.stat().st_size


def test_jsonl_skips_finished_blocks_without_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: E501
    monkeypatch.setattr(reader, "READ_BLOCK_BYTES", 64)
    path = write_corpus(tmp_path / "c.jsonl", [{"text": f"t{i}"} for i in range(100)])
    r = open_input(path, "text", None)
    seen = list(r.rows(skip=lambda a, b: b <= 60))
    assert seen[0].start <= 60 and seen[-1].stop == 100
    for rows in seen:
        assert rows.ids.to_pylist() == list(range(rows.start, rows.stop))
        assert rows.texts == [f"t{i}" for i in range(rows.start, rows.stop)]
    assert r.total_rows == 100


def test_jsonl_id_of_another_type(tmp_path: Path) -> None:
    lines = [{"id": i, "text": "a"} for i in range(5)] + [{"id": "x5", "text": "b"}]
    early = write_corpus(tmp_path / "early.jsonl", lines)
    with pytest.raises(CorpusError, match="values of id column 'id' do not share one type"):
        open_input(early, "text", "id")  # seen in the first 1000 lines: before any work
    lines = [{"id": i, "text": "a"} for i in range(1500)] + [{"id": "x1500", "text": "b"}]
    late = write_corpus(tmp_path / "late.jsonl", lines)
    with pytest.raises(CorpusError, match="row 1500: id 'x1500' is not of the id column's type"):
        collect(open_input(late, "text", "id"))


def test_parquet_skips_row_groups(tmp_path: Path) -> None:
    path = write_corpus(
        tmp_path / "c.parquet",
        [{"k": f"k{i}", "text": f"t{i}"} for i in range(1000)],
        row_group_size=100,
    )
    r = open_input(path, "text", "k")
    assert r.total_rows == 1000
    runs = list(r.rows(skip=lambda a, b: b <= 500, batch_rows=64))
    assert runs[0].start == 500 and runs[-1].stop == 1000
    assert all(run.ids.to_pylist() == [f"k{i}" for i in range(run.start, run.stop)] for run in runs)


def test_csv_quoted_multiline_text(tmp_path: Path) -> None:
    texts = ['a, "quoted" text', "two\nlines", "", "plain"]
    path = write_corpus(tmp_path / "c.csv", [{"id": i, "text": t} for i, t in enumerate(texts)])
    r = open_input(path, "text", "id")
    ids, got, _ = collect(r)
    assert ids == [0, 1, 2, 3] and got == texts
    assert r.total_rows == 4 and r.bytes_read == path.stat().st_size


def test_text_column_must_hold_strings(tmp_path: Path) -> None:
    path = write_corpus(tmp_path / "c.parquet", [{"text": 1}])
    with pytest.raises(CorpusError, match="column 'text' has type int64; the text column must"):
        open_input(path, "text", None)
    with pytest.raises(CorpusError, match="--id-column and --text-column are both 'text'"):
        open_input(path, "text", "text")
