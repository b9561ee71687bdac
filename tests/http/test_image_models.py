"""Text-and-image models (CLIP, SigLIP, SigLIP 2 NaFlex) behind the router: `/info` says the
model takes images, and `/embed` of texts equals `Model.embed`, SigLIP's texts padded by the
router as the runtime pads them (tiny random checkpoints, tests/checkpoints/vision.py)."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from checkpoints.vision import (
    IMAGE_SIZE,
    PATCH,
    SIGLIP2_BUDGET,
    hf_image_features,
    hf_model,
    make_vision_checkpoint,
    reference_pixels,
    sample_images,
)
from PIL import Image

from trt_tei_runtime import Model

pytestmark = pytest.mark.integration

TEXTS = ["the cat", "a dog in paris reads a book by the river", "blue", "what is it"]
ARCHITECTURES = ["CLIPModel", "SiglipModel", "Siglip2Model"]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def served(request, start_server, tmp_path_factory):  # type: ignore[no-untyped-def]
    """(server, Model) of one tiny checkpoint of the architecture."""
    folder = make_vision_checkpoint(
        tmp_path_factory.mktemp(request.param) / "model", request.param, seed=3
    )
    return start_server(folder), Model(str(folder), device="cpu")


def test_info_says_the_model_takes_images(served):  # type: ignore[no-untyped-def]
    server, model = served
    image_input = server.get("/info").json()["image_input"]
    # The processor's steps, which the router runs in Rust (images.py `steps`).
    assert model.info.image_input is not None
    assert image_input.pop("steps") == model.info.image_input.preprocessor.steps()
    if model.info.architecture == "Siglip2Model":
        # A block of the budget's patches and a row for the image's grid (images.py).
        assert image_input == {
            "height": SIGLIP2_BUDGET + 1,
            "width": 3 * PATCH * PATCH,
            "channels": 1,
            "patch_size": PATCH,
            "tokens_per_image": SIGLIP2_BUDGET,
        }
        return
    tokens = (IMAGE_SIZE // PATCH) ** 2 + (model.info.architecture == "CLIPModel")
    assert image_input == {
        "height": IMAGE_SIZE,
        "width": IMAGE_SIZE,
        "channels": 3,
        "patch_size": PATCH,
        "tokens_per_image": tokens,
    }


def test_text_embeddings_equal_the_models(served):  # type: ignore[no-untyped-def]
    server, model = served
    got = np.asarray(server.post("/embed", {"inputs": TEXTS}).json(), dtype=np.float32)
    expected = model.embed(TEXTS)
    assert got.shape == expected.shape
    assert cosines(got, expected).min() >= 0.99999
    openai = server.post("/v1/embeddings", {"input": TEXTS[1], "model": "m"}).json()
    assert cosines(np.asarray([openai["data"][0]["embedding"]]), expected[1:2])[0] >= 0.99999


# Image inputs. The servers above keep the default limits; these ones refuse what is large.
MAX_BYTES = 60_000
MAX_PIXELS = 100_000


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


def rows(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.asarray(response.json(), dtype=np.float32)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def limited(request, start_server, tmp_path_factory):  # type: ignore[no-untyped-def]
    """(server with small image limits, Model, transformers model, folder)."""
    folder = make_vision_checkpoint(
        tmp_path_factory.mktemp(request.param) / "model", request.param, seed=5
    )
    server = start_server(
        folder, "--max-image-bytes", str(MAX_BYTES), "--max-image-pixels", str(MAX_PIXELS)
    )
    return server, Model(str(folder), device="cpu"), hf_model(folder), folder


def test_image_vectors_equal_get_image_features(limited):  # type: ignore[no-untyped-def]
    server, model, reference, folder = limited
    images = sample_images()
    # Data URLs and plain base64 alike.
    inputs = [
        {"image": data_url(data) if i % 2 else base64.b64encode(data).decode()}
        for i, data in enumerate(images)
    ]
    got = rows(server.post("/embed", {"inputs": inputs, "normalize": False}))
    expected = hf_image_features(reference, reference_pixels(folder, images)).numpy()
    assert got.shape == expected.shape
    assert cosines(got, expected).min() >= 0.99999
    # The router decodes JPEGs with zune-jpeg, the reference with libjpeg-turbo, whose RGB
    # values may differ by a few levels (docs/models.md): their vectors' lengths agree less
    # closely than those of lossless images.
    norms = np.linalg.norm(expected, axis=1)
    relative = np.abs(np.linalg.norm(got, axis=1) - norms) / norms
    jpeg = np.array([data.startswith(b"\xff\xd8") for data in images])
    assert (relative <= np.where(jpeg, 1e-3, 1e-4)).all(), relative
    normalized = rows(server.post("/embed", {"inputs": inputs}))
    assert cosines(normalized, model.embed_images(images)).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1.0, rtol=1e-5)
    single = rows(server.post("/embed", {"inputs": {"image": data_url(images[2])}}))
    assert cosines(single, expected[2:3])[0] >= 0.99999
    openai = server.post("/v1/embeddings", {"input": inputs, "model": "m"})
    assert openai.status_code == 200, openai.text
    vectors = np.asarray([d["embedding"] for d in openai.json()["data"]])
    assert [d["index"] for d in openai.json()["data"]] == list(range(len(images)))
    assert cosines(vectors, expected).min() >= 0.99999


def test_texts_and_images_mix_in_one_request_in_order(limited):  # type: ignore[no-untyped-def]
    server, model, _, _ = limited
    images = sample_images()[:3]
    inputs: list[object] = [
        TEXTS[0],
        {"image": data_url(images[0])},
        {"text": TEXTS[1]},
        {"image": data_url(images[1])},
        {"image": data_url(images[2])},
        TEXTS[2],
    ]
    got = rows(server.post("/embed", {"inputs": inputs}))
    texts = model.embed([TEXTS[0], TEXTS[1], TEXTS[2]])
    pictures = model.embed_images(images)
    expected = np.stack([texts[0], pictures[0], texts[1], pictures[1], pictures[2], texts[2]])
    assert cosines(got, expected).min() >= 0.99999
    # Through the bulk lane, in batches the queue packs by kind, the order holds too.
    bulk = rows(server.post("/embed", {"inputs": inputs * 5, "priority": "low"}))
    assert cosines(bulk, np.concatenate([expected] * 5)).min() >= 0.99999


def big_png(side: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_bad_images_are_refused_naming_the_input(limited):  # type: ignore[no-untyped-def]
    server, _, _, _ = limited
    good = {"image": data_url(sample_images()[0])}
    truncated = sample_images()[0][:200]
    noise = np.random.default_rng(1).integers(0, 256, MAX_BYTES + 10, dtype=np.uint8).tobytes()
    assert len(big_png(400)) < MAX_BYTES  # refused for its pixels, not its bytes
    cases = [
        ({"image": data_url(b"this is not an image")}, "inputs[1]", "not an image"),
        ({"image": data_url(truncated)}, "inputs[1]", "cannot decode"),
        ({"image": data_url(big_png(400))}, "inputs[1]", str(MAX_PIXELS)),
        ({"image": data_url(noise)}, "inputs[1]", "--max-image-bytes"),
        ({"image": "https://example.com/cat.png"}, "inputs[1]", "not fetched"),
        ({"image": "data:image/png,raw"}, "inputs[1]", "base64"),
        ({"image": "%%%not-base64"}, "inputs[1]", "base64"),
    ]
    for bad, name, says in cases:
        response = server.post("/embed", {"inputs": [good, bad, "a text"]})
        assert response.status_code == 422, (says, response.text)
        error = response.json()["error"]
        assert name in error and says.lower() in error.lower(), error
        openai = server.post("/v1/embeddings", {"input": ["a text", "b", bad], "model": "m"})
        assert openai.status_code == 422 and "input[2]" in openai.json()["error"]["message"]
    for body in ({"audio": "x"}, {"text": "a", "image": "b"}):
        response = server.post("/embed", {"inputs": ["a", body]})
        assert response.status_code == 422, response.text
    # Nothing else failed: the server answers the good image as before.
    assert rows(server.post("/embed", {"inputs": [good]})).shape[0] == 1


def test_routes_of_texts_refuse_images(limited):  # type: ignore[no-untyped-def]
    server, _, _, _ = limited
    image = {"image": data_url(sample_images()[0])}
    response = server.post("/embed_all", {"inputs": ["a", image]})
    assert response.status_code == 422
    assert "inputs[1]" in response.json()["error"], response.text


def test_a_text_only_model_refuses_images(start_server, minilm_dir):  # type: ignore[no-untyped-def]
    server = start_server(minilm_dir)
    image = {"image": data_url(sample_images()[0])}
    response = server.post("/embed", {"inputs": ["a text", image]})
    assert response.status_code == 422
    error = response.json()["error"]
    assert "inputs[1]" in error and "texts only" in error, error


def test_images_reach_device_worker_processes(start_server, tmp_path):  # type: ignore[no-untyped-def]
    """With `--device-workers processes` the router decodes the images and the workers embed
    their pixels, as one process does; an image only the runtime reads is refused there,
    naming the input and the reason."""
    folder = make_vision_checkpoint(tmp_path / "model", "CLIPModel", seed=7)
    server = start_server(folder, "--device-workers", "processes", "--devices", "cpu,cpu")
    images = sample_images()
    inputs = [{"image": data_url(data)} for data in images]
    got = rows(server.post("/embed", {"inputs": ["the cat", *inputs], "normalize": False}))
    model = Model(str(folder), device="cpu")
    assert cosines(got[1:], model.embed_images(images, normalize=False)).min() >= 0.99999
    assert cosines(got[:1], model.embed(["the cat"]))[0] >= 0.99999
    sixteen_bit = io.BytesIO()
    Image.fromarray(np.full((8, 8), 40000, dtype=np.uint16)).save(sixteen_bit, format="PNG")
    image = {"image": data_url(sixteen_bit.getvalue())}
    response = server.post("/embed", {"inputs": ["a text", image]})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert "inputs[1]" in error and "--device-workers threads" in error, error
