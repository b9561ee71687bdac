"""The server under concurrent load: overload answers 429 and nothing else, a raising backend
fails only its batch, and SIGTERM drains every accepted request before exiting 0."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from router_harness import cosine, openai_sdk

pytestmark = pytest.mark.integration

BACKEND = ["--python-backend-class", "backends:FaultyBackend"]


def token_id(minilm_dir, word: str) -> int:  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer

    found = Tokenizer.from_file(str(minilm_dir / "tokenizer.json")).token_to_id(word)
    assert found is not None, word
    return int(found)


@pytest.fixture(scope="module")
def poison_id(minilm_dir) -> int:
    return token_id(minilm_dir, "poison")


@pytest.fixture(scope="module")
def nan_id(minilm_dir) -> int:
    """A sequence holding it comes back as NaN from the faulty backend."""
    return token_id(minilm_dir, "infinity")


@pytest.fixture(scope="module")
def faulty(start_server, minilm_dir, poison_id):
    """One sequence per batch, a few requests in flight at most, JSON logs."""
    return start_server(
        minilm_dir,
        *BACKEND,
        "--max-concurrent-requests", "4",
        "--max-batch-requests", "1",
        "--json-output",
        env={"TEST_POISON_ID": str(poison_id), "TEST_BATCH_DELAY_S": "0.05"},
    )  # fmt: skip


def test_overload_gives_429_and_no_other_error(faulty):
    def one(i: int) -> int:
        return faulty.post("/embed", {"inputs": f"request number {i}"}).status_code

    with ThreadPoolExecutor(24) as pool:
        statuses = list(pool.map(one, range(48)))
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) > 0 and statuses.count(200) >= 4, statuses
    r = faulty.post("/embed", {"inputs": ["a"] * 5})
    assert r.status_code == 200  # permits come back


def test_overload_in_openai_shape(faulty):
    openai = openai_sdk()
    client = openai.OpenAI(base_url=f"{faulty.url}/v1", api_key="x", max_retries=0)
    seen: list[str] = []

    def one(i: int) -> None:
        try:
            client.embeddings.create(model="m", input=f"text {i}")
            seen.append("ok")
        except openai.RateLimitError as e:
            assert "overloaded" in str(e)
            seen.append("429")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(32)))
    assert "429" in seen and "ok" in seen


def test_raising_backend_fails_only_its_batch(faulty):
    texts = ["this is poison", "good text", "more good text", "poison again", "fine"]

    def one(text: str) -> tuple[str, httpx.Response]:
        return text, faulty.post("/embed", {"inputs": text})

    # Three clients at a time stay under --max-concurrent-requests.
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, texts * 3))
    for text, r in results:
        if "poison" in text:
            assert r.status_code == 424, r.text
            assert r.json()["error_type"] == "backend"
            assert "ValueError: poison token" in r.json()["error"]
            assert "Traceback" not in r.json()["error"]
        else:
            assert r.status_code == 200, r.text
    r = faulty.post("/v1/embeddings", {"input": "poison"})
    assert r.status_code == 500 and "poison token" in r.json()["error"]["message"]
    assert faulty.get("/health").status_code == 200
    # The traceback went to the (JSON) log instead.
    lines = [json.loads(line) for line in faulty.logs().splitlines() if line.startswith("{")]
    assert any("Traceback" in line.get("message", "") for line in lines)


def test_one_bad_input_fails_only_its_own_request(start_server, minilm_dir, poison_id, nan_id):
    """Requests batched together: one raises, one comes back NaN; only those two fail, each
    with its own message, and the neighbours get the right vectors."""
    from sentence_transformers import SentenceTransformer

    server = start_server(
        minilm_dir,
        *BACKEND,
        env={
            "TEST_POISON_ID": str(poison_id),
            "TEST_NAN_ID": str(nan_id),
            # The first batch holds the backend while the others queue up behind it.
            "TEST_BATCH_DELAY_S": "0.5",
        },
    )
    good = [f"a good sentence number {i}" for i in range(6)]
    texts = ["poison in this one", *good[:3], "an infinity here", *good[3:]]

    def one(text: str) -> tuple[str, httpx.Response]:
        route, body = (
            ("/v1/embeddings", {"input": text})
            if "infinity" in text
            else (
                "/embed",
                {"inputs": text},
            )
        )
        return text, server.post(route, body)

    with ThreadPoolExecutor(len(texts) + 2) as pool:
        # Two holders: one runs, one waits in the prefetch slot; the rest queue behind them
        # and are packed into one batch.
        holders = []
        for i in range(2):
            holders.append(pool.submit(one, f"holder {i}"))
            time.sleep(0.15)
        results = dict(pool.map(one, texts))
        assert all(h.result()[1].status_code == 200 for h in holders)
    poisoned, overflowed = results.pop(texts[0]), results.pop("an infinity here")
    assert poisoned.status_code == 424, poisoned.text
    assert "poison token" in poisoned.json()["error"]
    assert overflowed.status_code == 500, overflowed.text
    error = overflowed.json()["error"]
    assert error["type"] == "backend" and "NaN or infinite" in error["message"], error
    assert "poison" not in error["message"]
    st = SentenceTransformer(str(minilm_dir), device="cpu").float()
    reference = dict(zip(good, st.encode(good)))
    for text, r in results.items():
        assert r.status_code == 200, (text, r.text)
        assert cosine(r.json()[0], reference[text]) > 0.99999
    metrics = server.get("/metrics").text
    assert "te_inference_non_finite 1" in metrics
    # The failed batch held several requests and was re-run apart.
    assert re.search(r"^te_batch_isolation_pass [1-9]", metrics, re.M), metrics
    assert server.stop() == 0


def test_sigterm_drains_accepted_requests_then_exits_0(start_server, minilm_dir):
    server = start_server(
        minilm_dir,
        *BACKEND,
        "--max-batch-requests", "2",
        env={"TEST_BATCH_DELAY_S": "0.15"},
    )  # fmt: skip
    n = 12
    results: list[httpx.Response | Exception] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            r = httpx.post(
                f"{server.url}/embed", json={"inputs": [f"text {i}", f"more {i}"]}, timeout=60
            )
        except Exception as e:  # noqa: BLE001 - recorded and asserted on below
            r = e
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    # Wait until the server has admitted every request (12 x 2 sequences, 2 per 0.15 s
    # batch: ~1.8 s of work queued), then ask it to stop.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = server.get("/metrics").text
        admitted = sum(
            int(v) for v in re.findall(r"^te_request_count\{[^}]*\} (\d+)$", metrics, re.M)
        )
        if admitted >= n:
            break
        time.sleep(0.02)
    assert admitted >= n
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    # Draining: the probe says so at once, and a new request is turned away, not reset.
    assert server.get("/health").status_code == 503
    late = httpx.post(f"{server.url}/embed", json={"inputs": "late"}, timeout=5)
    assert late.status_code == 503 and late.json()["error_type"] == "shutting_down"
    for t in threads:
        t.join(timeout=60)
    assert server.proc.wait(timeout=60) == 0, server.logs()
    assert len(results) == n
    for r in results:
        assert isinstance(r, httpx.Response), r
        assert r.status_code == 200, r.text
        assert len(r.json()) == 2
    assert "draining" in server.logs()
