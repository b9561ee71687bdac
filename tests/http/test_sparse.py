"""/embed_sparse through the real router process on a tiny SPLADE folder, against
sentence-transformers' `SparseEncoder` on the same folder."""

from __future__ import annotations

import pytest
from checkpoints import make_checkpoint, make_splade_checkpoint

pytestmark = pytest.mark.integration

TEXTS = ["the cat", "a long document about the river in paris", "x", "search engine query"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("sparse")
    return {
        "splade": make_splade_checkpoint(root / "splade", seed=4, max_seq_length=16),
        "dense": make_checkpoint(root / "dense", "BertModel", pooling="mean"),
    }


@pytest.fixture(scope="module")
def splade(start_server, folders):  # type: ignore[no-untyped-def]
    return start_server(folders["splade"])


def reference(folder, texts):  # type: ignore[no-untyped-def]
    from sentence_transformers import SparseEncoder

    dense = SparseEncoder(str(folder), device="cpu").encode(texts, convert_to_sparse_tensor=False)
    return [{int(j): float(row[j]) for j in row.nonzero().flatten()} for row in dense]


def as_dict(answer: list[dict]) -> dict[int, float]:
    indices = [p["index"] for p in answer]
    assert indices == sorted(indices), "pairs come in index order"
    return {p["index"]: p["value"] for p in answer}


def assert_same(ours: dict[int, float], ref: dict[int, float]) -> None:
    assert ours.keys() == ref.keys()
    assert max(abs(ours[j] - ref[j]) for j in ref) <= 1e-4


def test_embed_sparse_matches_sparse_encoder(splade, folders):  # type: ignore[no-untyped-def]
    r = splade.post("/embed_sparse", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    answers = r.json()
    assert len(answers) == len(TEXTS)
    for ours, ref in zip(answers, reference(folders["splade"], TEXTS)):
        assert_same(as_dict(ours), ref)
    # One at a time gives the same vectors as the batch.
    single = splade.post("/embed_sparse", {"inputs": TEXTS[1]}).json()
    assert single[0] == answers[1]
    # POST / is the model's own route: /embed_sparse.
    assert splade.post("/", {"inputs": TEXTS}).json() == answers


def test_sparse_model_info_and_truncation(splade, folders):  # type: ignore[no-untyped-def]
    info = splade.get("/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}
    long = " ".join(["river"] * 40)
    r = splade.post("/embed_sparse", {"inputs": long})
    assert r.status_code == 422 and "16" in r.json()["error"], r.text
    r = splade.post("/embed_sparse", {"inputs": long, "truncate": True})
    assert r.status_code == 200, r.text


def test_sparse_model_on_embed_is_a_clear_424(splade):  # type: ignore[no-untyped-def]
    for path, body in [("/embed", {"inputs": "a"}), ("/predict", {"inputs": "a"})]:
        r = splade.post(path, body)
        assert r.status_code == 424, r.text
        assert r.json()["error_type"] == "model_type"
        assert "SPLADE" in r.json()["error"] and "/embed_sparse" in r.json()["error"]
    r = splade.post("/v1/embeddings", {"input": "a"})
    assert r.status_code == 400 and "/embed_sparse" in r.json()["error"]["message"], r.text
    r = splade.post("/embed_sparse", {"inputs": []})
    assert r.status_code == 400


def test_dense_model_on_embed_sparse_is_a_clear_424(start_server, folders):  # type: ignore[no-untyped-def]
    server = start_server(folders["dense"])
    r = server.post("/embed_sparse", {"inputs": "a"})
    assert r.status_code == 424, r.text
    assert r.json()["error_type"] == "model_type"
    assert "needs a SPLADE model" in r.json()["error"]


def test_max_active_dims_flag(start_server, folders):  # type: ignore[no-untyped-def]
    from sentence_transformers import SparseEncoder

    server = start_server(folders["splade"], "--max-active-dims", "3", "--pooling", "splade")
    answers = server.post("/embed_sparse", {"inputs": TEXTS}).json()
    ref = SparseEncoder(str(folders["splade"]), device="cpu").encode(
        TEXTS, convert_to_sparse_tensor=False, max_active_dims=3
    )
    for ours, row in zip(answers, ref):
        assert len(ours) == 3
        assert_same(as_dict(ours), {int(j): float(row[j]) for j in row.nonzero().flatten()})
