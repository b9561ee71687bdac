"""The router image itself (`make test_image`, not part of `make test`): built by
`make image`, run with all-MiniLM-L6-v2 mounted read-only, checked against
sentence-transformers, then stopped with requests in flight.

Needs podman (or `PODMAN=docker`) and the image named by `IMAGE`. Containers use the host's
network (the project's machines have no container bridge) and a free loopback port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "http"))
from router_harness import InFlight, cosine, free_port  # noqa: E402
from sentences import SENTENCES  # noqa: E402

pytestmark = pytest.mark.image

REPO = Path(__file__).parents[2]
IMAGE = os.environ.get("IMAGE", "localhost/trt-tei-runtime:latest")
MODEL_IN_CONTAINER = "/models/all-MiniLM-L6-v2"
SHUTDOWN_TIMEOUT_S = 20
STARTUP_TIMEOUT_S = 240


def podman_command() -> list[str]:
    tool = os.environ.get("PODMAN", "podman")
    if tool == "podman":
        # Hybrid cgroups and fixed rlimits on the project's machines (shared/CONTAINERS.md).
        os.environ.setdefault("CONTAINERS_CONF", str(REPO / "deploy/image/containers.conf"))
        return [tool, "--runtime", "runc"]
    return [tool]


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*podman_command(), *args], capture_output=True, text=True, check=check, timeout=timeout
    )


@dataclass
class Container:
    name: str
    url: str

    def logs(self) -> str:
        out = podman("logs", self.name, check=False)
        return out.stdout + out.stderr

    def exec(self, *command: str) -> subprocess.CompletedProcess:
        return podman("exec", self.name, *command, check=False)


@pytest.fixture(scope="module")
def container(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    data = tmp_path_factory.mktemp("data")
    os.chown(data, 1000, 1000)  # the image's user; a volume's owner is the operator's to set
    port = free_port()
    name = f"trt-tei-test-{uuid.uuid4().hex[:8]}"
    podman(
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        "host",
        "--volume",
        f"{minilm_dir}:{MODEL_IN_CONTAINER}:ro",
        "--volume",
        f"{data}:/data",
        "--env",
        f"MODEL_ID={MODEL_IN_CONTAINER}",
        "--env",
        f"PORT={port}",
        "--env",
        f"SHUTDOWN_TIMEOUT={SHUTDOWN_TIMEOUT_S}",
        "--env",
        "HF_HUB_OFFLINE=1",
        IMAGE,
    )
    box = Container(name, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{box.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            running = podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            assert running == "true", f"container exited:\n{box.logs()}"
            assert time.monotonic() < deadline, f"not healthy in time:\n{box.logs()}"
            time.sleep(1)
        yield box
    finally:
        print(f"\n--- container log (tail) ---\n{box.logs()[-3000:]}")
        podman("rm", "--force", "--time", "0", name, check=False)


def test_image_size_and_declared_config():
    inspect = json.loads(podman("image", "inspect", IMAGE).stdout)[0]
    config = inspect["Config"]
    print(f"\nimage {IMAGE}: {inspect['Size'] / 1e6:.0f} MB")
    assert config["User"].split(":")[0] == "1000"
    assert config["Entrypoint"] == ["tini", "--", "text-embeddings-router"]
    assert "8080/tcp" in config["ExposedPorts"]
    assert "/data" in config["Volumes"]
    # Docker reports it in Config, podman beside it; the OCI format would drop it.
    healthcheck = config.get("Healthcheck") or inspect.get("Healthcheck")
    assert healthcheck["Test"] == ["CMD", "healthcheck"], healthcheck


def test_runs_as_non_root_under_tini_with_no_build_toolchain(container):
    assert container.exec("id", "-u").stdout.strip() == "1000"
    assert container.exec("cat", "/proc/1/comm").stdout.strip() == "tini"
    for tool in ("cargo", "rustc", "gcc", "cc", "maturin", "pip"):
        found = container.exec("sh", "-c", f"command -v {tool}")
        assert found.returncode != 0, f"{tool} in the runtime image: {found.stdout}"


def test_embed_matches_sentence_transformers(container, minilm_dir):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(
        SENTENCES[:16], normalize_embeddings=True
    )
    answer = httpx.post(f"{container.url}/embed", json={"inputs": SENTENCES[:16]}, timeout=60)
    assert answer.status_code == 200, answer.text
    vectors = answer.json()
    assert len(vectors) == 16
    for got, want in zip(vectors, reference):
        assert cosine(got, want) >= 0.99999


def test_health_metrics_and_the_healthcheck_command(container):
    assert httpx.get(f"{container.url}/health", timeout=10).status_code == 200
    metrics = httpx.get(f"{container.url}/metrics", timeout=10)
    assert metrics.status_code == 200
    assert "te_request_success" in metrics.text and "te_queue_size" in metrics.text
    assert container.exec("healthcheck").returncode == 0


def test_the_model_mount_stays_read_only_and_data_is_writable(container):
    assert container.exec("touch", f"{MODEL_IN_CONTAINER}/probe").returncode != 0
    assert container.exec("touch", "/data/probe").returncode == 0


def test_podman_stop_answers_requests_in_flight_and_exits_0(container):
    """Runs last: SIGTERM through `podman stop` while clients wait for their vectors."""
    texts = [f"passage {i}: " + "words of a longer document " * 20 for i in range(32)]
    clients = InFlight(f"{container.url}/embed", {"inputs": texts}, clients=4)
    time.sleep(0.5)
    start = time.monotonic()
    podman("stop", "--time", str(SHUTDOWN_TIMEOUT_S + 10), container.name, timeout=60)
    elapsed = time.monotonic() - start
    answers = clients.answers()
    code = podman("inspect", "--format", "{{.State.ExitCode}}", container.name).stdout.strip()
    print(f"\npodman stop with {len(answers)} requests in flight: {elapsed:.1f} s, exit {code}")
    assert code == "0", container.logs()
    assert elapsed < SHUTDOWN_TIMEOUT_S, container.logs()
    for answer in answers:
        assert isinstance(answer, httpx.Response), answer
        assert answer.status_code == 200, answer.text
        assert len(answer.json()) == len(texts)
