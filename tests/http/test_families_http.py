"""Issue 15's families through the real router process, against `transformers` / peft /
sentence-transformers: jina-embeddings-v3's adapter chosen per request by `prompt_name`
(a mixed batch included, and an unknown task refused), NomicBERT with its prompts,
EmbeddingGemma with its Dense modules, a ModernBERT classifier."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
import torch
from checkpoints import (
    JINA_PROMPTS,
    add_embeddinggemma_modules,
    add_jina_adapters,
    hf_jina_outputs,
    make_family_checkpoint,
)
from reference import hf_encoder_outputs
from router_harness import cosine, openai_sdk
from tokenizers import Tokenizer

pytestmark = pytest.mark.integration

TEXTS = ["what is the capital of france", "paris is a city on a river", "a"]
# The -hf checkpoint's folder of each task name a client sends.
FOLDER = {
    "retrieval.query": "retrieval_query",
    "retrieval.passage": "retrieval_passage",
    "separation": "separation",
    "classification": "classification",
    "text-matching": "text_matching",
}


@pytest.fixture(scope="module")
def jina_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = make_family_checkpoint(
        tmp_path_factory.mktemp("jina"),
        "JinaEmbeddingsV3Model",
        seed=1,
        pooling="mean",
        prompts=JINA_PROMPTS,
    )
    add_jina_adapters(folder, seed=1)
    return folder


def jina_expected(folder, texts, task: str | None) -> np.ndarray:  # type: ignore[no-untyped-def]
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    prompt = JINA_PROMPTS.get(task or "", "")
    ids = [tok.encode(prompt + t).ids for t in texts]
    hidden = hf_jina_outputs(folder, ids, None if task is None else FOLDER[task])
    pooled = torch.stack([h.mean(0) for h in hidden])
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_jina_prompt_name_picks_the_adapter(start_server, jina_dir):  # type: ignore[no-untyped-def]
    server = start_server(jina_dir)
    for task in FOLDER:
        r = server.post("/embed", {"inputs": TEXTS, "prompt_name": task})
        assert r.status_code == 200, r.text
        for got, exp in zip(r.json(), jina_expected(jina_dir, TEXTS, task)):
            assert cosine(got, exp) >= 0.99999, task
    # No prompt name: the base weights.
    plain = server.post("/embed", {"inputs": TEXTS}).json()
    for got, exp in zip(plain, jina_expected(jina_dir, TEXTS, None)):
        assert cosine(got, exp) >= 0.99999


def test_jina_concurrent_requests_with_different_adapters(start_server, jina_dir):  # type: ignore[no-untyped-def]
    """Requests for different tasks at once share batches; each keeps its own adapter."""
    server = start_server(jina_dir)
    expected = {task: jina_expected(jina_dir, TEXTS, task) for task in FOLDER}
    jobs = [task for task in FOLDER for _ in range(4)]

    def call(task: str):  # type: ignore[no-untyped-def]
        return task, server.post("/embed", {"inputs": TEXTS, "prompt_name": task})

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        for task, r in pool.map(call, jobs):
            assert r.status_code == 200, r.text
            for got, exp in zip(r.json(), expected[task]):
                assert cosine(got, exp) >= 0.99999, task


def test_jina_unknown_task_is_refused(start_server, jina_dir):  # type: ignore[no-untyped-def]
    server = start_server(jina_dir)
    r = server.post("/embed", {"inputs": TEXTS, "prompt_name": "retrieval"})
    assert r.status_code == 422
    assert "retrieval" in r.json()["error"] and "retrieval.query" in r.json()["error"]


def test_jina_default_task_on_openai_embeddings(start_server, jina_dir):  # type: ignore[no-untyped-def]
    """/v1/embeddings has no prompt_name: the server's --default-prompt-name picks the task."""
    server = start_server(jina_dir, "--default-prompt-name", "retrieval.passage")
    openai = openai_sdk()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    resp = client.embeddings.create(model="jina", input=TEXTS)
    expected = jina_expected(jina_dir, TEXTS, "retrieval.passage")
    for item, exp in zip(resp.data, expected):
        assert cosine(item.embedding, exp) >= 0.99999


def test_nomic_prompts(start_server, tmp_path):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    prompts = {"query": "search_query: ", "document": "search_document: "}
    folder = make_family_checkpoint(tmp_path, "NomicBertModel", pooling="mean", prompts=prompts)
    server = start_server(folder)
    reference = SentenceTransformer(str(folder), device="cpu")
    for name in prompts:
        r = server.post("/embed", {"inputs": TEXTS, "prompt_name": name})
        assert r.status_code == 200, r.text
        expected = reference.encode(TEXTS, prompt_name=name, normalize_embeddings=True)
        for got, exp in zip(r.json(), expected):
            assert cosine(got, exp) >= 0.99999


def test_embeddinggemma_dense_modules(start_server, tmp_path):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    folder = make_family_checkpoint(tmp_path, "Gemma3TextModel", use_bidirectional_attention=True)
    add_embeddinggemma_modules(folder, hidden=64)
    server = start_server(folder)
    assert server.get("/info").json()["model_type"]["embedding"]["pooling"] == "mean"
    reference = SentenceTransformer(str(folder), device="cpu")
    r = server.post("/embed", {"inputs": TEXTS, "prompt_name": "query"})
    assert r.status_code == 200, r.text
    for got, exp in zip(r.json(), reference.encode(TEXTS, prompt_name="query")):
        assert len(got) == 64 and cosine(got, exp) >= 0.99999


def test_modernbert_classifier(start_server, tmp_path):  # type: ignore[no-untyped-def]
    folder = make_family_checkpoint(
        tmp_path, "ModernBertForSequenceClassification", num_labels=3, classifier_pooling="mean"
    )
    server = start_server(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    logits = torch.stack(hf_encoder_outputs(folder, [tok.encode(t).ids for t in TEXTS]))
    r = server.post("/predict", {"inputs": [[t] for t in TEXTS], "raw_scores": True})
    assert r.status_code == 200, r.text
    for got, exp in zip(r.json(), logits.numpy()):
        scores = {s["label"]: s["score"] for s in got}
        assert np.abs(np.array([scores[f"label_{i}"] for i in range(3)]) - exp).max() <= 1e-4
