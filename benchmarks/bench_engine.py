"""Engine benchmark: docs/performance.md's backfill and query workloads, ours against the
`transformers` baseline in the same run. Prints a table last.

    python benchmarks/bench_engine.py --shapes bert-large --dtype bfloat16

Not a test: it reports; CI never times it. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from shapes import BF16_LIMIT_TOKENS_PER_S, write_random_checkpoint

from trt_tei_runtime.batch import PackedBatch, token_budget_batches
from trt_tei_runtime.layers import triton_attention
from trt_tei_runtime.layers.fp8 import quantize_linears
from trt_tei_runtime.runtime import Executor, load_model

H200_BF16_GEMM_TFLOPS = 795.0  # docs/performance.md's ceiling, which the limits assume


def bf16_gemm_ceiling_tflops() -> float:
    """This GPU's bf16 GEMM ceiling (8192³, median of 10), to scale the H200 limits."""
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in "ab")
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * 8192**3 / statistics.median(times) / 1e12


@contextlib.contextmanager
def flash_attention_2():  # type: ignore[no-untyped-def]
    """Run the engine with torch's FlashAttention 2 instead of our Triton attention, for an
    A/B in the same run (the graphs captured inside keep FlashAttention 2)."""
    available = triton_attention.available
    triton_attention.available = lambda q: False  # type: ignore[assignment]
    try:
        yield
    finally:
        triton_attention.available = available  # type: ignore[assignment]


def backfill_lengths(shape: str) -> list[int]:
    rng = np.random.default_rng(0)
    count = 512 if shape == "qwen3-8b" else 2048
    return rng.integers(64, 513, size=count).tolist()


def random_ids(lengths: list[int], vocab: int, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # Avoid special ids at the low end so no model treats them as padding.
    return [rng.integers(1000, vocab - 1, size=n).tolist() for n in lengths]


def timed(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def ours_backfill(
    model: Any, docs: list[list[int]], max_batch_tokens: int
) -> Callable[[], list[torch.Tensor]]:
    batches = token_budget_batches([len(d) for d in docs], max_batch_tokens)
    packed = [
        PackedBatch.from_sequences([docs[i] for i in b], position_offset=model.info.position_offset)
        for b in batches
    ]

    def run() -> list[torch.Tensor]:
        return [model.embed(b) for b in packed]

    return run


def hf_backfill(
    hf: Any, docs: list[list[int]], batch_size: int = 32
) -> Callable[[], list[torch.Tensor]]:
    """What sentence-transformers does: length-sorted batches of 32, padded, mean pooling."""
    order = sorted(range(len(docs)), key=lambda i: -len(docs[i]))
    batches = []
    for s in range(0, len(order), batch_size):
        seqs = [docs[i] for i in order[s : s + batch_size]]
        width = max(len(x) for x in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, x in enumerate(seqs):
            ids[r, : len(x)] = torch.tensor(x)
            mask[r, : len(x)] = 1
        batches.append((ids.cuda(), mask.cuda()))

    @torch.inference_mode()
    def run() -> list[torch.Tensor]:
        out = []
        for ids, mask in batches:
            hidden = hf(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask[..., None].to(hidden.dtype)
            out.append((hidden * m).sum(1) / m.sum(1))
        return out

    return run


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds of latencies in seconds."""
    ordered = sorted(latencies)
    return statistics.median(ordered) * 1e3, ordered[int(0.99 * (len(ordered) - 1))] * 1e3


def query_latencies(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    for _ in range(5):
        fn()
    return percentiles([timed(fn) for _ in range(reps)])


def bench_shape(  # type: ignore[no-untyped-def]
    shape: str, dtype: str, reps: int, max_batch_tokens: int, fp8: bool, args
) -> list[dict]:
    import transformers

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_random_checkpoint(shape, Path(tmp) / shape)
        # (label, CUDA graphs, FP8, FlashAttention 2 instead of ours)
        variants = [("graphs", True, False, False)]
        if args.fa2:
            variants.append(("graphs-fa2", True, False, True))
        if args.eager:
            variants.append(("eager", False, False, False))
        if fp8:
            variants.append(("fp8-graphs", True, True, False))
        reference_out = None
        for label, graphs, quantize, fa2 in variants:
            with flash_attention_2() if fa2 else contextlib.nullcontext():
                loaded = load_model(
                    folder,
                    device="cuda",
                    dtype=dtype,
                    pooling="mean",
                    max_num_tokens=max_batch_tokens,
                )
                if quantize:
                    quantize_linears(loaded.network)
                model = Executor(
                    loaded, cuda_graphs=graphs, max_num_tokens=max_batch_tokens, max_batch_size=256
                )
                vocab = loaded.network.vocab_size
                docs = random_ids(backfill_lengths(shape), vocab)
                tokens = sum(len(d) for d in docs)
                query = PackedBatch.from_sequences(
                    random_ids([24], vocab, seed=2), position_offset=model.info.position_offset
                )
                fill = ours_backfill(model, docs, max_batch_tokens)
                outputs = torch.cat(fill())
                ours_s = statistics.median(timed(fill) for _ in range(3))
                q50, q99 = query_latencies(partial(model.embed, query), reps)
                if reference_out is None:
                    reference_out = outputs
                cosine = torch.nn.functional.cosine_similarity(outputs, reference_out, dim=-1)
                rows.append(
                    dict(
                        shape=shape,
                        impl=f"ours-{label}-{dtype}",
                        tokens_per_s=tokens / ours_s,
                        p50_ms=q50,
                        p99_ms=q99,
                        min_cos_vs_bf16=float(cosine.min()),
                    )
                )
            del model, loaded, fill, outputs
            torch.cuda.empty_cache()

        hf_attention = "sdpa"
        try:
            hf = transformers.AutoModel.from_pretrained(
                folder, dtype=torch.float16, attn_implementation="sdpa"
            )
        except ValueError:  # MPNet, DeBERTa: transformers has no SDPA path for them
            hf_attention = "eager"
            hf = transformers.AutoModel.from_pretrained(
                folder, dtype=torch.float16, attn_implementation="eager"
            )
        hf = hf.cuda().eval()
        fill = hf_backfill(hf, docs)
        fill()
        hf_s = statistics.median(timed(fill) for _ in range(3))
        ids = torch.tensor(random_ids([24], vocab, seed=2), device="cuda")

        def hf_query(m: Any = hf) -> torch.Tensor:
            return m(input_ids=ids).last_hidden_state.mean(1)

        with torch.inference_mode():
            h50, h99 = query_latencies(hf_query, reps)
        rows.append(
            dict(
                shape=shape,
                impl=f"hf-fp16-{hf_attention}-b32",
                tokens_per_s=tokens / hf_s,
                p50_ms=h50,
                p99_ms=h99,
            )
        )
        del hf
        torch.cuda.empty_cache()
    base = rows[-1]["tokens_per_s"]
    for row in rows:
        row["x_baseline"] = row["tokens_per_s"] / base
        limit = BF16_LIMIT_TOKENS_PER_S.get(shape)
        # The H200 limit scaled by this GPU's measured GEMM ceiling (issue 5's rule).
        scaled = limit * args.ceiling / H200_BF16_GEMM_TFLOPS if limit else None
        row["frac_bf16_limit"] = row["tokens_per_s"] / scaled if scaled else None
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes",
        default="bert-large",
        help="comma-separated: minilm, bert-large, qwen3-0.6b, qwen3-8b",
    )
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--reps", type=int, default=100, help="query repetitions")
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--fp8", action="store_true", help="also run FP8 linears (Hopper)")
    parser.add_argument("--eager", action="store_true", help="also run without CUDA graphs")
    parser.add_argument(
        "--fa2", action="store_true", help="also run with FlashAttention 2 instead of ours"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_engine needs a CUDA GPU")
    # The GPU machine gets the tree without .git: the caller passes the commit then.
    commit = (
        os.environ.get("TRT_TEI_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    args.ceiling = bf16_gemm_ceiling_tflops()
    print(
        f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
        f"commit {commit or 'unknown'}  bf16 GEMM 8192³ {args.ceiling:.0f} TFLOP/s "
        f"(limits scaled from the H200's {H200_BF16_GEMM_TFLOPS:.0f})"
    )
    rows = [
        r
        for s in args.shapes.split(",")
        for r in bench_shape(
            s.strip(), args.dtype, args.reps, args.max_batch_tokens, args.fp8, args
        )
    ]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print(
        f"{'shape':<11} {'impl':<22} {'backfill tok/s':>15} {'x HF':>6} {'of limit':>9} "
        f"{'query p50 ms':>13} {'p99 ms':>8} {'min cos vs bf16':>16}"
    )
    for r in rows:
        frac = f"{r['frac_bf16_limit']:.0%}" if r["frac_bf16_limit"] else "-"
        print(
            f"{r['shape']:<11} {r['impl']:<22} {r['tokens_per_s']:>15,.0f} "
            f"{r['x_baseline']:>6.2f} {frac:>9} {r['p50_ms']:>13.2f} {r['p99_ms']:>8.2f} "
            f"{r.get('min_cos_vs_bf16', float('nan')):>16.5f}"
        )


if __name__ == "__main__":
    main()
