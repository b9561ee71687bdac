"""A large model's query beside its backfill on part of the SMs, against the query alone.

    python benchmarks/experiments/bench_sm_partition.py --shape qwen3-8b --free-sms 8,16,32

Today a query runs alone on the GPU: the bulk lane stops at its next step (gate) and waits
while the query is in flight. A qwen3-8b query reads 13.9 GB of weights (~4.4 ms on an
H200), so one every 20 ms takes ~22 % of the GPU from a backfill, which keeps ~80 % of its
solo speed whatever the gate does. The backfill's GEMMs are compute-bound and the query's
memory-bound: run at the same time, each could use what the other leaves. The bulk GEMMs
are persistent kernels that hold every SM, so a query beside them needs SMs kept free:
cuBLAS's SM count target (`torch._C._set_sm_carveout_experimental`) launches a GEMM on all
SMs but `free` of them.

The stack is `bench_query_pdl.py`'s (every layer its own weights; norms and linears,
attention left out). The bulk work is that stack's linears over `--bulk-tokens` rows, one
linear a step, launched by a thread that keeps at most two steps queued. Queries are
replays of a CUDA graph of the stack for 24 tokens (captured with cuBLASLt, as the
engine's interactive lane is), one every `--interval-ms` on a highest-priority stream.
Policies:

- `alone`: the query alone, back to back (its GPU time), and the bulk alone;
- `serial`: the bulk thread launches nothing while a query is in flight (today's gate);
- `beside`: the bulk never waits; its GEMMs keep no SMs free;
- `beside/free=N`: the bulk never waits; its GEMMs keep N SMs free all the time;
- `beside/free=N while queried`: N SMs kept free only by the steps launched while a query
  is in flight.

Prints, per policy, the query's latency (host clock, launch to completion) and the bulk's
steps/s as a share of its solo rate. CUDA only.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

import torch
from bench_query_pdl import SHAPES, Shape, layer_weights, stack

from trt_tei_runtime.runtime.blas import preferred_blas


def query_graph(
    shape: Shape, weights: list[dict[str, torch.Tensor]], tokens: int
) -> tuple[torch.cuda.CUDAGraph, torch.cuda.Stream]:
    """The stack for `tokens` rows as one graph, and the highest-priority stream it runs on."""
    _, highest = torch.cuda.Stream.priority_range()  # type: ignore[call-arg]
    stream = torch.cuda.Stream(priority=highest)
    h0 = torch.randn(tokens, shape.hidden, device="cuda", dtype=torch.bfloat16)
    with preferred_blas("cublaslt"):
        run = stack(shape, weights, "cublaslt")
        with torch.cuda.stream(stream):
            run(h0.clone())  # the eager pass picks the kernels the graph keeps
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                run(h0.clone())
    stream.synchronize()
    return graph, stream


def bulk_steps(
    shape: Shape, weights: list[dict[str, torch.Tensor]], tokens: int
) -> list[Callable[[], None]]:
    """One callable per linear of the stack, over `tokens` rows (outputs reused)."""
    x = torch.randn(tokens, max(shape.hidden, shape.intermediate), device="cuda")
    x = x.to(torch.bfloat16) / 4
    outputs: dict[tuple[int, int], torch.Tensor] = {}
    steps = []
    for lw in weights:
        for name in ("qkv", "o", "up", "down"):
            w = lw[name]
            key = tuple(w.shape)
            if key not in outputs:
                outputs[key] = torch.empty(tokens, w.shape[0], device="cuda", dtype=w.dtype)
            out, inp = outputs[key], x[:, : w.shape[1]]
            steps.append(lambda w=w, out=out, inp=inp: torch.mm(inp, w.t(), out=out))
    return steps


def set_free_sms(free: int) -> None:
    torch._C._set_sm_carveout_experimental(free if free > 0 else None)  # type: ignore[attr-defined]


class Bulk:
    """Launches the bulk steps on their own stream from a thread, at most two queued."""

    def __init__(self, steps: list[Callable[[], None]], blas: str | None) -> None:
        self.steps, self.stream, self.blas = steps, torch.cuda.Stream(), blas
        self.done = 0
        self.stop = threading.Event()
        self.query_in_flight = threading.Event()
        self.wait_for_queries = False
        self.free_always = 0
        self.free_while_queried = 0

    def run(self) -> None:
        queued: list[torch.cuda.Event] = []
        i = 0
        with torch.cuda.stream(self.stream), preferred_blas(self.blas):
            while not self.stop.is_set():
                if self.wait_for_queries:
                    while self.query_in_flight.is_set() and not self.stop.is_set():
                        time.sleep(20e-6)
                queried = self.query_in_flight.is_set()
                set_free_sms(self.free_while_queried if queried else self.free_always)
                self.steps[i % len(self.steps)]()
                i += 1
                event = torch.cuda.Event()
                event.record()
                queued.append(event)
                if len(queued) > 2:
                    queued.pop(0).synchronize()
                    self.done += 1
            for event in queued:
                event.synchronize()
                self.done += 1
        set_free_sms(0)

    def rate(self, seconds: float, queries: Callable[[threading.Event], None] | None) -> float:
        """Steps per second over `seconds`, with `queries` running beside it."""
        self.stop.clear()
        self.done = 0
        thread = threading.Thread(target=self.run)
        thread.start()
        time.sleep(0.5)  # warm: the queue is full and the clocks are up
        start_done, start = self.done, time.perf_counter()
        stop_queries = threading.Event()
        query_thread = None
        if queries is not None:
            query_thread = threading.Thread(target=queries, args=(stop_queries,))
            query_thread.start()
        time.sleep(seconds)
        rate = (self.done - start_done) / (time.perf_counter() - start)
        stop_queries.set()
        if query_thread is not None:
            query_thread.join()
        self.stop.set()
        thread.join()
        return rate


def query_loop(
    graph: torch.cuda.CUDAGraph,
    stream: torch.cuda.Stream,
    interval_s: float,
    bulk: Bulk,
    latencies: list[float],
) -> Callable[[threading.Event], None]:
    def loop(stop: threading.Event) -> None:
        next_at = time.perf_counter()
        while not stop.is_set():
            bulk.query_in_flight.set()
            t0 = time.perf_counter()
            with torch.cuda.stream(stream):
                graph.replay()
            stream.synchronize()
            latencies.append((time.perf_counter() - t0) * 1e3)
            bulk.query_in_flight.clear()
            next_at = max(next_at + interval_s, time.perf_counter())
            time.sleep(max(0.0, next_at - time.perf_counter()))

    return loop


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 2 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--bulk-tokens", type=int, default=8192)
    parser.add_argument("--free-sms", default="8,16,32")
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--bulk-blas",
        default="torch",
        choices=("torch", "cublas", "cublaslt"),
        help="the bulk GEMMs' library (torch: its own choice, as the engine's bulk lane)",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = SHAPES[args.shape]
    weights = [layer_weights(shape, "cuda") for _ in range(shape.layers)]
    graph, stream = query_graph(shape, weights, args.tokens)
    blas = None if args.bulk_blas == "torch" else args.bulk_blas
    bulk = Bulk(bulk_steps(shape, weights, args.bulk_tokens), blas)
    interval = args.interval_ms / 1e3

    alone = []
    for _ in range(3):  # warm
        graph.replay()
    torch.cuda.synchronize()
    for _ in range(100):
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()
        alone.append((time.perf_counter() - t0) * 1e3)
    solo = bulk.rate(args.seconds, None)
    rows = [("alone", statistics.median(alone), pct(alone, 99), 1.0)]
    print(f"query alone {rows[0][1]:.3f} ms; bulk alone {solo:.1f} steps/s", flush=True)

    policies: list[tuple[str, bool, int, int]] = [("serial", True, 0, 0), ("beside", False, 0, 0)]
    for free in (int(f) for f in args.free_sms.split(",")):
        policies.append((f"beside/free={free}", False, free, free))
        policies.append((f"beside/free={free} while queried", False, 0, free))
    for name, wait, free_always, free_queried in policies:
        bulk.wait_for_queries, bulk.free_always = wait, free_always
        bulk.free_while_queried = free_queried
        latencies: list[float] = []
        rate = bulk.rate(args.seconds, query_loop(graph, stream, interval, bulk, latencies))
        rows.append((name, statistics.median(latencies), pct(latencies, 99), rate / solo))
        print(f"{name}: {rows[-1][1]:.2f} / {rows[-1][2]:.2f} ms, {rate / solo:.1%}", flush=True)
    free_only = {}
    for free in (int(f) for f in args.free_sms.split(",")):
        bulk.wait_for_queries, bulk.free_always, bulk.free_while_queried = False, free, free
        free_only[free] = bulk.rate(args.seconds, None) / solo

    print(
        f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.shape}, "
        f"query {args.tokens} tokens every {args.interval_ms:g} ms, bulk steps of "
        f"{args.bulk_tokens} rows ({args.bulk_blas}), {args.seconds:g} s a policy"
    )
    print("| policy | query p50 / p99 ms | bulk, of solo |")
    print("|---|---|---|")
    for name, p50, p99, share in rows:
        print(f"| {name} | {p50:.2f} / {p99:.2f} | {share:.1%} |")
    print("\nThe bulk alone with SMs kept free (no queries):")
    for free, share in free_only.items():
        print(f"| free={free} | {share:.1%} |")


if __name__ == "__main__":
    main()
