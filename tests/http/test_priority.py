"""`priority` and `X-Max-Queue-Ms` against the real router and all-MiniLM-L6-v2 on CPU: a
request with a 1 ms queue deadline queued behind a backfill is answered 503 `queue_timeout`
without running (and counted); `priority: high` puts a request over the size limit on the
interactive lane, `priority: low` keeps a tiny one off it (told by the per-lane batch
counts of /metrics)."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest
from router_harness import Server

pytestmark = pytest.mark.integration


def metric(server: Server, series: str) -> float:
    """The value of `series` (name and labels as rendered) on /metrics, 0 if absent."""
    text = server.get("/metrics").text
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def packed(server: Server) -> tuple[float, float]:
    """Batches packed so far, (interactive, bulk)."""
    return (
        metric(server, 'te_batch_next_size_count{lane="interactive"}'),
        metric(server, 'te_batch_next_size_count{lane="bulk"}'),
    )


def until(what: str, done, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.002)


def test_a_low_request_past_its_deadline_behind_a_backfill_is_503(start_server, minilm_dir):
    server = start_server(minilm_dir)
    # 32 documents of ~250 tokens: on CPU, paced bulk batches of ~40 ms run them one part
    # after another, and the rest waits in the bulk lane meanwhile.
    backfill_body = {"inputs": [f"document {i} " + "word " * 240 for i in range(32)]}
    answers: list[httpx.Response] = []
    backfill = threading.Thread(target=lambda: answers.append(server.post("/embed", backfill_body)))
    backfill.start()
    until("the backfill waits in the queue", lambda: metric(server, "te_queue_size") > 0)
    late = server.post(
        "/embed",
        {"inputs": "a short document", "priority": "low"},
        headers={"X-Max-Queue-Ms": "1"},
    )
    assert late.status_code == 503, late.text
    body = late.json()
    assert body["error_type"] == "queue_timeout", body
    assert "1 ms" in body["error"], body
    assert metric(server, "te_queue_timeout_count") == 1
    assert metric(server, 'te_request_failure{err="queue_timeout"}') == 1
    backfill.join(timeout=120)
    assert answers and answers[0].status_code == 200, answers
    # The same request with a deadline it can meet (an idle server) is answered.
    ok = server.post(
        "/embed",
        {"inputs": "a short document", "priority": "low"},
        headers={"X-Max-Queue-Ms": "10000"},
    )
    assert ok.status_code == 200, ok.text
    assert metric(server, "te_queue_timeout_count") == 1
    bad = server.post("/embed", {"inputs": "a"}, headers={"X-Max-Queue-Ms": "0"})
    assert bad.status_code == 422 and bad.json()["error_type"] == "validation", bad.text


def test_priority_overrides_the_lane_the_size_gives(start_server, minilm_dir):
    server = start_server(minilm_dir)
    # Two inputs of ~150 tokens (the model's limit is 256 each): ~300 tokens in all, over
    # --interactive-max-tokens (256), so bulk by size.
    large = {"inputs": ["word " * 150, "text " * 150]}
    before = packed(server)
    assert server.post("/embed", large).status_code == 200
    after_plain = packed(server)
    assert after_plain == (before[0], before[1] + 1), (before, after_plain)
    response = server.post("/embed", {**large, "priority": "high"})
    assert response.status_code == 200, response.text
    after_high = packed(server)
    assert after_high == (after_plain[0] + 1, after_plain[1]), (after_plain, after_high)
    # A few tokens: interactive by size, bulk when low (on the OpenAI route too).
    response = server.post("/v1/embeddings", {"input": "hi", "priority": "low"})
    assert response.status_code == 200, response.text
    after_low = packed(server)
    assert after_low == (after_high[0], after_high[1] + 1), (after_high, after_low)
    bad = server.post("/embed", {"inputs": "hi", "priority": "urgent"})
    assert bad.status_code == 422, bad.text
    assert '"high", "low" or null' in bad.json()["error"], bad.text
