"""Worker processes on GPUs (device machine: `pytest -m gpu tests/http/test_device_workers_gpu.py`).

The CPU tests (test_device_workers.py) cover the protocol, faults and mistakes; here the
worker runs CUDA: its bulk lane pipelines (launch k + 1 while k is read back) and its
interactive lane takes the direct query path, and the answers must be those of the same
device served in one process. With one GPU the worker mode is forced for that one device;
with two or more, `auto` must pick processes by itself.
"""

from __future__ import annotations

import pytest
from router_harness import cosine
from test_device_workers import workers_of

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

TEXTS = [f"document {i}: " + "several words of text " * (i % 40 + 1) for i in range(200)]
QUERY = "What is Deep Learning?"


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def test_a_gpu_worker_answers_as_the_gpu_in_one_process(start_server, minilm_dir):
    if gpu_count() == 0:
        pytest.skip("no GPU")
    devices = ",".join(f"cuda:{i}" for i in range(min(gpu_count(), 2)))
    # One GPU: processes are asked for; several: `auto` must choose them.
    mode = ["--device-workers", "processes"] if gpu_count() == 1 else []
    batch = ("--max-client-batch-size", str(len(TEXTS)))
    in_process = start_server(minilm_dir, "--device", "cuda:0", *batch)
    workers = start_server(minilm_dir, "--devices", devices, *mode, *batch)
    assert len(workers_of(workers.proc.pid)) == devices.count(",") + 1

    expected = in_process.post("/embed", {"inputs": TEXTS}).json()
    # Many bulk batches (pipelined in the worker) and one query (the interactive lane).
    got = workers.post("/embed", {"inputs": TEXTS})
    assert got.status_code == 200, got.text
    for g, e in zip(got.json(), expected):
        assert cosine(g, e) >= 0.9999
    query = workers.post("/embed", {"inputs": QUERY})
    assert cosine(query.json()[0], in_process.post("/embed", {"inputs": QUERY}).json()[0]) >= 0.9999
    assert "cuda" in query.headers["x-compute-type"]
    devices_info = workers.get("/info").json()["devices"]
    assert all(d["healthy"] and d["failed_batches"] == 0 for d in devices_info), devices_info
    assert workers.stop() == 0
