"""Late interaction (ColBERT) through the real router process: /embed_multivector and
/rerank by MaxSim on a tiny PyLate checkpoint, against PyLate's encoder rules
(`checkpoints.colbert`)."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

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


def cpu_maxsim(query: list[list[float]], document: list[list[float]]) -> float:
    """The router's former rule, on `/embed_multivector`'s vectors: the sum over the
    query's vectors of the best dot product with the document's; 0 without any."""
    if not document:
        return 0.0
    return float((np.asarray(query) @ np.asarray(document).T).max(axis=1).sum())


def test_rerank_equals_maxsim_of_the_multivector_vectors(colbert):  # type: ignore[no-untyped-def]
    texts = [*DOCUMENTS, "?!."]  # the last has only skiplist tokens besides its specials
    for query in QUERIES:
        q = colbert.post("/embed_multivector", {"inputs": query, "input_type": "query"})
        docs = colbert.post("/embed_multivector", {"inputs": texts, "input_type": "document"})
        assert q.status_code == docs.status_code == 200, (q.text, docs.text)
        expected = [cpu_maxsim(q.json()[0], d) for d in docs.json()]
        r = colbert.post("/rerank", {"query": query, "texts": texts})
        assert r.status_code == 200, r.text
        for x in r.json():
            assert abs(x["score"] - expected[x["index"]]) <= 1e-4, (query, x, expected)


def test_concurrent_reranks_get_each_their_own_scores(colbert, folders):  # type: ignore[no-untyped-def]
    """Documents of different queries share batches; each request is scored against its
    own query."""
    reference = {}
    docs = pylate_encode(folders["colbert"], DOCUMENTS, is_query=False)
    for query in QUERIES:
        q = pylate_encode(folders["colbert"], [query], is_query=True)[0]
        reference[query] = pylate_maxsim(q, docs)
    work = [QUERIES[i % len(QUERIES)] for i in range(24)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda q: colbert.post("/rerank", {"query": q, "texts": DOCUMENTS}), work)
        )
    for query, r in zip(work, answers):
        assert r.status_code == 200, r.text
        for x in r.json():
            assert abs(x["score"] - float(reference[query][x["index"]])) <= 1e-4, (query, x)


def test_bad_rerank_requests(colbert):  # type: ignore[no-untyped-def]
    r = colbert.post("/rerank", {"query": "cat", "texts": []})
    assert r.status_code in (400, 422), r.text
    long = " ".join(["river"] * 40)
    r = colbert.post("/rerank", {"query": "cat", "texts": ["a", long], "truncate": False})
    assert r.status_code == 422 and "texts[1]" in r.json()["error"], r.text
    r = colbert.post("/rerank", {"query": long, "texts": ["a"], "truncate": False})
    assert r.status_code == 422 and "query" in r.json()["error"], r.text


def test_rerank_in_device_worker_processes(start_server, folders, colbert):  # type: ignore[no-untyped-def]
    """`--device-workers processes`: MaxSim batches cross to the workers with their
    queries and score as in one process."""
    server = start_server(
        folders["colbert"], "--auto-truncate", "--devices", "cpu,cpu", "--device-workers",
        "processes",
    )  # fmt: skip
    for query in QUERIES:
        body = {"query": query, "texts": DOCUMENTS}
        ours, theirs = server.post("/rerank", body), colbert.post("/rerank", body)
        assert ours.status_code == 200, ours.text
        expected = {x["index"]: x["score"] for x in theirs.json()}
        for x in ours.json():
            assert abs(x["score"] - expected[x["index"]]) <= 1e-4, (query, x)


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
