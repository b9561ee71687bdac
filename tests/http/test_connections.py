"""Slow, idle and too many clients cannot hold the server, and SIGTERM always ends in a clean
exit: the real process on loopback, driven with raw sockets where a client misbehaves."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytestmark = pytest.mark.integration

BACKEND = ["--python-backend-class", "backends:FaultyBackend"]
REQUEST_HEAD = b"POST /embed HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"


def connect(server) -> socket.socket:  # type: ignore[no-untyped-def]
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Reads until the server closes the socket; (closed in time, what it sent)."""
    sock.settimeout(0.2)
    received = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return True, received
        if not chunk:
            return True, received
        received += chunk
    return False, received


def trickle(sock: socket.socket, data: bytes, every_s: float, stop: threading.Event) -> None:
    """Sends `data` one byte at a time, as a slowloris client does."""
    for byte in data:
        if stop.is_set():
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return
        time.sleep(every_s)


@pytest.fixture(scope="module")
def tight(start_server, minilm_dir):
    """Short deadlines so each case takes about a second."""
    return start_server(
        minilm_dir,
        "--header-read-timeout", "1",
        "--body-read-timeout", "1",
        "--keep-alive-timeout", "1.5",
    )  # fmt: skip


def test_slow_headers_are_cut_at_the_header_deadline(tight):
    sock = connect(tight)
    stop = threading.Event()
    sender = threading.Thread(target=trickle, args=(sock, REQUEST_HEAD * 20, 0.1, stop))
    start = time.monotonic()
    sender.start()
    closed, _ = closed_within(sock, 5)
    stop.set()
    sender.join()
    assert closed and time.monotonic() - start < 3, "a slowloris header kept the connection"
    assert 'te_connection_timeout{phase="header"}' in tight.get("/metrics").text


def test_a_slow_body_gets_408_at_the_body_deadline(tight):
    sock = connect(tight)
    body = json.dumps({"inputs": "x" * 200}).encode()
    sock.sendall(REQUEST_HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode())
    stop = threading.Event()
    sender = threading.Thread(target=trickle, args=(sock, body, 0.1, stop))
    start = time.monotonic()
    sender.start()
    closed, received = closed_within(sock, 5)
    stop.set()
    sender.join()
    assert closed and time.monotonic() - start < 3
    assert received.startswith(b"HTTP/1.1 408"), received
    assert b'"error_type":"timeout"' in received


def test_idle_sockets_are_closed_after_the_keep_alive_timeout(tight):
    fresh = connect(tight)
    used = connect(tight)
    used.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
    start = time.monotonic()
    closed_fresh, _ = closed_within(fresh, 5)
    closed_used, answer = closed_within(used, 5)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert closed_fresh and closed_used
    assert time.monotonic() - start < 4
    assert 'te_connection_timeout{phase="idle"}' in tight.get("/metrics").text


def test_past_the_connection_cap_new_clients_are_refused_fast(start_server, minilm_dir):
    server = start_server(minilm_dir, "--max-connections", "4", "--keep-alive-timeout", "60")
    # One client keeps a connection it uses; three more sit idle and fill the cap.
    client = httpx.Client(base_url=server.url, timeout=10)
    assert client.get("/health").status_code == 200
    idle = [connect(server) for _ in range(3)]
    time.sleep(0.2)
    start = time.monotonic()
    extra = connect(server)
    closed, received = closed_within(extra, 3)
    assert closed and time.monotonic() - start < 1, "a client past the cap was kept waiting"
    assert received.startswith(b"HTTP/1.1 503"), received
    # The existing client is still served.
    r = client.post("/embed", json={"inputs": "still here"})
    assert r.status_code == 200, r.text
    metrics = client.get("/metrics").text
    assert "te_connection_refused 1" in metrics
    assert "te_connection_open 4" in metrics
    assert "refused connections" in server.logs()
    for s in idle:
        s.close()
    client.close()


def test_sigterm_with_a_half_sent_request_exits_0_in_time(start_server, minilm_dir):
    server = start_server(minilm_dir, "--shutdown-timeout", "6")
    half_headers = connect(server)
    half_headers.sendall(REQUEST_HEAD)
    half_body = connect(server)
    half_body.sendall(REQUEST_HEAD + b"Content-Length: 100\r\n\r\n{")
    time.sleep(0.3)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=10) == 0, server.logs()
    assert time.monotonic() - start < 6
    _, received = closed_within(half_body, 2)
    assert received.startswith(b"HTTP/1.1 503"), received
    closed, _ = closed_within(half_headers, 2)
    assert closed


def test_sigterm_with_16_clients_answers_every_accepted_request(
    start_server, minilm_dir
):  # fmt: skip
    server = start_server(
        minilm_dir, *BACKEND, "--shutdown-timeout", "8", env={"TEST_BATCH_DELAY_S": "0.05"}
    )
    signalled = threading.Event()
    outcomes: list[tuple[str, object]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            sent_after_signal = 0
            while sent_after_signal < 3:
                if signalled.is_set():
                    sent_after_signal += 1
                try:
                    r = c.post("/embed", json={"inputs": [f"client {i} text", "more text"]})
                    outcome: tuple[str, object] = ("status", r.status_code)
                except httpx.ConnectError:
                    outcome = ("refused", None)  # after the listener closed: never accepted
                except httpx.HTTPError as e:
                    outcome = ("broken", repr(e))
                with lock:
                    outcomes.append(outcome)
                if outcome[0] == "refused":
                    return

    with ThreadPoolExecutor(17) as pool:
        futures = [pool.submit(client, i) for i in range(16)]
        time.sleep(1.0)
        health = httpx.Client(base_url=server.url, timeout=5)
        assert health.get("/health").status_code == 200
        start = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        signalled.set()
        time.sleep(0.05)
        assert health.get("/health").status_code == 503
        for f in futures:
            f.result(timeout=30)
    assert server.proc.wait(timeout=15) == 0, server.logs()
    assert time.monotonic() - start < 8
    broken = [o for o in outcomes if o[0] == "broken"]
    statuses = {o[1] for o in outcomes if o[0] == "status"}
    assert not broken, broken
    assert statuses <= {200, 503}, statuses
    assert 200 in statuses
    # Requests sent after the signal were answered (503) or never accepted (refused).
    assert 503 in statuses or any(o[0] == "refused" for o in outcomes)


@pytest.mark.parametrize("stuck", ["TEST_BATCH_DELAY_S", "TEST_BATCH_BUSY_S"])
def test_a_request_still_running_at_the_deadline_is_answered_503(start_server, minilm_dir, stuck):
    # Sleeping, or computing: the process must exit 0 with torch's threads still at work.
    server = start_server(minilm_dir, *BACKEND, "--shutdown-timeout", "3", env={stuck: "20"})
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(server.post, "/v1/embeddings", {"input": "a slow one"})
        time.sleep(0.5)
        start = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        r = pending.result(timeout=10)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "shutting_down"
    # The forward pass never returned, and still the process exits 0 by the deadline.
    assert server.proc.wait(timeout=10) == 0, server.logs()
    assert time.monotonic() - start < 4
    assert "did not stop by the shutdown deadline" in server.logs()
