"""Clients that trickle, never read, half-close or arrive past the cap cannot tie the server
up: the real process on loopback serving all-MiniLM-L6-v2, driven with raw sockets."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import httpx
import pytest
from test_connections import closed_within, connect, trickle

pytestmark = pytest.mark.integration

# 16 inputs of ~250 tokens: /embed_all answers ~19 MB of JSON.
LONG_BATCH = {"inputs": ["hello " * 248] * 16}


def request(path: str, body: dict, version: str = "1.1") -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/{version}\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def gauge(metrics: str, name: str) -> float:
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_trickled_head_is_cut_at_the_header_deadline_whatever_the_keep_alive(
    start_server, minilm_dir
):  # type: ignore[no-untyped-def]
    server = start_server(
        minilm_dir, "--header-read-timeout", "1", "--keep-alive-timeout", "20"
    )  # fmt: skip
    sock = connect(server)
    stop = threading.Event()
    head = b"POST /embed HTTP/1.1\r\nHost: test\r\n" * 40
    sender = threading.Thread(target=trickle, args=(sock, head, 0.1, stop))
    start = time.monotonic()
    sender.start()
    closed, _ = closed_within(sock, 6)
    took = time.monotonic() - start
    stop.set()
    sender.join()
    assert closed and took < 3, f"a trickled head held the connection for {took:.1f} s"


def test_unread_answers_are_capped_and_cut_at_the_send_deadline(start_server, minilm_dir):  # type: ignore[no-untyped-def]
    limit = 4_000_000
    server = start_server(
        minilm_dir, "--send-timeout", "2", "--response-buffer-limit", str(limit)
    )  # fmt: skip
    client = httpx.Client(base_url=server.url, timeout=60)
    readers = []
    for _ in range(2):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(request("/embed_all", LONG_BATCH))
        readers.append(sock)
    # Both answers are produced and mostly left in the server.
    deadline = time.monotonic() + 60
    while gauge(client.get("/metrics").text, "te_response_unsent_bytes") <= limit:
        assert time.monotonic() < deadline, "the unread answers never filled the buffer"
        time.sleep(0.05)
    # Past the cap new work is refused and nothing grows; probes and metrics still answer.
    peak = gauge(client.get("/metrics").text, "te_response_unsent_bytes")
    refused = client.post("/embed", json={"inputs": "a query"})
    assert refused.status_code == 503, refused.text
    assert refused.json()["error_type"] == "congested"
    assert "--response-buffer-limit" in refused.json()["error"]
    openai = client.post("/v1/embeddings", json={"input": "a query", "model": "m"})
    assert openai.status_code == 503 and "--response-buffer-limit" in openai.text
    assert client.get("/health").status_code == 200
    assert gauge(client.get("/metrics").text, "te_response_unsent_bytes") <= peak
    # The clients that read nothing are cut at the send deadline, and work is taken again.
    deadline = time.monotonic() + 30
    while 'te_connection_timeout{phase="send"} 2' not in (metrics := client.get("/metrics").text):
        assert time.monotonic() < deadline, metrics
        time.sleep(0.2)
    for sock in readers:
        closed, received = closed_within(sock, 10)
        assert closed and len(received) < 19_000_000, "an unread answer outlived --send-timeout"
    assert gauge(metrics, "te_response_unsent_bytes") == 0
    assert 'te_request_failure{err="congested"} 2' in metrics
    assert client.post("/embed", json={"inputs": "a query"}).status_code == 200
    client.close()


def test_a_declared_oversize_body_gets_413_at_once(start_server, minilm_dir):  # type: ignore[no-untyped-def]
    server = start_server(minilm_dir, "--body-read-timeout", "30")
    sock = connect(server)
    sock.sendall(
        b"POST /embed HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000000\r\n\r\n{"
    )
    start = time.monotonic()
    closed, received = closed_within(sock, 5)
    assert closed and time.monotonic() - start < 2, "the oversize body was waited for"
    assert received.startswith(b"HTTP/1.1 413"), received
    assert b"--payload-limit" in received


def hold_a_slot(server) -> socket.socket:  # type: ignore[no-untyped-def]
    """A keep-alive connection the server has answered on, so it certainly holds one of the
    `--max-connections` slots. The harness's own health checks may still hold one for a
    moment after they close (refused meanwhile: retry)."""
    for _ in range(50):
        sock = connect(server)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        if sock.recv(4096).startswith(b"HTTP/1.1 200"):
            return sock
        sock.close()
        time.sleep(0.1)
    raise AssertionError("no connection slot came free")


def test_clients_past_the_connection_cap_read_the_503_never_a_reset(start_server, minilm_dir):  # type: ignore[no-untyped-def]
    server = start_server(minilm_dir, "--max-connections", "2")
    held = [hold_a_slot(server) for _ in range(2)]
    resets = 0
    for i in range(40):
        sock = connect(server)
        if i % 2:
            time.sleep(0.02)  # the request arrives after the 503 was written
        try:
            sock.sendall(request("/embed", {"inputs": "past the cap"}))
        except OSError:
            pass
        try:
            closed, received = closed_within(sock, 5)
        except ConnectionResetError:
            resets += 1
            continue
        assert closed and received.startswith(b"HTTP/1.1 503"), received
        sock.close()
    assert resets == 0, f"{resets} of 40 clients past the cap were reset"
    for sock in held:
        sock.close()


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_a_client_that_half_closes_after_its_request_gets_the_answer(
    start_server, minilm_dir, version
):  # type: ignore[no-untyped-def]
    server = start_server(minilm_dir)
    sock = connect(server)
    sock.sendall(request("/embed", {"inputs": ["half", "closed"]}, version))
    sock.shutdown(socket.SHUT_WR)
    closed, received = closed_within(sock, 10)
    assert closed, received
    final = received.split(b"\r\n\r\n", 2)
    # An HTTP/1.1 client may first get an interim 100 Continue, which it skips.
    if received.startswith(b"HTTP/1.1 100"):
        final = final[1:]
    assert final[0].startswith(f"HTTP/{version} 200".encode()) or final[0].startswith(
        b"HTTP/1.1 200"
    ), received[:200]
    vectors = json.loads(final[1])
    assert len(vectors) == 2 and len(vectors[0]) == 384
