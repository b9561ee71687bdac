"""The router's tokenization time on realistic text, with a backend that answers instantly.

    python benchmarks/experiments/bench_router_tokenize.py \
        [--model-id DIR] [--queries 2000] [--docs 512]

Starts `text-embeddings-router` on loopback with `bench_router_overhead.InstantBackend` (the
model's info, no forward pass), then sends, on one connection and one at a time:
- the issue-16 queries (`realistic_traffic.queries`: 24 tokens of varied English), each
  tokenized inline by its handler;
- the realistic corpus (`realistic_traffic.documents`, 64-512 tokens, cut to the model's
  limit by `--auto-truncate`) in requests of 32 documents, tokenized on the pool.
Prints the router's mean tokenization time per request from `/metrics`
(`te_request_tokenization_duration`) and, for documents, tokens per second of that time.
Run it under two builds with `ab_wheels.sh` to compare them. CPU is enough.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers these experiments share with the maintained scripts live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import http.client
import json
import os
import sys
from pathlib import Path

from bench_router_overhead import scrape, start_instant_router
from realistic_traffic import documents, minilm_folder, plain_tokenizer, queries


def _tokenization_us(before: dict[str, float], after: dict[str, float]) -> float:
    name = "te_request_tokenization_duration"
    n = after[name + "_count"] - before.get(name + "_count", 0)
    return 1e6 * (after[name + "_sum"] - before.get(name + "_sum", 0)) / max(n, 1)


def _send_all(port: int, bodies: list[bytes], path: str) -> int:
    """Sends each body in turn; the tokens the router counted (`usage.prompt_tokens`)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    tokens = 0
    for body in bodies:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = response.read()
        if response.status != 200:
            raise SystemExit(f"{path}: HTTP {response.status}: {answer[:200]!r}")
        tokens += json.loads(answer)["usage"]["prompt_tokens"]
    conn.close()
    return tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-id", type=Path, help="default: the packaged all-MiniLM-L6-v2")
    p.add_argument("--port", type=int, default=3999)
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--docs", type=int, default=512)
    p.add_argument("--workers", type=int, default=2, help="--tokenization-workers")
    args = p.parse_args()
    model = minilm_folder(args.model_id)
    tokenizer = plain_tokenizer(model)
    query_bodies = queries(tokenizer, 64)
    docs, _ = documents(tokenizer, args.docs, 64, 512)
    doc_bodies = [
        json.dumps({"input": docs[i : i + 32], "model": "bench"}).encode()
        for i in range(0, len(docs), 32)
    ]
    extra = ["--auto-truncate", "--tokenization-workers", str(args.workers)]
    proc, base = start_instant_router(model, args.port, "InstantBackend", extra)
    try:
        _send_all(args.port, query_bodies + doc_bodies[:2], "/v1/embeddings")  # warm-up
        rounds = max(1, args.queries // len(query_bodies))
        before = scrape(base)
        _send_all(args.port, query_bodies * rounds, "/v1/embeddings")
        query_us = _tokenization_us(before, scrape(base))
        before = scrape(base)
        doc_tokens = _send_all(args.port, doc_bodies, "/v1/embeddings")
        doc_us = _tokenization_us(before, scrape(base))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    doc_s = doc_us * len(doc_bodies) / 1e6
    python = sys.version.split()[0]
    print(f"device: CPU ({os.cpu_count()} cores); model: {model.name}; python {python}")
    print("| request | tokenization per request, mean µs | tokens/s of tokenization time |")
    print("|---|---|---|")
    print(f"| one 24-token query (inline), x{len(query_bodies) * rounds} | {query_us:.1f} | – |")
    print(
        f"| 32 documents of 64-512 tokens (pool, {args.workers} workers), x{len(doc_bodies)} "
        f"| {doc_us:.0f} | {doc_tokens / doc_s:,.0f} |"
    )


if __name__ == "__main__":
    main()
