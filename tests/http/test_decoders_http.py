"""Decoder models through the router: a tiny Qwen3 embedder with a named prompt over
`/embed` and `/v1/embeddings`, tiny Qwen2 classifiers over `/predict` and `/rerank`,
each against `transformers`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints import hf_decoder_outputs, make_decoder_checkpoint, tokenizer
from router_harness import cosine, openai_sdk

pytestmark = pytest.mark.integration

PROMPTS = {"query": "<Query>: ", "document": ""}
TEXTS = ["what is the capital of france", "the cat sat on the mat and the dog read a book", "yes"]
QUERY = "the capital of france"
DOCS = ["paris is the capital of france", "the dog read a book", "no"]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    return make_decoder_checkpoint(
        tmp_path_factory.mktemp("qwen3"), "Qwen3Model", seed=3, prompts=PROMPTS, pooling="lasttoken"
    )


def expected_embeddings(folder, texts, prefix: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    ids = [tokenizer().encode(prefix + t).ids for t in texts]
    last = torch.stack([h[-1] for h in hf_decoder_outputs(folder, ids)])
    return torch.nn.functional.normalize(last, dim=-1).numpy()


def test_qwen3_named_prompt_on_embed(start_server, qwen3_dir):  # type: ignore[no-untyped-def]
    server = start_server(qwen3_dir)
    info = server.get("/info").json()
    assert info["model_type"]["embedding"]["pooling"] == "last-token"
    r = server.post("/embed", {"inputs": TEXTS, "prompt_name": "query"})
    assert r.status_code == 200, r.text
    expected = expected_embeddings(qwen3_dir, TEXTS, PROMPTS["query"])
    for got, exp in zip(r.json(), expected):
        assert cosine(got, exp) >= 0.99999
    plain = server.post("/embed", {"inputs": TEXTS}).json()
    assert cosine(plain[0], expected[0]) < 0.9999  # the prompt really changes the input
    r = server.post("/embed", {"inputs": TEXTS, "prompt_name": "nope"})
    assert r.status_code == 422 and "nope" in r.json()["error"]


def test_qwen3_default_prompt_on_openai_embeddings(start_server, qwen3_dir):  # type: ignore[no-untyped-def]
    server = start_server(qwen3_dir, "--default-prompt-name", "query")
    expected = expected_embeddings(qwen3_dir, TEXTS, PROMPTS["query"])
    openai = openai_sdk()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    resp = client.embeddings.create(model="qwen3-tiny", input=TEXTS)
    for item, exp in zip(resp.data, expected):
        assert cosine(item.embedding, exp) >= 0.99999
    assert resp.usage.prompt_tokens == sum(
        len(tokenizer().encode(PROMPTS["query"] + t).ids) for t in TEXTS
    )


@pytest.fixture(scope="module")
def qwen2_dirs(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("qwen2")
    return {
        "classifier": make_decoder_checkpoint(
            root / "classifier", "Qwen2ForSequenceClassification", seed=4, num_labels=3
        ),
        "reranker": make_decoder_checkpoint(
            root / "reranker", "Qwen2ForSequenceClassification", seed=5, num_labels=1
        ),
    }


def test_qwen2_classifier_over_predict(start_server, qwen2_dirs):  # type: ignore[no-untyped-def]
    folder = qwen2_dirs["classifier"]
    server = start_server(folder)
    logits = torch.stack(
        hf_decoder_outputs(folder, [tokenizer().encode(t).ids for t in TEXTS])
    ).numpy()
    r = server.post("/predict", {"inputs": [[t] for t in TEXTS], "raw_scores": True})
    assert r.status_code == 200, r.text
    for preds, expected in zip(r.json(), logits):
        got = {p["label"]: p["score"] for p in preds}
        np.testing.assert_allclose([got[f"label_{i}"] for i in range(3)], expected, atol=1e-4)


def test_qwen2_reranker_over_rerank(start_server, qwen2_dirs):  # type: ignore[no-untyped-def]
    folder = qwen2_dirs["reranker"]
    server = start_server(folder)
    pairs = [tokenizer().encode(QUERY, d).ids for d in DOCS]
    logits = torch.stack(hf_decoder_outputs(folder, pairs)).numpy()[:, 0]
    r = server.post("/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True})
    assert r.status_code == 200, r.text
    ranks = r.json()
    assert [x["index"] for x in ranks] == list(np.argsort(-logits))
    for x in ranks:
        assert abs(x["score"] - logits[x["index"]]) <= 1e-4


def test_qwen3_yes_no_reranker_over_rerank(start_server, tmp_path):  # type: ignore[no-untyped-def]
    """`--task rerank-yes-no`: a Qwen3ForCausalLM scored as logit(yes) - logit(no) on the
    Qwen3-Reranker prompt, tokenized as its model card does."""
    from trt_tei_runtime.templates import QWEN3_RERANKER

    folder = make_decoder_checkpoint(tmp_path / "qwen3-reranker", "Qwen3ForCausalLM", seed=6)
    server = start_server(folder, "--task", "rerank-yes-no")
    tok, t = tokenizer(), QWEN3_RERANKER

    def card_ids(doc: str) -> list[int]:
        body = t.body.format(instruction=t.instruction, query=QUERY, document=doc)
        return [
            *tok.encode(t.prefix, add_special_tokens=False).ids,
            *tok.encode(body, add_special_tokens=False).ids,
            *tok.encode(t.suffix, add_special_tokens=False).ids,
        ]

    yes_no = (tok.token_to_id("no"), tok.token_to_id("yes"))
    expected = torch.cat(hf_decoder_outputs(folder, [card_ids(d) for d in DOCS], yes_no=yes_no))
    r = server.post("/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True})
    assert r.status_code == 200, r.text
    for x in r.json():
        assert abs(x["score"] - float(expected[x["index"]])) <= 1e-4
    probs = {
        x["index"]: x["score"]
        for x in server.post("/rerank", {"query": QUERY, "texts": DOCS}).json()
    }
    np.testing.assert_allclose(
        [probs[i] for i in range(len(DOCS))], torch.sigmoid(expected), atol=1e-5
    )
    r = start_server(folder).post("/rerank", {"query": QUERY, "texts": DOCS})
    assert r.status_code == 424  # without --task it is an embedding model
