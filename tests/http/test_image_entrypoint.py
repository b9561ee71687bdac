"""The image's entry point, run outside the container as the image runs it: the final
stage's ENTRYPOINT + CMD with its ENV (paths under /opt/venv and /data mapped to this
machine), configured only through TEI's environment variables. CI has no container engine;
`make test_image` runs the same checks inside the real image.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from containerfile import read_image_config
from router_harness import InFlight, free_port

REPO = Path(__file__).parents[2]
HEALTHCHECK = REPO / "deploy" / "image" / "healthcheck.py"
HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
SHUTDOWN_TIMEOUT_S = 12


def hub_cache_with(model_dir: Path, cache: Path, repo_id: str) -> None:
    """A Hugging Face hub cache holding `model_dir` as `repo_id` (what a first start with
    network access leaves on the /data volume), so the hub id resolves offline."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    snapshot = repo / "snapshots" / revision
    snapshot.parent.mkdir(parents=True)
    shutil.copytree(model_dir, snapshot, symlinks=False)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


def image_env(data: Path) -> dict[str, str]:
    """The container's environment: the image's ENV with its paths mapped to this machine."""
    venv_bin = str(Path(sys.executable).parent)
    config = read_image_config(base_env={"PATH": os.environ["PATH"]})
    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "HOSTNAME", "MODEL_ID")}
    for key, value in config.env.items():
        env[key] = value.replace("/opt/venv/bin", venv_bin).replace("/data", str(data))
    return env


def entrypoint_command() -> list[str]:
    """ENTRYPOINT + CMD; tini stays in front where this machine has it."""
    command = read_image_config().command
    if command[:2] == ["tini", "--"] and shutil.which("tini") is None:
        command = command[2:]
    return command


def healthcheck(env: dict[str, str]) -> int:
    command = read_image_config().healthcheck
    assert command == ["healthcheck"], command
    return subprocess.run([sys.executable, str(HEALTHCHECK)], env=env, timeout=10).returncode


def test_the_image_declares_what_operators_rely_on():
    config = read_image_config()
    assert config.command[:3] == ["tini", "--", "text-embeddings-router"]
    assert config.user.split(":")[0] not in ("", "0", "root")
    assert config.env["PORT"] in [p.split("/")[0] for p in config.exposed]
    assert config.env["HF_HOME"] == "/data" and "/data" in config.volumes
    assert config.env["HUGGINGFACE_HUB_CACHE"].startswith("/data")
    assert config.env["HOSTNAME"] == "0.0.0.0"


def test_entrypoint_serves_from_env_vars_and_drains_on_sigterm(minilm_dir, tmp_path):
    data = tmp_path / "data"
    hub_cache_with(minilm_dir, data / "hub", HUB_ID)
    port = free_port()
    env = image_env(data)
    env.update(
        MODEL_ID=HUB_ID,
        PORT=str(port),
        MAX_BATCH_TOKENS="2048",
        MAX_CLIENT_BATCH_SIZE="64",
        SHUTDOWN_TIMEOUT=str(SHUTDOWN_TIMEOUT_S),
        TOKENIZATION_WORKERS="2",
        HF_HUB_OFFLINE="1",
    )
    log_path = tmp_path / "router.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(entrypoint_command(), env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        assert healthcheck(env) == 1, "healthy before the router started"
        deadline = time.monotonic() + 90
        while healthcheck(env) != 0:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.5)

        info = httpx.get(f"{url}/info", timeout=10).json()
        assert info["max_batch_tokens"] == 2048
        assert info["max_client_batch_size"] == 64
        assert info["model_id"] == HUB_ID
        # CMD's --json-output: every log line is one JSON object.
        lines = [ln for ln in log_path.read_text().splitlines() if ln.strip()]
        assert lines and all(json.loads(ln) for ln in lines)

        # Requests in flight at SIGTERM are all answered, and the process exits 0 in time.
        texts = [f"document {i}: " + "tokens of a longer passage " * 20 for i in range(40)]
        clients = InFlight(f"{url}/embed", {"inputs": texts}, clients=4)
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=SHUTDOWN_TIMEOUT_S + 5)
        elapsed = time.monotonic() - sent
        answers = clients.answers()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logs = log_path.read_text()
    assert code == 0, logs
    assert elapsed < SHUTDOWN_TIMEOUT_S, f"took {elapsed:.1f}s\n{logs}"
    for answer in answers:
        assert isinstance(answer, httpx.Response), answer
        assert answer.status_code == 200, answer.text
        assert len(answer.json()) == len(texts)
    assert healthcheck(env) == 1, "healthy after the router exited"
