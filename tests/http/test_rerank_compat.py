"""Cohere- and Jina-style rerank (`/v1/rerank`, `/v2/rerank`) on a tiny random reranker:
through Cohere's own SDK, against the documented body shape, and against TEI's `/rerank`
(whose scores `test_classifier.py` checks against transformers)."""

from __future__ import annotations

import uuid

import pytest
from checkpoints import make_checkpoint

pytestmark = pytest.mark.integration

QUERY = "what is deep learning"
DOCS = ["deep learning is a machine model", "paris is the capital of france", "cat", "dog dog"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerank-compat")
    return {
        "reranker": make_checkpoint(
            root / "reranker",
            "BertForSequenceClassification",
            num_labels=1,
            seed=2,
            max_position_embeddings=64,
        ),
        "embedder": make_checkpoint(root / "embedder", "BertModel", seed=3),
    }


@pytest.fixture(scope="module")
def reranker(start_server, checkpoints):
    return start_server(checkpoints["reranker"], "--served-model-name", "tiny-reranker")


@pytest.fixture(scope="module")
def tei_ranks(reranker) -> list[dict]:
    """TEI's `/rerank` on the same query and documents: the reference order and scores."""
    r = reranker.post("/rerank", {"query": QUERY, "texts": DOCS})
    assert r.status_code == 200, r.text
    return r.json()


def cohere_sdk():  # type: ignore[no-untyped-def]
    return pytest.importorskip("cohere")


def test_cohere_v1_sdk(reranker, tei_ranks):
    cohere = cohere_sdk()
    co = cohere.Client(api_key="unused", base_url=reranker.url, timeout=60)
    # Strings and {text} objects mixed, as Cohere v1 takes them.
    docs = [DOCS[0], {"text": DOCS[1]}, DOCS[2], {"text": DOCS[3], "title": "ignored"}]
    res = co.rerank(model="m", query=QUERY, documents=docs, top_n=3, return_documents=True)
    assert [x.index for x in res.results] == [x["index"] for x in tei_ranks[:3]]
    for got, ref in zip(res.results, tei_ranks):
        assert got.relevance_score == pytest.approx(ref["score"], abs=1e-6)
        assert 0.0 <= got.relevance_score <= 1.0
        assert got.document is not None and got.document.text == DOCS[got.index]
    uuid.UUID(res.id)
    assert res.meta is not None and res.meta.api_version.version == "1"
    assert res.meta.billed_units.search_units == 1
    assert res.meta.billed_units.input_tokens > 0
    # return_documents defaults to false: no documents.
    res = co.rerank(model="m", query=QUERY, documents=DOCS)
    assert len(res.results) == len(DOCS)
    assert all(x.document is None for x in res.results)


def test_cohere_v2_sdk(reranker, tei_ranks):
    cohere = cohere_sdk()
    co = cohere.ClientV2(api_key="unused", base_url=reranker.url, timeout=60)
    res = co.rerank(model="m", query=QUERY, documents=DOCS, top_n=2)
    assert [x.index for x in res.results] == [x["index"] for x in tei_ranks[:2]]
    assert res.results[0].relevance_score == pytest.approx(tei_ranks[0]["score"], abs=1e-6)
    assert res.meta.api_version.version == "2"
    assert res.meta.tokens.input_tokens == res.meta.billed_units.input_tokens


def test_cohere_sdk_errors(reranker, start_server, checkpoints):
    cohere = cohere_sdk()
    co = cohere.ClientV2(api_key="unused", base_url=reranker.url, timeout=60)
    with pytest.raises(cohere.errors.UnprocessableEntityError) as e:
        co.rerank(model="m", query=QUERY, documents=DOCS, top_n=0)
    assert "top_n" in e.value.body["error"]["message"]
    with pytest.raises(cohere.errors.BadRequestError) as e:
        co.rerank(model="m", query=QUERY, documents=[])
    assert "`documents` cannot be empty" in e.value.body["error"]["message"]
    embedder = start_server(checkpoints["embedder"])
    co = cohere.Client(api_key="unused", base_url=embedder.url, timeout=60)
    with pytest.raises(cohere.errors.BadRequestError) as e:
        co.rerank(model="m", query=QUERY, documents=DOCS)
    message = e.value.body["error"]["message"]
    assert "not available" in message and "an embedding model" in message, message


def test_documented_shape_without_sdk(reranker, tei_ranks):
    """Cohere's `{id, results: [{index, relevance_score, document: {text}}], meta}` and Jina's
    `{model, usage: {total_tokens}, results}`, read as plain JSON."""
    for path, version in [("/v1/rerank", "1"), ("/v2/rerank", "2")]:
        r = reranker.post(
            path,
            {"model": "jina-reranker", "query": QUERY, "documents": DOCS, "return_documents": True},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"id", "model", "results", "meta", "usage"}
        assert body["model"] == "tiny-reranker"
        results = body["results"]
        assert [x["index"] for x in results] == [x["index"] for x in tei_ranks]
        for x, ref in zip(results, tei_ranks):
            assert set(x) == {"index", "relevance_score", "document"}
            assert x["document"] == {"text": DOCS[x["index"]]}
            assert x["relevance_score"] == pytest.approx(ref["score"], abs=1e-6)
        scores = [x["relevance_score"] for x in results]
        assert scores == sorted(scores, reverse=True)
        tokens = body["usage"]["total_tokens"]
        assert tokens == body["usage"]["prompt_tokens"] == int(r.headers["x-compute-tokens"])
        assert body["meta"] == {
            "api_version": {"version": version},
            "billed_units": {"search_units": 1, "input_tokens": tokens},
            "tokens": {"input_tokens": tokens, "output_tokens": 0},
        }


def test_long_documents_are_truncated_unless_asked_not_to(reranker):
    long_doc = " ".join(["cat"] * 80)  # over the model's 64 positions
    r = reranker.post("/v1/rerank", {"query": QUERY, "documents": [long_doc, "cat"]})
    assert r.status_code == 200, r.text
    r = reranker.post("/v1/rerank", {"query": QUERY, "documents": [long_doc], "truncate": False})
    assert r.status_code == 422 and "64" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        ({"query": QUERY, "documents": DOCS, "top_n": 0}, 422, "`top_n` must be at least 1"),
        ({"query": QUERY, "documents": DOCS, "top_n": -1}, 422, "`top_n` must be at least 1"),
        ({"query": QUERY, "documents": []}, 400, "`documents` cannot be empty"),
        ({"query": QUERY, "documents": ["a", ""]}, 400, "`documents[1]` cannot be empty"),
        ({"query": "", "documents": DOCS}, 400, "`query` cannot be empty"),
        ({"query": QUERY, "documents": [1, 2]}, 422, "`documents[0]` must be a string or"),
        ({"query": QUERY, "documents": "a"}, 422, "`documents` must be a list"),
        ({"query": QUERY, "documents": [{"title": "x"}]}, 422, "no string `text`"),
        ({"query": QUERY, "documents": DOCS, "rank_fields": ["title"]}, 422, "rank_fields"),
        ({"query": QUERY, "documents": ["a"] * 33}, 422, "batch size 33"),
        ({"documents": DOCS}, 422, "query"),
    ],
)
def test_bad_inputs(reranker, path, body, status, expected):
    r = reranker.post(path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert expected in error["message"], error
    assert error["code"] == status
