"""Where a server's start-up time goes, per shape (docs/performance.md: process start to `/health`
200 ≤ 10 s for bert-large, ≤ 20 s for qwen3-8b, from a local folder).

    python benchmarks/profile_startup.py --shapes bert-large,qwen3-0.6b --tokenizer-from DIR \
        [--variants "TRT_TEI_BULK_GRAPHS=0;"]

Each shape is a random-weight checkpoint (benchmarks/shapes.py) with DIR's tokenizer. For
every variant (environment settings for the server, `;`-separated; the empty one is the
default build) it runs, each in a fresh process:
- `Backend(folder)` with the executor's start-up phases timed: loading, the allocator's
  warm-up, the small graphs (both lanes), the bulk layer's timing, the bulk graphs (their
  buckets' warm-up passes, captured passes and graph instantiation), and Triton compiles;
  first with an empty Triton cache (a fresh machine or container), then with the cache
  that run left (every later start);
- the router itself, from process start to the first `/health` 200, with the warm cache,
  split by its log: up to "loading model" (the interpreter and imports), to "model loaded"
  (the `Backend`), to "Ready" and to the first `/health` 200.
`--cprofile N` also prints the N functions with the most cumulative time of the warm
`Backend()`. Reports only; needs a CUDA GPU and the `text-embeddings-router` on PATH.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()  # the child's imports of torch and the runtime count from here
Timers = collections.defaultdict[str, list[float]]


def timed(timers: Timers, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            timers[name].append(time.perf_counter() - start)

    return wrapper


def child(folder: str, cprofile: int) -> None:
    """One `Backend` built with its phases timed; prints them as JSON on the last line."""
    import torch
    import triton.runtime.jit as triton_jit

    from trt_tei_runtime.backend import Backend
    from trt_tei_runtime.runtime import executor as executor_module
    from trt_tei_runtime.runtime.graphs import CudaGraphRunner

    imported = time.perf_counter() - STARTED
    timers: Timers = collections.defaultdict(list)
    executor = executor_module.Executor
    executor_module.load_model = timed(timers, "load", executor_module.load_model)  # type: ignore[assignment]
    for name in ("_warm_up", "_time_layer", "_capture_large"):
        setattr(executor, name, timed(timers, name, getattr(executor, name)))
    original_capture = executor._capture

    def capture(self: Any, *args: Any, **options: Any) -> Any:
        kind = "bulk graphs" if options.get("buckets") else "small graphs"
        return timed(timers, kind, original_capture)(self, *args, **options)

    executor._capture = capture  # type: ignore[method-assign]
    # A bucket's first pass is its warm-up, its second the captured one.
    original_pass = CudaGraphRunner._pass

    def graph_pass(self: CudaGraphRunner, *args: Any) -> Any:
        kind = "capture pass" if torch.cuda.is_current_stream_capturing() else "warm-up pass"
        prefix = "bulk " if self.inputs.block_table is not None else "small "
        return timed(timers, prefix + kind, original_pass)(self, *args)

    CudaGraphRunner._pass = graph_pass  # type: ignore[method-assign]
    CudaGraphRunner._capture_bucket = timed(  # type: ignore[method-assign]
        timers, "bucket", CudaGraphRunner._capture_bucket
    )
    torch.cuda.CUDAGraph.capture_end = timed(  # type: ignore[method-assign]
        timers, "instantiate", torch.cuda.CUDAGraph.capture_end
    )
    triton_jit.JITFunction._do_compile = timed(  # type: ignore[method-assign]
        timers, "triton compile", triton_jit.JITFunction._do_compile
    )
    start = time.perf_counter()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    cuda_init = time.perf_counter() - start
    profiler = None
    if cprofile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    Backend(folder)
    total = time.perf_counter() - start
    if profiler is not None:
        import pstats

        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(cprofile)
    row = {name: [sum(values), len(values)] for name, values in timers.items()}
    row["backend"] = [total, 1]
    row["imports"] = [imported, 1]
    row["cuda init"] = [cuda_init, 1]
    print(json.dumps(row))


def child_row(folder: Path, env: dict[str, str], cprofile: int) -> dict[str, list[float]]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(folder), "--cprofile", str(cprofile)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"child failed:\n{proc.stderr[-3000:]}")
    *profile, last = proc.stdout.strip().splitlines()
    if cprofile:
        print("\n".join(profile))
    return json.loads(last)


ROUTER_EVENTS = ("loading model", "model loaded", "Ready")
LOG_TIME = re.compile(r"^(\S+Z)\s+INFO (.*)$")


def router_startup(folder: Path, port: int, env: dict[str, str]) -> list[float]:
    """Seconds from the router's process start to its log's `ROUTER_EVENTS` and to its
    first `/health` 200."""
    cmd = ["text-embeddings-router", "--model-id", str(folder), "--port", str(port)]
    cmd += ["--hostname", "127.0.0.1", "--pooling", "mean"]
    with tempfile.TemporaryFile() as log:
        started_at = time.time()
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
        try:
            while time.perf_counter() - start < 300:
                if proc.poll() is not None:
                    log.seek(0)
                    raise SystemExit(f"router exited:\n{log.read().decode()[-3000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                        healthy = time.perf_counter() - start
                        break
                except OSError:
                    time.sleep(0.05)
            else:
                raise SystemExit("router did not start in 300 s")
        finally:
            proc.terminate()
            proc.wait(30)
        log.seek(0)
        events: dict[str, float] = {}
        for line in log.read().decode(errors="replace").splitlines():
            found = LOG_TIME.match(line)
            if found:
                at = datetime.fromisoformat(found.group(1)).timestamp() - started_at
                for event in ROUTER_EVENTS:
                    if found.group(2).startswith(event):
                        events.setdefault(event, at)
    return [events.get(event, float("nan")) for event in ROUTER_EVENTS] + [healthy]


def parse_variant(variant: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in variant.split())


def seconds(row: dict[str, list[float]], name: str) -> str:
    value, count = row.get(name, [0.0, 0])
    return f"{value:.2f}" if count == 1 or not count else f"{value:.2f} ({int(count)})"


COLUMNS = [
    ("imports", "imports"),
    ("cuda init", "CUDA init"),
    ("backend", "Backend()"),
    ("load", "load"),
    ("_warm_up", "allocator warm-up"),
    ("small graphs", "small graphs (captures)"),
    ("_time_layer", "bulk layer timed"),
    ("bulk graphs", "bulk graphs"),
    ("bulk warm-up pass", "of which warm-up passes"),
    ("bulk capture pass", "captured passes"),
    ("instantiate", "instantiate, all graphs (count)"),
    ("triton compile", "Triton compiles"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="bert-large,qwen3-0.6b")
    parser.add_argument("--tokenizer-from", type=Path)
    parser.add_argument("--variants", default="", help="';'-separated NAME=VALUE settings")
    parser.add_argument("--port", type=int, default=18090)
    parser.add_argument("--cprofile", type=int, default=0, metavar="N")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.cprofile)
        return
    from shapes import with_tokenizer, write_random_checkpoint

    if args.tokenizer_from is None:
        parser.error("--tokenizer-from is required")
    variants = args.variants.split(";")
    lines = [
        "| shape | variant | Triton cache | "
        + " | ".join(title for _, title in COLUMNS)
        + " | router: to loading model / model loaded / Ready / first /health 200 |",
        "|---|---|---|" + "---|" * len(COLUMNS) + "---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            folder = with_tokenizer(
                write_random_checkpoint(shape, Path(tmp) / shape), args.tokenizer_from
            )
            for variant in variants:
                cache = Path(tmp) / f"triton-{shape}-{len(lines)}"
                env = {**parse_variant(variant), "TRITON_CACHE_DIR": str(cache)}
                for state in ("empty", "warm"):
                    row = child_row(folder, env, args.cprofile if state == "warm" else 0)
                    router = ""
                    if state == "warm":
                        times = router_startup(folder, args.port, env)
                        router = " / ".join(f"{t:.2f}" for t in times)
                    cells = " | ".join(seconds(row, name) for name, _ in COLUMNS)
                    lines.append(
                        f"| {shape} | {variant or 'default'} | {state} | {cells} | {router} |"
                    )
                    print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
