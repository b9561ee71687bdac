"""Closed-loop HTTP load: N client threads, each sending one request after the other.

Standard library only (it also runs on the GPU machine, which has no package index), and
light enough per request that several processes of it keep a fast server busy:

    python tests/http/loadgen.py http://127.0.0.1:8080 --clients 8 --seconds 10

prints one JSON line: requests, errors (by status), seconds, requests/s, latency p50/p99 ms.
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
from urllib.parse import urlsplit


def run(url: str, path: str, body: bytes, clients: int, seconds: float) -> dict:
    parts = urlsplit(url)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client() -> None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        mine: list[float] = []
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            try:
                conn.request("POST", path, body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                status = resp.status
            except (OSError, http.client.HTTPException) as e:
                status = type(e).__name__
                conn.close()
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
            if status == 200:
                mine.append(time.perf_counter() - t0)
            else:
                with lock:
                    errors[str(status)] = errors.get(str(status), 0) + 1
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    latencies.sort()

    def pct(q: float) -> float:
        return (
            1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else 0.0
        )

    return {
        "requests": len(latencies),
        "errors": errors,
        "seconds": elapsed,
        "requests_per_s": len(latencies) / elapsed,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--path", default="/v1/embeddings")
    parser.add_argument("--text", default="hello " * 22)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    key = "input" if args.path.endswith("embeddings") else "inputs"
    body = json.dumps({key: args.text.strip(), "model": "m"}).encode()
    print(json.dumps(run(args.url, args.path, body, args.clients, args.seconds)))


if __name__ == "__main__":
    main()
