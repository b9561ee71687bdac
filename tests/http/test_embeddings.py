"""all-MiniLM-L6-v2 served by the router, driven by real clients, against sentence-transformers."""

from __future__ import annotations

import base64
import json
import os
import platform
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from router_harness import cosine, openai_sdk

pytestmark = pytest.mark.integration

TEXTS = [
    "What is Deep Learning?",
    "Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors",
    "a",
]
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def server(start_server, minilm_dir):
    return start_server(minilm_dir, "--max-client-batch-size", "64")


@pytest.fixture(scope="module")
def st_model(minilm_dir):
    from sentence_transformers import SentenceTransformer

    # float32 even where the checkpoint is stored in half precision (the GPU machine's copy).
    return SentenceTransformer(str(minilm_dir), device="cpu").float()


@pytest.fixture(scope="module")
def st_unnormalized(st_model):
    """The same model without its Normalize module: raw mean-pooled embeddings."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(modules=[st_model[0], st_model[1]], device="cpu")


@pytest.fixture(scope="module")
def reference(st_model):
    return st_model.encode(TEXTS, convert_to_numpy=True)


def assert_same(got, expected) -> None:
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    for g, e in zip(got, expected):
        assert cosine(g, e) >= MIN_COSINE


def openai_client(server):
    return openai_sdk().OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60
    )


def test_openai_float(server, reference):
    resp = openai_client(server).embeddings.create(model="minilm", input=TEXTS)
    assert [d.index for d in resp.data] == list(range(len(TEXTS)))
    got = np.array([d.embedding for d in resp.data])
    assert_same(got, reference)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > len(TEXTS) * 2
    assert resp.model == server.get("/info").json()["served_model_name"]


def test_openai_base64_single(server, reference):
    resp = openai_client(server).embeddings.create(
        model="minilm", input=TEXTS[0], encoding_format="base64"
    )
    emb = resp.data[0].embedding
    if isinstance(emb, str):  # older SDKs hand base64 through undecoded
        emb = np.frombuffer(base64.b64decode(emb), dtype="<f4")
    assert_same([emb], reference[:1])


def test_openai_dimensions(server, st_unnormalized):
    resp = openai_client(server).embeddings.create(model="minilm", input=TEXTS, dimensions=128)
    got = np.array([d.embedding for d in resp.data])
    assert got.shape == (len(TEXTS), 128)
    # Matryoshka: the first 128 raw dimensions, then normalized.
    raw = st_unnormalized.encode(TEXTS, convert_to_numpy=True)[:, :128]
    expected = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    assert_same(got, expected)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_inference_client_feature_extraction(server, reference, monkeypatch):
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    # Offline mode blocks every request the hub client makes, loopback included; this client
    # only ever talks to the local server.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    client = InferenceClient(base_url=server.url, timeout=60)
    got = client.feature_extraction(TEXTS[1])
    assert_same(np.asarray(got).reshape(1, -1), reference[1:2])
    got = client.feature_extraction(TEXTS)
    assert_same(got, reference)


def test_embed_normalized_and_raw(server, reference, st_unnormalized):
    r = server.post("/embed", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    assert_same(r.json(), reference)
    r = server.post("/embed", {"inputs": TEXTS, "normalize": False})
    got = np.array(r.json())
    raw = st_unnormalized.encode(TEXTS, convert_to_numpy=True)
    assert_same(got, raw)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(raw, axis=1), rtol=1e-4)


def test_embed_all_matches_token_embeddings(server, st_model):
    r = server.post("/embed_all", {"inputs": TEXTS[:2]})
    assert r.status_code == 200, r.text
    expected = st_model.encode(TEXTS[:2], output_value="token_embeddings")
    for got, exp in zip(r.json(), expected):
        exp = exp.cpu().numpy()
        assert len(got) == len(exp)
        for g, e in zip(got, exp):
            assert cosine(g, e) >= MIN_COSINE


def test_truncation_uses_the_models_limit(server, st_model):
    # 300 words: over the tokenizer file's own 128 limit and the model's 256 limit.
    long = " ".join(["word"] * 300)
    r = server.post("/embed", {"inputs": long})
    assert r.status_code == 422
    assert "256" in r.json()["error"] and "302" in r.json()["error"]
    r = server.post("/embed", {"inputs": long, "truncate": True})
    assert r.status_code == 200, r.text
    assert_same(r.json(), st_model.encode([long]))  # ST truncates at max_seq_length=256
    # 200 words fit the model (256) though not the file's built-in truncation (128).
    medium = " ".join(["word"] * 200)
    r = server.post("/embed", {"inputs": medium})
    assert r.status_code == 200, r.text
    assert r.headers["x-compute-tokens"] == "202"
    assert_same(r.json(), st_model.encode([medium]))


def test_similarity(server, st_model):
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    r = server.post("/similarity", body)
    assert r.status_code == 200, r.text
    emb = st_model.encode(TEXTS, convert_to_numpy=True)
    expected = [cosine(emb[0], e) for e in emb[1:]]
    np.testing.assert_allclose(r.json(), expected, atol=1e-5)


def test_tokenize_and_decode(server, minilm_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    r = server.post("/tokenize", {"inputs": TEXTS[0]})
    assert r.status_code == 200, r.text
    tokens = r.json()[0]
    assert [t["id"] for t in tokens] == tok.encode(TEXTS[0]).ids
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[1]["text"] == "What" and tokens[1]["start"] == 0 and tokens[1]["stop"] == 4
    r = server.post("/decode", {"ids": [t["id"] for t in tokens]})
    assert r.json() == [tok.decode(tok.encode(TEXTS[0]).ids)]


def test_headers_info_metrics_docs(server):
    r = server.post("/embed", {"inputs": TEXTS[:2]})
    for h in (
        "x-compute-time",
        "x-compute-tokens",
        "x-tokenization-time",
        "x-queue-time",
        "x-inference-time",
        "x-total-time",
        "x-compute-characters",
        "x-compute-type",
    ):
        assert h in r.headers
    info = server.get("/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256
    assert info["max_client_batch_size"] == 64
    metrics = server.get("/metrics").text
    for name in (
        "te_request_count",
        "te_request_duration_bucket",
        "te_batch_next_size_bucket",
        "te_request_input_length_bucket",
        "te_batch_inference_duration_bucket",
        "te_queue_size",
    ):
        assert name in metrics
    spec = server.get("/api-doc/openapi.json").json()
    assert "/embed" in spec["paths"] and "/v1/embeddings" in spec["paths"]
    assert "swagger" in server.get("/docs", follow_redirects=True).text.lower()
    assert server.get("/health").status_code == 200


ALLOCATOR_GAUGES = (
    "te_allocator_arenas",
    "te_allocator_arena_bytes",
    "te_allocator_in_use_bytes",
    "te_allocator_free_bytes",
    "te_allocator_mmap_bytes",
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallinfo2 only")
def test_allocator_gauges_are_the_processs(server):
    """`te_allocator_*` (rust_router/src/allocator.rs): every gauge with help text, and
    figures that can only be this process's: the model's weights in use, no more in use
    than the process maps, the free bytes inside the arenas."""
    assert server.post("/embed", {"inputs": TEXTS}).status_code == 200
    text = server.get("/metrics").text
    for name in ALLOCATOR_GAUGES:
        assert f"# HELP {name} " in text and f"# TYPE {name} gauge" in text, name
    got = {k: float(v) for k, v in re.findall(r"^te_allocator_(\w+) (\S+)$", text, re.M)}
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    vm_size = int(re.search(r"^VmSize:\s+(\d+) kB", status, re.M).group(1)) * 1024
    mib = 1 << 20
    # all-MiniLM-L6-v2's 22.7 M weights are 43 MiB in half precision, 87 MiB in float32.
    assert 32 * mib < got["in_use_bytes"] < vm_size
    assert got["mmap_bytes"] <= got["in_use_bytes"]
    assert 0 <= got["free_bytes"] <= got["arena_bytes"] < vm_size
    # One main arena plus at most glibc's default of 8 per core.
    assert 1 <= got["arenas"] <= 8 * (os.cpu_count() or 1) + 1


def test_root_dispatches_to_embed(server, reference):
    r = server.post("/", {"inputs": TEXTS[0]})
    assert r.status_code == 200, r.text
    assert_same(r.json(), reference[:1])


def test_concurrent_requests_batch_to_the_same_results(server, reference):
    """Many clients at once: the queue packs them together, results stay per-request."""

    def one(i: int):
        r = server.post("/embed", {"inputs": TEXTS[i % len(TEXTS)]})
        assert r.status_code == 200, r.text
        return i, r.json()[0]

    with ThreadPoolExecutor(16) as pool:
        for i, emb in pool.map(one, range(48)):
            assert cosine(emb, reference[i % len(TEXTS)]) >= MIN_COSINE


def test_spinning_backend_thread_answers_the_same_and_stops(start_server, minilm_dir, server):
    """`--backend-spin-us`: requests inside the spin window (the thread still polling) and
    after it (the thread asleep again) get the default server's embeddings, and SIGTERM still
    stops the process with 0 (a polling thread sees its channel close)."""
    spinning = start_server(minilm_dir, "--backend-spin-us", "200000")
    expected = server.post("/embed", {"inputs": TEXTS}).json()
    for pause_s in (0.0, 0.05, 0.4, 0.01):  # 0.4 s is past the 0.2 s window
        time.sleep(pause_s)
        response = spinning.post("/embed", {"inputs": TEXTS})
        assert response.status_code == 200, response.text
        assert_same(response.json(), expected)
    assert spinning.stop() == 0


def _seconds(duration: str) -> float:
    """A Rust `Duration`'s Debug text ("812.3µs", "1.2ms", "0ns") in seconds."""
    m = re.fullmatch(r"([0-9.]+)(ns|µs|ms|s)", duration)
    assert m, duration
    return float(m.group(1)) * {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]


def test_debug_log_gives_each_requests_times(start_server, minilm_dir):
    """At debug level every answered request logs its times (docs/server.md, "Logs"); the part of
    its queue time before its batch reached a backend thread is within the queue time."""
    logged = start_server(
        minilm_dir, "--json-output", env={"LOG_LEVEL": "info,trt_tei_router::http=debug"}
    )
    for text in TEXTS:
        assert logged.post("/embed", {"inputs": text}).status_code == 200
    events = [json.loads(line) for line in logged.logs().splitlines() if '"success"' in line]
    events = [e for e in events if e.get("message") == "success"]
    assert len(events) == len(TEXTS), logged.logs()[-2000:]
    for event in events:
        times = {
            k: _seconds(event[f"{k}_time"])
            for k in ("total", "tokenization", "queue", "handover", "inference")
        }
        assert 0 <= times["handover"] <= times["queue"], event
        assert times["tokenization"] + times["queue"] + times["inference"] <= times["total"], event


VARIED = [
    "How do I change the E-MAIL address of my account, after the old one was closed?!",
    "Questions remain (see §4.2). Data: 3,412 respondents; margin ±2.1%.",
    "café naïve Ωmega 中文字 Zürich – “quoted” ‘single’ … ellipsis",
    "tabs\tand\nnewlines\r\nand  double  spaces\u00a0and a no-break space",
    "a bell\u0007 and a form\u000cfeed and a vertical\u000btab",
    "antidisestablishmentarianism " + "x" * 120 + " supercalifragilistic",
    "user@example.com https://example.org/path?q=1&r=2#frag C++ C# node.js $5,000.00",
    "what is [MASK] and [mask] and [SEP] doing here?",
    "query: UPPER lower MiXeD 1234 3.14159 ~tilde ^caret |pipe| \\back/slash `tick`",
]


def test_varied_text_is_tokenized_as_the_reference_does(server, st_model):
    """Token by token against sentence-transformers (its `tokenizers` pipeline): the router
    tokenizes plain ASCII without the tokenizer's bookkeeping, and hands it the rest."""
    r = server.post("/embed_all", {"inputs": VARIED})
    assert r.status_code == 200, r.text
    expected = st_model.encode(VARIED, output_value="token_embeddings")
    for text, got, exp in zip(VARIED, r.json(), expected, strict=True):
        exp = exp.cpu().numpy()
        assert len(got) == len(exp), text
        for g, e in zip(got, exp, strict=True):
            assert cosine(g, e) >= MIN_COSINE, text
