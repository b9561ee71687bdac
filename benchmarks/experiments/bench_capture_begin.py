"""What starting and ending one CUDA graph segment costs on the host.

    python benchmarks/experiments/bench_capture_begin.py [--segments 300]

`profile_startup.py` found `CUDAGraph.capture_begin` at ~1.35 ms per call while the bulk
graphs were captured (541 segments, one per layer and bucket). This captures `--segments`
graphs of one small kernel each into one shared pool, as `CudaGraphRunner` cuts a bucket
into segments, and prints the median host time of `capture_begin`, the captured work and
`capture_end` (which instantiates), per capture mode; "allocating" segments also allocate
1 MB from the pool each and keep it, as a forward pass's activations do. Reports only;
CUDA only.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def segments(count: int, mode: str, allocate: bool) -> tuple[float, float, float]:
    """Median µs of capture_begin, the captured work and capture_end over `count` graphs."""
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    x = torch.zeros(1024, device="cuda")
    graphs, kept, begin, work, end = [], [], [], [], []
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        for _ in range(count):
            graph = torch.cuda.CUDAGraph()
            t0 = time.perf_counter()
            graph.capture_begin(pool=pool, capture_error_mode=mode)
            t1 = time.perf_counter()
            x.add_(1.0)
            if allocate:
                kept.append(torch.ones(256 * 1024, device="cuda"))
            t2 = time.perf_counter()
            graph.capture_end()
            t3 = time.perf_counter()
            graphs.append(graph)
            begin.append(t1 - t0)
            work.append(t2 - t1)
            end.append(t3 - t2)
    return tuple(statistics.median(v) * 1e6 for v in (begin, work, end))  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--segments", type=int, default=300)
    args = parser.parse_args()
    segments(20, "global", False)  # the first capture sets the pool and the stream up
    print("| capture mode | segments | capture_begin µs | captured work µs | capture_end µs |")
    print("|---|---|---|---|---|")
    for mode, allocate in [
        ("global", False),
        ("thread_local", False),
        ("relaxed", False),
        ("global", True),
        ("thread_local", True),
        ("global", False),
    ]:
        begin, work, end = segments(args.segments, mode, allocate)
        kind = "allocating" if allocate else "one kernel"
        print(f"| {mode} | {kind} | {begin:.1f} | {work:.1f} | {end:.1f} |", flush=True)


if __name__ == "__main__":
    main()
