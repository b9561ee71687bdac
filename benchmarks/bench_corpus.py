"""Corpus throughput: the engine alone against what a user gets from texts.

For each shape (random weights, all-MiniLM-L6-v2's tokenizer), on a deterministic corpus of
varied English text (`corpus_text.py`, seed 0, 64–512 tokens):

- engine: the texts tokenized beforehand, packed into 16k-token batches and run through the
  executor's bulk lane back to back (what `bench_engine.py` measures);
- Model.embed: `Model.embed(texts)` from strings to normalized host vectors, tokenization
  included (docs/performance.md's target: ≥ 95 % of the engine);
- trt-tei-embed: the corpus job on a Parquet file of the same texts repeated
  `--job-repeat` times (a job's steady state, not its start), its own tokens/s
  (`--devices` and `--device-workers` as given), when this build has it. `--jobs` runs
  several device sets and modes on the same checkpoint instead, one row each, the corpus
  repeated `--job-repeat` times per device (a scaling table in one call).

With `JOB_PROFILE_DIR` set and `py-spy` on PATH, each job runs under `py-spy record` (its
worker processes too), writing collapsed stacks there: where a job's time goes on the GPU
machine, without a second call.

Works with builds before and after the runtime split (it finds the executor either way),
so `ab_wheels.sh`-style old/new comparisons run the same file.

    python3 benchmarks/bench_corpus.py --shapes bert-large,qwen3-0.6b --tokenizer-from DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
    if output.exists():
        shutil.rmtree(output)  # the same work folder for every variant: a fresh job each
    # Run from the work folder: `-m` puts the working directory first on the import path, and
    # a source checkout there (no compiled router) would shadow the installed package.
    job = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=work
    )
    profiler = profile(job.pid, f"job-{folder.name}-{devices.count(',') + 1}-{device_workers}")
    _, stderr = job.communicate()
    if profiler is not None:
        profiler.wait()
    if job.returncode != 0:
        print(stderr[-3000:], file=sys.stderr)
        return None
    summary = json.loads((output / "manifest.json").read_text()).get("last_run") or {}
    return summary.get("tokens_per_s")


def profile(pid: int, name: str) -> subprocess.Popen[bytes] | None:
    """py-spy attached to the job (and its worker processes) until it ends, if asked for;
    a profiler that fails leaves the job as it is."""
    profile_dir = os.environ.get("JOB_PROFILE_DIR")
    if not profile_dir or not shutil.which("py-spy"):
        return None
    out = Path(profile_dir) / f"{name}.txt"
    cmd = ["py-spy", "record", "--pid", str(pid), "--format", "raw", "--subprocesses"]
    cmd += ["--nonblocking", "--rate", "50", "--output", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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
    parser.add_argument(
        "--jobs",
        help="several jobs per shape, ';'-separated DEVICES@MODE (e.g. "
        "'cuda:0@threads;cuda:0,cuda:1@processes'), the corpus repeated --job-repeat times "
        "per device; replaces --devices/--device-workers",
    )
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}  commit {os.environ.get('TRT_TEI_COMMIT', '?')}")
    texts = corpus(args.docs)
    jobs = [(args.devices, args.device_workers)]
    if args.jobs:
        jobs = [(d, m or None) for d, _, m in (j.partition("@") for j in args.jobs.split(";"))]
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
            for devices, mode in jobs:
                n = devices.count(",") + 1
                repeat = args.job_repeat * (n if args.jobs else 1)
                job = job_tokens_per_s(folder, texts, Path(tmp), devices, repeat, mode)
                rows.append((shape, tokens, engine, api, devices, mode, n, job))
                print(f"{shape} {devices} {mode or 'default'}: {job}", flush=True)
    print("\n| shape | tokens | engine tok/s | Model.embed tok/s (of engine) ", end="")
    print("| trt-tei-embed devices, mode | tok/s (of n x engine) |")
    print("|---|---|---|---|---|---|")
    for shape, tokens, engine, api, devices, mode, n, job in rows:
        job_cell = "—" if job is None else f"{job:,.0f} ({job / (n * engine):.2f})"
        api_cell = f"{api:,.0f} ({api / engine:.0%})"
        job_name = f"{devices} {mode or 'default'}"
        print(f"| {shape} | {tokens:,} | {engine:,.0f} | {api_cell} | {job_name} | {job_cell} |")


if __name__ == "__main__":
    main()
