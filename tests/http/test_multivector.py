"""Late interaction (ColBERT) through the real router process: /embed_multivector and
/rerank by MaxSim on a tiny PyLate checkpoint, against PyLate's encoder rules
(`checkpoints.colbert`)."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint
from checkpoints.colbert import make_colbert_checkpoint, pylate_encode, pylate_maxsim

pytestmark = pytest.mark.integration

QUERIES = ["what is the capital of france?", "cat", "the dog " * 30]
DOCUMENTS = [
    "paris is the capital of france, a city on a river.",
    "the cat is on the house!",
    "a",
    "book, text, sentence... long document about the green tree " * 6,
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("colbert")
    return {
        "colbert": make_colbert_checkpoint(root / "colbert", seed=3),
        "dense": make_checkpoint(root / "dense", "BertModel", pooling="mean"),
    }


@pytest.fixture(scope="module")
def colbert(start_server, folders):  # type: ignore[no-untyped-def]
    return start_server(folders["colbert"], "--auto-truncate")


def assert_same(ours: list[list[list[float]]], ref: list[torch.Tensor]) -> None:
    assert [len(o) for o in ours] == [r.shape[0] for r in ref]
    for o, r in zip(ours, ref):
        o = torch.tensor(o)
        cosine = torch.nn.functional.cosine_similarity(o, r, dim=1)
        assert cosine.min() >= 0.99999 and (o - r).abs().max() <= 1e-5


@pytest.mark.parametrize("input_type", ["query", "document"])
def test_embed_multivector_matches_pylate(colbert, folders, input_type):  # type: ignore[no-untyped-def]
    texts = QUERIES if input_type == "query" else DOCUMENTS
    r = colbert.post("/embed_multivector", {"inputs": texts, "input_type": input_type})
    assert r.status_code == 200, r.text
    ref = pylate_encode(folders["colbert"], texts, is_query=input_type == "query")
    assert_same(r.json(), ref)
    # base64: per input, its vectors' little-endian float32 bytes end to end.
    b64 = colbert.post(
        "/embed_multivector",
        {"inputs": texts[0], "input_type": input_type, "encoding_format": "base64"},
    )
    assert b64.status_code == 200, b64.text
    flat = np.frombuffer(base64.b64decode(b64.json()[0]), dtype="<f4")
    np.testing.assert_array_equal(flat, np.asarray(r.json()[0], dtype=np.float32).ravel())


def test_rerank_scores_by_maxsim(colbert, folders):  # type: ignore[no-untyped-def]
    query = QUERIES[0]
    r = colbert.post("/rerank", {"query": query, "texts": DOCUMENTS, "return_text": True})
    assert r.status_code == 200, r.text
    q = pylate_encode(folders["colbert"], [query], is_query=True)[0]
    ref = pylate_maxsim(q, pylate_encode(folders["colbert"], DOCUMENTS, is_query=False))
    ranks = r.json()
    assert [x["index"] for x in ranks] == sorted(range(len(DOCUMENTS)), key=lambda i: -ref[i])
    for x in ranks:
        assert abs(x["score"] - float(ref[x["index"]])) <= 1e-4
        assert x["text"] == DOCUMENTS[x["index"]]


def test_info_says_multivector(colbert):  # type: ignore[no-untyped-def]
    info = colbert.get("/info").json()
    late = info["multivector"]
    assert (late["query_length"], late["document_length"], late["embedding_size"]) == (12, 20, 16)
    assert info["hidden_size"] == 16


def test_bad_multivector_requests(colbert):  # type: ignore[no-untyped-def]
    for body in [
        {"inputs": "a"},
        {"inputs": "a", "input_type": "passage"},
        {"inputs": "a", "input_type": None},
        {"inputs": [[1, 2, 3]], "input_type": "query"},
        {"inputs": "a", "input_type": "query", "encoding_format": "int8"},
    ]:
        r = colbert.post("/embed_multivector", body)
        assert r.status_code == 422, (body, r.text)
    r = colbert.post("/embed_multivector", {"inputs": "a", "input_type": "passage"})
    assert "expected `query` or `document`" in r.json()["error"], r.text
    r = colbert.post("/embed_multivector", {"inputs": "a"})
    assert "missing field `input_type`" in r.json()["error"], r.text
    r = colbert.post("/embed_multivector", {"inputs": "  ", "input_type": "query"})
    assert r.status_code == 400, r.text
    long = " ".join(["river"] * 40)
    r = colbert.post(
        "/embed_multivector", {"inputs": long, "input_type": "document", "truncate": False}
    )
    assert r.status_code == 422 and "document limit of 19" in r.json()["error"], r.text
    # One vector per input is not what this model gives.
    r = colbert.post("/embed", {"inputs": "a"})
    assert 400 <= r.status_code < 500 and "embed_multivector" in r.text, r.text


def test_multivector_on_a_single_vector_model(start_server, folders):  # type: ignore[no-untyped-def]
    server = start_server(folders["dense"])
    r = server.post("/embed_multivector", {"inputs": "a", "input_type": "query"})
    assert r.status_code == 424, r.text
    assert r.json()["error_type"] == "model_type" and "/embed_multivector" in r.json()["error"]
    assert "multivector" not in server.get("/info").json()
