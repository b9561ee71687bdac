"""Ray: `trt_tei_runtime.corpus.ray_data.EmbedBatches` under `Dataset.map_batches`, and
`trt-tei-embed --ray` on a local cluster of two worker nodes (one CPU each), a worker
killed in the middle of a shard included. Vectors equal single-process `Model.embed`'s."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from corpus_util import (
    json_lines,
    make_texts,
    manifest,
    min_cosine,
    read_output,
    run_cli,
    write_corpus,
)

from trt_tei_runtime.corpus.ray_executor import CRASH_ENV

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

N = 1200


@pytest.fixture(scope="module")
def cluster():  # type: ignore[no-untyped-def]
    """A head that runs nothing and two worker nodes: actors land on separate nodes."""
    from ray.cluster_utils import Cluster

    small = {"object_store_memory": 100 * 1024**2}
    # Workers import the package from this checkout, wherever the test runs from.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, **small})
    for _ in range(2):
        c.add_node(num_cpus=1, **small)
    c.wait_for_nodes()
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return make_texts(N, seed=21)


@pytest.fixture(scope="module")
def reference(minilm, texts):  # type: ignore[no-untyped-def]
    return minilm.embed(texts)


def test_map_batches_embeds_like_model_embed(cluster, minilm_dir, texts, reference):  # type: ignore[no-untyped-def]
    from trt_tei_runtime.corpus.ray_data import embed_dataset

    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        rows = [{"id": i, "text": t} for i, t in enumerate(texts)]
        rows.append({"id": N, "text": "   "})  # a bad row: dropped with on_bad_row="skip"
        ds = ray.data.from_items(rows, override_num_blocks=6)
        out = embed_dataset(
            ds, str(minilm_dir), concurrency=2, batch_size=100, id_column="id", on_bad_row="skip"
        ).take_all()
    finally:
        ray.shutdown()
    out.sort(key=lambda r: r["id"])
    assert [r["id"] for r in out] == list(range(N))
    vectors = np.stack([r["embedding"] for r in out])
    assert vectors.dtype == np.float32 and vectors.shape == (N, 384)
    assert min_cosine(vectors, reference) >= 0.99999
    assert [r["text"] for r in out] == texts  # other columns pass through


def test_cli_on_ray_survives_a_killed_worker(cluster, minilm_dir, texts, reference, tmp_path):  # type: ignore[no-untyped-def]
    ids = [f"doc{i}" for i in range(N)]
    path = write_corpus(tmp_path / "c.parquet", [{"id": d, "text": t} for d, t in zip(ids, texts)])
    marker = tmp_path / "crashed"
    result = run_cli(
        minilm_dir,
        "--input",
        path,
        "--id-column",
        "id",
        "--output",
        tmp_path / "out",
        "--shard-rows",
        200,
        "--chunk-rows",
        100,
        "--ray",
        cluster.address,
        "--ray-actors",
        2,
        env={CRASH_ENV: f"2:{marker}"},  # the worker embedding shard 2 dies, once
        timeout=400,
    )
    assert result.returncode == 0, result.stderr
    assert marker.exists()  # the crash did happen
    summary = json_lines(result.stderr)[-1]
    assert summary["complete"] and summary["rows"] == N and summary["shards"] == 6
    assert len(summary["devices"]) == 2  # both actors worked
    out_ids, vectors, num_tokens = read_output(tmp_path / "out")
    assert out_ids == ids  # nothing lost, nothing twice
    assert min_cosine(vectors, reference) >= 0.99999
    np.testing.assert_allclose(vectors, reference, atol=2e-5)
    m = manifest(tmp_path / "out")
    assert m["complete"] and [s["rows"] for s in m["shards"]] == [200] * 6
    assert not [p for p in Path(tmp_path / "out").iterdir() if ".tmp-" in p.name]
