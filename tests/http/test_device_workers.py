"""`--device-workers processes`: one runtime worker process per device, started by the router,
batches through shared memory. The CPU stands in for GPUs (`--devices cpu,cpu`). The server
answers as one device does; a worker killed in the middle of a batch takes only its device
out of service; stopping the server leaves no worker behind; and the mistakes are one clear
line."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from processes import children, is_running
from test_devices import TEXTS, assert_same, embed_each_concurrently, run_router

pytestmark = pytest.mark.integration

WORKERS = ("--device-workers", "processes")


def workers_of(pid: int) -> list[int]:
    """The device workers the server started, in the order it started them."""
    return [c for c in children(pid) if b"device_worker" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_worker_processes_answer_as_one_device_does(start_server, minilm_dir):
    one = start_server(minilm_dir, "--device", "cpu")
    server = start_server(minilm_dir, "--devices", "cpu,cpu", *WORKERS, "--max-batch-requests", "2")
    workers = workers_of(server.proc.pid)
    assert len(workers) == 2, workers
    info = server.get("/info").json()
    assert [d["name"] for d in info["devices"]] == ["cpu", "cpu"]

    expected = one.post("/embed", {"inputs": TEXTS}).json()
    r = server.post("/embed", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    assert_same(r.json(), expected)
    assert_same(embed_each_concurrently(server, TEXTS), expected)
    # Every route's kind crosses: per-token rows too (larger than a pooled row).
    all_one = one.post("/embed_all", {"inputs": TEXTS[:3]}).json()
    all_two = server.post("/embed_all", {"inputs": TEXTS[:3]}).json()
    for a, b in zip(all_one, all_two):
        assert_same(b, a)

    devices = server.get("/info").json()["devices"]
    assert all(d["batches"] > 0 for d in devices), devices
    assert server.stop() == 0
    assert not any(is_running(w) for w in workers), "a worker outlived the server"


def test_a_worker_killed_mid_batch_takes_only_its_device_out(start_server, minilm_dir):
    server = start_server(
        minilm_dir,
        "--devices", "cpu,cpu", *WORKERS,
        "--python-backend-class", "backends:FaultyBackend",
        "--max-batch-requests", "1",
        # Each batch takes a second: both devices are busy when one is killed.
        env={"TEST_BATCH_DELAY_S": "1"},
    )  # fmt: skip
    workers = workers_of(server.proc.pid)
    assert len(workers) == 2, workers
    with ThreadPoolExecutor(max_workers=2) as pool:
        pending = [pool.submit(server.post, "/embed", {"inputs": t}) for t in TEXTS[:2]]
        time.sleep(0.5)
        os.kill(workers[1], signal.SIGKILL)
        answers = [f.result() for f in pending]
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 503], [r.text for r in answers]
    lost = next(r for r in answers if r.status_code == 503)
    assert lost.json()["error_type"] == "unhealthy"
    assert "killed by signal 9" in lost.json()["error"], lost.text

    health = server.get("/health")
    assert health.status_code == 200
    assert health.json()["unhealthy_devices"] == [{"index": 1, "name": "cpu"}]
    error = server.get("/info").json()["devices"][1]["error"]
    assert error == "the worker process of cpu stopped: it was killed by signal 9"
    # The other worker answers everything from now on.
    with ThreadPoolExecutor(max_workers=3) as pool:
        later = list(pool.map(lambda t: server.post("/embed", {"inputs": t}), TEXTS[2:5]))
    assert [r.status_code for r in later] == [200] * 3, [r.text for r in later]
    assert server.stop() == 0
    assert not is_running(workers[0])


def test_bad_input_in_a_worker_fails_only_its_request(start_server, minilm_dir):
    server = start_server(
        minilm_dir,
        "--devices", "cpu,cpu", *WORKERS,
        "--python-backend-class", "backends:FaultyBackend",
        env={"TEST_POISON_ID": "4419"},  # "fox": its batch raises in the worker
    )  # fmt: skip
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda t: server.post("/embed", {"inputs": t}), TEXTS[:4]))
    fox = [r for t, r in zip(TEXTS, answers) if "fox" in t]
    assert [r.status_code for r in fox] == [424], [r.text for r in fox]
    assert all(r.status_code == 200 for t, r in zip(TEXTS, answers) if "fox" not in t)
    assert server.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            [*WORKERS, "--python-backend-class", "backends:UnnamedDevicesBackend"],
            "needs `backends:UnnamedDevicesBackend.device_names(devices)`",
        ),
        (["--device-workers", "elsewhere"], "invalid value 'elsewhere'"),
    ],
)
def test_device_workers_mistakes_are_one_clear_line(minilm_dir, args, needle):
    proc = run_router(
        "--model-id", str(minilm_dir), "--port", "0", "--devices", "cpu,cpu", *args
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    assert needle in out, out


def test_a_worker_that_cannot_load_stops_the_start_with_the_reason(tmp_path):
    proc = run_router(
        "--model-id", str(tmp_path), "--port", "0", "--devices", "cpu,cpu", *WORKERS
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    errors = [line for line in out.splitlines() if "ERROR" in line]
    assert len(errors) == 1, out
    assert "missing file config.json" in errors[0], errors[0]
