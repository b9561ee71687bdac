"""The HTTP connections' own thread (`router-http`) and `--http-spin-us`: after a request
the thread polls its sockets for the window, using a core, and sleeps again once the window
has passed; by default (no interactive lane, as on a CPU) it never polls. Requests of every
size are answered through it, small ones' handlers on it and large ones' on the workers."""

from __future__ import annotations

import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
FAULTY = ["--python-backend-class", "backends:FaultyBackend"]


def _http_thread(pid: int) -> Path:
    tasks = [
        t
        for t in Path(f"/proc/{pid}/task").iterdir()
        if (t / "comm").read_text().strip() == "router-http"
    ]
    assert len(tasks) == 1, "exactly one router-http thread"
    return tasks[0]


def _cpu_seconds(task: Path) -> float:
    """User + system CPU time of one thread, from /proc (fields 14 and 15 of its stat)."""
    stat = (task / "stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def _cpu_during(task: Path, seconds: float) -> float:
    before = _cpu_seconds(task)
    time.sleep(seconds)
    return _cpu_seconds(task) - before


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_the_http_thread_polls_within_the_window_and_sleeps_after_it(start_server, minilm_dir):  # type: ignore[no-untyped-def]
    server = start_server(minilm_dir, "--http-spin-us", "400000")
    task = _http_thread(server.proc.pid)
    time.sleep(0.5)  # past the window of the start-up's health checks
    assert _cpu_during(task, 0.3) < 0.05, "polled with no request in the window"
    assert server.post("/embed", {"inputs": "a query"}).status_code == 200
    busy = _cpu_during(task, 0.3)
    # About 0.3 s of CPU while it polls; a loaded test machine may give it less.
    assert busy >= 0.1, f"only {busy:.2f} s of CPU in the window"
    time.sleep(0.2)  # the window closes 0.4 s after the request
    assert _cpu_during(task, 0.3) < 0.05, "polled after the window"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_without_an_interactive_lane_the_http_thread_never_polls(start_server, minilm_dir):  # type: ignore[no-untyped-def]
    server = start_server(minilm_dir)
    task = _http_thread(server.proc.pid)
    assert server.post("/embed", {"inputs": "a query"}).status_code == 200
    assert _cpu_during(task, 0.3) < 0.05


def test_small_and_large_requests_alike_through_the_http_thread(start_server, minilm_dir):  # type: ignore[no-untyped-def]
    server = start_server(minilm_dir, "--http-spin-us", "50000")
    text = "the quick brown fox jumps over the lazy dog, " * 4
    alone = server.post("/embed", {"inputs": text})
    # Over 4 KiB of body: its handler runs on the tokio workers, not on the HTTP thread.
    many = server.post("/embed", {"inputs": [text] * 30})
    assert alone.status_code == many.status_code == 200
    assert len(many.json()) == 30
    assert many.json()[17] == pytest.approx(alone.json()[0], abs=1e-5)


def _counter(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_a_large_request_whose_client_leaves_is_taken_out_of_the_queue(start_server, minilm_dir):  # type: ignore[no-untyped-def]
    """A large request's handler runs on the tokio workers; when its client closes the
    connection while it waits in the queue, the handler there is aborted like one on the
    HTTP thread would be dropped, and its inputs leave the queue unrun. The request is one
    `dropped` failure, however many inputs it had."""
    server = start_server(
        minilm_dir, *FAULTY, "--http-spin-us", "50000", env={"TEST_BATCH_DELAY_S": "1.0"}
    )
    text = "the quick brown fox jumps over the lazy dog, " * 4
    large = {"inputs": [text] * 30}
    body = json.dumps(large).encode()
    assert len(body) > 4096
    with ThreadPoolExecutor(2) as pool:
        # Two requests keep the backend thread busy for about two seconds.
        busy = [pool.submit(server.post, "/embed", large) for _ in range(2)]
        time.sleep(0.3)
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        head = "POST /embed HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.3)  # tokenized and queued behind the busy ones
        sock.close()
        deadline = time.monotonic() + 10
        dropped = 0.0
        while time.monotonic() < deadline and dropped < 1:
            dropped = _counter(server.get("/metrics").text, 'te_request_failure{err="dropped"}')
            time.sleep(0.1)
        assert dropped == 1, f"{dropped} requests counted as dropped"
        assert all(f.result().status_code == 200 for f in busy)
    metrics = server.get("/metrics").text
    assert _counter(metrics, "te_queue_size") == 0
    assert _counter(metrics, 'te_request_failure{err="dropped"}') == 1
