"""`trt-tei-embed`: embed a corpus file into Parquet shards, resumably.

Exit status: 0 done; 1 the job failed (a bad row under --on-bad-row fail, a model or device
error; finished shards are kept and a rerun resumes); 2 bad arguments or input (nothing was
written); 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional

from ..errors import RuntimeErrorBase
from ..long_inputs import DEFAULT_MAX_CHUNKS
from .device_workers import DEVICE_WORKER_MODES
from .errors import BadRowError, CorpusError
from .options import BAD_ROW_POLICIES, DTYPES, LONG_INPUT_MODES, VERIFY_MODES, JobOptions
from .progress import Progress, Summary

PROG = "trt-tei-embed"

DESCRIPTION = """\
Embed every row of a Parquet, JSONL or CSV file with one model and write the vectors as
Parquet shards plus a manifest.json to --output. Shard i holds input rows
[i*shard_rows, (i+1)*shard_rows) (less bad rows) with the columns id, embedding (a
fixed-size list of float32, L2-normalized) and num_tokens. Shards and the manifest are
written atomically: run the same command again after a crash and it checks the finished
shards and embeds only the rest. The input is read as a stream; tokenizing runs ahead of
the model in a thread. Several GPUs (--devices all) each get a worker process of their own
(--device-workers)."""

EPILOG = """\
examples:
  trt-tei-embed sentence-transformers/all-MiniLM-L6-v2 --input corpus.parquet --output out/
  trt-tei-embed BAAI/bge-m3 --input docs.jsonl --id-column doc_id --devices all \\
      --dtype float16 --output out/ --on-bad-row skip
  trt-tei-embed MODEL --input corpus.parquet --output out/ --ray auto   # on a Ray cluster

exit status: 0 done, 1 job failed (rerun to resume), 2 bad arguments or input, 130 interrupted
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="hub id or local folder (checkpoint or engine)")
    p.add_argument(
        "--input",
        required=True,
        type=Path,
        help="corpus file: .parquet/.pq, .jsonl/.ndjson (one JSON object a line; blank lines "
        "are not rows) or .csv (with a header)",
    )
    p.add_argument("--output", required=True, type=Path, help="output directory (created)")
    p.add_argument("--text-column", help="column (key) holding the text (default: text)")
    p.add_argument(
        "--image-column",
        help="embed images instead of texts (a text-and-image model: CLIP, SigLIP): the "
        "column holding each row's encoded image (Parquet binary) or its file's path "
        "(relative ones under --image-root); not with --text-column",
    )
    p.add_argument(
        "--image-root",
        type=Path,
        help="with --image-column: the folder relative image paths start from (default: the "
        "input file's folder)",
    )
    p.add_argument(
        "--id-column",
        help="column written as `id`; without it the id is the row's ordinal in the input "
        "(0-based, blank JSONL lines not counted)",
    )
    p.add_argument(
        "--devices",
        help="as Model(device=...) takes them: e.g. cuda, cuda:1, cuda:0,cuda:1, cpu, all "
        "(default: the first GPU if any, else the CPU); several GPUs run as one worker "
        "process each (--device-workers). Not with --ray (each Ray actor takes one GPU)",
    )
    p.add_argument(
        "--device-workers",
        choices=DEVICE_WORKER_MODES,
        default="auto",
        help="how several --devices run: processes = one worker process per device, each "
        "with its own model (this process reads, tokenizes and writes; a worker that dies "
        "is restarted and its chunks embedded again); threads = one model over every device "
        "in this process (its device threads share one interpreter lock, which costs "
        "throughput past one GPU); auto = processes for several GPUs, else threads "
        "(default; docs/corpus-jobs.md)",
    )
    p.add_argument(
        "--dimensions", type=int, help="Matryoshka: keep the first N dimensions, then normalize"
    )
    p.add_argument("--prompt-name", help="named prompt from config_sentence_transformers.json")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help="the model's COMPUTE dtype, as Model(dtype=...) (default: float32 on CPU, the "
        "checkpoint's half type on GPU). Stored vectors are float32 whatever it is",
    )
    p.add_argument(
        "--long-input",
        choices=LONG_INPUT_MODES,
        default="truncate",
        help="a text over the model's input limit: truncate it (default), or chunk = embed it "
        "whole, as the weighted mean of windows of the limit (the server's `long_input: "
        "chunk`, docs/server.md); num_tokens then counts every window's tokens",
    )
    p.add_argument(
        "--chunk-overlap",
        type=int,
        default=0,
        help="with --long-input chunk: tokens each window shares with the one before (default 0)",
    )
    p.add_argument(
        "--max-chunks",
        type=int,
        default=DEFAULT_MAX_CHUNKS,
        help="with --long-input chunk: a text needing more windows is a bad row (default "
        f"{DEFAULT_MAX_CHUNKS})",
    )
    p.add_argument(
        "--shard-rows", type=int, default=100_000, help="input rows per shard (default 100000)"
    )
    p.add_argument(
        "--on-bad-row",
        choices=BAD_ROW_POLICIES,
        default="fail",
        help="a row with a missing, null, non-string or empty text (or none left after "
        "tokenizing): fail the job naming its id (default), or skip it; either way it is "
        "reported on stderr and counted (the first 100 per shard listed) in the manifest",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the job in --output and start over (needed when the model, input or an "
        "output-affecting option differs from the existing job's)",
    )
    p.add_argument(
        "--verify",
        choices=VERIFY_MODES,
        default="full",
        help="how a resumed run checks finished shards: full = size, row count and sha256 "
        "(reads every shard once), size = size and row count only (default: full)",
    )
    p.add_argument(
        "--chunk-rows",
        type=int,
        default=4096,
        help="rows per model call; the tokenizer runs two chunks ahead (default 4096)",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run on a Ray cluster (`auto`, or ray://host:10001, or host:6379): one model per "
        "actor, one task per unfinished shard; this process reads the input and commits "
        "shards. Needs the `ray` extra",
    )
    p.add_argument(
        "--ray-actors",
        type=int,
        help="model actors on the cluster (default: one per GPU, or one per node without GPUs)",
    )
    return p


def parse_options(argv: Optional[list[str]] = None) -> JobOptions:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.image_column is not None and args.text_column is not None:
        parser.error("--image-column and --text-column exclude each other: a job embeds one")
    if args.image_root is not None and args.image_column is None:
        parser.error("--image-root applies with --image-column only")
    return JobOptions(
        model=args.model,
        input=args.input,
        output=args.output,
        text_column=args.text_column or "text",
        image_column=args.image_column,
        image_root=args.image_root,
        id_column=args.id_column,
        devices=args.devices,
        device_workers=args.device_workers,
        dimensions=args.dimensions,
        prompt_name=args.prompt_name,
        dtype=args.dtype,
        shard_rows=args.shard_rows,
        on_bad_row=args.on_bad_row,
        overwrite=args.overwrite,
        verify=args.verify,
        chunk_rows=args.chunk_rows,
        long_input=args.long_input,
        chunk_overlap=args.chunk_overlap,
        max_chunks=args.max_chunks,
        ray_address=args.ray,
        ray_actors=args.ray_actors,
    )


def execute(options: JobOptions, progress: Optional[Progress] = None, model: Any = None) -> Summary:
    """Runs a job in this process; `model`: an already loaded `Model` (local jobs only)."""
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise CorpusError("trt-tei-embed needs pyarrow: pip install pyarrow") from exc
    progress = progress or Progress(interval_s=options.progress_interval_s)
    if options.image_column is not None:
        _check_image_options(options)
    if options.ray_address is not None:
        if options.devices is not None:
            raise CorpusError("--devices does not apply with --ray: each actor takes one GPU")
        if options.device_workers != "auto":
            raise CorpusError("--device-workers does not apply with --ray: actors are processes")
        from .ray_executor import run_ray

        return run_ray(options, progress)
    from .local_executor import run_local

    return run_local(options, progress, model)


def _check_image_options(options: JobOptions) -> None:
    """What an image job does not take: options of texts, and Ray (its actors embed texts)."""
    if options.ray_address is not None:
        raise CorpusError("--image-column runs on this machine only, not with --ray")
    if options.chunking is not None:
        raise CorpusError("--long-input chunk applies to texts, not to --image-column")
    if options.prompt_name is not None:
        raise CorpusError("--prompt-name applies to texts, not to --image-column")


def main(argv: Optional[list[str]] = None) -> None:
    options = parse_options(argv)
    try:
        summary = execute(options)
    except CorpusError as exc:
        _fail(str(exc), 2)
    except KeyboardInterrupt:
        _fail("interrupted; finished shards are kept, run again to resume", 130)
    except BadRowError as exc:
        _fail(str(exc), 1)  # says how to go on
    except RuntimeErrorBase as exc:  # a model or device error (DeviceError: a lost GPU)
        _fail(f"{exc}\nfinished shards are kept: run the same command again to resume", 1)
    sys.exit(0 if summary.complete else 1)


def _fail(message: str, status: int) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
