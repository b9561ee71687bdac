"""all-MiniLM-L6-v2's idle query p50 with OpenTelemetry tracing on against off (issue 41):

    python benchmarks/bench_tracing.py               # a GPU machine (source device_prepare.sh)
    python benchmarks/bench_tracing.py --dry-run     # the CPU: a few queries, to check the script

The router is started `--rounds` times each way, alternately: without `--otlp-endpoint`, and
with `--otlp-endpoint http://127.0.0.1:PORT --otlp-protocol http/protobuf` pointing at a
local OTLP sink (this script again, as a process of its own: it answers every
`POST /v1/traces` 200 with an empty protobuf body and counts the exports; no OpenTelemetry
package is needed). Each round sends `--queries` 24-token `POST /embed` queries with a W3C
`traceparent`, one every 20 ms, on one kept-alive connection, and takes the p50 and p99 of the
client's round trip. Reported: each way's median p50 over its rounds, their difference (target:
within 3 %), the exports the sink received and `te_otlp_spans_dropped_total` of the traced
servers (the spans are really exported, none dropped). Reports only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench_grpc import free_port, minilm_dir, paced

QUERY = " ".join(["hello"] * 22)  # 24 tokens with [CLS] and [SEP]


def run_sink(port: int) -> None:
    """The OTLP/HTTP sink: 200 and an empty ExportTraceServiceResponse to every
    `POST /v1/traces`; `GET /count` answers the exports and bytes received, as JSON."""
    received = {"exports": 0, "bytes": 0}
    lock = threading.Lock()

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the handler's API)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                received["exports"] += 1
                received["bytes"] += len(body)
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            with lock:
                body = json.dumps(received).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()


def start_sink() -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--sink", str(port)])
    wait_until_up(proc, f"http://127.0.0.1:{port}/count", "sink", 30)
    return proc, port


def sink_count(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=5) as r:
        return dict(json.loads(r.read()))


def wait_until_up(proc: subprocess.Popen, url: str, what: str, seconds: float) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{what} did not start")


def serve(folder: Path, port: int, extra: list[str]) -> subprocess.Popen:
    """The router on loopback, once `/health` answers."""
    beside = Path(sys.executable).parent / "text-embeddings-router"
    router = str(beside) if beside.exists() else "text-embeddings-router"
    cmd = [router, "--model-id", str(folder), "--port", str(port), "--hostname", "127.0.0.1"]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([*cmd, *extra], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_up(proc, f"http://127.0.0.1:{port}/health", "router", 600)
    except SystemExit:
        log.seek(0)
        print(log.read().decode()[-3000:], file=sys.stderr)
        raise
    return proc


def dropped_spans(port: int) -> int | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        found = re.search(r"^te_otlp_spans_dropped_total (\d+)", r.read().decode(), re.M)
    return int(found.group(1)) if found else None


def queries(port: int, count: int) -> list[float]:
    """Round trips (seconds) of `count` queries, one every 20 ms, after a warm-up; each with a
    `traceparent` of its own, as a traced client sends them."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"inputs": QUERY}).encode()

    def send() -> None:
        traceparent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
        headers = {"Content-Type": "application/json", "traceparent": traceparent}
        conn.request("POST", "/embed", body, headers)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status

    try:
        return paced(send, count)
    finally:
        conn.close()


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds of latencies in seconds."""
    ordered = sorted(latencies)
    return statistics.median(ordered) * 1e3, ordered[int(0.99 * (len(ordered) - 1))] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="all-MiniLM-L6-v2's folder [default: the package's]")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2, help="servers started each way")
    parser.add_argument("--router-args", default="", help="extra router flags, space-separated")
    parser.add_argument(
        "--dry-run", action="store_true", help="a few queries, one round, on any machine"
    )
    parser.add_argument("--sink", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sink:
        run_sink(args.sink)
        return
    if args.dry_run:
        args.queries, args.rounds = 20, 1
    extra = args.router_args.split()
    if "--dtype" not in extra and not args.dry_run:
        extra += ["--dtype", "float16"]
    folder = minilm_dir(args.model)
    sink, sink_port = start_sink()
    endpoint = f"http://127.0.0.1:{sink_port}"
    traced = ["--otlp-endpoint", endpoint, "--otlp-protocol", "http/protobuf"]
    results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    dropped: list[int | None] = []
    try:
        for _ in range(args.rounds):
            for way in ("off", "on"):
                port = free_port()
                proc = serve(folder, port, extra + (traced if way == "on" else []))
                try:
                    results[way].append(percentiles(queries(port, args.queries)))
                    if way == "on":
                        dropped.append(dropped_spans(port))
                finally:
                    proc.terminate()  # a traced server sends its last spans as it stops
                    proc.wait(timeout=60)
        received = sink_count(sink_port)
    finally:
        sink.terminate()
        sink.wait(timeout=10)
    off = statistics.median(p50 for p50, _ in results["off"])
    on = statistics.median(p50 for p50, _ in results["on"])
    print(f"all-MiniLM-L6-v2, {args.queries} idle queries x {args.rounds} rounds each way")
    print("| tracing | query p50 ms (each round) | p99 ms (each round) |")
    print("|---|---|---|")
    for way, rounds in results.items():
        p50s = ", ".join(f"{p50:.3f}" for p50, _ in rounds)
        p99s = ", ".join(f"{p99:.3f}" for _, p99 in rounds)
        print(f"| {way} | {p50s} | {p99s} |")
    print(f"median p50: off {off:.3f} ms, on {on:.3f} ms ({(on - off) / off:+.1%}; target ±3 %)")
    print(
        f"sink: {received['exports']} OTLP exports, {received['bytes']:,} bytes; "
        f"te_otlp_spans_dropped_total per traced server: {dropped}"
    )
    if args.dry_run:
        print("(dry run: a check of the script, not a measurement)")


if __name__ == "__main__":
    main()
