"""End-to-end HTTP benchmark: the real `text-embeddings-router` process on loopback.

    python benchmarks/bench_http.py --model-id PATH [--router text-embeddings-router]

Measures (1) p50/p99 latency of single `/v1/embeddings` requests of 24 tokens, one at a
time, and (2) requests/s with 64 concurrent clients sending the same request. The client
is asyncio over raw keep-alive HTTP/1.1 connections (no client library in the loop), so it
is not the bottleneck. Reports only; CI does not time it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

# 24 tokens with [CLS]/[SEP] for all-MiniLM-L6-v2's WordPiece vocabulary.
QUERY = (
    "how do embedding servers batch short queries so each user still "
    "gets an answer within milliseconds"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"router exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("router did not become healthy")


def request_bytes(port: int) -> bytes:
    body = json.dumps({"input": QUERY, "model": "bench"}).encode()
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


async def read_response(reader: asyncio.StreamReader) -> int:
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    length = 0
    chunked = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
        if name.lower() == "transfer-encoding" and "chunked" in value:
            chunked = True
    if chunked:
        while True:
            size = int((await reader.readline()).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        await reader.readexactly(length)
    return status


async def sequential(port: int, count: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = request_bytes(port)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        writer.write(payload)
        status = await read_response(reader)
        times.append(time.perf_counter() - start)
        assert status == 200, status
    writer.close()
    return times


async def concurrent(port: int, clients: int, seconds: float) -> tuple[int, int]:
    payload = request_bytes(port)
    done = errors = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done, errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            writer.write(payload)
            if await read_response(reader) == 200:
                done += 1
            else:
                errors += 1
        writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return done, errors


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--router", default="text-embeddings-router")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("router_args", nargs="*", help="extra router flags after --")
    args = parser.parse_args()
    port = free_port()
    cmd = [
        args.router,
        "--model-id",
        args.model_id,
        "--port",
        str(port),
        "--max-concurrent-requests",
        "1024",
        *args.router_args,
    ]
    proc = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr, env=dict(os.environ))
    try:
        wait_healthy(port, proc)
        asyncio.run(sequential(port, 50))  # warm-up
        times = sorted(asyncio.run(sequential(port, args.requests)))
        p50 = statistics.median(times) * 1e3
        p99 = times[int(0.99 * (len(times) - 1))] * 1e3
        done, errors = asyncio.run(concurrent(port, args.clients, args.seconds))
        print(f"router: {' '.join(cmd[:1])}  model: {args.model_id}")
        print(
            f"{'single 24-token p50 ms':>24} {'p99 ms':>8} "
            f"{f'{args.clients} clients req/s':>18} {'errors':>7}"
        )
        print(f"{p50:>24.2f} {p99:>8.2f} {done / args.seconds:>18,.0f} {errors:>7}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
