"""Is there a faster cuBLASLt algorithm for a query's skinny GEMMs than the one torch runs?

    python benchmarks/experiments/bench_lt_algos.py --shape qwen3-8b --tokens 24

A qwen3-8b query's graph is ~4.4 ms on an H200, almost all of it 144 skinny GEMMs that
stream 13.9 GB of weights at ~65-73 % of HBM's bandwidth. torch asks cuBLASLt's heuristic
for one algorithm per GEMM and runs it; torch's TunableOp cannot look further on CUDA (it
registers only that default op). This asks the heuristic for every algorithm it offers
for each of the stack's GEMM shapes, tries each also split along K in 2, 4 and 8, and times
all of them through cuBLASLt directly (ctypes), as a CUDA graph of the stack's GEMMs of
that shape (every layer its own weights, so each GEMM reads its weights from HBM).

Prints, per GEMM shape: torch's F.linear (its default library, and cuBLASLt preferred, as
the interactive lane's graphs are captured), the heuristic's first choice, and the fastest
algorithm found, in µs per GEMM and weight TB/s; then the stack's sum for each. CUDA only;
reports only.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import sys

import torch
import torch.nn.functional as F
from bench_query_pdl import SHAPES
from query_graphs import replay_us

from trt_tei_runtime.runtime.blas import preferred_blas

CUDA_R_32F, CUDA_R_16BF, CUBLAS_COMPUTE_32F = 0, 14, 68
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE_BYTES = 1
CONFIG_SPLITK_NUM = 2
WORKSPACE_BYTES = 32 << 20


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    _fields_ = [
        ("algo", Algo),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def load_cublaslt() -> ctypes.CDLL:
    for folder in sys.path:
        for path in glob.glob(os.path.join(folder, "nvidia", "*", "lib", "libcublasLt.so.*")):
            return ctypes.CDLL(path)
    return ctypes.CDLL("libcublasLt.so")


class Lt:
    """The few cuBLASLt calls a bf16 `y = x @ w.T` needs (row-major torch tensors)."""

    def __init__(self) -> None:
        self.lib = load_cublaslt()
        self.handle = ctypes.c_void_p()
        self.check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    @staticmethod
    def check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what}: cuBLAS status {status}")

    def layout(self, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        self.check(
            self.lib.cublasLtMatrixLayoutCreate(
                ctypes.byref(out),
                CUDA_R_16BF,
                ctypes.c_uint64(rows),
                ctypes.c_uint64(cols),
                ctypes.c_int64(ld),
            ),
            "cublasLtMatrixLayoutCreate",
        )
        return out

    def problem(self, m: int, n: int, k: int) -> tuple[ctypes.c_void_p, ...]:
        """Descriptors for y[m,n] = x[m,k] @ w[n,k].T, i.e. column-major y.T = w @ x.T."""
        desc = ctypes.c_void_p()
        self.check(
            self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), CUBLAS_COMPUTE_32F, CUDA_R_32F),
            "cublasLtMatmulDescCreate",
        )
        for attribute, value in ((DESC_TRANSA, CUBLAS_OP_T), (DESC_TRANSB, CUBLAS_OP_N)):
            op = ctypes.c_int32(value)
            self.check(
                self.lib.cublasLtMatmulDescSetAttribute(
                    desc, attribute, ctypes.byref(op), ctypes.c_size_t(4)
                ),
                "cublasLtMatmulDescSetAttribute",
            )
        a, b, d = self.layout(k, n, k), self.layout(k, m, k), self.layout(n, m, n)
        return desc, a, b, d

    def algorithms(self, problem: tuple[ctypes.c_void_p, ...], count: int) -> list[Algo]:
        desc, a, b, d = problem
        preference = ctypes.c_void_p()
        self.check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), "pref")
        size = ctypes.c_uint64(WORKSPACE_BYTES)
        self.check(
            self.lib.cublasLtMatmulPreferenceSetAttribute(
                preference, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size), ctypes.c_size_t(8)
            ),
            "pref workspace",
        )
        results = (HeuristicResult * count)()
        returned = ctypes.c_int()
        self.check(
            self.lib.cublasLtMatmulAlgoGetHeuristic(
                self.handle, desc, a, b, d, d, preference, count, results, ctypes.byref(returned)
            ),
            "cublasLtMatmulAlgoGetHeuristic",
        )
        return [results[i].algo for i in range(returned.value) if results[i].state == 0]

    def split(self, problem: tuple[ctypes.c_void_p, ...], algo: Algo, splits: int) -> Algo | None:
        """`algo` split `splits` ways along K, if cuBLASLt accepts it for this problem."""
        copy = Algo()
        ctypes.memmove(ctypes.byref(copy), ctypes.byref(algo), ctypes.sizeof(Algo))
        value = ctypes.c_uint32(splits)
        if self.lib.cublasLtMatmulAlgoConfigSetAttribute(
            ctypes.byref(copy), CONFIG_SPLITK_NUM, ctypes.byref(value), ctypes.c_size_t(4)
        ):
            return None
        desc, a, b, d = problem
        result = HeuristicResult()
        status = self.lib.cublasLtMatmulAlgoCheck(
            self.handle, desc, a, b, d, d, ctypes.byref(copy), ctypes.byref(result)
        )
        ok = status == 0 and result.workspaceSize <= WORKSPACE_BYTES
        return copy if ok else None

    def matmul(
        self,
        problem: tuple[ctypes.c_void_p, ...],
        algo: Algo,
        x: torch.Tensor,
        w: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        desc, a, b, d = problem
        self.check(
            self.lib.cublasLtMatmul(
                self.handle,
                desc,
                ctypes.byref(self.alpha),
                ctypes.c_void_p(w.data_ptr()),
                a,
                ctypes.c_void_p(x.data_ptr()),
                b,
                ctypes.byref(self.beta),
                ctypes.c_void_p(out.data_ptr()),
                d,
                ctypes.c_void_p(out.data_ptr()),
                d,
                ctypes.byref(algo),
                ctypes.c_void_p(self.workspace.data_ptr()),
                ctypes.c_size_t(WORKSPACE_BYTES),
                ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
            ),
            "cublasLtMatmul",
        )


def time_gemm(lt: Lt, m: int, n: int, k: int, layers: int, args: argparse.Namespace) -> dict:
    """µs per GEMM of `m` rows against `layers` weights of [n, k], per variant; and the
    fastest cuBLASLt candidate's label under "best (which)"."""
    weights = [
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(layers)
    ]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    reference = F.linear(x, weights[0])

    def torch_run() -> None:
        for w in weights:
            torch.mm(x, w.t(), out=out)

    timed: dict = {"torch": replay_us(torch_run, args.reps, warmup=3) / layers}
    with preferred_blas("cublaslt"):
        timed["torch, cuBLASLt"] = replay_us(torch_run, args.reps, warmup=3) / layers
    problem = lt.problem(m, n, k)
    candidates: list[tuple[str, Algo]] = []
    for index, algo in enumerate(lt.algorithms(problem, args.algorithms)):
        candidates.append((f"#{index}", algo))
        for splits in (2, 4, 8):
            split = lt.split(problem, algo, splits)
            if split is not None:
                candidates.append((f"#{index}/split {splits}", split))
    results: dict[str, float] = {}
    for label, algo in candidates:
        lt.matmul(problem, algo, x, weights[0], out)
        torch.cuda.synchronize()
        error = (out.float() - reference.float()).abs().max().item()
        if error > 0.05:
            print(f"  {label}: wrong result (max abs error {error:.3g}), skipped")
            continue

        def lt_run(algo: Algo = algo) -> None:
            for w in weights:
                lt.matmul(problem, algo, x, w, out)

        results[label] = replay_us(lt_run, args.reps, warmup=3) / layers
    fastest = sorted(results.items(), key=lambda r: r[1])
    print(
        f"{n} x {k}: {len(candidates)} candidates; fastest "
        + ", ".join(f"{label} {us:.1f}" for label, us in fastest[:6]),
        flush=True,
    )
    timed["heuristic's first"] = results.get("#0", float("nan"))
    timed["best"] = fastest[0][1]
    timed["which"] = fastest[0][0]
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--algorithms", type=int, default=64, help="asked of the heuristic")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = SHAPES[args.shape]
    h, i = shape.hidden, shape.intermediate
    gemm_shapes = {  # name: (N, K)
        "qkv": (shape.qkv, h),
        "o": (h, shape.attn),
        "up": (2 * i if shape.decoder else i, h),
        "down": (h, i),
    }
    lt = Lt()
    variants = ("torch", "torch, cuBLASLt", "heuristic's first", "best")
    totals = dict.fromkeys(variants, 0.0)
    rows = []
    for name, (n, k) in gemm_shapes.items():
        timed = time_gemm(lt, args.tokens, n, k, shape.layers, args)
        for variant in variants:
            totals[variant] += timed[variant] * shape.layers
        rows.append((name, n, k, n * k * 2 / 1e6, timed))
        torch.cuda.empty_cache()

    print(
        f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.shape}, "
        f"{args.tokens} tokens, µs per GEMM (weights TB/s)"
    )
    print("| GEMM | N × K | torch | torch, cuBLASLt | heuristic's first | best (which) |")
    print("|---|---|---|---|---|---|")
    for name, n, k, mb, timed in rows:
        cells = [f"{timed[v]:.1f} ({mb / timed[v]:.2f})" for v in variants]
        print(f"| {name} | {n} × {k} | {' | '.join(cells[:3])} | {cells[3]} ({timed['which']}) |")
    sums = " | ".join(f"{totals[v] / 1e3:.3f}" for v in variants)
    print(f"| the stack's GEMMs, ms | | {sums} |")


if __name__ == "__main__":
    main()
