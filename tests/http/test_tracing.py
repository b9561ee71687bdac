"""The real server exports its request spans to an OTLP/HTTP collector (`--otlp-endpoint`,
docs/tracing.md) in the caller's trace, and serves as usual with its collector down.

The collector here is a loopback HTTP server that keeps every `POST /v1/traces` body: no
OpenTelemetry package is installed (one breaks Ray's local cluster, see issue 41), so the
spans are found in the protobuf bytes: ids are raw bytes there, names and values UTF-8.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from router_harness import free_port, router_command

pytestmark = pytest.mark.integration

# The batch span processor sends what it holds every 5 s.
EXPORT_WAIT_S = 20


class Collector:
    """Keeps the body of every OTLP/HTTP trace export it is sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        lock = threading.Lock()
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the handler's API)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/v1/traces":
                    with lock:
                        bodies.append(body)
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def export_with(self, needle: bytes) -> bytes:
        """The first export that holds `needle`, waiting for it."""
        deadline = time.monotonic() + EXPORT_WAIT_S
        while time.monotonic() < deadline:
            found = [b for b in list(self.bodies) if needle in b]
            if found:
                return found[0]
            time.sleep(0.1)
        raise AssertionError(f"no export held {needle.hex()} in {EXPORT_WAIT_S} s")


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.server.shutdown()


@pytest.fixture(scope="module")
def server(start_server, minilm_dir, collector):
    return start_server(
        minilm_dir,
        "--otlp-endpoint", collector.url,
        "--otlp-protocol", "http/protobuf",
        "--otlp-service-name", "tracing-under-test",
    )  # fmt: skip


def test_a_requests_spans_reach_the_collector_in_the_callers_trace(server, collector):
    trace_id, parent_id = secrets.token_bytes(16), secrets.token_bytes(8)
    traceparent = f"00-{trace_id.hex()}-{parent_id.hex()}-01"
    r = server.post("/embed", {"inputs": "hello world"}, headers={"traceparent": traceparent})
    assert r.status_code == 200, r.text
    export = collector.export_with(trace_id)
    # The request's span and its three children, all in the caller's trace.
    assert export.count(trace_id) == 4
    assert parent_id in export
    for text in (b"POST /embed", b"tokenize", b"queue", b"inference", b"tracing-under-test"):
        assert text in export, text
    for key in (b"http.route", b"model", b"lane", b"device", b"batch_size"):
        assert key in export, key


def test_a_dead_collector_changes_nothing_for_clients(start_server, minilm_dir, server):
    dead = start_server(minilm_dir, "--otlp-endpoint", f"http://127.0.0.1:{free_port()}")
    body = {"inputs": "hello world"}
    traceparent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    r = dead.post("/embed", body, headers={"traceparent": traceparent})
    assert r.status_code == 200, r.text
    assert r.json() == server.post("/embed", body).json()
    deadline = time.monotonic() + EXPORT_WAIT_S
    dropped = 0
    while time.monotonic() < deadline and dropped == 0:
        metrics = dead.get("/metrics").text
        dropped = int(re.search(r"^te_otlp_spans_dropped_total (\d+)", metrics, re.M)[1])
        time.sleep(0.2)
    assert dropped == 4


def test_a_malformed_endpoint_fails_at_start_with_its_reason(minilm_dir):
    cmd = [*router_command(), "--model-id", str(minilm_dir), "--otlp-endpoint", "collector:4317"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--otlp-endpoint `collector:4317`" in done.stdout + done.stderr
