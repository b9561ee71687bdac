"""Start-up: the port is bound before the model loads (a port in use fails at once), names
resolve instead of silently binding 0.0.0.0, `--port 0` logs the port it got, and a
configuration mistake is one clear line, not a Python traceback."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time

import httpx
import pytest
from router_harness import router_command

pytestmark = pytest.mark.integration


def run_router(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    for key in ("PORT", "HOSTNAME", "MODEL_ID"):
        env.pop(key, None)
    return subprocess.run(
        [*router_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if "ERROR" in line]


def test_a_port_in_use_fails_before_the_model_loads(minilm_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        proc = run_router(
            "--model-id", str(minilm_dir), "--hostname", "127.0.0.1", "--port", str(port)
        )  # fmt: skip
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "the port is in use" in out, out
    assert "loading model" not in out, "the model loaded before the bind failed"
    assert time.monotonic() - start < 10


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model-id", "/no/such/folder"], "does not exist"),
        (["--python-backend-class", "no_such_module:Backend"], "--python-backend-class"),
        (["--max-batch-tokens", "64"], "max_batch_tokens (64) must be at least"),
        (["--dtype", "float7"], "float7"),
        (["--hostname", "no-such-host.invalid"], "neither an IP address"),
    ],
)
def test_configuration_mistakes_are_one_clear_line(minilm_dir, args, needle):
    base = ["--port", "0"]
    if "--model-id" not in args:
        base += ["--model-id", str(minilm_dir)]
    proc = run_router(*base, *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    errors = error_lines(proc)
    assert len(errors) == 1, out
    assert needle in errors[0], errors[0]


def test_localhost_binds_loopback_and_port_0_logs_the_real_port(minilm_dir):
    proc = subprocess.Popen(
        [*router_command(), "--model-id", str(minilm_dir), "--hostname", "localhost",
         "--port", "0", "--tokenization-workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )  # fmt: skip
    try:
        ports: set[int] = set()
        addresses: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"listening on (\S+):(\d+)", line)
            if m:
                addresses.append(m.group(1))
                ports.add(int(m.group(2)))
            if "Ready" in line:
                break
        assert addresses and all(a in ("127.0.0.1", "[::1]") for a in addresses), addresses
        assert len(ports) == 1 and 0 not in ports, ports
        port = ports.pop()
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
