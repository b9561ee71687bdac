"""Progress: JSON lines on stderr when it is not a terminal, a tqdm bar when it is, and the
summary at the end (also kept in the manifest)."""

from __future__ import annotations

import io
from pathlib import Path

from corpus_util import json_lines, make_texts, manifest, run_cli, write_corpus

from trt_tei_runtime.corpus import JobOptions
from trt_tei_runtime.corpus.cli import execute
from trt_tei_runtime.corpus.progress import Progress

SUMMARY_KEYS = {
    "output",
    "complete",
    "total_rows",
    "rows",
    "bad_rows",
    "resumed_rows",
    "shards",
    "tokens",
    "seconds",
    "rows_per_s",
    "tokens_per_s",
    "devices",
}


def test_json_progress_lines_and_summary(tiny_dir: Path, tmp_path: Path) -> None:
    path = write_corpus(tmp_path / "c.jsonl", [{"text": t} for t in make_texts(500, seed=11)])
    result = run_cli(tiny_dir, "--input", path, "--output", tmp_path / "out", "--shard-rows", 200)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # stdout stays free for the caller
    lines = json_lines(result.stderr)
    assert len(lines) == len(result.stderr.strip().splitlines())  # every line is JSON
    progress = [x for x in lines if x["event"] == "progress"]
    assert progress[0]["rows_done"] == 0
    # One line per finished shard at least (others every 10 s).
    assert [x["shards_done"] for x in progress][-3:] == [1, 2, 3]
    assert progress[-1]["rows_done"] == 500 and progress[-1]["rows_total"] == 500
    assert set(progress[-1]) >= {"rows_per_s", "tokens_per_s", "eta_s", "elapsed_s", "tokens"}
    summary = lines[-1]
    assert summary["event"] == "summary" and set(summary) - {"event"} == SUMMARY_KEYS
    assert (summary["rows"], summary["shards"], summary["complete"]) == (500, 3, True)
    assert summary["tokens"] > 500 and summary["tokens_per_s"] > 0
    assert summary["devices"] == {
        "cpu": {"tokens": summary["tokens"], "tokens_per_s": summary["tokens_per_s"]}
    }
    last_run = manifest(tmp_path / "out")["last_run"]
    assert last_run["rows"] == 500 and last_run["tokens"] == summary["tokens"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_and_summary_on_a_terminal(tiny, tiny_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = write_corpus(tmp_path / "c.parquet", [{"text": t} for t in make_texts(300, seed=12)])
    stream = _Terminal()
    options = JobOptions(model=str(tiny_dir), input=path, output=tmp_path / "out", shard_rows=100)
    execute(options, Progress(stream=stream), model=tiny)
    text = stream.getvalue()
    assert "embedding: 100%" in text and "300/300" in text and "tok/s" in text
    assert "done: 300 rows embedded (0 bad, 0 from earlier runs), 3 shards" in text
    assert "\n  cpu: " in text and "tokens/s" in text
    assert "{" not in text  # no JSON on a terminal
