"""Bad rows are reported by id and skipped or fatal, never silently dropped; bad arguments
and bad input fail before any work with a message saying what is wrong."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_util import json_lines, make_texts, manifest, read_output, run_cli, write_corpus

from trt_tei_runtime.corpus import JobOptions
from trt_tei_runtime.corpus.cli import execute, main
from trt_tei_runtime.corpus.progress import Progress
from trt_tei_runtime.corpus.reader import Rows
from trt_tei_runtime.corpus.rows import screen, tokenize
from trt_tei_runtime.token_ids import TokenIds

BAD_LINES = {  # row ordinal → (JSONL line, reason the manifest gives)
    3: ('{"id": "b3", "text": null}', "missing or null text"),
    10: ('{"id": "b10"}', "no key 'text'"),
    17: ('{"id": "b17", "text": 42}', "text is a int, not a string"),
    25: ('{"id": "b25", "text": ""}', "empty text"),
    40: ('{"id": "b40", "text": "  \\t "}', "text is only whitespace"),
    55: ('{"id": "b55", "text": ["a", "list"]}', "text is a list, not a string"),
    230: ('{"id": "b230", "text": "cut off', "line is not JSON"),
    260: ('["an", "array"]', "line is a JSON list, not an object"),
}


@pytest.fixture
def bad_jsonl(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    """300 rows, 8 of them bad; returns the file and the good rows' ids and texts."""
    texts = make_texts(300, seed=7)
    good_ids, good_texts = [], []
    with open(tmp_path / "bad.jsonl", "w") as f:
        for i, t in enumerate(texts):
            if i in BAD_LINES:
                f.write(BAD_LINES[i][0] + "\n")
            else:
                f.write(json.dumps({"id": f"b{i}", "text": t}) + "\n")
                good_ids.append(f"b{i}")
                good_texts.append(t)
    return tmp_path / "bad.jsonl", good_ids, good_texts


def test_bad_rows_skipped_and_listed(tiny, tiny_dir, bad_jsonl, tmp_path):  # type: ignore[no-untyped-def]
    path, good_ids, good_texts = bad_jsonl
    stream = io.StringIO()
    options = JobOptions(
        model=str(tiny_dir),
        input=path,
        output=tmp_path / "out",
        id_column="id",
        shard_rows=100,
        on_bad_row="skip",
    )
    summary = execute(options, Progress(stream=stream, json_lines=True), model=tiny)
    assert summary.complete and summary.bad_rows == 8 and summary.rows == 292
    ids, vectors, _ = read_output(tmp_path / "out")
    assert ids == good_ids
    np.testing.assert_allclose(vectors, tiny.embed(good_texts), atol=1e-5)
    m = manifest(tmp_path / "out")
    assert m["bad_rows"]["count"] == 8 and m["rows"] == 292 and m["total_rows"] == 300
    listed = {b["row"]: (b["id"], b["reason"]) for b in m["bad_rows"]["rows"]}
    for row, (_, reason) in BAD_LINES.items():
        assert listed[row][1].startswith(reason), (row, listed[row])
        # Unparseable lines have no id to give; the others give theirs.
        assert listed[row][0] == (None if row in (230, 260) else f"b{row}")
    assert [s["bad_rows"] for s in m["shards"]] == [6, 0, 2]
    reported = [x for x in json_lines(stream.getvalue()) if x["event"] == "bad_row"]
    assert sorted(x["row"] for x in reported) == sorted(BAD_LINES)


def test_bad_row_fails_the_job_by_default_and_keeps_finished_shards(tiny_dir, tmp_path):  # type: ignore[no-untyped-def]
    texts = make_texts(300, seed=8)
    records = [{"id": f"r{i}", "text": t} for i, t in enumerate(texts)]
    records[250]["text"] = None
    path = write_corpus(tmp_path / "c.parquet", records)
    args = [
        tiny_dir,
        "--input",
        path,
        "--id-column",
        "id",
        "--output",
        tmp_path / "out",
        "--shard-rows",
        100,
    ]
    result = run_cli(*args)
    assert result.returncode == 1
    assert "bad row id 'r250' (row 250): missing or null text" in result.stderr
    assert "--on-bad-row skip" in result.stderr
    m = manifest(tmp_path / "out")
    assert not m["complete"] and [s["index"] for s in m["shards"]] == [0, 1]
    assert "BadRowError" in m["last_run"]["error"]

    again = run_cli(*args, "--on-bad-row", "skip")  # resumes: shards 0 and 1 are kept
    assert again.returncode == 0, again.stderr
    summary = json_lines(again.stderr)[-1]
    assert (summary["resumed_rows"], summary["rows"], summary["bad_rows"]) == (200, 99, 1)
    ids, _, _ = read_output(tmp_path / "out")
    assert ids == [f"r{i}" for i in range(300) if i != 250]


def test_parquet_and_csv_bad_rows(tiny, tiny_dir, tmp_path):  # type: ignore[no-untyped-def]
    texts = make_texts(50, seed=9)
    table = pa.table(
        {
            "id": pa.array([i if i != 7 else None for i in range(50)], pa.int64()),
            "text": [t if i != 12 else None for i, t in enumerate(texts)],
        }
    )
    pq.write_table(table, tmp_path / "c.parquet")
    csv_records = [{"id": i, "text": t if i != 30 else ""} for i, t in enumerate(texts)]
    write_corpus(tmp_path / "c.csv", csv_records)
    for name, expected in (
        ("c.parquet", {7: "null id", 12: "missing or null text"}),
        ("c.csv", {30: "empty text"}),
    ):
        out = tmp_path / f"out-{name}"
        options = JobOptions(
            model=str(tiny_dir),
            input=tmp_path / name,
            output=out,
            id_column="id",
            shard_rows=20,
            on_bad_row="skip",
        )
        execute(options, Progress(stream=io.StringIO(), json_lines=True), model=tiny)
        listed = {b["row"]: b["reason"] for b in manifest(out)["bad_rows"]["rows"]}
        assert listed == expected
        ids, _, _ = read_output(out)
        assert ids == [i for i in range(50) if i not in expected]


class _DropsEverything:
    """A tokenizer that adds no special tokens and knows no word of some texts."""

    def tokenize_ids(self, texts, *, prompt_name=None, truncate=True):  # type: ignore[no-untyped-def]
        return TokenIds.from_lists([[] if t.startswith("zzz") else [1, 2] for t in texts])


def test_no_tokens_after_tokenization_is_a_bad_row() -> None:
    rows = Rows(10, pa.array(["a", "b", "c", "d"]), ["ok", None, "zzz unknown", "fine"])
    tok = tokenize(_DropsEverything(), screen(rows), None)
    assert [(b.row, b.id, b.reason) for b in tok.bad] == [
        (11, "b", "missing or null text"),
        (12, "c", "no tokens after tokenization"),
    ]
    assert tok.ids.to_pylist() == ["a", "d"] and tok.token_ids.to_lists() == [[1, 2], [1, 2]]


def cli_error(capsys, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_bad_arguments(tiny_dir, tmp_path, capsys):  # type: ignore[no-untyped-def]
    good = write_corpus(tmp_path / "c.parquet", [{"id": 1, "text": "the cat"}])
    out = tmp_path / "out"
    m = str(tiny_dir)
    cases = [
        (["--input", tmp_path / "nope.parquet"], "input file .*nope.parquet does not exist"),
        (["--input", tmp_path], "is not a file"),
        (["--input", good, "--shard-rows", 0], "--shard-rows must be a positive number"),
        (["--input", good, "--text-column", "body"], r"no column 'body'; it has \['id', 'text'\]"),
        (["--input", good, "--id-column", "doc_id"], "no column 'doc_id'"),
        (["--input", good, "--dimensions", 999], "--dimensions 999 is more than the model's 32"),
        (["--input", good, "--prompt-name", "nope"], "unknown prompt_name 'nope'"),
        (["--input", good, "--devices", "cpu", "--ray", "auto"], "--devices does not apply"),
    ]
    for extra, message in cases:
        err = cli_error(capsys, m, "--output", out, *extra)
        assert err.startswith("trt-tei-embed: error: "), err
        import re

        assert re.search(message, err), (message, err)
    (tmp_path / "c.txt").write_text("the cat\n")
    assert "unknown extension '.txt'" in cli_error(
        capsys, m, "--input", tmp_path / "c.txt", "--output", out
    )
    (tmp_path / "afile").write_text("")
    assert "exists and is not a directory" in cli_error(
        capsys, m, "--input", good, "--output", tmp_path / "afile"
    )
    assert "cannot load model" in cli_error(
        capsys, tmp_path / "no-model", "--input", good, "--output", tmp_path / "out2"
    )
    assert "the following arguments are required: --output" in cli_error(capsys, m, "--input", good)


def test_missing_columns_in_jsonl_and_csv(tiny_dir, tmp_path, capsys):  # type: ignore[no-untyped-def]
    write_corpus(tmp_path / "c.jsonl", [{"body": "the cat"}])
    write_corpus(tmp_path / "c.csv", [{"body": "the cat"}])
    err = cli_error(capsys, tiny_dir, "--input", tmp_path / "c.jsonl", "--output", tmp_path / "o")
    assert "no record among the first 1000 lines has the key 'text'; keys seen: ['body']" in err
    err = cli_error(capsys, tiny_dir, "--input", tmp_path / "c.csv", "--output", tmp_path / "o")
    assert "no column 'text'; it has ['body'] (pick one with --text-column)" in err
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text("hello")
    err = cli_error(capsys, tiny_dir, "--input", not_parquet, "--output", tmp_path / "o")
    assert "is not a readable Parquet file" in err


def test_cli_bad_argument_exit_status(tmp_path):  # type: ignore[no-untyped-def]
    result = run_cli(
        "some-model", "--input", tmp_path / "missing.jsonl", "--output", tmp_path / "o"
    )
    assert result.returncode == 2
    assert "trt-tei-embed: error: input file" in result.stderr and "does not exist" in result.stderr
    assert not (tmp_path / "o").exists()  # nothing written
