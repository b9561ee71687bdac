"""/predict and /rerank on tiny random classifiers, against transformers' logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint
from router_harness import openai_sdk

pytestmark = pytest.mark.integration

QUERY = "what is deep learning"
DOCS = ["deep learning is a machine model", "paris is the capital of france", "cat", "dog dog"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("classifiers")
    return {
        # 64 positions: the bad-input tests go past the model's limit.
        "classifier": make_checkpoint(
            root / "classifier",
            "BertForSequenceClassification",
            num_labels=3,
            seed=1,
            max_position_embeddings=64,
        ),
        "reranker": make_checkpoint(
            root / "reranker",
            "BertForSequenceClassification",
            num_labels=1,
            seed=2,
            max_position_embeddings=64,
        ),
    }


@pytest.fixture(scope="module")
def classifier(start_server, checkpoints):
    return start_server(checkpoints["classifier"])


@pytest.fixture(scope="module")
def reranker(start_server, checkpoints):
    return start_server(checkpoints["reranker"])


def hf_logits(folder, texts, pairs=None) -> np.ndarray:
    """transformers' logits, tokenized as pairs (token_type_ids 0/1) when `pairs` is given."""
    from tokenizers import Tokenizer
    from transformers import BertForSequenceClassification

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    # The file carries its own truncation (8) and padding (16), as real ones do; the router
    # ignores both, so the reference does too.
    tok.no_truncation()
    tok.no_padding()
    model = BertForSequenceClassification.from_pretrained(folder).eval()
    out = []
    for i, text in enumerate(texts):
        enc = tok.encode(text, pairs[i]) if pairs else tok.encode(text)
        with torch.no_grad():
            logits = model(
                input_ids=torch.tensor([enc.ids]),
                token_type_ids=torch.tensor([enc.type_ids]),
            ).logits
        out.append(logits[0].numpy())
    return np.array(out)


def by_label(predictions) -> np.ndarray:
    scores = {p["label"]: p["score"] for p in predictions}
    return np.array([scores[f"label_{i}"] for i in range(len(scores))])


def test_predict_single_raw_and_softmax(classifier, checkpoints):
    logits = hf_logits(checkpoints["classifier"], [DOCS[0]])[0]
    r = classifier.post("/predict", {"inputs": DOCS[0], "raw_scores": True})
    assert r.status_code == 200, r.text
    raw = by_label(r.json())
    np.testing.assert_allclose(raw, logits, atol=1e-4)
    r = classifier.post("/predict", {"inputs": DOCS[0]})
    preds = r.json()

    def softmax(x: np.ndarray) -> np.ndarray:
        return np.exp(x - x.max()) / np.exp(x - x.max()).sum()

    # The server's probabilities are its own logits' softmax; against transformers' they
    # carry the logits' tolerance (a device's float32 sums differ in their last digits).
    np.testing.assert_allclose(by_label(preds), softmax(raw), atol=1e-6)
    np.testing.assert_allclose(by_label(preds), softmax(logits), atol=1e-4)
    assert [p["score"] for p in preds] == sorted((p["score"] for p in preds), reverse=True)


def test_predict_pairs_and_batches(classifier, checkpoints):
    logits = hf_logits(checkpoints["classifier"], [QUERY] * 2, pairs=DOCS[:2])
    r = classifier.post("/predict", {"inputs": [QUERY, DOCS[0]], "raw_scores": True})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(by_label(r.json()), logits[0], atol=1e-4)
    batch = [[QUERY, DOCS[0]], [DOCS[2]], [QUERY, DOCS[1]]]
    r = classifier.post("/predict", {"inputs": batch, "raw_scores": True})
    got = [by_label(p) for p in r.json()]
    np.testing.assert_allclose(got[0], logits[0], atol=1e-4)
    np.testing.assert_allclose(got[2], logits[1], atol=1e-4)
    single = hf_logits(checkpoints["classifier"], [DOCS[2]])[0]
    np.testing.assert_allclose(got[1], single, atol=1e-4)


def test_classifier_refuses_other_routes(classifier):
    r = classifier.post("/rerank", {"query": QUERY, "texts": DOCS})
    assert r.status_code == 424 and "/predict" in r.json()["error"]
    r = classifier.post("/embed", {"inputs": "a"})
    assert r.status_code == 424 and "classifier" in r.json()["error"]
    r = classifier.post("/v1/embeddings", {"input": "a"})
    assert r.status_code == 400 and "/predict" in r.json()["error"]["message"]
    info = classifier.get("/info").json()
    assert info["model_type"]["classifier"]["id2label"] == {str(i): f"label_{i}" for i in range(3)}
    r = classifier.post("/", {"inputs": DOCS[0]})
    assert r.status_code == 200 and len(r.json()) == 3


def test_openai_sdk_on_a_classifier(classifier):
    openai = openai_sdk()
    oa = openai.OpenAI(base_url=f"{classifier.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        oa.embeddings.create(model="m", input="a")
    assert "/predict" in str(e.value)


def test_rerank_matches_sigmoid_of_logits(reranker, checkpoints):
    logits = hf_logits(checkpoints["reranker"], [QUERY] * len(DOCS), pairs=DOCS)[:, 0]
    r = reranker.post("/rerank", {"query": QUERY, "texts": DOCS, "return_text": True})
    assert r.status_code == 200, r.text
    ranks = r.json()
    order = list(np.argsort(-logits))
    assert [x["index"] for x in ranks] == order
    expected = 1 / (1 + np.exp(-logits))
    for x in ranks:
        assert x["text"] == DOCS[x["index"]]
        assert abs(x["score"] - expected[x["index"]]) < 1e-5
    r = reranker.post("/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True, "top_n": 2})
    ranks = r.json()
    assert len(ranks) == 2 and "text" not in ranks[0]
    assert abs(ranks[0]["score"] - logits[order[0]]) < 1e-4
    # POST / reranks on a reranker; /predict scores pairs too.
    assert reranker.post("/", {"query": QUERY, "texts": DOCS}).json()[0]["index"] == order[0]
    r = reranker.post("/predict", {"inputs": [QUERY, DOCS[0]], "raw_scores": True})
    assert abs(r.json()[0]["score"] - logits[0]) < 1e-4


def test_rerank_bad_inputs(reranker):
    r = reranker.post("/rerank", {"query": QUERY, "texts": []})
    assert r.status_code == 400 and "`texts`" in r.json()["error"]
    r = reranker.post("/rerank", {"query": QUERY, "texts": ["a"] * 33})
    assert r.status_code == 422 and "batch size 33" in r.json()["error"]
    r = reranker.post("/rerank", {"query": QUERY, "texts": [" ".join(["cat"] * 80)]})
    assert r.status_code == 422 and "64" in r.json()["error"]
    r = reranker.post("/rerank", {"query": QUERY, "texts": ["cat " * 80], "truncate": True})
    assert r.status_code == 200
