"""`trt-tei-embed --long-input chunk`: long rows embedded whole, each stored vector equal to
`Model.embed(..., long_input="chunk")` (itself checked against the rule computed with
sentence-transformers in tests/test_long_inputs.py), in one process, in worker processes
and from the command line; too many windows are bad rows; a bad overlap is bad input; a
chunked job and a truncating one do not resume each other."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from checkpoints import make_checkpoint
from corpus_util import read_output, run_cli, write_corpus
from test_long_inputs import LIMIT, TEXTS, WINDOW

from trt_tei_runtime import Model
from trt_tei_runtime.corpus import BadRowError, CorpusError, JobOptions
from trt_tei_runtime.corpus.cli import execute, parse_options
from trt_tei_runtime.corpus.progress import Progress


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus_long")
    return make_checkpoint(root, "BertModel", pooling="mean", max_seq_length=LIMIT)


@pytest.fixture(scope="module")
def model(folder: Path) -> Model:
    return Model(folder, device="cpu")


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS * 3)]
    return write_corpus(tmp_path / "long.jsonl", records)


def run(folder: Path, corpus: Path, output: Path, model: Any = None, **kw: Any):  # type: ignore[no-untyped-def]
    options = JobOptions(model=str(folder), input=corpus, output=output, id_column="id", **kw)
    return execute(options, Progress(stream=io.StringIO(), json_lines=True), model=model)


def window_tokens(model: Model, texts: list[str], overlap: int = 0) -> np.ndarray:
    windows = model.tokenize_windows(texts, overlap=overlap)
    rows = np.repeat(np.arange(len(texts)), windows.counts.astype(np.int64))
    return np.bincount(rows, weights=windows.ids.lengths, minlength=len(texts)).astype(np.int64)


@pytest.mark.parametrize("overlap, dimensions", [(0, None), (3, 8)])
def test_rows_equal_model_embed_chunked(folder, model, corpus, tmp_path, overlap, dimensions):  # type: ignore[no-untyped-def]
    summary = run(
        folder,
        corpus,
        tmp_path / "out",
        model=model,
        long_input="chunk",
        chunk_overlap=overlap,
        dimensions=dimensions,
        chunk_rows=4,  # windows of one chunk's rows run with other chunks' in one stream
    )
    assert summary.complete
    ids, vectors, tokens = read_output(tmp_path / "out")
    texts = TEXTS * 3
    assert ids == [f"d{i}" for i in range(len(texts))]
    expected = model.embed(texts, long_input="chunk", chunk_overlap=overlap, dimensions=dimensions)
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    np.testing.assert_array_equal(tokens, window_tokens(model, texts, overlap))
    # The long row is not its truncation: the job's default cuts it.
    truncated = model.embed(TEXTS[:1], dimensions=dimensions)[0]
    assert float(vectors[0] @ truncated) < 0.9999
    assert summary.tokens == int(tokens.sum())


def test_worker_processes_write_the_same_rows(folder, model, corpus, tmp_path):  # type: ignore[no-untyped-def]
    run(folder, corpus, tmp_path / "one", model=model, long_input="chunk", dimensions=8)
    run(
        folder,
        corpus,
        tmp_path / "two",
        long_input="chunk",
        dimensions=8,
        devices="cpu,cpu",
        device_workers="processes",
        chunk_rows=4,
    )
    one, two = read_output(tmp_path / "one"), read_output(tmp_path / "two")
    assert one[0] == two[0]
    np.testing.assert_allclose(one[1], two[1], atol=1e-5)
    np.testing.assert_array_equal(one[2], two[2])


def test_rows_over_max_chunks_are_bad_rows(folder, model, corpus, tmp_path):  # type: ignore[no-untyped-def]
    with pytest.raises(
        BadRowError, match=r"id 'd0' \(row 0\): needs 40 windows.*--max-chunks \(3\)"
    ):
        run(folder, corpus, tmp_path / "fail", model=model, long_input="chunk", max_chunks=3)
    summary = run(
        folder,
        corpus,
        tmp_path / "skip",
        model=model,
        long_input="chunk",
        max_chunks=3,
        on_bad_row="skip",
    )
    ids, vectors, _ = read_output(tmp_path / "skip")
    texts = TEXTS * 3
    counts = model.tokenize_windows(texts).counts
    kept = [i for i in range(len(texts)) if counts[i] <= 3]
    assert 0 < len(kept) < len(texts) and summary.bad_rows == len(texts) - len(kept)
    assert ids == [f"d{i}" for i in kept]
    expected = model.embed([texts[i] for i in kept], long_input="chunk")
    np.testing.assert_allclose(vectors, expected, atol=1e-5)


def test_bad_chunking_options_are_bad_input(folder, model, corpus, tmp_path):  # type: ignore[no-untyped-def]
    with pytest.raises(CorpusError, match=r"--chunk-overlap: .*must be smaller than the window"):
        run(folder, corpus, tmp_path / "a", model=model, long_input="chunk", chunk_overlap=WINDOW)
    with pytest.raises(CorpusError, match="--max-chunks must be at least 1"):
        run(folder, corpus, tmp_path / "b", model=model, long_input="chunk", max_chunks=0)
    with pytest.raises(CorpusError, match="--chunk-overlap must be at least 0"):
        run(folder, corpus, tmp_path / "c", model=model, long_input="chunk", chunk_overlap=-1)
    assert not (tmp_path / "a" / "manifest.json").exists()


def test_chunked_and_truncated_jobs_do_not_resume_each_other(folder, model, corpus, tmp_path):  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    run(folder, corpus, out, model=model)
    with pytest.raises(CorpusError, match="--overwrite"):
        run(folder, corpus, out, model=model, long_input="chunk")
    summary = run(folder, corpus, out, model=model, long_input="chunk", overwrite=True)
    assert summary.complete
    with pytest.raises(CorpusError, match="--overwrite"):
        run(folder, corpus, out, model=model, long_input="chunk", chunk_overlap=2)


def test_command_line(folder, model, corpus, tmp_path):  # type: ignore[no-untyped-def]
    options = parse_options(
        [
            "m",
            "--input",
            "i",
            "--output",
            "o",
            "--long-input",
            "chunk",
            "--chunk-overlap",
            "2",
            "--max-chunks",
            "5",
        ]
    )
    assert (options.long_input, options.chunk_overlap, options.max_chunks) == ("chunk", 2, 5)
    assert parse_options(["m", "--input", "i", "--output", "o"]).long_input == "truncate"
    done = run_cli(
        folder,
        "--input",
        corpus,
        "--output",
        tmp_path / "cli",
        "--id-column",
        "id",
        "--long-input",
        "chunk",
        "--devices",
        "cpu",
    )
    assert done.returncode == 0, done.stderr
    _, vectors, _ = read_output(tmp_path / "cli")
    np.testing.assert_allclose(vectors, model.embed(TEXTS * 3, long_input="chunk"), atol=1e-5)
