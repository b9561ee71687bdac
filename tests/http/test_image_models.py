"""Text-and-image models (CLIP, SigLIP, SigLIP 2 NaFlex) behind the router: `/info` says the
model takes images, and `/embed` of texts equals `Model.embed`, SigLIP's texts padded by the
router as the runtime pads them (tiny random checkpoints, tests/checkpoints/vision.py)."""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints.vision import IMAGE_SIZE, PATCH, SIGLIP2_BUDGET, make_vision_checkpoint

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
