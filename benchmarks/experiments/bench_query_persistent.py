"""A query's chain of linears as one persistent kernel that streams weights across them.

    python benchmarks/experiments/bench_query_persistent.py --shape qwen3-8b --tokens 24

A qwen3-8b query's graph is 144 skinny GEMMs that each start from nothing when the one
before ends: cuBLAS streams their 13.9 GB at ~73 % of HBM's bandwidth, and neither another
cuBLASLt algorithm (`bench_lt_algos.py`) nor Triton kernels launched with PDL
(`bench_query_pdl.py`) did better. A weight does not depend on the activations, only the
product does; so one kernel that stays on every SM can ask for the next linear's weight
tile before the previous linear has finished, and wait only for the (small) activations.

The kernel here: one program per SM (or a few); the stack's linears cut into tiles of `BN`
output columns (a gated linear's tile is `BN/2` gate and `BN/2` up columns with SiLU(gate) *
up in its epilogue); every program takes tiles in the stack's order, loads its first weight
blocks, then waits (an acquire on the previous linear's counter of finished tiles) and reads
its activations past L1; after its stores, a release adds one to its linear's counter.
Programs take tiles in order and all are resident (a variant whose programs cannot all fit
is refused before launch), so a wait always ends.

The chain is each layer's QKV, output projection (on the first columns of QKV), gate/up
with the gated SiLU (a BERT shape: the up projection, no activation) and down projection,
every layer its own weights; no norms, attention or residual (the same in both variants).
Variants: `cublas` / `cublaslt` (torch.mm and the engine's Triton gated activation, one
CUDA graph); `persistent:BN/BK/STAGES[/PER_SM]` (one weight block asked for before the
wait; PER_SM programs on each SM), `persistent2:...` (two blocks), `persistent-noprefetch:...`
(none), `persistent-nowait:...` (no waits at all: a wrong result, the tiles' streaming
alone). Flags after the name: `+loads` polls the counter with plain loads instead of
atomics, `+l2` asks the TMA unit for the first 4 KB of each of the tile's weight rows into
L2 before the wait (`+l2full`: whole rows), `+splitN` splits the plain linears with fewer
than 256 column tiles N ways along K (the parts added into float32 activations, which the
host zeroes before each run). Prints µs per stack (weights TB/s) and the largest
difference from `cublas`'s output. CUDA only; reports only.

`TRITON_INTERPRET=1 python benchmarks/experiments/bench_query_persistent.py --interpret-check`
checks the kernel's arithmetic on a CPU; `--trace VARIANT` reads the GPU's global timer in every
tile of one run of a variant and prints where each kind of linear spends its time.

What it found (docs/journal/results-log.md, sixteenth session): without waits the tiles stream
10 % faster than cuBLAS on an H100 and 10 % slower on an H200; in order they lose more,
because each tile starts its pipeline from empty and 128-192 narrow tiles in flight do not
keep HBM busy.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from bench_query_pdl import SHAPES, Shape
from bench_query_prefetch import l2_prefetch
from query_graphs import replay_us

from trt_tei_runtime.kernels import triton_kernels
from trt_tei_runtime.runtime.blas import preferred_blas

META_FIELDS = tl.constexpr(10)  # int64s per linear in the table: see `Chain.persistent`


@triton.jit
def _chain_kernel(
    w_ptr,
    act_ptr,
    meta_ptr,
    tile_linear_ptr,
    tile_index_ptr,
    done_ptr,
    M,
    total_tiles,
    programs,
    tiles_per_program,
    BM: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    PREFETCH: tl.constexpr,
    WAIT: tl.constexpr,
    POLL_LOADS: tl.constexpr,
    L2_BYTES: tl.constexpr,
    TRACE: tl.constexpr,
    trace_ptr,
):
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    rh = tl.arange(0, BH)
    x_mask = rm[:, None] < M
    ready = tl.program_id(0) * 0 - 1  # the last linear seen complete by this program
    # Tile t goes to program t % programs; a program's tiles in the stack's order.
    for i in range(0, tiles_per_program):
        t = tl.program_id(0) + i * programs
        if t < total_tiles:
            if TRACE:
                tl.store(trace_ptr + 3 * t, _now())
            lin = tl.load(tile_linear_ptr + t)
            j = tl.load(tile_index_ptr + t).to(tl.int64)
            meta = meta_ptr + lin * META_FIELDS
            # Every offset and size is a multiple of 16 elements (the host checks): without
            # the hints the loads are 2 bytes wide and Triton does not pipeline them.
            w_off = tl.multiple_of(tl.load(meta + 0), 16)
            K = tl.multiple_of(tl.load(meta + 1), 16)
            x_off = tl.multiple_of(tl.load(meta + 2), 16)
            x_ld = tl.multiple_of(tl.load(meta + 3), 16)
            y_off = tl.multiple_of(tl.load(meta + 4), 16)
            y_ld = tl.multiple_of(tl.load(meta + 5), 16)
            up_rows = tl.load(meta + 6)  # 0: a plain linear; else where the up half's rows begin
            wait_for = tl.load(meta + 7)  # tiles of the linear before
            # A linear split along K has `split` tiles per column block; they add their
            # parts into a float32 output that the host zeroed.
            split = tl.load(meta + 9)
            part = j % split
            j = j // split
            k_len = tl.multiple_of(K // split, 16)
            k_lo = tl.multiple_of(part * k_len, 16)
            first_row = tl.load(meta + 8) * j  # this tile's first row of the first half
            second_row = first_row + BH
            if up_rows > 0:
                second_row = up_rows + first_row
            w0_ptrs = w_ptr + w_off + (first_row + rh)[None, :] * K + (k_lo + rk)[:, None]
            w1_ptrs = w_ptr + w_off + (second_row + rh)[None, :] * K + (k_lo + rk)[:, None]
            x_ptrs = act_ptr + x_off + rm[:, None] * x_ld + (k_lo + rk)[None, :]
            w_type = w_ptr.dtype.element_ty
            acc0 = tl.zeros((BM, BH), dtype=tl.float32)
            acc1 = tl.zeros((BM, BH), dtype=tl.float32)
            if L2_BYTES > 0:
                # The tile's rows (their first L2_BYTES) asked into L2 by the TMA unit before
                # the wait, so that HBM keeps streaming while the program waits.
                r = tl.arange(0, 2 * BH)
                rows = tl.where(r < BH, first_row + r, second_row + r - BH)
                sizes = tl.minimum(K * 2, L2_BYTES).to(tl.int32) + r * 0
                asked = l2_prefetch(w_ptr + w_off + rows * K, sizes)
                tl.store(done_ptr + lin + r * 0, asked, mask=asked != 0)  # keeps the requests
            # The first PREFETCH weight blocks are asked for before the wait: a load's
            # registers are waited for only where they are first used.
            if PREFETCH >= 1:
                a0 = tl.load(w0_ptrs)
                a1 = tl.load(w1_ptrs)
            if PREFETCH >= 2:
                b0 = tl.load(w0_ptrs + BK)
                b1 = tl.load(w1_ptrs + BK)
            if WAIT and lin - 1 > ready:  # this program's first tile of this linear
                if POLL_LOADS:
                    # Plain loads poll the counter side by side in L2, where atomics queue
                    # behind each other; one acquire then orders the reads that follow.
                    while tl.load(done_ptr + lin - 1, volatile=True) < wait_for:
                        pass
                    tl.atomic_add(done_ptr + lin - 1, 0, sem="acquire")
                else:
                    while tl.atomic_add(done_ptr + lin - 1, 0, sem="acquire") < wait_for:
                        pass
                ready = lin - 1
            if TRACE:
                tl.store(trace_ptr + 3 * t + 1, _now())
            if PREFETCH >= 1:
                x = tl.load(x_ptrs, mask=x_mask, other=0.0, cache_modifier=".cg").to(w_type)
                acc0 += tl.dot(x, a0)
                acc1 += tl.dot(x, a1)
            if PREFETCH >= 2:
                x = tl.load(x_ptrs + BK, mask=x_mask, other=0.0, cache_modifier=".cg").to(w_type)
                acc0 += tl.dot(x, b0)
                acc1 += tl.dot(x, b1)
            for k in range(PREFETCH * BK, k_len, BK):
                x = tl.load(x_ptrs + k, mask=x_mask, other=0.0, cache_modifier=".cg").to(w_type)
                acc0 += tl.dot(x, tl.load(w0_ptrs + k))
                acc1 += tl.dot(x, tl.load(w1_ptrs + k))
            y_ptrs = act_ptr + y_off + rm[:, None] * y_ld + rh[None, :]
            if up_rows > 0:
                gated = acc0 * tl.sigmoid(acc0) * acc1
                tl.store(y_ptrs + j * BH, gated.to(act_ptr.dtype.element_ty), mask=x_mask)
            elif split > 1:
                tl.atomic_add(y_ptrs + first_row, acc0, mask=x_mask, sem="relaxed")
                tl.atomic_add(y_ptrs + second_row, acc1, mask=x_mask, sem="relaxed")
            else:
                tl.store(y_ptrs + first_row, acc0.to(act_ptr.dtype.element_ty), mask=x_mask)
                tl.store(y_ptrs + second_row, acc1.to(act_ptr.dtype.element_ty), mask=x_mask)
            tl.debug_barrier()
            tl.atomic_add(done_ptr + lin, 1, sem="release")
            if TRACE:
                tl.store(trace_ptr + 3 * t + 2, _now())


@triton.jit
def _now():  # type: ignore[no-untyped-def]
    """The GPU's global timer, ns."""
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@dataclass
class Linear:
    n: int  # output rows of the weight (both halves of a gated linear)
    k: int
    gated: bool
    w_off: int = 0
    x_off: int = 0
    x_ld: int = 0
    y_off: int = 0
    y_ld: int = 0


class Chain:
    """The stack's weights in one buffer, its activations in another, and the tables the
    persistent kernel reads."""

    def __init__(
        self,
        shape: Shape,
        tokens: int,
        bm: int,
        device: str = "cuda",
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.device = device
        h, i, a = shape.hidden, shape.intermediate, shape.attn
        self.tokens, self.bm = tokens, bm
        self.linears: list[Linear] = []
        w_off = 0
        x_off, x_ld = 0, h  # the stack's input: the activation buffer's first rows
        act_off = bm * h
        layer = (  # (output rows, input columns, gated) of QKV, O, gate/up, down
            (shape.qkv, h, False),
            (h, a, False),
            (2 * i if shape.decoder else i, h, shape.decoder),
            (h, i, False),
        )
        for _ in range(shape.layers):
            for n, k, gated in layer:
                out_cols = n // 2 if gated else n
                lin = Linear(n, k, gated, w_off, x_off, x_ld, act_off, out_cols)
                self.linears.append(lin)
                w_off += n * k
                # Each linear reads the one before's output (O reads QKV's first `a` columns).
                x_off, x_ld = act_off, out_cols
                act_off += bm * out_cols
        self.weights = torch.empty(w_off, device=device, dtype=dtype)
        for lin in self.linears:
            self.weight(lin).normal_(0.0, lin.k**-0.5)
        self.act = torch.zeros(act_off, device=device, dtype=dtype)
        # Linears split along K add into float32 outputs; the other variants use `act`.
        self.act32 = torch.zeros(act_off, device=device, dtype=torch.float32)
        self.last_act = self.act
        self.trace = torch.zeros(0, dtype=torch.int64, device=device)  # see `persistent`
        self.x0 = torch.randn(tokens, h, device=device, dtype=dtype)
        self.weight_bytes = w_off * self.weights.element_size()

    def weight(self, lin: Linear) -> torch.Tensor:
        return self.weights[lin.w_off : lin.w_off + lin.n * lin.k].view(lin.n, lin.k)

    def rows(
        self, offset: int, cols: int, ld: int, act: torch.Tensor | None = None
    ) -> torch.Tensor:
        act = self.act if act is None else act
        return act[offset : offset + self.tokens * ld].view(self.tokens, ld)[:, :cols]

    def output(self) -> torch.Tensor:
        """The last run's output (torch's or the persistent kernel's)."""
        last = self.linears[-1]
        return self.rows(last.y_off, last.y_ld, last.y_ld, self.last_act)

    def splits(self, bn: int, split: int) -> list[int]:
        """Ways each linear is split along K: `split` for the plain linears with fewer
        than 256 column tiles, 1 for the rest (a gated linear needs its whole sums)."""
        return [
            1 if lin.gated or lin.n // bn >= 256 else split for lin in self.linears
        ]  # fmt: skip

    def torch_run(self) -> None:
        self.last_act = self.act
        self.rows(0, self.x0.shape[1], self.x0.shape[1]).copy_(self.x0)
        for lin in self.linears:
            x = self.rows(lin.x_off, lin.k, lin.x_ld)
            y = self.rows(lin.y_off, lin.y_ld, lin.y_ld)
            if lin.gated:
                y.copy_(triton_kernels.gated_activation(x @ self.weight(lin).t(), "silu"))
            else:
                torch.mm(x, self.weight(lin).t(), out=y)

    def persistent(
        self,
        bn: int,
        bk: int,
        stages: int,
        prefetch: int,
        programs: int,
        wait: bool = True,
        poll_loads: bool = False,
        l2_bytes: int = 0,
        trace: bool = False,
        split: int = 1,
    ) -> Callable[[], None]:
        """The kernel's run for these settings; with `trace`, each run leaves three
        global-timer readings per tile in `self.trace` (see `trace_report`)."""
        bh = bn // 2
        tile_linear, tile_index, meta = [], [], []
        splits = self.splits(bn, split)
        act = self.act32 if split > 1 else self.act
        for index, (lin, ways) in enumerate(zip(self.linears, splits, strict=True)):
            if (lin.k // ways) % bk or (lin.n // 2 if lin.gated else lin.n) % bh:
                raise ValueError(f"BK={bk} / BN={bn} / split {ways} do not fit linear {index}")
            if any(v % 16 for v in (lin.w_off, lin.k, lin.x_off, lin.x_ld, lin.y_off, lin.y_ld)):
                raise ValueError(f"linear {index}: an offset is not a multiple of 16 elements")
            tiles = (lin.n // 2) // bh if lin.gated else lin.n // bn * ways
            before = len(tile_index) and tile_index[-1] + 1
            meta += [
                lin.w_off, lin.k, lin.x_off, lin.x_ld, lin.y_off, lin.y_ld,
                lin.n // 2 if lin.gated else 0, before if index else 0,
                bh if lin.gated else bn, ways,
            ]  # fmt: skip
            tile_linear += [index] * tiles
            tile_index += list(range(tiles))
        self.tile_linear = tile_linear
        meta_t = torch.tensor(meta, dtype=torch.int64, device=self.device)
        linear_t = torch.tensor(tile_linear, dtype=torch.int32, device=self.device)
        index_t = torch.tensor(tile_index, dtype=torch.int32, device=self.device)
        done = torch.zeros(len(self.linears), dtype=torch.int32, device=self.device)
        if trace:
            self.trace = torch.zeros(3 * len(tile_index), dtype=torch.int64, device=self.device)

        args = (
            self.weights, act, meta_t, linear_t, index_t, done,
            self.tokens, len(tile_index), programs, -(-len(tile_index) // programs),
        )  # fmt: skip
        options = dict(
            BM=self.bm, BH=bh, BK=bk, PREFETCH=prefetch, WAIT=wait, POLL_LOADS=poll_loads,
            L2_BYTES=l2_bytes, TRACE=trace,
            trace_ptr=self.trace if trace else done, num_warps=4, num_stages=stages,
        )  # fmt: skip
        if self.device == "cuda":
            check_resident(_chain_kernel.warmup(*args, grid=(programs,), **options), programs)

        def run() -> None:
            self.last_act = act
            if split > 1:
                act.zero_()  # the split linears add into their outputs
            self.rows(0, self.x0.shape[1], self.x0.shape[1], act).copy_(self.x0)
            done.zero_()
            _chain_kernel[(programs,)](*args, **options)

        return run


def check_resident(kernel: Any, programs: int) -> None:
    """Refuses a launch whose programs cannot all be on the GPU at once: a program waiting
    for a tile that no SM has room to run would wait forever."""
    kernel._init_handles()  # loads the binary, which reads its register count
    props = torch.cuda.get_device_properties(0)
    per_sm = -(-programs // props.multi_processor_count)
    shared, registers = kernel.metadata.shared, kernel.n_regs * 32 * kernel.metadata.num_warps
    if (
        per_sm * shared > props.shared_memory_per_multiprocessor
        or per_sm * registers > props.regs_per_multiprocessor
    ):
        raise ValueError(
            f"{per_sm} programs of {shared} B shared memory and {registers} registers do not "
            "fit one SM together"
        )


def interpret_check() -> None:
    """The kernel's result in Triton's interpreter on the CPU, one program taking every tile
    (so no wait can hang), a two-layer toy stack in float16 (the interpreter's bfloat16 dot
    is wrong), against float32 arithmetic, for 0, 1 and 2 blocks asked for before the wait."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--interpret-check: run with TRITON_INTERPRET=1")
    import inspect

    import triton.runtime.interpreter as interpreter

    # The interpreter reads a loop bound with int() of a one-element array, which numpy 2
    # refuses; read its element instead.
    source = inspect.getsource(interpreter._patch_lang_tensor).replace(
        "int(self.handle.data)", "int(self.handle.data.reshape(-1)[0])"
    )
    exec(compile(source, interpreter.__file__, "exec"), interpreter.__dict__)
    torch.manual_seed(0)
    chain = Chain(Shape(2, 64, 96, 64, 128, True), 5, bm=16, device="cpu", dtype=torch.float16)
    x = chain.x0.float()
    for lin in chain.linears:
        y = x[:, : lin.k] @ chain.weight(lin).float().t()
        if lin.gated:
            y = F.silu(y[:, : lin.n // 2]) * y[:, lin.n // 2 :]
        x = y.half().float()  # each linear's output is stored in float16
    for prefetch, split in ((0, 1), (1, 1), (2, 1), (1, 2)):
        chain.act.zero_()
        chain.persistent(32, 32, 2, prefetch, programs=1, split=split)()
        error = (chain.output().float() - x).abs().max().item()
        print(f"{prefetch} blocks before the wait, split {split}: max abs error {error:.3g} "
              f"(output max {x.abs().max().item():.3g})")  # fmt: skip
        if error > 1e-2:
            raise SystemExit("the persistent kernel's result is wrong")


def persistent_variant(chain: Chain, variant: str, trace: bool = False) -> Callable[[], None]:
    """The persistent kernel's run for a variant `name[+flag...]:BN/BK/STAGES[/PER_SM]`."""
    name, _, config = variant.partition(":")
    bn, bk, stages, *per_sm = (int(c) for c in config.split("/"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = sms * (per_sm[0] if per_sm else 1)
    kind, *flags = name.split("+")
    prefetch = {"persistent-noprefetch": 0, "persistent": 1, "persistent2": 2}.get(kind, 1)
    wait = kind != "persistent-nowait"
    l2 = {"l2": 4096, "l2full": 1 << 20}
    l2_bytes = max([l2[f] for f in flags if f in l2], default=0)
    split = max([int(f[5:]) for f in flags if f.startswith("split")], default=1)
    return chain.persistent(
        bn, bk, stages, prefetch, programs, wait, "loads" in flags, l2_bytes, trace, split
    )


def trace_report(chain: Chain, variant: str) -> None:
    """Where one run of `variant` spends each linear, from every tile's global-timer
    readings (its start, the end of its wait, the end of its release): per kind of linear,
    medians over the layers, µs."""
    run = persistent_variant(chain, variant, trace=True)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    times = chain.trace.view(-1, 3).cpu().numpy().astype(np.float64) / 1e3
    linear_of = np.array(chain.tile_linear)
    kinds = ("qkv", "o", "up", "down")
    rows: dict[str, list[tuple[float, ...]]] = {kind: [] for kind in kinds}
    previous_end = times[:, 0].min()
    for index in range(len(chain.linears)):
        start, woke, end = times[linear_of == index].T
        rows[kinds[index % 4]].append(
            (
                end.max() - previous_end,  # the linear's span, end to end
                woke.min() - previous_end,  # the first wait's end after the last tile before
                float(np.median(woke)) - previous_end,
                float(np.median(end - woke)),  # a tile after its wait
                end.max() - float(np.median(end)),  # the last tile's lag
            )
        )
        previous_end = end.max()
    total = times[:, 2].max() - times[:, 0].min()
    print(f"\ntrace of {variant}: {total:.1f} µs from the first tile's start to the last's end")
    print("| linear | span | first wait ends | median wait ends | a tile after its wait | "
          "last tile's lag |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for kind, values in rows.items():
        medians = np.median(np.array(values), axis=0)
        print(f"| {kind} | " + " | ".join(f"{v:.1f}" for v in medians) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--layers", type=int, default=0, help="fewer layers (0: the shape's)")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--trace", default="", help="a persistent variant to trace after timing")
    parser.add_argument(
        "--interpret-check",
        action="store_true",
        help="check the kernel's result on the CPU instead (run with TRITON_INTERPRET=1)",
    )
    parser.add_argument(
        "--variants",
        default="cublas,cublaslt,persistent:32/256/4,persistent:32/512/3,"
        "persistent:64/256/4,persistent-noprefetch:32/256/4",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.interpret_check:
        interpret_check()
        return
    shape = SHAPES[args.shape]
    if args.layers:
        shape = dataclasses.replace(shape, layers=args.layers)
    chain = Chain(shape, args.tokens, bm=max(16, triton.next_power_of_2(args.tokens)))
    chain.torch_run()
    reference = chain.output().float().clone()
    scale = reference.abs().max().item()
    rows = []
    for variant in args.variants.split(","):
        name, _, config = variant.partition(":")
        if name in ("cublas", "cublaslt"):
            with preferred_blas("cublaslt" if name == "cublaslt" else None):
                us = replay_us(chain.torch_run, args.reps)
                chain.torch_run()
        else:
            try:
                run = persistent_variant(chain, variant)
            except ValueError as refused:
                print(f"{variant}: skipped ({refused})", flush=True)
                continue
            run()
            torch.cuda.synchronize()
            print(f"{variant}: first run done", flush=True)
            us = replay_us(run, args.reps)
            run()
        torch.cuda.synchronize()
        diff = (chain.output().float() - reference).abs().max().item()
        rows.append((variant, us, chain.weight_bytes / us / 1e6, diff))
        print(f"{variant}: {us:.1f} µs, max abs diff {diff:.3g} (output max {scale:.3g})",
              flush=True)  # fmt: skip
    print(
        f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.shape} "
        f"({len(chain.linears)} linears, {chain.weight_bytes / 1e9:.1f} GB), {args.tokens} tokens"
    )
    print("| variant | µs per stack | weights TB/s | max abs diff from cublas |")
    print("|---|---|---|---|")
    for variant, us, tbs, diff in rows:
        print(f"| {variant} | {us:.1f} | {tbs:.2f} | {diff:.3g} |")
    if args.trace:
        trace_report(chain, args.trace)


if __name__ == "__main__":
    main()
