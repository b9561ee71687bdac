"""`long_input: chunk` through the real router on tiny mean- and CLS-pooled BERT folders
(limit 16 tokens: windows of 14), against the rule computed with sentence-transformers
(tests/long_input_rule.py); `usage`; the 413 and 422 answers."""

from __future__ import annotations

import pytest
from checkpoints import make_checkpoint
from long_input_rule import ChunkRule, cosine, document

pytestmark = pytest.mark.integration

LIMIT = 16
WINDOW = LIMIT - 2
MIN_COSINE = 0.99999
# A document of 40 windows (without overlap), one of one window, short inputs, and one of 8.
TEXTS = [
    document(40 * WINDOW, seed=1),
    "the cat",
    document(WINDOW, seed=2),
    "search engine query",
    document(7 * WINDOW + 3, seed=3),
]
POOLINGS = ["mean", "cls"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("long_input")
    return {
        p: make_checkpoint(root / p, "BertModel", pooling=p, max_seq_length=LIMIT, seed=i + 5)
        for i, p in enumerate(POOLINGS)
    }


@pytest.fixture(scope="module")
def servers(start_server, folders):  # type: ignore[no-untyped-def]
    return {p: start_server(folders[p], "--max-chunks", "64") for p in POOLINGS}


@pytest.fixture(scope="module")
def rules(folders):  # type: ignore[no-untyped-def]
    return {p: ChunkRule(folders[p], LIMIT) for p in POOLINGS}


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("overlap", [0, 5])
def test_chunked_inputs_match_the_rule(servers, rules, pooling, overlap):  # type: ignore[no-untyped-def]
    rule = rules[pooling]
    assert len(rule.windows(TEXTS[0], 0)) == 40 and len(rule.windows(TEXTS[2], 0)) == 1
    r = servers[pooling].post(
        "/embed", {"inputs": TEXTS, "long_input": "chunk", "chunk_overlap": overlap}
    )
    assert r.status_code == 200, r.text
    for text, got in zip(TEXTS, r.json()):
        assert cosine(got, rule.embed(text, overlap)) >= MIN_COSINE


def test_openai_usage_counts_every_window(servers, rules):  # type: ignore[no-untyped-def]
    rule = rules["mean"]
    r = servers["mean"].post(
        "/v1/embeddings", {"input": TEXTS, "long_input": "chunk", "chunk_overlap": 3}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == sum(rule.tokens(t, 3) for t in TEXTS)
    for text, item in zip(TEXTS, body["data"]):
        assert cosine(item["embedding"], rule.embed(text, 3)) >= MIN_COSINE


def test_post_root_and_similarity_chunk(servers, rules):  # type: ignore[no-untyped-def]
    server, rule = servers["cls"], rules["cls"]
    root = server.post("/", {"inputs": TEXTS[:2], "long_input": "chunk"})
    assert root.status_code == 200, root.text
    assert cosine(root.json()[0], rule.embed(TEXTS[0])) >= MIN_COSINE
    r = server.post(
        "/similarity",
        {
            "inputs": {"source_sentence": TEXTS[0], "sentences": [TEXTS[4], TEXTS[1]]},
            "parameters": {"long_input": "chunk"},
        },
    )
    assert r.status_code == 200, r.text
    source = rule.embed(TEXTS[0])
    for sentence, score in zip([TEXTS[4], TEXTS[1]], r.json()):
        assert abs(score - float(source @ rule.embed(sentence))) < 1e-5


def test_over_max_chunks_is_413_naming_the_input(servers):  # type: ignore[no-untyped-def]
    over = document(64 * WINDOW + 1, seed=9)
    r = servers["mean"].post("/embed", {"inputs": ["the cat", over], "long_input": "chunk"})
    assert r.status_code == 413, r.text
    assert r.json()["error_type"] == "payload_too_large"
    assert "`inputs[1]` needs 65 windows of 14 tokens" in r.json()["error"]
    r = servers["mean"].post("/v1/embeddings", {"input": over, "long_input": "chunk"})
    assert r.status_code == 413 and "`input` needs 65 windows" in r.text, r.text


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"long_input": "whole"}, '`long_input` must be "error", "truncate" or "chunk"'),
        ({"long_input": "chunk", "chunk_overlap": -2}, "`chunk_overlap` must be at least 0"),
        ({"long_input": "chunk", "chunk_overlap": 14}, "`chunk_overlap` (14) must be smaller"),
    ],
)
def test_bad_long_input_fields_are_422(servers, fields, needle):  # type: ignore[no-untyped-def]
    r = servers["mean"].post("/embed", {"inputs": "the cat", **fields})
    assert r.status_code == 422, r.text
    assert needle in r.json()["error"]


def test_error_is_the_default_and_says_what_helps(servers):  # type: ignore[no-untyped-def]
    r = servers["mean"].post("/embed", {"inputs": TEXTS[0]})
    assert r.status_code == 422, r.text
    assert "long_input" in r.json()["error"]
