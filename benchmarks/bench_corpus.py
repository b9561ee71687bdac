"""Corpus throughput: the engine alone against what a user gets from texts.

For each shape (random weights, all-MiniLM-L6-v2's tokenizer), on a deterministic corpus of
varied English text (`corpus_text.py`, seed 0, 64–512 tokens):

- engine: the texts tokenized beforehand, packed into 16k-token batches and run through the
  executor's bulk lane back to back (what `bench_engine.py` measures);
- Model.embed: `Model.embed(texts)` from strings to normalized host vectors, tokenization
  included (docs/performance.md's target: ≥ 95 % of the engine);
- trt-tei-embed: the corpus job on a Parquet file of the same texts repeated
  `--job-repeat` times (a job's steady state, not its start), its own tokens/s
  (`--devices` and `--device-workers` as given), when this build has it.

Works with builds before and after the runtime split (it finds the executor either way),
so `ab_wheels.sh`-style old/new comparisons run the same file.

    python3 benchmarks/bench_corpus.py --shapes bert-large,qwen3-0.6b --tokenizer-from DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from corpus_text import corpus
from shapes import with_tokenizer, write_random_checkpoint

from trt_tei_runtime import Model
from trt_tei_runtime.batch import PackedBatch, token_budget_batches

BATCH_TOKENS = 16384


def engine_of(model: Model):  # type: ignore[no-untyped-def]
    """The object that runs packed batches: the executor, or the older InferenceModel."""
    executors = getattr(model, "executors", None)
    return executors[0] if executors else model._model  # type: ignore[attr-defined]


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def engine_tokens_per_s(model: Model, texts: list[str], reps: int) -> tuple[float, int]:
    ids = [e.ids for e in model.tokenizer.encode(texts, truncate=True)]
    offset = model.info.position_offset
    batches = [
        PackedBatch.from_sequences([ids[i] for i in group], position_offset=offset)
        for group in token_budget_batches([len(s) for s in ids], BATCH_TOKENS)
    ]
    engine = engine_of(model)
    tokens = sum(len(s) for s in ids)

    def run() -> None:
        for batch in batches:
            engine.embed(batch)

    run()
    return tokens / statistics.median(timed(run) for _ in range(reps)), tokens


def model_tokens_per_s(model: Model, texts: list[str], tokens: int, reps: int) -> float:
    model.embed(texts[:256])
    return tokens / statistics.median(timed(lambda: model.embed(texts)) for _ in range(reps))


def job_tokens_per_s(
    folder: Path,
    texts: list[str],
    work: Path,
    devices: str,
    repeat: int,
    device_workers: str | None = None,
) -> float | None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        import trt_tei_runtime.corpus.cli  # noqa: F401
    except ImportError:
        return None
    source = work / "corpus.parquet"
    rows = texts * repeat
    pq.write_table(pa.table({"id": list(range(len(rows))), "text": rows}), source)
    output = work / "out"
    cmd = [sys.executable, "-m", "trt_tei_runtime.corpus.cli", str(folder)]
    cmd += ["--input", str(source), "--output", str(output), "--devices", devices]
    cmd += ["--shard-rows", str(len(texts))]
    if device_workers:
        cmd += ["--device-workers", device_workers]
    # Run from the work folder: `-m` puts the working directory first on the import path, and
    # a source checkout there (no compiled router) would shadow the installed package.
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ}, cwd=work)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return None
    summary = json.loads((output / "manifest.json").read_text()).get("last_run") or {}
    return summary.get("tokens_per_s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="bert-large,qwen3-0.6b")
    parser.add_argument("--tokenizer-from", type=Path, required=True)
    parser.add_argument("--docs", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--devices", default="cuda:0", help="for trt-tei-embed")
    parser.add_argument(
        "--device-workers",
        choices=("auto", "threads", "processes"),
        help="for trt-tei-embed (left out: the job's default, and builds without the flag work)",
    )
    parser.add_argument("--job-repeat", type=int, default=8, help="corpus copies for the job")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}  commit {os.environ.get('TRT_TEI_COMMIT', '?')}")
    texts = corpus(args.docs)
    rows = []
    for shape in args.shapes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            folder = with_tokenizer(
                write_random_checkpoint(shape, Path(tmp) / shape), args.tokenizer_from
            )
            model = Model(folder, device="cuda", dtype=args.dtype, pooling="mean")
            engine, tokens = engine_tokens_per_s(model, texts, args.reps)
            api = model_tokens_per_s(model, texts, tokens, args.reps)
            del model
            torch.cuda.empty_cache()
            job = job_tokens_per_s(
                folder, texts, Path(tmp), args.devices, args.job_repeat, args.device_workers
            )
            rows.append((shape, tokens, engine, api, job))
    print("\n| shape | tokens | engine tok/s | Model.embed tok/s (of engine) ", end="")
    print("| trt-tei-embed tok/s (of engine) |")
    print("|---|---|---|---|---|")
    for shape, tokens, engine, api, job in rows:
        job_cell = "—" if job is None else f"{job:,.0f} ({job / engine:.0%})"
        api_cell = f"{api:,.0f} ({api / engine:.0%})"
        print(f"| {shape} | {tokens:,} | {engine:,.0f} | {api_cell} | {job_cell} |")


if __name__ == "__main__":
    main()
