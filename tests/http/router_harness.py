"""Helpers for the router's integration tests: a server process on loopback, tiny
classifier checkpoints, and small numeric helpers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).parent
STARTUP_TIMEOUT_S = 90
STOP_TIMEOUT_S = 30


def router_command() -> list[str]:
    """The installed console script, as users run it (built by `make router_dev`)."""
    script = Path(sys.executable).parent / "text-embeddings-router"
    if script.exists():
        return [str(script)]
    found = shutil.which("text-embeddings-router")
    if found:
        return [found]
    return [sys.executable, "-m", "trt_tei_runtime.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One router process on a free loopback port; its output goes to a log file."""

    def __init__(
        self,
        model: Path | str,
        log_dir: Path,
        *args: str,
        env: dict | None = None,
        default_pool: bool = False,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"router-{self.port}.log"
        cmd = [
            *router_command(),
            "--model-id",
            str(model),
            "--hostname",
            "127.0.0.1",
            "--port",
            str(self.port),
            *args,
        ]
        # Two tokenizer threads unless asked otherwise: tests run side by side on few cores.
        if "--tokenization-workers" not in args and not default_pool:
            cmd += ["--tokenization-workers", "2"]
        full_env = dict(os.environ)
        full_env.update(
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            # Test backends (tests/http/backends.py) are imported by module path.
            PYTHONPATH=os.pathsep.join([str(HERE), full_env.get("PYTHONPATH", "")]),
        )
        for key in ("PORT", "HOSTNAME", "API_KEY", "MODEL_ID", "MODELS_FILE", "AUTO_TRUNCATE"):
            full_env.pop(key, None)
        full_env.update(env or {})
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=full_env)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"router not ready after {STARTUP_TIMEOUT_S}s:\n{self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signals the process and returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return int(self.proc.returncode)

    def post(self, path: str, body: object, **kw: object) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=60, **kw)

    def get(self, path: str, **kw: object) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=60, **kw)


def openai_sdk():  # type: ignore[no-untyped-def]
    """The `openai` package, or skip: the GPU machine has none and no index to get it from."""
    return pytest.importorskip("openai")


def cosine(a: object, b: object) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


class InFlight:
    """`clients` POSTs of one JSON body, each on its own thread, started at once: requests
    to be in flight when something happens to the server. `answers()` waits for them and
    returns each response, or the exception its client raised."""

    def __init__(self, url: str, body: object, clients: int) -> None:
        self._results: list[httpx.Response | BaseException] = []
        self._threads = [
            threading.Thread(target=self._send, args=(url, body)) for _ in range(clients)
        ]
        for thread in self._threads:
            thread.start()

    def _send(self, url: str, body: object) -> None:
        try:
            self._results.append(httpx.post(url, json=body, timeout=60))
        except BaseException as exc:  # noqa: BLE001 - handed to the test by answers()
            self._results.append(exc)

    def answers(self) -> list[httpx.Response | BaseException]:
        for thread in self._threads:
            thread.join(timeout=60)
        assert len(self._results) == len(self._threads), "a client never finished"
        return list(self._results)
