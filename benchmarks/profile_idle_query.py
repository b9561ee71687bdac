"""Where a lone query's time goes when queries arrive one every 20 ms (issue 16's idle rows).

    python benchmarks/profile_idle_query.py --shapes minilm-real,bert-large --tokenizer-from DIR \
        [--parts runtime,router] [--router-variants ";--backend-spin-us 25000"] [--backfill]
    python benchmarks/profile_idle_query.py --parts router --shapes minilm-real --instant-backend

A query every 20 ms leaves every thread asleep and the GPU idle between queries, unlike a
closed loop, where the next query follows the last at once. This splits the difference:

- runtime: `Backend.embed` of one 24-token query as the router calls it, per lane, called
  back to back, after a 20 ms sleep, and after a 20 ms busy-wait (the calling core stays
  awake, the GPU idles): sleep slower than busy-wait means the host's wake-up costs, busy-
  wait slower than back to back means the GPU's. Also the Python garbage collector: the
  objects it tracks, how long a full collection takes (a pause a query can land in), and
  the collections that ran during the timed calls.
- gpu-idle: the bulk lane's call after busy-waits of 0–20 ms, and after 20 ms with work on
  another stream (one SM spinning, every SM spinning, short pulses, device copies, the
  weights read, the query itself), back to back with the L2 flushed, and an empty kernel's
  round trip, each with the SM clock measured on the GPU as the query would
  start: whether the slowdown after idling is the clock, and what keeps it away.
- gpu-wake: host or device, which is slow after 20 ms without GPU work: host-only Python,
  and an empty kernel's and a small copy's launch and synchronize timed apart (no model).
- gpu-replay: the query's CUDA graph alone, host clock and GPU time (CUDA events), back to
  back, after a 20 ms busy-wait, and then queued behind a 0.3 or 2 ms kernel (the GPU's
  execution alone, without the host's launch).
- gpu-warmers: a thread that sends the GPU one small operation every 1 ms, on the query's
  stream or another, while the caller busy-waits 20 ms; round trips of an empty kernel
  and of small copies, and the query on each lane, after the wait.
- router: the router on loopback, queries every 20 ms and back to back, client latency
  against the router's own per-request figures (its debug log: total, tokenization,
  queue, the part of the queue time before the batch reached its backend thread,
  inference, the rest of its total (admission, and the results' way back to the handler);
  and its `slow hand-over` events: a query whose handler took ≥ 0.2 ms to hand
  it over, and whether the kernel preempted that thread, put it to sleep or page-faulted
  it meanwhile); with `--backfill`, also under the realistic backfill
  (benchmarks/realistic_traffic.py). One server per `--router-variants` entry (extra
  flags, `;`-separated; empty = defaults; leading NAME=VALUE words go to the server's
  environment, e.g. "TOKIO_WORKER_THREADS=4 --backend-spin-us 0": tokio reads its worker
  count from that variable). With `--instant-backend` the server runs
  `bench_router_overhead.InstantLaneBackend` (the model is loaded for its info but never
  run; it claims an interactive lane as a GPU runtime does), so what is left is the
  router's own time: this part then runs on a CPU, and its "client − server" column is
  HTTP, JSON and the connection task's hand-offs, the figure to compare before and after
  a router change.

p50 / p99 in ms. Reports only; the runtime parts need CUDA, the router part does not.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import re
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import realistic_traffic as rt
import torch
import triton
import triton.language as tl
from bench_engine import percentiles
from bench_router import serve, split_variant
from shapes import with_tokenizer, write_random_checkpoint
from tokenizers import Tokenizer
from triton.language.extra.cuda import globaltimer

from trt_tei_runtime.backend import Backend
from trt_tei_runtime.batch import HostArrays

INTERVAL_S = 0.020


def spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def timed_calls(
    fn: Callable[[], object], reps: int, pause: Callable[[], None] | None
) -> list[float]:
    for _ in range(10):
        fn()
    out = []
    for _ in range(reps):
        if pause is not None:
            pause()
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


class GcWatch:
    """Collections and their pause times while active (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._start))

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def served_tokenizer(folder: Path) -> Tokenizer:
    """The folder's tokenizer without its file's own truncation and padding, as the router
    uses it."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def query_arrays(tokenizer: Tokenizer, offset: int) -> tuple[bytes, ...]:
    body = json.loads(rt.queries(tokenizer, 1)[0])
    ids = np.array(tokenizer.encode(body["input"]).ids, np.uint32)
    n = len(ids)
    return (
        ids.tobytes(),
        np.zeros(n, np.uint32).tobytes(),
        (np.arange(n) + offset).astype(np.uint32).tobytes(),
        np.array([0, n], np.uint32).tobytes(),
    )


def query_backend(folder: Path, dtype: str) -> tuple[Backend, tuple[bytes, ...]]:
    """The router's Backend on the GPU and one 24-token query's arrays, as it passes them."""
    backend = Backend(
        str(folder), device="cuda", dtype=dtype, pooling="mean", max_batch_tokens=16384
    )
    return backend, query_arrays(served_tokenizer(folder), backend.model.info.position_offset)


def runtime_part(shape: str, folder: Path, dtype: str, reps: int) -> list[str]:
    backend, arrays = query_backend(folder, dtype)
    rows = []
    pauses = {
        "back to back": None,
        "after 20 ms sleep": lambda: time.sleep(INTERVAL_S),
        "after 20 ms busy-wait": lambda: spin(INTERVAL_S),
    }
    with GcWatch() as watch:
        for lane in ("interactive", "bulk"):
            call = functools.partial(backend.embed, *arrays, interactive=lane == "interactive")
            for label, pause in pauses.items():
                p50, p99 = percentiles(timed_calls(call, reps, pause))
                rows.append(
                    f"| {shape} | Backend.embed, {lane} lane, {label} | {p50:.3f} / {p99:.3f} |"
                )
    tracked = len(gc.get_objects())
    start = time.perf_counter()
    gc.collect()
    full_ms = (time.perf_counter() - start) * 1e3
    by_gen = {g: [p for gen, p in watch.pauses if gen == g] for g in (0, 1, 2)}
    gcs = ", ".join(
        f"gen{g}: {len(p)} ({max(p) * 1e3:.2f} ms max)" if p else f"gen{g}: 0"
        for g, p in by_gen.items()
    )
    rows.append(
        f"| {shape} | gc: {tracked:,} tracked objects, full collection {full_ms:.1f} ms; "
        f"during the {6 * reps} timed calls {gcs} | |"
    )
    del backend, call
    torch.cuda.empty_cache()
    return rows


def gpu_idle_part(shape: str, folder: Path, dtype: str, reps: int) -> list[str]:
    """The bulk lane's `Backend.embed` after the calling core busy-waited with the GPU idle,
    or with work on another stream during the wait, and the SM clock the GPU runs at when
    the query would start (`clock_probe_kernel`, measured after the same wait): whether the
    slowdown after idling is the clock, and which kind of work, if any, keeps it away."""
    backend, arrays = query_backend(folder, dtype)
    call = functools.partial(backend.embed, *arrays)
    sms = torch.cuda.get_device_properties().multi_processor_count
    side = torch.cuda.Stream()  # the default priority, as a backfill's would be
    source = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)

    def busy(
        pause_ms: float, work: Callable[[], object] | None = None, every_ms: float | None = None
    ) -> Callable[[], None]:
        """Busy-waits `pause_ms`; `work` goes to the side stream at the start of the wait,
        and again every `every_ms` if given."""

        def run() -> None:
            side.synchronize()
            now = time.perf_counter()
            until, next_at = now + pause_ms / 1e3, now
            while (now := time.perf_counter()) < until:
                if work is not None and now >= next_at:
                    with torch.cuda.stream(side):
                        work()
                    next_at = now + every_ms / 1e3 if every_ms else until

        return run

    weights = list(backend.model.model.network.parameters())
    flush_source = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    flush_target = torch.empty_like(flush_source)

    def flush_l2() -> None:
        """A copy of 128 MB (over twice the L2) right before the query: the GPU awake and
        busy, its L2 cold."""
        flush_target.copy_(flush_source)
        torch.cuda.synchronize()

    def empty_kernel() -> None:
        spin_kernel[(1,)](0)
        torch.cuda.synchronize()

    queries: list[tuple[str, Callable[[], object], Callable[[], None]]] = [
        (f"busy-wait {p:g} ms", call, busy(p)) for p in (0.0, 1.0, 3.0, 10.0, 20.0)
    ]
    queries += [
        ("back to back, L2 flushed by a 128 MB copy", call, flush_l2),
        (
            "busy-wait 20 ms, 1 program spinning 21 ms",
            call,
            busy(20.0, lambda: spin_kernel[(1,)](21_000_000)),
        ),
        (
            f"busy-wait 20 ms, {sms} programs (every SM) spinning 21 ms",
            call,
            busy(20.0, lambda: spin_kernel[(sms,)](21_000_000)),
        ),
        (
            f"busy-wait 20 ms, {sms} programs spinning 20 µs every 1 ms",
            call,
            busy(20.0, lambda: spin_kernel[(sms,)](20_000), 1.0),
        ),
        (
            "busy-wait 20 ms, a 32 MB device-to-device copy every 1 ms",
            call,
            busy(20.0, lambda: target.copy_(source), 1.0),
        ),
        (
            "busy-wait 20 ms, every weight read (`_foreach_norm`) every 1 ms",
            call,
            busy(20.0, lambda: torch._foreach_norm(weights), 1.0),
        ),
        ("busy-wait 20 ms, the query itself every 1 ms", call, busy(20.0, call, 1.0)),
        ("busy-wait 20 ms, the query itself every 5 ms", call, busy(20.0, call, 5.0)),
        ("an empty kernel and a synchronize, back to back", empty_kernel, busy(0.0)),
        ("an empty kernel and a synchronize, busy-wait 20 ms", empty_kernel, busy(20.0)),
    ]
    rows = []
    for label, fn, pause in queries:
        p50, p99 = percentiles(timed_calls(fn, reps, pause))
        mhz = np.median([sm_clock_mhz(pause) for _ in range(max(5, reps // 5))])
        rows.append(
            f"| {shape} | {'bulk lane, ' if fn is call else ''}{label}; "
            f"SM clock as it starts {mhz:,.0f} MHz "
            f"| {p50:.3f} / {p99:.3f} |"
        )
    del backend, call
    torch.cuda.empty_cache()
    return rows


def gpu_warmers_part(shape: str, folder: Path, dtype: str, reps: int) -> list[str]:
    """What keeps an idle GPU quick to answer: a thread that wakes every 1 ms and sends the
    GPU one small operation (a kernel launch, with or without a synchronize, 4-byte copies)
    on a stream of the query's lane or on another, while the calling core busy-waits 20 ms
    before each timed call. Timed: an empty kernel's round trip and 4-byte copies both
    ways on the default stream (the GPU's own wake-up, no model), and a 24-token query on
    each lane (`Backend.embed`; the bulk lane runs on the default stream, the interactive
    lane on a stream of its own)."""
    backend, arrays = query_backend(folder, dtype)
    interactive_lane = backend.model.interactive
    streams = {
        "the default stream": torch.cuda.default_stream(),
        "another stream": torch.cuda.Stream(),
    }
    if interactive_lane is not None:
        streams["the interactive lane's stream"] = interactive_lane.stream
    pinned = torch.zeros(1, dtype=torch.int32).pin_memory()
    on_device = torch.zeros(1, dtype=torch.int32, device="cuda")

    def launch() -> None:
        spin_kernel[(1,)](0)

    def launch_and_sync() -> None:
        spin_kernel[(1,)](0)
        torch.cuda.current_stream().synchronize()

    def copies_and_sync() -> None:
        on_device.copy_(pinned, non_blocking=True)
        pinned.copy_(on_device, non_blocking=True)
        torch.cuda.current_stream().synchronize()

    timed: dict[str, Callable[[], object]] = {
        "empty kernel round trip": launch_and_sync,
        "4-byte copies round trip": copies_and_sync,
        "query, bulk lane": functools.partial(backend.embed, *arrays),
    }
    if interactive_lane is not None:
        timed["query, interactive lane"] = functools.partial(
            backend.embed, *arrays, interactive=True
        )
    warmers: list[tuple[str, Callable[[], None] | None, str]] = [("none", None, "")]
    for stream_name in streams:
        warmers += [
            ("an empty kernel launched", launch, stream_name),
            ("an empty kernel and a synchronize", launch_and_sync, stream_name),
            ("4-byte copies both ways and a synchronize", copies_and_sync, stream_name),
        ]

    def warm(work: Callable[[], None], stream: torch.cuda.Stream, stop: threading.Event) -> None:
        with torch.cuda.stream(stream):
            while not stop.wait(1e-3):
                work()

    rows = []
    for label, work, stream_name in warmers:
        stop = threading.Event()
        thread = None
        if work is not None:
            thread = threading.Thread(
                target=warm, args=(work, streams[stream_name], stop), daemon=True
            )
            thread.start()
        timings = []
        for name, fn in timed.items():
            p50, p99 = percentiles(timed_calls(fn, reps, lambda: spin(INTERVAL_S)))
            timings.append(f"{name} {p50:.3f} / {p99:.3f}")
        stop.set()
        if thread is not None:
            thread.join()
        where = f" every 1 ms on {stream_name}" if work is not None else ""
        rows.append(f"| {shape} | busy-wait 20 ms, warmer: {label}{where} | {'; '.join(timings)} |")
    back_to_back = [
        f"{name} {percentiles(timed_calls(fn, reps, None))[0]:.3f}" for name, fn in timed.items()
    ]
    rows.append(f"| {shape} | back to back, p50 | {'; '.join(back_to_back)} |")
    del backend, timed
    torch.cuda.empty_cache()
    return rows


def gpu_wake_part(reps: int) -> list[str]:
    """Which side is slow after 20 ms without GPU work, host or device: host-only Python
    work (JSON and numpy, no GPU), then an empty kernel's launch (the host's time until the
    call returns) and the synchronize after it (waiting for the GPU) timed apart, and the
    same for a 4-byte copy to the device; back to back, after a 20 ms busy-wait (the core
    awake) and after a 20 ms sleep. No model."""
    document = {"input": ["a query of a few words " * 4] * 4, "model": "m"}
    numbers = np.random.default_rng(0).random(4096)
    pinned = torch.zeros(1, dtype=torch.int32).pin_memory()
    on_device = torch.zeros(1, dtype=torch.int32, device="cuda")

    def host_work() -> None:
        for _ in range(3):
            json.loads(json.dumps(document))
        np.sort(numbers).sum()

    def kernel() -> None:
        spin_kernel[(1,)](0)

    def copy() -> None:
        on_device.copy_(pinned, non_blocking=True)

    pauses: dict[str, Callable[[], None] | None] = {
        "back to back": None,
        "after a 20 ms busy-wait": lambda: spin(INTERVAL_S),
        "after a 20 ms sleep": lambda: time.sleep(INTERVAL_S),
    }
    rows = []
    for label, pause in pauses.items():
        host = percentiles(timed_calls(host_work, reps, pause))
        cells = [f"host-only Python {host[0]:.3f}"]
        for name, submit in (("empty kernel", kernel), ("4-byte copy", copy)):
            submit_s, wait_s = [], []
            for i in range(reps + 10):
                if pause is not None:
                    pause()
                start = time.perf_counter()
                submit()
                submitted = time.perf_counter()
                torch.cuda.current_stream().synchronize()
                if i >= 10:
                    submit_s.append(submitted - start)
                    wait_s.append(time.perf_counter() - submitted)
            cells.append(
                f"{name}: launch {percentiles(submit_s)[0]:.3f}, "
                f"synchronize {percentiles(wait_s)[0]:.3f}"
            )
        rows.append(f"| (no model) | {label}, p50 | {'; '.join(cells)} |")
    return rows


def gpu_replay_part(shape: str, folder: Path, dtype: str, reps: int) -> list[str]:
    """The query's CUDA graph alone (bulk lane, inputs already in its buffers): the replay
    and a synchronize on the host's clock, and the replay's GPU time between CUDA events,
    back to back, after a 20 ms busy-wait, and then queued behind a kernel of 0.3 or 2 ms,
    so that the events time the GPU's execution and not the host's launch (a cold host
    may take longer than 0.3 ms to launch: its GPU time then still holds some of that).
    The same GPU time after idling means the slowdown is on the host."""
    backend, arrays = query_backend(folder, dtype)
    batch = HostArrays.check(*arrays).packed()
    graphs = backend.model.bulk.graphs
    assert graphs is not None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows = []
    variants = (
        ("back to back", None, 0),
        ("after a 20 ms busy-wait", INTERVAL_S, 0),
        ("after a 20 ms busy-wait, queued behind a 0.3 ms kernel", INTERVAL_S, 300_000),
        ("after a 20 ms busy-wait, queued behind a 2 ms kernel", INTERVAL_S, 2_000_000),
    )
    for label, pause, head_start_ns in variants:
        wall, gpu = [], []
        for i in range(reps + 10):
            if pause is not None:
                spin(pause)
            began = time.perf_counter()
            if head_start_ns:  # the host's launch then overlaps the kernel: GPU time alone
                spin_kernel[(1,)](head_start_ns)
            start.record()
            graphs.run(batch)
            end.record()
            end.synchronize()
            if i >= 10:
                wall.append(time.perf_counter() - began)
                gpu.append(start.elapsed_time(end) / 1e3)
        (w50, w99), (g50, g99) = percentiles(wall), percentiles(gpu)
        rows.append(
            f"| {shape} | graph replay, {label}: host clock {w50:.3f} / {w99:.3f}, "
            f"GPU time {g50:.3f} / {g99:.3f} | |"
        )
    del backend, graphs
    torch.cuda.empty_cache()
    return rows


def sm_clock_mhz(pause: Callable[[], None], duration_ns: int = 30_000) -> float:
    """The SM clock over the first `duration_ns` after `pause`: cycles counted by one
    program against the GPU's global timer."""
    out = torch.zeros(2, dtype=torch.int64, device="cuda")
    pause()
    clock_probe_kernel[(1,)](out, duration_ns)
    cycles, nanoseconds = out.tolist()
    return cycles / nanoseconds * 1e3


@triton.jit
def spin_kernel(duration_ns):
    """Spins for `duration_ns` of the GPU's global timer: work that keeps one SM busy per
    program."""
    start = globaltimer()
    while globaltimer() - start < duration_ns:
        pass


@triton.jit
def clock_probe_kernel(out_ptr, duration_ns):
    """Stores the SM cycles and global-timer nanoseconds of a `duration_ns` spin."""
    start_ns = globaltimer()
    start_cycles = tl.inline_asm_elementwise(
        "mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )
    while globaltimer() - start_ns < duration_ns:
        pass
    end_cycles = tl.inline_asm_elementwise(
        "mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )
    end_ns = globaltimer()
    tl.store(out_ptr, end_cycles - start_cycles)
    tl.store(out_ptr + 1, end_ns - start_ns)


DURATION = re.compile(r"^([0-9.]+)(ns|µs|us|ms|s)$")
UNIT_S = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def duration_s(text: str) -> float:
    """A Rust `Duration`'s Debug text ("812.3µs", "1.2ms") in seconds."""
    m = DURATION.match(text)
    if m is None:
        raise ValueError(f"not a duration: {text!r}")
    return float(m.group(1)) * UNIT_S[m.group(2)]


def server_timings(log: Path, seen: int, max_tokens: int) -> tuple[list[dict[str, float]], int]:
    """The router's per-request figures of the log lines after the first `seen`, for
    requests of at most `max_tokens` tokens (queries, not backfill); and the new line count."""
    lines = log.read_text(errors="replace").splitlines()
    out = []
    for line in lines[seen:]:
        if '"success"' not in line:
            continue
        event = json.loads(line)
        if event.get("message") != "success" or int(event["compute_tokens"]) > max_tokens:
            continue
        out.append(
            {
                k: duration_s(event[f"{k}_time"])
                for k in ("total", "tokenization", "queue", "handover", "inference")
            }
        )
    return out, len(lines)


def slow_handovers(log: Path, start: int, end: int) -> str:
    """The router's `slow hand-over` events of queries (interactive lane) in log lines
    `start:end`: how many, how many of those the kernel preempted the thread in, put it to
    sleep in, or page-faulted it in (a hand-over can have several), and the longest."""
    lines = log.read_text(errors="replace").splitlines()[start:end]
    events = []
    for line in lines:
        if '"slow hand-over"' in line:
            event = json.loads(line)
            if event.get("lane") == "interactive":
                events.append(event)
    if not events:
        return "0"

    def count(field: str) -> int:
        return sum(int(e[field]) > 0 for e in events)

    longest = max(int(e["took_us"]) for e in events) / 1e3
    return (
        f"{len(events)}: {count('involuntary_switches')} / {count('voluntary_switches')} / "
        f"{count('minor_faults') + count('major_faults')}, {longest:.2f} ms"
    )


# A backend that answers at once, claiming an interactive lane (`--instant-backend`).
INSTANT_BACKEND = "bench_router_overhead:InstantLaneBackend"
# The router logs each request's figures at debug level, in its `http` module.
# Its `infer` module logs slow hand-overs at debug level.
ROUTER_TIMINGS_LOG_LEVEL = "warn,trt_tei_router::http=debug,trt_tei_router::infer=debug"
# (label, seconds between queries, raw socket client) of the router's query phases.
PHASES = [
    ("every 20 ms", INTERVAL_S, False),
    ("every 20 ms, raw client", INTERVAL_S, True),
    ("back to back", 0.0, False),
    ("back to back, raw client", 0.0, True),
]


def row(
    shape: str,
    variant: str,
    phase: str,
    client: list[float],
    server: list[dict[str, float]],
    stalls: str,
) -> str:
    def pair(seconds: list[float]) -> str:
        return "{:.3f} / {:.3f}".format(*percentiles(seconds)) if seconds else "–"

    cols = [pair(client)]
    parts = ("total", "tokenization", "queue", "handover", "inference")
    cols += [pair([s[k] for s in server]) for k in parts]
    # What the parts leave out: admission before the tokenization, and after the forward
    # pass, the results' way back to the handler (two task wake-ups) until it has them.
    rest = [s["total"] - s["tokenization"] - s["queue"] - s["inference"] for s in server]
    cols.append(pair(rest))
    outside = (np.median(client) - np.median([s["total"] for s in server])) * 1e3
    return (
        f"| {shape} | {variant or 'defaults'} | {phase} ({len(client)}) | "
        + " | ".join(cols)
        + f" | {outside:.3f} | {stalls} |"
    )


def router_part(
    shape: str, folder: Path, dtype: str, variants: list[str], args: argparse.Namespace
) -> list[str]:
    tokenizer = served_tokenizer(folder)
    bodies = rt.queries(tokenizer)
    rows = []
    for i, variant in enumerate(variants):
        port = 18500 + i
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "router.log"
            variant_env, variant_flags = split_variant(variant)
            flags = ["--dtype", dtype, "--json-output", *variant_flags]
            env = {"LOG_LEVEL": ROUTER_TIMINGS_LOG_LEVEL, **variant_env}
            if args.instant_backend:
                flags += ["--python-backend-class", INSTANT_BACKEND]
                env["PYTHONPATH"] = os.pathsep.join(
                    [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
                )
            proc = serve(folder, port, flags, log, env)
            try:
                rt.Queries(port, bodies, INTERVAL_S).run(seconds=1.0)  # warm-up
                _, seen = server_timings(log, 0, 64)
                for phase, interval_s, raw in PHASES:
                    queries = rt.Queries(port, bodies, interval_s, raw)
                    queries.run(seconds=args.seconds)
                    server, end = server_timings(log, seen, 64)
                    stalls = slow_handovers(log, seen, end)
                    rows.append(row(shape, variant, phase, queries.latencies, server, stalls))
                    seen = end
                if args.backfill:
                    rows.append(
                        backfill_row(shape, variant, port, tokenizer, bodies, log, seen, args)
                    )
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    return rows


def backfill_row(
    shape: str,
    variant: str,
    port: int,
    tokenizer: Tokenizer,
    bodies: list[bytes],
    log: Path,
    seen: int,
    args: argparse.Namespace,
) -> str:
    client = rt.ensure_client()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=10) as r:
        max_tokens = min(512, json.load(r)["max_input_length"])
    docs, tokens = rt.documents(tokenizer, 1024, 64, max_tokens)
    backfill = rt.Backfill.connect(client, port, docs, tokens, 8, 32)
    estimate = backfill.run(1)
    passes = max(1, int((0.5 + args.seconds) * estimate / tokens) + 1)
    _, seen = server_timings(log, seen, 64)
    loaded = rt.Queries(port, bodies, INTERVAL_S)
    rt.mixed(backfill, loaded, passes, settle_s=0.5)
    server, end = server_timings(log, seen, 64)
    stalls = slow_handovers(log, seen, end)
    return row(shape, variant, "under the backfill", loaded.latencies, server, stalls)


def measure(args: argparse.Namespace, runtime_rows: list[str], router_rows: list[str]) -> None:
    """Runs `--parts` on every shape, appending each part's rows as it finishes."""
    parts = args.parts.split(",")
    if "gpu-wake" in parts:  # no model: once
        runtime_rows += gpu_wake_part(args.reps)
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            if shape == "minilm-real":
                folder, dtype = rt.minilm_folder(args.minilm_dir), "float16"
                if not torch.cuda.is_available():
                    dtype = "float32"
            else:
                folder = write_random_checkpoint(shape, Path(tmp) / shape)
                folder, dtype = with_tokenizer(folder, args.tokenizer_from), "bfloat16"
            if "runtime" in parts:
                runtime_rows += runtime_part(shape, folder, dtype, args.reps)
            if "gpu-idle" in parts:
                runtime_rows += gpu_idle_part(shape, folder, dtype, args.reps)
            if "gpu-replay" in parts:
                runtime_rows += gpu_replay_part(shape, folder, dtype, args.reps)
            if "gpu-warmers" in parts:
                runtime_rows += gpu_warmers_part(shape, folder, dtype, args.reps)
            if "router" in parts:
                router_rows += router_part(
                    shape, folder, dtype, args.router_variants.split(";"), args
                )


def print_tables(runtime_rows: list[str], router_rows: list[str]) -> None:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"device: {device}; 24-token queries; p50 / p99 ms")
    if runtime_rows:
        print("\n| shape | call | p50 / p99 ms |\n|---|---|---|")
        print("\n".join(runtime_rows))
    if router_rows:
        print(
            "\n| shape | router flags | queries (answered) | client | server total | "
            "tokenization | queue | of it, before the hand-over | inference | "
            "the rest of the server total | client − server, p50 | "
            "slow hand-overs (≥ 0.2 ms): preempted / slept / faulted, longest |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(router_rows))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="minilm-real,bert-large")
    parser.add_argument("--tokenizer-from", type=Path, help="tokenizer.json for random shapes")
    parser.add_argument("--minilm-dir", type=Path)
    parser.add_argument("--parts", default="runtime,router")
    parser.add_argument("--router-variants", default="", help="`;`-separated extra router flags")
    parser.add_argument("--backfill", action="store_true", help="router: also under the backfill")
    parser.add_argument(
        "--instant-backend",
        action="store_true",
        help="router: a backend that never runs the model (the router's own time, on a CPU)",
    )
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    runtime_rows: list[str] = []
    router_rows: list[str] = []
    try:
        measure(args, runtime_rows, router_rows)
    finally:  # what was measured is printed even when a later part fails
        print_tables(runtime_rows, router_rows)


if __name__ == "__main__":
    main()
