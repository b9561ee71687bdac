"""Corpus jobs: embed a whole Parquet, JSONL or CSV file into resumable Parquet shards.

`trt-tei-embed` (cli.py) runs a job with one driver (driver.py) and one of two shard
executors: on one machine (local_executor.py; several GPUs as one worker process each,
worker_pool.py and worker_process.py) or on a Ray cluster (ray_executor.py). Both
read the input in a stream (reader.py, cut into shards and chunks by plan.py), screen and
tokenize rows ahead of the model (rows.py, ahead.py), and commit shards and the manifest
atomically (store.py, shards.py, manifest.py), so a run killed at any point resumes without
losing or duplicating a row. ray_data.py embeds a Ray Data `Dataset` instead.
"""

from .errors import BadRowError, CorpusError, OutputMismatchError
from .options import JobOptions

__all__ = ["BadRowError", "CorpusError", "JobOptions", "OutputMismatchError", "run_job"]


def run_job(options: JobOptions) -> dict[str, object]:
    """Runs a corpus job and returns its summary (what the manifest's `last_run` holds)."""
    from .cli import execute

    return execute(options).as_dict()
