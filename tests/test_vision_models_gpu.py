"""Device tier: CLIP and SigLIP on CUDA in bfloat16 with CUDA graphs (text and vision
towers), against transformers in float32: the tests' tiny checkpoints and random ones of
real shapes (CLIP ViT-B/16, SigLIP base at 224 pixels). Run with `make test_gpu`."""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints.vision import (
    hf_image_features,
    hf_model,
    hf_text_features,
    make_vision_checkpoint,
    sample_images,
)
from test_vision_models import CASES, TEXTS, cosines, reference_pixels

from trt_tei_runtime import Model
from trt_tei_runtime.backend import Backend

pytestmark = pytest.mark.gpu


def _expected(folder, images):  # type: ignore[no-untyped-def]
    reference = hf_model(folder, device="cuda")
    return reference, hf_image_features(reference, reference_pixels(folder, images)).numpy()


@pytest.mark.parametrize("case", sorted(CASES))
def test_bf16_with_graphs_matches_fp32(tmp_path, case):  # type: ignore[no-untyped-def]
    folder = make_vision_checkpoint(tmp_path, **CASES[case])  # type: ignore[arg-type]
    model = Model(folder, device="cuda", dtype="bfloat16")
    graphs = model.executors[0].bulk.image_graphs
    assert graphs is not None and graphs.max_images >= 5
    images = sample_images()
    reference, expected = _expected(folder, images)
    assert cosines(model.embed_images(images, normalize=False), expected).min() >= 0.999
    texts = hf_text_features(reference, model.tokenize(TEXTS)).numpy()
    assert cosines(model.embed(TEXTS, normalize=False), texts).min() >= 0.999
    # A batch above the graphs' images runs eagerly, in the same order.
    many = images * (graphs.max_images // len(images) + 2)
    rows = model.embed_images(many, normalize=False)
    assert cosines(rows, np.tile(expected, (len(many) // len(images), 1))).min() >= 0.999


@pytest.mark.parametrize("case", ["clip", "siglip"])
def test_router_lanes_bf16(tmp_path, case):  # type: ignore[no-untyped-def]
    """Through `Backend` as the router calls it: the interactive lane (eager), the bulk
    lane's graphs, and a bulk batch above them that passes the preemption gate."""
    folder = make_vision_checkpoint(tmp_path, **CASES[case])  # type: ignore[arg-type]
    backend = Backend(str(folder), dtype="bfloat16", max_batch_tokens=4096)
    assert backend.info()["interactive_lane"]
    images = sample_images()
    _, expected = _expected(folder, images)
    pixels = b"".join(backend.preprocess_image(data).tobytes() for data in images)
    for rows in (
        backend.embed_images(pixels, interactive=True),
        backend.launch("embed_images", pixels).result(),
    ):
        assert cosines(rows, expected).min() >= 0.999
    executor = backend.executors[0]
    assert executor.bulk.image_graphs is not None
    many = executor.bulk.image_graphs.max_images // len(images) + 2
    rows = backend.launch("embed_images", pixels * many).result()
    assert cosines(rows, np.tile(expected, (many, 1))).min() >= 0.999


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["CLIPModel", "SiglipModel"])
def test_real_shapes_bf16_with_graphs(tmp_path, architecture):  # type: ignore[no-untyped-def]
    """Head width 64, 197 (CLIP) and 196 (SigLIP) tokens per image: shapes the tiny
    checkpoints do not reach."""
    folder = make_vision_checkpoint(tmp_path, architecture, full_size=True)
    model = Model(folder, device="cuda", dtype="bfloat16")
    assert model.info.image_input is not None
    assert model.info.image_input.tokens_per_image == (197 if architecture == "CLIPModel" else 196)
    images = sample_images()
    reference, expected = _expected(folder, images)
    assert cosines(model.embed_images(images, normalize=False), expected).min() >= 0.999
    texts = hf_text_features(reference, model.tokenize(TEXTS)).numpy()
    assert cosines(model.embed(TEXTS, normalize=False), texts).min() >= 0.999
