"""Does a query run faster when the next layer's weights are already in L2?

    python benchmarks/experiments/bench_query_prefetch.py \
        --shapes bert-large,qwen3-0.6b [--reps 300]

A 24-token query's graph is a chain of small kernels; its GEMMs each read a weight matrix
of a few MB from HBM at ≤ 1.5 TB/s (bench_skinny_gemm.py), well short of the bandwidth,
because each kernel is too short to have many loads in flight. One layer of bert-large or
qwen3-0.6b holds 25–31 MB of weights and an H100's L2 holds 50 MB. This captures the
query's graph (bucket of 32 tokens, pooling inside, as the lanes' graphs) with a second
branch that, as layer k starts, brings layer k + 1's weights into L2, so that layer k + 1's
GEMMs find them there; the branch joins the query after the last layer. Two ways:
- `P:last` / `P:normal`: P programs read the weights (with the `evict_last` L2 policy or
  the default one); they occupy SMs and read at their own pace;
- `bulk:T`: one thread per 64 KB issues Hopper's `cp.async.bulk.prefetch.L2` (the TMA unit
  fetches into L2 while no thread waits), T threads per program (each SM's TMA unit takes
  its own program's requests), for every weight of at least 1 MB.
Rows: the graph's GPU time back to back (CUDA events) and the host's clock for a replay
and a synchronize after a 20 ms busy-wait (the idle query), p50 / p99 ms, against the
same graph without the branch. Random weights in bf16. Reports only; CUDA.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers these experiments share with the maintained scripts live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from bench_engine import percentiles
from profile_idle_query import spin
from shapes import write_random_checkpoint

from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.runtime.executor import load_executor
from trt_tei_runtime.runtime.graphs import CudaGraphRunner

PAUSE_S = 0.020


@triton.jit
def _touch_kernel(ptr, n, out, BLOCK: tl.constexpr, EVICT_LAST: tl.constexpr):
    """Reads `n` int32 words so that they land in L2; stores nothing (the sum is kept only
    where it equals an impossible value, so the loads cannot be dropped)."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(pid * BLOCK, n, programs * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        if EVICT_LAST:
            words = tl.load(ptr + offsets, mask=offsets < n, other=0, eviction_policy="evict_last")
        else:
            words = tl.load(ptr + offsets, mask=offsets < n, other=0)
        acc ^= words
    total = tl.sum(acc, 0)
    tl.store(out + pid, total, mask=total == 0x7FFFFFFF)


@triton.jit
def l2_prefetch(address, size):
    """Asks the TMA unit to bring `size` bytes at each `address` into L2 (sm_90's
    `cp.async.bulk.prefetch.L2`, one request per element; sizes and addresses multiples of
    16 bytes, a size of 0 asks for nothing). Returns zeros: a caller keeps them alive (a
    store that never happens) so that the requests are not optimized away."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [address, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _bulk_prefetch_kernel(ptr, n_bytes, sink, CHUNK: tl.constexpr, CHUNKS: tl.constexpr):
    """Each thread asks for one CHUNK of bytes at `ptr` to be fetched into L2 (sm_90's
    `cp.async.bulk.prefetch.L2`); sizes and addresses are multiples of 16 bytes."""
    index = tl.program_id(0) * CHUNKS + tl.arange(0, CHUNKS)
    start = index.to(tl.int64) * CHUNK
    valid = start < n_bytes
    size = tl.where(valid, tl.minimum(n_bytes - start, CHUNK), 0).to(tl.int32)
    done = l2_prefetch(ptr + tl.where(valid, start, 0), size)
    tl.store(sink + index, done, mask=done != 0)


BULK_CHUNK = 64 << 10
BULK_MIN_BYTES = 1 << 20


def weight_bytes(module: torch.nn.Module) -> list[torch.Tensor]:
    """A module's weights of at least `BULK_MIN_BYTES`, 16-byte aligned, as flat uint8."""
    found = []
    for tensor in module.parameters():
        size = tensor.numel() * tensor.element_size()
        if tensor.is_cuda and size >= BULK_MIN_BYTES and size % 16 == 0:
            if tensor.is_contiguous() and tensor.data_ptr() % 16 == 0:
                found.append(tensor.detach().view(-1).view(torch.uint8))
    return found


def weight_words(module: torch.nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers of 4-byte multiples as flat int32 views."""
    words = []
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.is_cuda and tensor.numel() * tensor.element_size() % 4 == 0:
            words.append(tensor.detach().contiguous().view(-1).view(torch.int32))
    return words


class Prefetcher:
    """Forward pre-hooks that read layer k + 1's weights (layer 0's before the embeddings)
    on a side stream, and a forward hook on the last layer that joins it back."""

    def __init__(self, network: torch.nn.Module, mode: str, block: int = 2048) -> None:
        """`mode`: "bulk:T" (T threads per program), or "P:last" / "P:normal" (P programs
        reading the weights)."""
        self.layers: list[torch.nn.Module] = list(network.layers)  # type: ignore[arg-type]
        self.bulk = mode.startswith("bulk")
        if self.bulk:
            self.words = [weight_bytes(layer) for layer in self.layers]
            self.programs, self.evict_last = 1, False
            self.chunks = int(mode.split(":")[1])
        else:
            self.words = [weight_words(layer) for layer in self.layers]
            programs, policy = mode.split(":")
            self.programs, self.evict_last = int(programs), policy == "last"
        self.block = block
        self.side = torch.cuda.Stream()
        most = max(t.numel() for words in self.words for t in words)
        self.sink = torch.empty(
            max(self.programs, triton.cdiv(most, BULK_CHUNK)), dtype=torch.int32, device="cuda"
        )
        self.hooks = [network.register_forward_pre_hook(lambda m, a: self._read(0))]
        for k, layer in enumerate(self.layers):
            self.hooks.append(layer.register_forward_pre_hook(self._reader(k + 1)))
        self.hooks.append(self.layers[-1].register_forward_hook(lambda m, a, o: self._join()))

    def _reader(self, index: int) -> Callable[..., None]:
        return lambda module, args: self._read(index)

    def _read(self, index: int) -> None:
        if index >= len(self.layers):
            return
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            for words in self.words[index]:
                if self.bulk:
                    grid = (triton.cdiv(words.numel(), BULK_CHUNK * self.chunks),)
                    _bulk_prefetch_kernel[grid](
                        words,
                        words.numel(),
                        self.sink,
                        CHUNK=BULK_CHUNK,
                        CHUNKS=self.chunks,
                        num_warps=1,
                    )
                else:
                    _touch_kernel[(self.programs,)](
                        words,
                        words.numel(),
                        self.sink,
                        BLOCK=self.block,
                        EVICT_LAST=self.evict_last,
                    )

    def _join(self) -> None:
        torch.cuda.current_stream().wait_stream(self.side)

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()


def query_runner(executor: Any, prefetch: str | None) -> CudaGraphRunner:
    network = executor.model.network
    prefetcher = None if prefetch is None else Prefetcher(network, prefetch)
    runner = CudaGraphRunner(
        network,
        executor.device,
        max_num_tokens=32,
        max_batch_size=4,
        max_seqlen=32,
        buckets=[32],
        pooler=executor._graph_pooler(),
    )
    try:
        runner.capture()
    finally:
        if prefetcher is not None:
            prefetcher.remove()
    return runner


def time_runner(runner: CudaGraphRunner, batch: PackedBatch, reps: int) -> list[float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu, idle = [], []
    for i in range(reps + 10):
        start.record()
        runner.run(batch)
        end.record()
        end.synchronize()
        if i >= 10:
            gpu.append(start.elapsed_time(end) / 1e3)
    for i in range(reps + 10):
        spin(PAUSE_S)
        began = time.perf_counter()
        runner.run(batch)
        torch.cuda.synchronize()
        if i >= 10:
            idle.append(time.perf_counter() - began)
    return [*percentiles(gpu), *percentiles(idle)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="bert-large,qwen3-0.6b")
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument(
        "--variants",
        default="bulk:32,bulk:8",
        help="prefetch variants: bulk:THREADS, or PROGRAMS:last|normal (their loads' L2 policy)",
    )
    args = parser.parse_args()
    lines = [
        "| shape | graph | GPU time back to back p50 / p99 ms "
        "| after 20 ms idle, host p50 / p99 ms | max abs diff |",
        "|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            folder = write_random_checkpoint(shape, Path(tmp) / shape)
            executor = load_executor(
                folder,
                device="cuda",
                dtype="bfloat16",
                pooling="mean",
                interactive_lane=False,
                bulk_graphs=False,
            )
            vocab = int(executor.model.network.vocab_size)
            gen = torch.Generator().manual_seed(0)
            batch = PackedBatch.from_sequences(
                [torch.randint(1000, vocab - 1, (24,), generator=gen).tolist()]
            )
            variants: list[tuple[str, str | None]] = [("no prefetch", None)]
            for variant in args.variants.split(","):
                variants.append((f"prefetch: {variant}", variant))
            reference = None
            for label, prefetch in variants + variants[:1]:
                runner = query_runner(executor, prefetch)
                pooled = runner.run(batch).pooled
                assert pooled is not None
                pooled = pooled.float().clone()
                reference = pooled if reference is None else reference
                diff = float((pooled - reference).abs().max())
                g50, g99, i50, i99 = time_runner(runner, batch, args.reps)
                lines.append(
                    f"| {shape} | {label} | {g50:.3f} / {g99:.3f} "
                    f"| {i50:.3f} / {i99:.3f} | {diff:.1e} |"
                )
                print(lines[-1], flush=True)
                del runner
            del executor
            torch.cuda.empty_cache()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
