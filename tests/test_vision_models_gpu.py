"""Device tier: CLIP and SigLIP on CUDA in bfloat16 with CUDA graphs (text and vision
towers), and SigLIP 2 NaFlex (its vision tower eager: its shapes follow the images), against
transformers in float32: the tests' tiny checkpoints and random ones of real shapes (CLIP
ViT-B/16, SigLIP base at 224 pixels, SigLIP 2 base at 256 patches). Run with
`make test_gpu`."""

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
# Towers of a fixed number of tokens per image, which run as CUDA graphs.
GRAPH_CASES = sorted(c for c in CASES if CASES[c]["architecture"] != "Siglip2Model")


def _expected(folder, images):  # type: ignore[no-untyped-def]
    reference = hf_model(folder, device="cuda")
    return reference, hf_image_features(reference, reference_pixels(folder, images)).numpy()


@pytest.mark.parametrize("case", GRAPH_CASES)
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


def test_siglip2_bf16_matches_fp32_on_every_lane(tmp_path):  # type: ignore[no-untyped-def]
    """Images of different grids packed as variable-length sequences on the device (the
    Triton varlen kernel), through `Model` and through `Backend` as the router calls it:
    the interactive lane, the bulk lane, and a bulk batch that passes the preemption gate."""
    folder = make_vision_checkpoint(tmp_path, "Siglip2Model")
    model = Model(folder, device="cuda", dtype="bfloat16")
    assert model.executors[0].bulk.image_graphs is None
    images = sample_images()
    reference, expected = _expected(folder, images)
    assert cosines(model.embed_images(images, normalize=False), expected).min() >= 0.999
    texts = hf_text_features(reference, model.tokenize(TEXTS)).numpy()
    assert cosines(model.embed(TEXTS, normalize=False), texts).min() >= 0.999
    backend = Backend(str(folder), dtype="bfloat16", max_batch_tokens=4096)
    assert backend.info()["interactive_lane"]
    pixels = b"".join(backend.preprocess_image(data).tobytes() for data in images)
    for rows in (
        backend.embed_images(pixels, interactive=True),
        backend.launch("embed_images", pixels).result(),
        backend.launch("embed_images", pixels * 30).result()[-len(images) :],
    ):
        assert cosines(rows, expected).min() >= 0.999


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["CLIPModel", "SiglipModel", "Siglip2Model"])
def test_real_shapes_bf16_with_graphs(tmp_path, architecture):  # type: ignore[no-untyped-def]
    """Head width 64, 197 (CLIP), 196 (SigLIP) and up to 256 (SigLIP 2) tokens per image:
    shapes the tiny checkpoints do not reach."""
    folder = make_vision_checkpoint(tmp_path, architecture, full_size=True)
    model = Model(folder, device="cuda", dtype="bfloat16")
    assert model.info.image_input is not None
    tokens = {"CLIPModel": 197, "SiglipModel": 196, "Siglip2Model": 256}[architecture]
    assert model.info.image_input.tokens_per_image == tokens
    images = sample_images()
    reference, expected = _expected(folder, images)
    assert cosines(model.embed_images(images, normalize=False), expected).min() >= 0.999
    texts = hf_text_features(reference, model.tokenize(TEXTS)).numpy()
    assert cosines(model.embed(TEXTS, normalize=False), texts).min() >= 0.999
