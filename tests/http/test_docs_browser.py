"""`/docs` in a real browser with the network off: headless Chromium renders the Swagger UI
from the assets built into the router, and every route of the spec shows up as an operation.

Chromium reaches only loopback: other hosts resolve to nothing and everything that is not
loopback goes to a dead proxy, so a page that needed a CDN would render empty. No OCR here:
the screenshot is kept for people (its path is printed), the assertions read the DOM that
Chromium rendered, not the spec JSON.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
WIDTH, HEIGHT = 1280, 2000


def find_chromium() -> str | None:
    if os.environ.get("CHROMIUM"):
        return shutil.which(os.environ["CHROMIUM"])
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip(f"no Chromium found (looked for {', '.join(BROWSERS)} and $CHROMIUM)")
    return path


@pytest.fixture(scope="module")
def server(start_server, minilm_dir):
    return start_server(minilm_dir)


def run_chromium(chromium: str, profile: Path, url: str, *args: str) -> str:
    """Runs one headless Chromium command on `url` and returns its stdout."""
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",  # CI containers run as root, where the sandbox cannot start
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        # The network is off: no name resolves but 127.0.0.1, and whatever is not loopback
        # goes through a proxy that is not there (port 9, discard). Loopback bypasses it.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--proxy-server=127.0.0.1:9",
        f"--window-size={WIDTH},{HEIGHT}",
        # Lets Swagger UI fetch the spec and render before the page is captured.
        "--virtual-time-budget=15000",
        *args,
        url,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{cmd}\nexit {done.returncode}\n{done.stderr[-4000:]}"
    return done.stdout


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_swagger_ui_renders_every_route_offline(server, chromium, tmp_path):
    spec = server.get("/api-doc/openapi.json").json()
    operations = {(m.upper(), p) for p, item in spec["paths"].items() for m in item}
    assert {("POST", "/embed"), ("POST", "/rerank"), ("POST", "/v1/embeddings")} <= operations
    url = f"{server.url}/docs/"

    screenshot = tmp_path / "docs.png"
    run_chromium(chromium, tmp_path / "profile-shot", url, f"--screenshot={screenshot}")
    print(f"\nSwagger UI screenshot: {screenshot}")
    assert png_size(screenshot) == (WIDTH, HEIGHT)
    # A blank page compresses to a few KB; the rendered operation list is far larger.
    assert screenshot.stat().st_size > 50_000, screenshot.stat().st_size

    dom = run_chromium(chromium, tmp_path / "profile-dom", url, "--dump-dom")
    (tmp_path / "docs.html").write_text(dom)
    assert 'id="swagger-ui"' in dom, dom[:2000]
    assert "trt-tei-runtime router" in dom, "the spec's title was not rendered"
    # One collapsed `opblock` per operation, its method and path rendered by Swagger UI.
    blocks = re.findall(
        r'class="opblock opblock-(\w+)[^"]*".*?'
        r'class="opblock-summary-path"[^>]*data-path="([^"]+)"',
        dom,
        re.DOTALL,
    )
    rendered = {(method.upper(), path) for method, path in blocks}
    assert len(blocks) == len(rendered), blocks
    assert rendered == operations, (
        f"missing: {sorted(operations - rendered)}, extra: {sorted(rendered - operations)}"
    )
