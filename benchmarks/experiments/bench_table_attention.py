"""The attention of the bulk lane's CUDA graphs: the persistent block-table kernel against
the grid kernel, on backfill batches.

    python benchmarks/experiments/bench_table_attention.py [--shapes bert-large,qwen3-0.6b,qwen3-8b]

An eager bulk pass launches the grid kernel sized to its own batch (`cu_seqlens` of its
sequences only, its longest sequence). A CUDA graph cannot: its launch is fixed at capture,
so a grid kernel in a graph is sized for the bucket's every sequence slot and its longest
possible sequence ("grid, static": 258 slots, 512 tokens for bert-large, the whole bucket
for a decoder). The block-table kernel runs a fixed number of persistent programs over
the batch's real query blocks; its rows sweep the programs per SM
(`triton_attention.PROGRAMS_PER_SM`). Each call is replayed from a CUDA graph, as the
engine runs it; µs per call, bf16, and the largest difference from the eager grid kernel.
Reports only; CUDA only.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers these experiments share with the maintained scripts live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse

import numpy as np
import torch
from bench_attention import HEADS, graph_time_us

from trt_tei_runtime.layers import triton_attention as ta

SLOTS = 258  # a bulk graph's cu_seqlens entries (max_batch_size 256 + 2)
BATCHES = {
    "backfill 16k": list(np.random.default_rng(0).integers(64, 513, 56)),
    "backfill 4k": list(np.random.default_rng(1).integers(64, 513, 14)),
}
LONGEST_INPUT = {"bert-large": 512, "qwen3-0.6b": 32768, "qwen3-8b": 32768}


def measure(shape: str, lengths: list[int], programs_per_sm: list[int]) -> list[str]:
    hq, hkv, dim, causal = HEADS[shape]
    tokens = int(sum(lengths))
    bucket = -(-tokens // 1024) * 1024
    cu_host = np.array([0, *np.cumsum(lengths)] + [bucket] * (SLOTS - len(lengths) - 1), np.int32)
    table_host = np.zeros(ta.block_table_capacity(bucket, SLOTS), np.int32)
    ta.fill_block_table(cu_host[: len(lengths) + 1], table_host)
    cu_static = torch.from_numpy(cu_host).cuda()
    cu_eager = cu_static[: len(lengths) + 1].clone()
    table = torch.from_numpy(table_host).cuda()
    q = torch.randn(bucket, hq, dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(bucket, hkv, dim, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    options = {"causal": causal, "sliding_window": None, "scale": dim**-0.5}
    longest, static_longest = max(lengths), min(LONGEST_INPUT[shape], bucket)
    sm = torch.cuda.get_device_properties(0).multi_processor_count

    def eager() -> torch.Tensor:
        return ta.attention(q, k, v, cu_eager, longest, **options)

    def static_grid() -> torch.Tensor:
        return ta.attention(q, k, v, cu_static, static_longest, **options)

    reference = eager()[:tokens].float()
    rows = [("grid, eager (the batch's own)", eager), ("grid, static (a graph's)", static_grid)]
    for per_sm in programs_per_sm:

        def with_table(programs: int = per_sm * sm) -> torch.Tensor:
            return ta.attention(
                q, k, v, cu_static, static_longest, block_table=table, programs=programs, **options
            )

        rows.append((f"table, {per_sm} programs per SM", with_table))
    cells = []
    for label, fn in rows:
        error = (fn()[:tokens].float() - reference).abs().max().item()
        cells.append(f"| {shape} | {tokens} | {label} | {graph_time_us(fn):.1f} | {error:.1e} |")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default=",".join(HEADS))
    parser.add_argument("--programs-per-sm", default="1,2,4,8")
    args = parser.parse_args()
    per_sm = [int(n) for n in args.programs_per_sm.split(",")]
    torch.manual_seed(0)
    lines = []
    for shape in args.shapes.split(","):
        for lengths in BATCHES.values():
            lines += measure(shape, [int(n) for n in lengths], per_sm)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; µs per call, bf16")
    print("| shape | tokens | kernel | µs | max abs diff vs eager grid |")
    print("|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
