"""Text-and-image models (CLIP, SigLIP, SigLIP 2 NaFlex) through `Model` against transformers
in fp32: texts by `get_text_features`, images by `get_image_features` on the reference
processor's outputs, for tiny random checkpoints made here (tests/checkpoints/vision.py)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from checkpoints.vision import (
    END,
    PAD,
    PROCESSORS,
    hf_image_features,
    hf_model,
    hf_text_features,
    make_vision_checkpoint,
    reference_pixels,
    sample_images,
)
from PIL import Image

from trt_tei_runtime import InputError, Model
from trt_tei_runtime.backend import Backend
from trt_tei_runtime.errors import CheckpointError

TEXTS = ["the cat", "a dog in paris reads a book by the river", "blue", "what is it"]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def assert_same_vectors(ours: np.ndarray, expected: np.ndarray) -> None:
    assert ours.shape == expected.shape
    assert cosines(ours, expected).min() >= 0.99999
    # Cosine misses a wrong scale (a missing norm weight or projection).
    np.testing.assert_allclose(
        np.linalg.norm(ours, axis=1) / np.linalg.norm(expected, axis=1), 1.0, rtol=1e-4
    )


CASES = {
    "clip": dict(architecture="CLIPModel"),
    "clip-legacy-eos-gelu": dict(architecture="CLIPModel", legacy_eos=True, hidden_act="gelu"),
    "siglip": dict(architecture="SiglipModel"),
    "siglip2": dict(architecture="Siglip2Model"),
}
# Each architecture's pixels per image (SigLIP 2: a block of 24 patches of 8x8x3 and its
# grid, `images.py`) and the tokens an image counts for.
PIXELS = {"CLIPModel": (3, 32, 32), "SiglipModel": (3, 32, 32), "Siglip2Model": (1, 25, 192)}
TOKENS = {"CLIPModel": 17, "SiglipModel": 16, "Siglip2Model": 24}


@pytest.fixture(scope="module", params=sorted(CASES))
def checkpoint(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    case = CASES[request.param]
    folder = make_vision_checkpoint(tmp_path_factory.mktemp(request.param), **case)  # type: ignore[arg-type]
    return case["architecture"], folder, Model(folder, device="cpu"), hf_model(folder)


def test_texts_equal_get_text_features(checkpoint):  # type: ignore[no-untyped-def]
    _, _, model, reference = checkpoint
    ids = model.tokenize(TEXTS)
    expected = hf_text_features(reference, ids).numpy()
    assert_same_vectors(model.embed(TEXTS, normalize=False), expected)
    normalized = model.embed(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1.0, rtol=1e-5)


def test_images_equal_get_image_features(checkpoint):  # type: ignore[no-untyped-def]
    _, folder, model, reference = checkpoint
    images = sample_images()
    expected = hf_image_features(reference, reference_pixels(folder, images)).numpy()
    ours = model.embed_images(images, normalize=False)
    assert_same_vectors(ours, expected)
    assert ours.shape[1] == model.info.hidden_size
    # Paths and PIL images give the same vectors; a single image is a batch of one.
    pil = [Image.open(io.BytesIO(data)) for data in images]
    np.testing.assert_allclose(model.embed_images(pil, normalize=False), ours, atol=1e-5)
    np.testing.assert_allclose(model.embed_images(images[1], normalize=False), ours[1:2], atol=1e-5)


def test_batches_split_by_the_token_budget(checkpoint):  # type: ignore[no-untyped-def]
    """Three images per batch (each is 16, 17 or 24 tokens): results keep the input order."""
    _, folder, model, _ = checkpoint
    images = sample_images() * 2
    small = Model(
        folder, device="cpu", max_batch_tokens=3 * model.info.image_input.tokens_per_image
    )
    assert small.executors[0].max_images(small.max_batch_tokens) == 3
    assert small.executors[0].max_images(small.max_batch_tokens, max_batch_size=2) == 2
    np.testing.assert_allclose(small.embed_images(images), model.embed_images(images), atol=1e-5)
    assert small.embed_images([]).shape == (0, model.info.hidden_size)


def test_info_says_the_model_takes_images(checkpoint):  # type: ignore[no-untyped-def]
    architecture, folder, model, _ = checkpoint
    image_input = model.info.image_input
    assert image_input is not None
    tokens = TOKENS[architecture]
    channels, height, width = PIXELS[architecture]
    assert (image_input.channels, image_input.height, image_input.width) == PIXELS[architecture]
    assert image_input.tokens_per_image == tokens
    info = Backend(str(folder)).info()
    assert info["image_input"] == {
        "height": height, "width": width, "channels": channels, "patch_size": 8,
        "tokens_per_image": tokens, "steps": image_input.preprocessor.steps(),
    }  # fmt: skip
    assert info["model_type"] == "embedding" and info["pooling"] == "last-token"
    if architecture != "CLIPModel":
        pad = model.tokenizer._flat.token_to_id(PAD)
        assert info["text_padding"] == {"length": 16, "token_id": pad}
    else:
        assert info["text_padding"] is None


def test_siglip_pads_texts_as_its_processor_does(tmp_path):  # type: ignore[no-untyped-def]
    """padding="max_length" to the model's 16 tokens, the pad token after `<end>`."""
    from transformers import PreTrainedTokenizerFast

    folder = make_vision_checkpoint(tmp_path, "SiglipModel")
    model = Model(folder, device="cpu")
    reference = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), pad_token=PAD, eos_token=END
    )
    long_text = " ".join(["house"] * 40)
    texts = [*TEXTS, long_text]
    expected = reference(texts, padding="max_length", max_length=16, truncation=True)["input_ids"]
    assert model.tokenize(texts) == expected
    assert all(len(ids) == 16 for ids in expected)


def test_sentence_transformers_clip_folder(tmp_path):  # type: ignore[no-untyped-def]
    """sentence-transformers' CLIP folders keep the model in 0_CLIPModel/."""
    plain = Model(make_vision_checkpoint(tmp_path / "plain", "CLIPModel"), device="cpu")
    st = Model(
        make_vision_checkpoint(tmp_path / "st", "CLIPModel", sentence_transformers=True),
        device="cpu",
    )
    assert st.info.model_dir.name == "0_CLIPModel"
    images = sample_images()[:2]
    np.testing.assert_array_equal(st.embed_images(images), plain.embed_images(images))
    np.testing.assert_array_equal(st.embed(TEXTS), plain.embed(TEXTS))


def test_bad_images_name_their_index(checkpoint):  # type: ignore[no-untyped-def]
    _, _, model, _ = checkpoint
    good = sample_images()[0]
    with pytest.raises(InputError, match="image 1: the bytes are not an image"):
        model.embed_images([good, b"not an image at all"])
    with pytest.raises(InputError, match="image 2: cannot decode the image"):
        model.embed_images([good, good, good[: len(good) // 2]])
    with pytest.raises(InputError, match="image 0: the image has 48x40 = 1920 pixels"):
        model.embed_images([good], max_image_pixels=1000)
    with pytest.raises(InputError, match="image 0: an image must be bytes, a path or a PIL image"):
        model.embed_images([3.5])  # type: ignore[list-item]


def test_text_models_take_no_images(tmp_path):  # type: ignore[no-untyped-def]
    from checkpoints import make_checkpoint

    model = Model(make_checkpoint(tmp_path, "BertModel", pooling="mean"), device="cpu")
    assert model.info.image_input is None
    with pytest.raises(InputError, match="takes no images"):
        model.embed_images(sample_images()[:1])
    with pytest.raises(InputError, match="takes no images"):
        model.executors[0].embed_images(torch.zeros(1, 3, 32, 32))


def test_pixels_of_the_wrong_shape_are_refused(checkpoint):  # type: ignore[no-untyped-def]
    architecture, _, model, _ = checkpoint
    shape = PIXELS[architecture]
    with pytest.raises(InputError, match=rf"pixels must be \[n, {', '.join(map(str, shape))}\]"):
        model.executors[0].embed_images(torch.zeros(2, *shape[:2], shape[2] - 1))


@pytest.mark.parametrize("architecture", ["CLIPModel", "SiglipModel"])
def test_patches_that_do_not_divide_the_image(tmp_path, architecture):  # type: ignore[no-untyped-def]
    """Patches of 6 over 32 pixels (as SigLIP so400m's 14 over 384): 5 a side, the last 2
    rows and columns unread, as transformers' strided convolution leaves them."""
    folder = make_vision_checkpoint(tmp_path, architecture, patch_size=6)
    model = Model(folder, device="cpu")
    assert model.info.image_input is not None
    assert model.info.image_input.tokens_per_image == 25 + (architecture == "CLIPModel")
    images = sample_images()
    reference = hf_model(folder)
    expected = hf_image_features(reference, reference_pixels(folder, images)).numpy()
    assert_same_vectors(model.embed_images(images, normalize=False), expected)


def test_checkpoint_problems_fail_clearly(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_vision_checkpoint(tmp_path / "clip", "CLIPModel")
    with pytest.raises(InputError, match="pools its texts as it was trained"):
        Model(folder, device="cpu", pooling="mean")
    config = dict(PROCESSORS["CLIPModel"], crop_size={"height": 24, "width": 24})
    (folder / "preprocessor_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="makes images 24x24; the vision tower takes 32x32"):
        Model(folder, device="cpu")
    (folder / "preprocessor_config.json").unlink()
    with pytest.raises(CheckpointError, match="missing file preprocessor_config.json"):
        Model(folder, device="cpu")
    siglip2 = make_vision_checkpoint(tmp_path / "siglip2", "Siglip2Model")
    fixed = dict(PROCESSORS["SiglipModel"])
    (siglip2 / "preprocessor_config.json").write_text(json.dumps(fixed))
    with pytest.raises(CheckpointError, match="must be a Siglip2ImageProcessor"):
        Model(siglip2, device="cpu")
    other_patches = dict(PROCESSORS["Siglip2Model"], patch_size=16)
    (siglip2 / "preprocessor_config.json").write_text(json.dumps(other_patches))
    with pytest.raises(CheckpointError, match="patch_size 16; the vision tower's patches are 8"):
        Model(siglip2, device="cpu")


def test_an_image_model_without_tokenizer_json_embeds_images_only(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_vision_checkpoint(tmp_path, "SiglipModel")
    (folder / "tokenizer.json").unlink()
    model = Model(folder, device="cpu")
    assert model.embed_images(sample_images()[:1]).shape == (1, 32)
    with pytest.raises(CheckpointError, match="no tokenizer.json: this model embeds images only"):
        model.embed(["a text"])


def test_backend_preprocesses_and_embeds_images_as_the_router_calls_it(checkpoint):  # type: ignore[no-untyped-def]
    """The router's path: `preprocess_image` per image, the pixels end to end as bytes to
    `embed_images` (or `launch`), texts as packed buffers to `embed`."""
    _, folder, model, _ = checkpoint
    backend = Backend(str(folder))
    images = sample_images()
    pixels = b"".join(backend.preprocess_image(data).tobytes() for data in images)
    rows = backend.embed_images(pixels)
    assert rows.dtype == np.float32 and rows.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(rows, model.embed_images(images, normalize=False), atol=1e-5)
    np.testing.assert_array_equal(backend.embed_images(pixels, interactive=True), rows)
    np.testing.assert_array_equal(backend.launch("embed_images", pixels).result(), rows)
    shape = "x".join(map(str, PIXELS[backend.info()["architecture"]]))
    with pytest.raises(InputError, match=f"not a whole number of {shape} images"):
        backend.embed_images(pixels[:-4])
    with pytest.raises(InputError, match="not an image"):
        backend.preprocess_image(b"GIF89a but no more")
    with pytest.raises(InputError, match="more than the limit of 100"):
        backend.preprocess_image(images[0], max_pixels=100)


def test_backend_refuses_images_for_text_models(tmp_path):  # type: ignore[no-untyped-def]
    from checkpoints import make_checkpoint

    backend = Backend(str(make_checkpoint(tmp_path, "BertModel", pooling="mean")))
    assert backend.info()["image_input"] is None and backend.info()["text_padding"] is None
    with pytest.raises(InputError, match="takes no images"):
        backend.preprocess_image(sample_images()[0])
    with pytest.raises(InputError, match="takes no images"):
        backend.embed_images(np.zeros((1, 3, 32, 32), np.float32).tobytes())


def test_siglip2_attends_to_each_image_s_own_patches_only(tmp_path):  # type: ignore[no-untyped-def]
    """Images of different grids in one batch: each one's vector is its own alone, and what
    lies in the padding rows of its block changes nothing; a block whose grid is not two
    positive integers within the budget is refused."""
    folder = make_vision_checkpoint(tmp_path, "Siglip2Model")
    backend = Backend(str(folder))
    blocks = np.stack([backend.preprocess_image(data) for data in sample_images()])
    grids = blocks[:, 0, -1, :2]
    assert len({tuple(g) for g in grids}) >= 4  # several aspect ratios
    rows = backend.embed_images(blocks.tobytes())
    for index in range(len(blocks)):
        alone = backend.embed_images(blocks[index].tobytes())
        np.testing.assert_allclose(alone[0], rows[index], rtol=1e-5, atol=1e-6)
    noisy = blocks.copy()
    for block, (height, width) in zip(noisy, grids.astype(int)):
        block[0, height * width : -1] = 7.0
    np.testing.assert_array_equal(backend.embed_images(noisy.tobytes()), rows)
    executor = backend.executors[0]
    for grid, message in [
        ((0, 4), "must hold its patch grid"),
        ((2.5, 4), "must hold its patch grid"),
        ((float("nan"), 4), "must hold its patch grid"),
        ((5, 5), "a 5x5 patch grid exceeds the budget of 24 patches"),
    ]:
        bad = torch.from_numpy(blocks.copy())
        bad[1, 0, -1, :2] = torch.tensor(grid)
        with pytest.raises(InputError, match=f"image 1: .*{message}"):
            executor.embed_images(bad)
