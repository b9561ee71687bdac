"""Where a query's host time goes on the interactive lane, step by step, and what the
direct path (`runtime.query_path`: numpy and CUDA driver calls, no torch operation) saves
against torch's path through the same CUDA graph.

    python benchmarks/experiments/bench_query_launch.py \
        --shapes minilm,bert-large,qwen3-0.6b --reps 200

Part 1, `Backend.embed(..., interactive=True)` of one 24-token query as the router calls
it (uint32 buffers in, float32 rows out), by torch's path (`TRT_TEI_QUERY_PATH=torch`'s)
and by the direct path, alternating call by call.

Part 2, torch's path taken apart, on the host's clock per step:
- enter: `lane.active()` (device, gate, stream);
- send: the inputs into the graph's buffers (`InputStaging.send`, one copy);
- launch: the graph's launch, by torch's `replay` or by the driver's `cuGraphLaunch`;
- read: the pooled row to the host (`.to("cpu")`, which waits for the GPU);
- total: from before `enter` to the row in numpy.
Part 3, the direct path taken apart: check (the arrays, the model's limits, the bucket),
fill (the pinned staging buffer), enter (the gate, the CUDA context), run (the copies, the
launch and the wait: the GPU's time), leave, copy (the rows out of the pinned buffer).

Each rep runs after a 20 ms sleep (the query stream of docs/performance.md) or back to back;
the two launches alternate rep by rep. Prints p50 / p99 ms last. CUDA only; reports only.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers these experiments share with the maintained scripts live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import ctypes
import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from bench_engine import percentiles, random_ids
from shapes import write_random_checkpoint

from trt_tei_runtime.backend import Backend
from trt_tei_runtime.batch import HostArrays, PackedBatch

QUERY_TOKENS = 24
PAUSE_S = 0.020
STEPS = ("enter", "send", "launch", "read", "total")
DIRECT_STEPS = ("check", "fill", "enter", "run", "leave", "copy", "total")
PAUSES = (("after 20 ms sleep", PAUSE_S), ("back to back", 0.0))


def driver_launch() -> Callable[[torch.cuda.CUDAGraph, torch.cuda.Stream], None]:
    """Launches a graph torch instantiated, through the driver, on a stream."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    libcuda.cuGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    libcuda.cuGraphLaunch.restype = ctypes.c_int

    def launch(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream) -> None:
        status = libcuda.cuGraphLaunch(graph.raw_cuda_graph_exec(), stream.cuda_stream)
        if status:
            raise RuntimeError(f"cuGraphLaunch failed: CUresult {status}")

    return launch


def bench(shape: str, reps: int) -> tuple[list[str], list[str], list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_random_checkpoint(shape, Path(tmp) / shape)
        backend = Backend(str(folder), device="cuda", dtype="bfloat16", pooling="mean")
    executor = backend.model
    lane = executor.interactive
    assert lane is not None and lane.query_path is not None
    direct = lane.query_path
    runner = lane.graphs
    vocab = executor.model.network.vocab_size
    query = PackedBatch.from_sequences(
        random_ids([QUERY_TOKENS], vocab, seed=2), position_offset=executor.info.position_offset
    )
    arrays = tuple(
        t.numpy().astype("<u4").tobytes()
        for t in (query.input_ids, query.token_type_ids, query.position_ids, query.cu_seqlens)
    )
    n = query.num_seqs
    bucket = runner.bucket_for(query.num_tokens, n)
    graph = runner.graphs[bucket][0]
    pooled = runner.pooled[bucket]
    launches = ("torch replay", "cuGraphLaunch")
    by_driver = driver_launch()

    def call(path: str) -> np.ndarray:
        lane.query_path = direct if path == "direct path" else None
        try:
            return backend.embed(*arrays, interactive=True)
        finally:
            lane.query_path = direct

    reference = call("torch path")
    assert np.array_equal(call("direct path"), reference)
    call_rows = []
    for pause_label, pause in PAUSES:
        paths = ("torch path", "direct path")
        totals: dict[str, list[float]] = {p: [] for p in paths}
        for i in range(2 * (reps + 10)):
            path = paths[i % 2]
            if pause:
                time.sleep(pause)
            began = time.perf_counter()
            out = call(path)
            if i >= 20:
                totals[path].append(time.perf_counter() - began)
            assert np.array_equal(out, reference)
        for path, seconds in totals.items():
            p50, p99 = percentiles(seconds)
            call_rows.append(f"| {shape} | {pause_label} | {path} | {p50:.3f} / {p99:.3f} |")

    def one(how: str) -> tuple[dict[str, float], np.ndarray]:
        marks = [time.perf_counter()]
        with torch.inference_mode(), lane.active():
            marks.append(time.perf_counter())
            runner.inputs.send(query, tail=bucket)
            marks.append(time.perf_counter())
            if how == "torch replay":
                graph.replay()
            else:
                by_driver(graph, lane.stream)
            marks.append(time.perf_counter())
            row = pooled[:n].to("cpu", torch.float32)
            marks.append(time.perf_counter())
        out = np.ascontiguousarray(row.numpy())
        marks.append(time.perf_counter())
        steps = dict(zip(STEPS[:-1], np.diff(marks[:-1]) * 1e3, strict=True))
        steps["read"] += (marks[-1] - marks[-2]) * 1e3
        steps["total"] = (marks[-1] - marks[0]) * 1e3
        return steps, out

    assert np.array_equal(one("torch replay")[1], reference)
    assert np.array_equal(one("cuGraphLaunch")[1], reference)
    step_rows = []
    for pause_label, pause in PAUSES:
        times: dict[str, dict[str, list[float]]] = {h: {s: [] for s in STEPS} for h in launches}
        for i in range(2 * (reps + 10)):
            how = launches[i % 2]
            if pause:
                time.sleep(pause)
            steps, out = one(how)
            if i >= 20:
                for step, ms in steps.items():
                    times[how][step].append(ms)
            assert np.array_equal(out, reference)
        for how, per_step in times.items():
            cells = []
            for step in STEPS:
                p50, p99 = percentiles([ms / 1e3 for ms in per_step[step]])
                cells.append(f"{p50:.3f} / {p99:.3f}")
            step_rows.append(f"| {shape} | {pause_label} | {how} | " + " | ".join(cells) + " |")

    def direct_steps() -> tuple[dict[str, float], np.ndarray]:
        """`QueryPath.embed` and its caller's checks, with a mark after each step."""
        driver, stream = direct._driver, direct._stream
        marks = [time.perf_counter()]
        batch = HostArrays.check(*arrays)
        executor._check_limits(batch.max_seqlen, batch.input_ids, batch.token_type_ids)
        bucket = runner.bucket_for(batch.num_tokens, batch.num_seqs)
        marks.append(time.perf_counter())
        runner.inputs.fill(
            batch.input_ids, batch.token_type_ids, batch.position_ids, batch.cu_seqlens, bucket
        )
        marks.append(time.perf_counter())
        gate = direct._gate.interactive()
        gate.__enter__()
        previous = driver.make_current(direct._context)
        marks.append(time.perf_counter())
        host, device, nbytes = direct._inputs
        driver.copy_to_device(device, host, nbytes, stream)
        driver.launch(direct._launches[bucket], stream)
        driver.copy_to_host(direct._rows_ptr, direct._pooled[bucket], n * direct._row_bytes, stream)
        driver.synchronize(stream)
        marks.append(time.perf_counter())
        if previous is not None:
            driver.set_current(previous)
        gate.__exit__(None, None, None)
        marks.append(time.perf_counter())
        out = direct._host_rows[:n].copy()
        marks.append(time.perf_counter())
        steps = dict(zip(DIRECT_STEPS[:-1], np.diff(marks) * 1e3, strict=True))
        steps["total"] = (marks[-1] - marks[0]) * 1e3
        return steps, out

    assert np.array_equal(direct_steps()[1], reference)
    direct_rows = []
    for pause_label, pause in PAUSES:
        per_step: dict[str, list[float]] = {s: [] for s in DIRECT_STEPS}
        for i in range(reps + 10):
            if pause:
                time.sleep(pause)
            steps, out = direct_steps()
            if i >= 10:
                for step, ms in steps.items():
                    per_step[step].append(ms / 1e3)
            assert np.array_equal(out, reference)
        cells = []
        for step in DIRECT_STEPS:
            p50, p99 = percentiles(per_step[step])
            cells.append(f"{p50:.3f} / {p99:.3f}")
        direct_rows.append(f"| {shape} | {pause_label} | " + " | ".join(cells) + " |")
    return call_rows, step_rows, direct_rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="minilm,bert-large,qwen3-0.6b")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    call_rows, step_rows, direct_rows = [], [], []
    for shape in args.shapes.split(","):
        calls, steps, direct_steps = bench(shape, args.reps)
        call_rows += calls
        step_rows += steps
        direct_rows += direct_steps
        gc.collect()  # the shape's executor, before the next one loads
        torch.cuda.empty_cache()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; p50 / p99 ms")
    print("\n| shape | before the query | Backend.embed, interactive |")
    print("|---|---|---|")
    print("\n".join(call_rows))
    print("\n| shape | before the query | launch | " + " | ".join(STEPS) + " |")
    print("|---|---|---|" + "---|" * len(STEPS))
    print("\n".join(step_rows))
    print("\n| shape | before the query | " + " | ".join(DIRECT_STEPS) + " |")
    print("|---|---|" + "---|" * len(DIRECT_STEPS))
    print("\n".join(direct_rows))


if __name__ == "__main__":
    main()
