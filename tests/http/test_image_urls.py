"""Image URLs behind the router: fetched from the hosts `--allowed-image-hosts` lists (a local
http.server here), embedded as `Model.embed_images` embeds their bytes; refused without the
flag, from other hosts, and when the fetch fails, with 422 naming the input."""

from __future__ import annotations

import base64
import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from checkpoints.vision import make_vision_checkpoint, sample_images
from test_devices import run_router

from trt_tei_runtime import Model

pytestmark = pytest.mark.integration


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def image_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[bytes]]]:
    """(base URL of a local server of `0.png`, `1.png`, ..., those images' bytes)."""
    folder = tmp_path_factory.mktemp("images")
    images = sample_images()
    for i, data in enumerate(images):
        (folder / f"{i}.png").write_bytes(data)
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", images
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_vision_checkpoint(tmp_path_factory.mktemp("clip") / "model", "CLIPModel", seed=7)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_urls_of_allowed_hosts_are_embedded_like_their_bytes(  # type: ignore[no-untyped-def]
    start_server, clip_folder, image_host
):
    base, images = image_host
    server = start_server(clip_folder, "--allowed-image-hosts", "127.0.0.1,*.example.test")
    data_url = f"data:image/png;base64,{base64.b64encode(images[1]).decode()}"
    inputs = [{"image": f"{base}/0.png"}, {"image": data_url}, {"image": f"{base}/2.png"}]
    response = server.post("/embed", {"inputs": inputs})
    assert response.status_code == 200, response.text
    got = np.asarray(response.json(), dtype=np.float32)
    expected = Model(str(clip_folder), device="cpu").embed_images(images[:3])
    assert got.shape == expected.shape
    assert cosines(got, expected).min() >= 0.99999

    port = base.rsplit(":", 1)[1]
    refused = [
        (f"{base}/missing.png", "404"),
        (f"http://localhost:{port}/0.png", "`localhost` is not listed by --allowed-image-hosts"),
        (f"http://user:pw@127.0.0.1:{port}/0.png", "credentials"),
        ("file:///etc/passwd", "only http and https"),
    ]
    for url, says in refused:
        response = server.post("/embed", {"inputs": [inputs[1], {"image": url}]})
        assert response.status_code == 422, (url, response.text)
        error = response.json()["error"]
        assert "inputs[1]" in error and says in error, error
        openai = server.post("/v1/embeddings", {"input": [{"image": url}], "model": "m"})
        assert openai.status_code == 422 and "input[0]" in openai.json()["error"]["message"]


def test_without_the_flag_no_url_is_fetched(  # type: ignore[no-untyped-def]
    start_server, clip_folder, image_host
):
    base, _ = image_host
    server = start_server(clip_folder)
    response = server.post("/embed", {"inputs": [{"image": f"{base}/0.png"}]})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert "inputs[0]" in error and "--allowed-image-hosts" in error, error


@pytest.mark.parametrize("entry", ["http://127.0.0.1", "127.0.0.1:8000", "images.test/cats"])
def test_a_host_with_a_scheme_port_or_path_stops_the_start(clip_folder, entry):  # type: ignore[no-untyped-def]
    proc = run_router("--model-id", str(clip_folder), "--port", "0", "--allowed-image-hosts", entry)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "is not a host name" in out, out
