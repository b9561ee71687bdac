"""`--device-workers processes`: one worker process per device (`cpu,cpu` here, as two GPUs
would be), the driver reading, tokenizing and committing. The output is the one-device
job's, row for row; a worker killed mid-job costs a retry, never a row; a job whose
workers keep dying fails resumably; bad rows and bad arguments are handled as in one
process."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from corpus_util import (
    json_lines,
    kill_at_first_shard,
    make_texts,
    manifest,
    read_output,
    run_cli,
    write_corpus,
)
from processes import children, is_running

from trt_tei_runtime.corpus import BadRowError, CorpusError, JobOptions, worker_pool
from trt_tei_runtime.corpus.cli import build_parser, execute
from trt_tei_runtime.corpus.crash_hook import CRASH_ENV
from trt_tei_runtime.corpus.device_workers import process_devices
from trt_tei_runtime.corpus.progress import Progress
from trt_tei_runtime.errors import DeviceError

pytestmark = pytest.mark.slow  # each test starts worker processes (torch, a model: seconds)

TWO = {"devices": "cpu,cpu", "device_workers": "processes"}
ONE = {"devices": "cpu", "device_workers": "processes"}


def run(model_dir: Path, input_path: Path, output: Path, model: Any = None, **kw: Any):  # type: ignore[no-untyped-def]
    stream = io.StringIO()
    options = JobOptions(model=str(model_dir), input=input_path, output=output, **kw)
    summary = execute(options, Progress(stream=stream, json_lines=True), model=model)
    return summary, json_lines(stream.getvalue())


def corpus_with_bad_rows(path: Path, n: int, seed: int) -> tuple[Path, list[str]]:
    """JSONL with string ids; every 97th text empty (a bad row)."""
    texts = make_texts(n, seed=seed)
    records = [{"id": f"d{i}", "text": "" if i % 97 == 13 else t} for i, t in enumerate(texts)]
    return write_corpus(path, records), [r["id"] for r in records if r["text"]]


def test_two_cpu_workers_write_the_one_device_rows(minilm, minilm_dir, tmp_path):  # type: ignore[no-untyped-def]
    path, good_ids = corpus_with_bad_rows(tmp_path / "c.jsonl", 1200, seed=31)
    common = {"id_column": "id", "shard_rows": 400, "chunk_rows": 100, "on_bad_row": "skip"}
    one, _ = run(minilm_dir, path, tmp_path / "one", model=minilm, **common)
    two, lines = run(minilm_dir, path, tmp_path / "two", **common, **TWO)

    ids, vectors, tokens = read_output(tmp_path / "two")
    one_ids, one_vectors, one_tokens = read_output(tmp_path / "one")
    assert ids == one_ids == good_ids
    np.testing.assert_allclose(vectors, one_vectors, atol=1e-5)
    np.testing.assert_array_equal(tokens, one_tokens)
    assert two.complete and two.rows == one.rows and two.bad_rows == one.bad_rows == 13
    assert two.tokens == one.tokens
    # Both workers embedded chunks, each counted under its own name.
    assert set(two.devices) == {"cpu#0", "cpu#1"} and all(two.devices.values())
    assert sum(two.devices.values()) == two.tokens
    m, m_one = manifest(tmp_path / "two"), manifest(tmp_path / "one")
    assert m["bad_rows"] == m_one["bad_rows"]
    assert [s["sha256"] for s in m["shards"]] == [s["sha256"] for s in m_one["shards"]]
    assert [x for x in lines if x["event"] == "bad_row"][0]["id"] == "d13"


@pytest.fixture
def parquet(tmp_path: Path) -> Path:
    texts = make_texts(1000, seed=32)
    return write_corpus(
        tmp_path / "c.parquet", [{"id": f"r{i}", "text": t} for i, t in enumerate(texts)]
    )


@pytest.fixture
def clean(tiny, tiny_dir, parquet, tmp_path):  # type: ignore[no-untyped-def]
    """The one-process output of `parquet`."""
    out = tmp_path / "clean"
    run(tiny_dir, parquet, out, model=tiny, id_column="id", shard_rows=200)
    return read_output(out)


def assert_same(out: Path, clean) -> None:  # type: ignore[no-untyped-def]
    ids, vectors, tokens = read_output(out)
    assert ids == clean[0]  # every row, once, in order
    np.testing.assert_allclose(vectors, clean[1], atol=1e-5)
    np.testing.assert_array_equal(tokens, clean[2])
    assert manifest(out)["complete"]
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


def test_a_killed_worker_costs_a_retry_not_a_row(  # type: ignore[no-untyped-def]
    tiny_dir, parquet, clean, tmp_path, monkeypatch
):
    marker = tmp_path / "crashed"
    monkeypatch.setenv(CRASH_ENV, f"2:{marker}")  # the worker embedding shard 2 dies, once
    out = tmp_path / "out"
    summary, lines = run(
        tiny_dir, parquet, out, id_column="id", shard_rows=200, chunk_rows=50, **TWO
    )
    assert marker.exists()
    warnings = [x["message"] for x in lines if x["event"] == "warning"]
    assert any("died" in w and "restarting it (1 of 3)" in w for w in warnings), warnings
    assert summary.complete and summary.rows == 1000 and summary.shards == 5
    assert sum(summary.devices.values()) == summary.tokens
    assert_same(out, clean)


def test_workers_dying_too_often_fail_the_job_resumably(  # type: ignore[no-untyped-def]
    tiny_dir, parquet, clean, tmp_path, monkeypatch
):
    monkeypatch.setattr(worker_pool, "WORKER_RESTARTS", 0)
    monkeypatch.setenv(CRASH_ENV, f"3:{tmp_path / 'crashed'}")
    out = tmp_path / "out"
    with pytest.raises(DeviceError, match="every device worker has died"):
        run(tiny_dir, parquet, out, id_column="id", shard_rows=200, chunk_rows=50, **ONE)
    kept = manifest(out)
    assert not kept["complete"] and {s["index"] for s in kept["shards"]} <= {0, 1, 2}
    assert "DeviceError" in kept["last_run"]["error"]

    monkeypatch.delenv(CRASH_ENV)
    summary, _ = run(tiny_dir, parquet, out, id_column="id", shard_rows=200, **TWO)
    assert summary.complete and summary.resumed_rows == 200 * len(kept["shards"])
    assert_same(out, clean)


def test_sigkill_of_the_driver_ends_its_workers_and_resumes(tiny_dir, tmp_path):  # type: ignore[no-untyped-def]
    texts = make_texts(3000, seed=33)
    path = write_corpus(tmp_path / "c.jsonl", [{"text": t} for t in texts])
    out = tmp_path / "out"
    args = [tiny_dir, "--input", path, "--output", out, "--shard-rows", 250, "--chunk-rows", 50]
    args += ["--devices", "cpu,cpu", "--device-workers", "processes"]
    workers: list[int] = []
    kill_at_first_shard(args, out, seen=lambda pid: workers.extend(children(pid)))
    assert len(workers) >= 2
    deadline = time.monotonic() + 60  # each finishes the chunks it holds, then exits
    while any(is_running(pid) for pid in workers):
        assert time.monotonic() < deadline, "a worker outlived its driver"
        time.sleep(0.1)
    killed = manifest(out)
    assert not killed["complete"]

    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    summary = json_lines(rerun.stderr)[-1]
    assert summary["complete"] and summary["rows"] + summary["resumed_rows"] == 3000
    ids, _, _ = read_output(out)
    assert ids == list(range(3000))


def test_bad_rows_and_bad_arguments_as_in_one_process(tiny_dir, tmp_path):  # type: ignore[no-untyped-def]
    path, _ = corpus_with_bad_rows(tmp_path / "c.jsonl", 600, seed=34)
    out = tmp_path / "out"
    with pytest.raises(BadRowError, match=r"id 'd13' \(row 13\): empty text"):
        run(tiny_dir, path, out, id_column="id", shard_rows=200, **TWO)
    # Raised in a worker, raised again here: the same class, so the same exit status.
    with pytest.raises(CorpusError, match="--prompt-name: .*nope"):
        run(tiny_dir, path, tmp_path / "o2", prompt_name="nope", **ONE)
    with pytest.raises(CorpusError, match="cannot load model"):
        run(tmp_path / "missing", path, tmp_path / "o3", **ONE)
    with pytest.raises(CorpusError, match="--devices: unknown device"):
        run(tiny_dir, path, tmp_path / "o4", devices="gpu9", device_workers="processes")


def test_which_devices_get_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert process_devices("threads", "cpu,cpu") is None
    assert process_devices("processes", "cpu,cpu") == ["cpu", "cpu"]
    assert process_devices("processes", "cpu") == ["cpu"]
    # auto: a process per device for several GPUs (as the server), else this process.
    # GPUs named as parsed on a machine that has them (this one may not).
    import torch

    from trt_tei_runtime.runtime import devices

    real = devices.parse_devices
    monkeypatch.setattr(
        devices,
        "parse_devices",
        lambda spec: [torch.device(n) for n in spec.split(",")] if "cuda" in spec else real(spec),
    )
    four = ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert process_devices("auto", ",".join(four)) == four
    assert process_devices("auto", "cuda:1") is None
    assert process_devices("auto", "cpu,cpu") is None
    assert process_devices("auto", "cpu") is None
    with pytest.raises(CorpusError, match="--device-workers must be one of"):
        process_devices("fibers", "cpu")
    assert "--device-workers" in build_parser().format_help()
    result = run_cli("m", "--input", "x.parquet", "--output", "o", "--device-workers", "fibers")
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_device_workers_do_not_apply_with_ray(tmp_path):  # type: ignore[no-untyped-def]
    path = write_corpus(tmp_path / "c.jsonl", [{"text": "a b"}])
    options = JobOptions(
        model="m", input=path, output=tmp_path / "o", ray_address="auto", device_workers="threads"
    )
    with pytest.raises(CorpusError, match="--device-workers does not apply with --ray"):
        execute(options, Progress(stream=io.StringIO(), json_lines=True))
