"""One server over several devices: `--devices cpu,cpu` runs two executors (the CPU stands in
for GPUs in CI) fed by one queue, and answers as one device does; a device that fails
(`DeviceError`) is taken out of service alone while the other keeps answering; and the
start-up mistakes around `--devices` are one clear line."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from router_harness import HERE, cosine, router_command

pytestmark = pytest.mark.integration

TEXTS = [
    "What is Deep Learning?",
    "Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors",
    "a",
    "Two devices, one queue.",
    "A backfill spreads over every device.",
    "Queries take the first free lane.",
    "The order of the answers is the order of the inputs.",
    "A lost GPU must not take the server down.",
]
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def one_device(start_server, minilm_dir):
    return start_server(minilm_dir, "--device", "cpu")


@pytest.fixture(scope="module")
def two_devices(start_server, minilm_dir):
    # Two sequences per batch: one request of many inputs becomes several batches, which
    # the two executors share.
    return start_server(minilm_dir, "--devices", "cpu,cpu", "--max-batch-requests", "2")


def embed_each_concurrently(server, texts: list[str]) -> list:
    with ThreadPoolExecutor(max_workers=8) as pool:
        responses = list(pool.map(lambda t: server.post("/embed", {"inputs": t}), texts))
    for r in responses:
        assert r.status_code == 200, r.text
    return [r.json()[0] for r in responses]


def assert_same(got, expected) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert cosine(g, e) >= MIN_COSINE
        np.testing.assert_allclose(g, e, atol=1e-4)


def test_two_devices_answer_as_one_device_does(one_device, two_devices):
    info = two_devices.get("/info").json()
    assert [d["name"] for d in info["devices"]] == ["cpu", "cpu"]
    assert [d["index"] for d in info["devices"]] == [0, 1]
    assert all(d["healthy"] for d in info["devices"])
    assert len(one_device.get("/info").json()["devices"]) == 1

    r = one_device.post("/embed", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    expected = r.json()
    # One request spread over five batches on both devices comes back in input order.
    r = two_devices.post("/embed", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    assert_same(r.json(), expected)
    # Many single requests at once, each answered with its own vector.
    assert_same(embed_each_concurrently(two_devices, TEXTS), expected)

    devices = two_devices.get("/info").json()["devices"]
    assert all(d["batches"] > 0 for d in devices), devices
    assert all(d["failed_batches"] == 0 for d in devices), devices
    metrics = two_devices.get("/metrics").text
    for device in ("0", "1"):
        assert f'te_batch_inference_success{{device="{device}"}}' in metrics, metrics
    assert metrics.count("# TYPE te_queue_size gauge") == 1
    assert two_devices.get("/health").status_code == 200


def test_a_failed_device_goes_out_alone_and_requests_keep_being_answered(
    start_server, minilm_dir, tmp_path
):
    trigger = tmp_path / "fail-device-1"
    server = start_server(
        minilm_dir,
        "--python-backend-class", "backends:DeviceFailingBackend",
        "--max-batch-requests", "1",
        env={
            # The environment form of `--devices`.
            "DEVICES": "cpu,cpu",
            "TEST_FAIL_DEVICE": "1",
            "TEST_FAIL_DEVICE_FILE": str(trigger),
            # Device 0 stays busy long enough that the next request goes to device 1.
            "TEST_BATCH_DELAY_S": "0.3",
        },
    )  # fmt: skip
    health = server.get("/health")
    assert (health.status_code, health.text) == (200, "")

    trigger.touch()
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = list(pool.map(lambda t: server.post("/embed", {"inputs": t}), TEXTS[:4]))
    failed = [r for r in first if r.status_code != 200]
    assert failed, "no request reached device 1"
    for r in failed:
        # The device's failure, not the request's: 503, which clients retry.
        assert r.status_code == 503, r.text
        assert r.json()["error_type"] == "unhealthy"
        assert "DeviceError" in r.json()["error"], r.text

    health = server.get("/health")
    assert health.status_code == 200, health.text
    assert health.json() == {
        "status": "degraded",
        "unhealthy_devices": [{"index": 1, "name": "cpu"}],
    }
    devices = server.get("/info").json()["devices"]
    assert devices[0]["healthy"] and not devices[1]["healthy"]
    assert "DeviceError" in devices[1]["error"]

    # Device 0 answers everything from now on, at once or one by one.
    with ThreadPoolExecutor(max_workers=4) as pool:
        later = list(pool.map(lambda t: server.post("/embed", {"inputs": t}), TEXTS[4:]))
    assert all(r.status_code == 200 for r in later), [r.text for r in later]
    assert server.post("/embed", {"inputs": TEXTS}).status_code == 200
    after = server.get("/info").json()["devices"]
    assert after[1]["batches"] == devices[1]["batches"], "the failed device ran again"
    logs = server.logs()
    assert "device failed and takes no more batches" in logs, logs
    assert server.stop() == 0


def run_router(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    for key in ("PORT", "HOSTNAME", "MODEL_ID", "DEVICE", "DEVICES"):
        env.pop(key, None)
    return subprocess.run(
        [*router_command(), *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--devices", "cpu,cpu", "--python-backend-class", "backends:OneDeviceBackend"],
            "takes no `devices` argument",
        ),
        (["--devices", "cpu,cpu", "--device", "cpu"], "give only one"),
    ],
)
def test_devices_mistakes_are_one_clear_line(minilm_dir, args, needle):
    proc = run_router("--model-id", str(minilm_dir), "--port", "0", *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if "ERROR" in line]
    assert len(errors) == 1, out
    assert needle in errors[0], errors[0]
