"""Resuming: a killed run, a damaged shard, a shard the manifest never listed, a changed
job. Every input row ends up exactly once, with the vectors a clean run writes."""

from __future__ import annotations

import io
import json
import signal
from pathlib import Path

import numpy as np
import pytest
from corpus_util import (
    json_lines,
    kill_at_first_shard,
    make_texts,
    manifest,
    read_output,
    run_cli,
    write_corpus,
)

from trt_tei_runtime import Model
from trt_tei_runtime.corpus import CorpusError, JobOptions, OutputMismatchError
from trt_tei_runtime.corpus.cli import execute
from trt_tei_runtime.corpus.progress import Progress
from trt_tei_runtime.corpus.store import OutputStore


def run(model: Model, model_dir: Path, input_path: Path, output: Path, **kw):  # type: ignore[no-untyped-def]
    stream = io.StringIO()
    options = JobOptions(model=str(model_dir), input=input_path, output=output, **kw)
    summary = execute(options, Progress(stream=stream, json_lines=True), model=model)
    return summary, json_lines(stream.getvalue())


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, list[str]]:
    texts = make_texts(900, seed=5)
    path = write_corpus(tmp_path / "c.parquet", [{"text": t} for t in texts])
    return path, texts


@pytest.fixture
def done(tiny, tiny_dir, corpus, tmp_path):  # type: ignore[no-untyped-def]
    """A finished job of 3 shards, and its output read back."""
    out = tmp_path / "out"
    run(tiny, tiny_dir, corpus[0], out, shard_rows=300)
    return out, read_output(out)


def assert_same_output(out: Path, expected) -> None:  # type: ignore[no-untyped-def]
    ids, vectors, tokens = read_output(out)
    assert ids == expected[0]
    np.testing.assert_allclose(vectors, expected[1], atol=1e-6)
    np.testing.assert_array_equal(tokens, expected[2])
    m = manifest(out)
    assert m["complete"] and m["rows"] == len(ids)


def test_sigkill_then_rerun(minilm, minilm_dir, tmp_path):  # type: ignore[no-untyped-def]
    n, shard_rows = 3000, 250
    texts = make_texts(n, seed=6)
    ids = [f"d{i}" for i in range(n)]
    path = write_corpus(tmp_path / "c.jsonl", [{"id": d, "text": t} for d, t in zip(ids, texts)])
    out = tmp_path / "out"
    args = [
        minilm_dir,
        "--input",
        path,
        "--id-column",
        "id",
        "--output",
        out,
        "--shard-rows",
        shard_rows,
        "--chunk-rows",
        125,
    ]
    assert kill_at_first_shard(args, out) == -signal.SIGKILL
    killed = manifest(out)
    assert not killed["complete"] and len(killed["shards"]) < n // shard_rows
    kept = {s["file"]: s["sha256"] for s in killed["shards"]}

    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    summary = json_lines(rerun.stderr)[-1]
    assert summary["event"] == "summary" and summary["complete"]
    assert summary["resumed_rows"] == len(kept) * shard_rows
    assert summary["rows"] + summary["resumed_rows"] == n
    m = manifest(out)
    assert {s["file"]: s["sha256"] for s in m["shards"] if s["file"] in kept} == kept
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]

    clean = tmp_path / "clean"
    execute(
        JobOptions(
            model=str(minilm_dir), input=path, output=clean, id_column="id", shard_rows=shard_rows
        ),
        Progress(stream=io.StringIO(), json_lines=True),
        model=minilm,
    )
    out_ids, vectors, tokens = read_output(out)
    clean_ids, clean_vectors, clean_tokens = read_output(clean)
    assert out_ids == clean_ids == ids  # every row exactly once
    np.testing.assert_allclose(vectors, clean_vectors, atol=2e-5)
    np.testing.assert_array_equal(tokens, clean_tokens)


def test_truncated_shard_is_redone(tiny, tiny_dir, corpus, done):  # type: ignore[no-untyped-def]
    out, expected = done
    shard = out / "shard-000001.parquet"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # a half-written file
    summary, lines = run(tiny, tiny_dir, corpus[0], out, shard_rows=300)
    assert summary.shards == 1 and summary.resumed_rows == 600
    warnings = [x["message"] for x in lines if x["event"] == "warning"]
    assert any("shard 1" in w and "bytes" in w and "redoing" in w for w in warnings), warnings
    assert_same_output(out, expected)


def test_same_size_corruption_is_caught_by_the_checksum(tiny, tiny_dir, corpus, done):  # type: ignore[no-untyped-def]
    out, expected = done
    shard = out / "shard-000000.parquet"
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(8)
    shard.write_bytes(bytes(data))
    summary, lines = run(tiny, tiny_dir, corpus[0], out, shard_rows=300)
    assert summary.shards == 1
    assert any("sha256" in x.get("message", "") for x in lines)
    assert_same_output(out, expected)


def test_unlisted_shard_missing_file_and_temporaries(tiny, tiny_dir, corpus, done):  # type: ignore[no-untyped-def]
    out, expected = done
    # Killed between renaming shard 2 into place and listing it in the manifest:
    m = manifest(out)
    m["shards"] = [s for s in m["shards"] if s["index"] != 2]
    m["complete"] = False
    (out / "manifest.json").write_text(json.dumps(m))
    (out / "shard-000001.parquet").unlink()  # a shard file lost
    stale = out / ".shard-000002.parquet.tmp-999-deadbeef"  # a killed run's temporary
    stale.write_bytes(b"PAR1 half")
    summary, _ = run(tiny, tiny_dir, corpus[0], out, shard_rows=300)
    assert summary.shards == 2 and summary.resumed_rows == 300
    assert not stale.exists()
    assert_same_output(out, expected)


def test_finished_job_rerun_does_nothing(tiny, tiny_dir, corpus, done):  # type: ignore[no-untyped-def]
    out, expected = done
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")}
    summary, _ = run(tiny, tiny_dir, corpus[0], out, shard_rows=300)
    assert summary.complete and summary.shards == 0 and summary.resumed_rows == 900
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")} == before
    assert_same_output(out, expected)


def test_other_options_fail_unless_overwrite(tiny, tiny_dir, corpus, done):  # type: ignore[no-untyped-def]
    out, _ = done
    with pytest.raises(OutputMismatchError, match=r"dimensions: None in the output, 8 now"):
        run(tiny, tiny_dir, corpus[0], out, shard_rows=300, dimensions=8)
    with pytest.raises(OutputMismatchError, match=r"shard_rows: 300 in the output, 200 now"):
        run(tiny, tiny_dir, corpus[0], out, shard_rows=200)
    # The bad-row policy, devices and verification do not change the output.
    run(tiny, tiny_dir, corpus[0], out, shard_rows=300, on_bad_row="skip", verify="size")
    summary, _ = run(tiny, tiny_dir, corpus[0], out, shard_rows=200, dimensions=8, overwrite=True)
    assert summary.complete and summary.shards == 5 and summary.resumed_rows == 0
    m = manifest(out)
    assert m["options"]["dimensions"] == 8 and m["embedding_dim"] == 8
    assert sorted(p.name for p in out.glob("shard-*")) == [
        f"shard-00000{i}.parquet" for i in range(5)
    ]
    ids, vectors, _ = read_output(out)
    assert ids == list(range(900)) and vectors.shape == (900, 8)


def test_changed_input_fails_unless_overwrite(tiny, tiny_dir, corpus, done):  # type: ignore[no-untyped-def]
    out, _ = done
    path, texts = corpus
    write_corpus(path, [{"text": t} for t in texts + ["one more"]])
    with pytest.raises(OutputMismatchError, match="input size"):
        run(tiny, tiny_dir, path, out, shard_rows=300)
    summary, _ = run(tiny, tiny_dir, path, out, shard_rows=300, overwrite=True)
    assert summary.complete and summary.rows == 901


def test_cli_reports_a_mismatch_with_status_2(tiny_dir, corpus, done):  # type: ignore[no-untyped-def]
    out, _ = done
    result = run_cli(tiny_dir, "--input", corpus[0], "--output", out, "--shard-rows", 100)
    assert result.returncode == 2
    assert "shard_rows: 300 in the output, 100 now" in result.stderr
    assert "--overwrite" in result.stderr


def test_output_folder_guards(tmp_path):  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    first = OutputStore.open(out, overwrite=False, warn=print)
    with pytest.raises(CorpusError, match="another trt-tei-embed is writing"):
        OutputStore.open(out, overwrite=False, warn=print)
    first.close()
    OutputStore.open(out, overwrite=False, warn=print).close()  # the lock went with it
    (out / "shard-000000.parquet").write_bytes(b"x")
    with pytest.raises(CorpusError, match="shard files but no manifest.json"):
        OutputStore.open(out, overwrite=False, warn=print)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(CorpusError, match="not a readable trt-tei-embed manifest.*--overwrite"):
        OutputStore.open(out, overwrite=False, warn=print)
    OutputStore.open(out, overwrite=True, warn=print).close()
    assert not (out / "manifest.json").exists() and not list(out.glob("shard-*"))
