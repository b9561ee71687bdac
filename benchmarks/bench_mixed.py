"""docs/performance.md's mixed workload at the engine level: a saturating backfill plus one
24-token query every 20 ms on the same model. Prints a table last.

    python benchmarks/bench_mixed.py --shapes bert-large,qwen3-0.6b --batch-tokens 16384,4096

For each shape and backfill batch size (`--batch-tokens`): the backfill alone (tokens/s),
queries alone (p50/p99), then both at once under each schedule:
- `serial`: one model thread that runs a waiting query before the next backfill batch —
  the best a single queue with queries first can do: a query waits for the running batch;
- `lanes`: what the router does when the runtime has an interactive lane — queries on
  their own thread, their own CUDA graphs and a highest-priority CUDA stream, while the
  backfill keeps running but pauses between layers while a query is in flight
  (`runtime.preemption`);
- `ungated`: the same without the pause between layers (stream priority alone).
Every batch's result is read back to the host, as the router does. Targets: query p99
under load ≤ 3× idle p50, backfill ≥ 90 % of its solo tokens/s. Reports only; CUDA only.
"""

from __future__ import annotations

import argparse
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_engine import backfill_lengths, percentiles, query_latencies, random_ids
from shapes import write_random_checkpoint

from trt_tei_runtime.backend import LANE_SWITCH_INTERVAL_S
from trt_tei_runtime.batch import PackedBatch, token_budget_batches
from trt_tei_runtime.runtime import Executor, InteractiveLane, load_executor
from trt_tei_runtime.runtime.preemption import LayerGate

QUERY_TOKENS = 24
QUERY_INTERVAL_S = 0.020


class Backfill:
    """Cycles over the backfill's batches, counting real tokens."""

    def __init__(self, model: Executor, docs: list[list[int]], batch_tokens: int) -> None:
        groups = token_budget_batches([len(d) for d in docs], batch_tokens)
        offset = model.info.position_offset
        self.batches = [
            PackedBatch.from_sequences([docs[i] for i in g], position_offset=offset) for g in groups
        ]
        self.model = model
        self.next = 0
        self.tokens = 0

    def step(self) -> None:
        batch = self.batches[self.next % len(self.batches)]
        self.next += 1
        self.model.embed(batch).cpu()
        self.tokens += batch.num_tokens


def solo_backfill(backfill: Backfill, seconds: float) -> float:
    backfill.step()
    backfill.tokens = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        backfill.step()
    return backfill.tokens / (time.perf_counter() - start)


def query_fn(model: Executor, query: PackedBatch, interactive: bool) -> Callable[[], None]:
    def run() -> None:
        lane = model.lane(interactive)
        with lane.active():
            model.embed(query, lane).cpu()

    return run


def mixed_serial(backfill: Backfill, run_query: Callable[[], None], seconds: float):  # type: ignore[no-untyped-def]
    """One model thread: a waiting query runs before the next backfill batch."""
    waiting: queue.SimpleQueue[tuple[float, threading.Event, list[float]]] = queue.SimpleQueue()
    stop = threading.Event()

    def model_thread() -> None:
        while not stop.is_set():
            try:
                asked, done, out = waiting.get_nowait()
            except queue.Empty:
                backfill.step()
                continue
            run_query()
            out.append(time.perf_counter() - asked)
            done.set()

    def submit() -> float:
        done, out = threading.Event(), []  # type: ignore[var-annotated]
        waiting.put((time.perf_counter(), done, out))
        done.wait()
        return out[0]

    return _drive(backfill, model_thread, submit, stop, seconds)


def mixed_lanes(backfill: Backfill, run_query: Callable[[], None], seconds: float):  # type: ignore[no-untyped-def]
    """Backfill on its thread; queries on theirs, on the interactive lane."""
    stop = threading.Event()

    def model_thread() -> None:
        while not stop.is_set():
            backfill.step()

    def submit() -> float:
        start = time.perf_counter()
        run_query()
        return time.perf_counter() - start

    return _drive(backfill, model_thread, submit, stop, seconds)


def _drive(backfill, model_thread, submit, stop, seconds):  # type: ignore[no-untyped-def]
    thread = threading.Thread(target=model_thread)
    backfill.tokens = 0
    start = time.perf_counter()
    thread.start()
    time.sleep(0.2)  # let the backfill saturate the GPU first
    latencies = []
    next_at = time.perf_counter()
    while time.perf_counter() - start < seconds:
        next_at += QUERY_INTERVAL_S
        latencies.append(submit())
        time.sleep(max(0.0, next_at - time.perf_counter()))
    stop.set()
    thread.join()
    return latencies, backfill.tokens / (time.perf_counter() - start)


def bench(shape: str, batch_tokens: list[int], seconds: float) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_random_checkpoint(shape, Path(tmp) / shape)
        model = load_executor(
            folder, device="cuda", dtype="bfloat16", max_num_tokens=max(batch_tokens)
        )
        assert model.interactive is not None
        vocab = model.model.network.vocab_size
        docs = random_ids(backfill_lengths(shape), vocab)
        query = PackedBatch.from_sequences(
            random_ids([QUERY_TOKENS], vocab, seed=2), position_offset=model.info.position_offset
        )
        gated = model.interactive
        # A gate attached to no layer never pauses the backfill.
        assert gated.graphs is not None
        ungated = InteractiveLane(
            model.model.network, model.device, graphs=gated.graphs, gate=LayerGate()
        )
        idle = query_latencies(query_fn(model, query, True), 200)
        for budget in batch_tokens:
            backfill = Backfill(model, docs, budget)
            solo = solo_backfill(backfill, seconds / 2)
            base = {"shape": shape, "batch_tokens": budget, "solo": solo, "idle": idle}
            schedules = [
                ("serial", mixed_serial, False, gated),
                ("lanes", mixed_lanes, True, gated),
                ("ungated", mixed_lanes, True, ungated),
            ]
            for name, schedule, interactive, lane in schedules:
                model.interactive = lane
                latencies, tokens_s = schedule(
                    backfill, query_fn(model, query, interactive), seconds
                )
                rows.append(
                    {**base, "schedule": name, "loaded": percentiles(latencies), "tok_s": tokens_s}
                )
            model.interactive = gated
        del model
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="bert-large")
    parser.add_argument("--batch-tokens", default="16384,4096")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=LANE_SWITCH_INTERVAL_S * 1e3,
        help="Python's thread switch interval, as the router's backend sets it",
    )
    args = parser.parse_args()
    budgets = [int(b) for b in args.batch_tokens.split(",")]
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = [r for s in args.shapes.split(",") for r in bench(s, budgets, args.seconds)]
    header = (
        f"{'shape':<11} {'batch':>6} {'schedule':<9} {'idle p50':>8} {'load p50':>8} "
        f"{'load p99':>8} {'p99/idle':>8} {'backfill tok/s':>14} {'of solo':>7}"
    )
    print(header)
    for r in rows:
        idle50 = r["idle"][0]
        p50, p99 = r["loaded"]
        print(
            f"{r['shape']:<11} {r['batch_tokens']:>6} {r['schedule']:<9} {idle50:>8.2f} "
            f"{p50:>8.2f} {p99:>8.2f} {p99 / idle50:>7.1f}x {r['tok_s']:>14,.0f} "
            f"{r['tok_s'] / r['solo']:>6.0%}"
        )
    solos = sorted({f"{r['shape']}@{r['batch_tokens']}={r['solo']:,.0f}" for r in rows})
    print("(ms; backfill alone, tok/s: " + ", ".join(solos) + ")")


if __name__ == "__main__":
    main()
