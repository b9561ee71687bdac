"""A corpus job's vectors equal `Model.embed`'s, for Parquet, JSONL and CSV, with the
input's ids (or ordinals) and every row exactly once."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from corpus_util import make_texts, manifest, min_cosine, read_output, write_corpus

from trt_tei_runtime import Model
from trt_tei_runtime.corpus import JobOptions
from trt_tei_runtime.corpus.cli import execute
from trt_tei_runtime.corpus.progress import Progress

N = 1100


def run(model: Model, model_dir: Path, input_path: Path, output: Path, **kw):  # type: ignore[no-untyped-def]
    options = JobOptions(model=str(model_dir), input=input_path, output=output, **kw)
    return execute(options, Progress(stream=io.StringIO(), json_lines=True), model=model)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return make_texts(N, seed=1)


@pytest.fixture(scope="module")
def reference(minilm: Model, texts: list[str]) -> np.ndarray:
    return minilm.embed(texts)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_vectors_equal_model_embed(fmt, minilm, minilm_dir, texts, reference, tmp_path):  # type: ignore[no-untyped-def]
    ids = [f"doc-{i * 7}" for i in range(N)]
    path = write_corpus(
        tmp_path / f"corpus.{fmt}", [{"doc": d, "body": t} for d, t in zip(ids, texts)]
    )
    summary = run(
        minilm,
        minilm_dir,
        path,
        tmp_path / "out",
        text_column="body",
        id_column="doc",
        shard_rows=400,
        chunk_rows=128,
    )
    assert summary.complete and summary.rows == N and summary.shards == 3
    out_ids, vectors, num_tokens = read_output(tmp_path / "out")
    assert out_ids == ids  # every row once, in input order
    assert vectors.dtype == np.float32 and vectors.shape == (N, 384)
    assert min_cosine(vectors, reference) >= 0.99999
    np.testing.assert_allclose(vectors, reference, atol=2e-5)
    assert list(num_tokens) == [len(t) for t in minilm.tokenize(texts)]
    m = manifest(tmp_path / "out")
    assert (m["complete"], m["total_rows"], m["rows"], m["num_shards"]) == (True, N, N, 3)
    assert [(s["start"], s["stop"], s["rows"]) for s in m["shards"]] == [
        (0, 400, 400),
        (400, 800, 400),
        (800, 1100, 300),
    ]
    assert m["input"]["format"] == fmt and m["columns"]["id"] == "string"


def test_ids_default_to_ordinals(tiny, tiny_dir, tmp_path):  # type: ignore[no-untyped-def]
    texts = make_texts(250, seed=2)
    path = tmp_path / "corpus.jsonl"
    # Blank lines are not rows: ordinals count records.
    with open(path, "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"text": t}) + "\n" + ("\n  \n" if i % 50 == 0 else ""))
    run(tiny, tiny_dir, path, tmp_path / "out", shard_rows=100)
    ids, vectors, _ = read_output(tmp_path / "out")
    assert ids == list(range(250))
    np.testing.assert_allclose(vectors, tiny.embed(texts), atol=1e-5)
    assert manifest(tmp_path / "out")["columns"]["id"] == "int64"


def test_dimensions_and_prompt_name(tiny, tiny_dir, tmp_path):  # type: ignore[no-untyped-def]
    texts = make_texts(300, seed=3)
    ids = list(range(1000, 1300))
    path = write_corpus(tmp_path / "c.parquet", [{"id": i, "text": t} for i, t in zip(ids, texts)])
    run(
        tiny,
        tiny_dir,
        path,
        tmp_path / "out",
        id_column="id",
        dimensions=16,
        prompt_name="query",
        shard_rows=128,
    )
    out_ids, vectors, num_tokens = read_output(tmp_path / "out")
    assert out_ids == ids and vectors.shape == (300, 16)
    np.testing.assert_allclose(
        vectors, tiny.embed(texts, dimensions=16, prompt_name="query"), atol=1e-5
    )
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # num_tokens counts the prompt's tokens too.
    assert list(num_tokens) == [len(x) for x in tiny.tokenize(texts, prompt_name="query")]
    assert manifest(tmp_path / "out")["options"]["prompt_name"] == "query"


def test_empty_input(tiny, tiny_dir, tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    # An empty JSONL has no columns to check: the job refuses it like any missing column.
    from trt_tei_runtime.corpus import CorpusError

    with pytest.raises(CorpusError, match="no record among the first"):
        run(tiny, tiny_dir, path, tmp_path / "out")
    empty_parquet = write_corpus(tmp_path / "e.parquet", [{"text": "x"}])
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(empty_parquet).slice(0, 0), empty_parquet)
    summary = run(tiny, tiny_dir, empty_parquet, tmp_path / "out2")
    assert summary.complete and summary.rows == 0
    assert manifest(tmp_path / "out2")["num_shards"] == 0
