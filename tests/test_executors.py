"""Executors per device, the dispatch of batches over them, and `Model` on several devices.
CPU only: two executors on the CPU stand for two GPUs (the machines here have none)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint

import trt_tei_runtime.model as model_module
from trt_tei_runtime import InputError, Model
from trt_tei_runtime.backend import Backend, _is_device_failure
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.errors import DeviceError
from trt_tei_runtime.runtime import Executor, load_executors, parse_devices
from trt_tei_runtime.runtime.dispatch import Job, run_jobs

TEXTS = [f"sentence number {i} " + "word " * (i % 17) for i in range(300)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):  # type: ignore[no-untyped-def]
    return make_checkpoint(tmp_path_factory.mktemp("bert"), "BertModel", pooling="mean")


def test_parse_devices():
    assert parse_devices("cpu") == [torch.device("cpu")]
    assert parse_devices("cpu, cpu") == [torch.device("cpu")] * 2
    assert parse_devices(["cpu", torch.device("cpu")]) == [torch.device("cpu")] * 2
    if not torch.cuda.is_available():
        assert parse_devices("all") == [torch.device("cpu")]
        assert parse_devices(None) == [torch.device("cpu")]
        with pytest.raises(InputError, match="no CUDA GPU is available"):
            parse_devices("cuda:0,cuda:1")
    with pytest.raises(InputError, match="expected 'all', 'cpu' or a list"):
        parse_devices("cpu,,cpu")
    with pytest.raises(InputError, match="unknown device 'tpu7'"):
        parse_devices("tpu7")


def test_two_executors_give_the_numbers_of_one(checkpoint, monkeypatch):  # type: ignore[no-untyped-def]
    # Small chunks and batches: many jobs, tokenized while the executors run.
    monkeypatch.setattr(model_module, "TOKENIZE_CHUNK", 37)
    one = Model(checkpoint, device="cpu", max_batch_tokens=256)
    two = Model(checkpoint, device="cpu,cpu", max_batch_tokens=256)
    assert two.devices == [torch.device("cpu")] * 2
    np.testing.assert_allclose(two.embed(TEXTS), one.embed(TEXTS), rtol=0, atol=1e-6)
    np.testing.assert_allclose(
        two.embed(TEXTS, dimensions=8, normalize=False),
        one.embed(TEXTS, dimensions=8, normalize=False),
        rtol=0,
        atol=1e-6,
    )
    # Both executors took part, and every token is counted once.
    counts = two.tokens_per_device()
    assert sum(counts.values()) == 2 * sum(len(ids) for ids in two.tokenize(TEXTS))
    assert counts  # one key: both executors are "cpu"


def test_model_rows_keep_input_order_across_chunks(checkpoint, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(model_module, "TOKENIZE_CHUNK", 5)
    model = Model(checkpoint, device="cpu,cpu", max_batch_tokens=128)
    together = model.embed(TEXTS[:40])
    alone = np.stack([model.embed(text)[0] for text in TEXTS[:40]])
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-5)
    with pytest.raises(InputError, match="input 13 must be a string"):
        model.embed(TEXTS[:13] + [None] + TEXTS[13:20])  # type: ignore[list-item]


def test_jobs_spread_over_executors_and_failures_surface(checkpoint):  # type: ignore[no-untyped-def]
    executors = load_executors(checkpoint, devices="cpu,cpu")
    threads_seen: dict[int, set[str]] = {id(e): set() for e in executors}

    def method(executor: Executor, batch: PackedBatch) -> torch.Tensor:
        threads_seen[id(executor)].add(threading.current_thread().name)
        threading.Event().wait(0.01)  # long enough for the other executor to take a job
        return executor.embed(batch)

    jobs = [Job(i, PackedBatch.from_sequences([[5, 6, 7 + i]])) for i in range(12)]
    done = sorted(job.key for job, _, _ in run_jobs(executors, jobs, method))
    assert done == list(range(12))
    assert all(threads_seen.values()), "one executor took no job"

    def failing_jobs():  # type: ignore[no-untyped-def]
        yield jobs[0]
        raise InputError("input 3 is empty after tokenization")

    with pytest.raises(InputError, match="input 3 is empty"):
        list(run_jobs(executors, failing_jobs(), Executor.embed))

    def failing_device(executor: Executor, batch: PackedBatch) -> torch.Tensor:
        if executor is executors[1]:
            raise DeviceError("cpu failed")
        threading.Event().wait(0.01)
        return executor.embed(batch)

    with pytest.raises(DeviceError, match="cpu failed"):
        list(run_jobs(executors, jobs, failing_device))
    # No thread of a failed call may still run a batch on an executor.
    assert not [t for t in threading.enumerate() if t.name.startswith("dispatch-")]


def test_backend_serves_each_device(checkpoint):  # type: ignore[no-untyped-def]
    backend = Backend(str(checkpoint), devices="cpu,cpu")
    assert backend.info()["devices"] == ["cpu", "cpu"]
    arrays = (
        np.array([2, 10, 11, 3], np.uint32).tobytes(),
        np.zeros(4, np.uint32).tobytes(),
        np.arange(4, dtype=np.uint32).tobytes(),
        np.array([0, 4], np.uint32).tobytes(),
    )
    first = backend.embed(*arrays, device=0)
    np.testing.assert_array_equal(backend.embed(*arrays, device=1), first)
    backend.health(device=1)
    with pytest.raises(ValueError, match="pass device or devices, not both"):
        Backend(str(checkpoint), device="cpu", devices="cpu")


def test_cuda_failures_are_told_from_input_errors():
    assert _is_device_failure(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not _is_device_failure(RuntimeError("shape mismatch"))
    assert not _is_device_failure(ValueError("CUDA error"))
