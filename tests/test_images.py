"""Image preprocessing (`trt_tei_runtime.images`) against transformers' reference processors
(the PIL backends of CLIPImageProcessor, SiglipImageProcessor and Siglip2ImageProcessor),
for images made here with Pillow in every format and mode the issue lists, and its errors
for bad images."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trt_tei_runtime import InputError
from trt_tei_runtime.errors import CheckpointError
from trt_tei_runtime.images import ImagePreprocessor, load_image

CLIP_CONFIG = {
    "image_processor_type": "CLIPImageProcessor",
    "do_resize": True,
    "size": {"shortest_edge": 40},
    "resample": 3,
    "do_center_crop": True,
    "crop_size": {"height": 32, "width": 32},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}
SIGLIP_CONFIG = {
    "image_processor_type": "SiglipImageProcessor",
    "do_resize": True,
    "size": {"height": 48, "width": 48},
    "resample": 2,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
# google/siglip2-base-patch16-naflex's, and a small budget with another filter.
SIGLIP2_CONFIGS = {
    "naflex-256": {
        "image_processor_type": "Siglip2ImageProcessor",
        "patch_size": 16,
        "max_num_patches": 256,
        "resample": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    },
    "naflex-small-bicubic": {
        "image_processor_type": "Siglip2ImageProcessor",
        "patch_size": 8,
        "max_num_patches": 24,
        "resample": 3,
    },
}
# openai/clip-vit-base-patch32's form: integer sizes, an old feature extractor name.
OLD_CLIP_CONFIG = {
    "feature_extractor_type": "CLIPFeatureExtractor",
    "size": 36,
    "crop_size": 30,
    "do_center_crop": True,
    "resample": 3,
}


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    """An RGB picture with edges, gradients and noise, so that every resize filter and
    every misplaced pixel shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) % 64 * 4], axis=-1)
    noisy = base + rng.normal(0, 20, base.shape)
    noisy[height // 3 : height // 2, width // 4 : width // 2] = [250, 10, 30]
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def rgba_png() -> bytes:
    image = picture(70, 50, 1).convert("RGBA")
    alpha = np.linspace(0, 255, 70 * 50).reshape(50, 70).astype(np.uint8)
    image.putalpha(Image.fromarray(alpha, "L"))
    return encode(image, "PNG")


def grey_jpeg() -> bytes:
    return encode(picture(64, 96, 2).convert("L"), "JPEG", quality=90)


def webp() -> bytes:
    return encode(picture(90, 60, 3), "WEBP", quality=80)


def animated_gif() -> bytes:
    first = picture(60, 45, 4).convert("P", palette=Image.Palette.ADAPTIVE)
    second = picture(60, 45, 5).convert("P", palette=Image.Palette.ADAPTIVE)
    buffer = io.BytesIO()
    first.save(buffer, format="GIF", save_all=True, append_images=[second], duration=100)
    return buffer.getvalue()


def rotated_jpeg() -> bytes:
    """A landscape JPEG whose EXIF says: rotate 90° clockwise to show it (orientation 6)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(picture(80, 40, 6), "JPEG", quality=95, exif=exif.tobytes())


def small_png() -> bytes:
    """Smaller than the crop on one side after the resize: the crop pads."""
    return encode(picture(20, 12, 7), "PNG")


IMAGES = {
    "png-rgba": rgba_png,
    "jpeg-greyscale": grey_jpeg,
    "webp": webp,
    "gif-first-frame": animated_gif,
    "jpeg-exif-rotated": rotated_jpeg,
    "png-small": small_png,
    "png-palette": lambda: encode(picture(33, 77, 8).convert("P"), "PNG"),
}


def reference_pixels(config: dict[str, object], path: Path) -> np.ndarray:
    from transformers.image_utils import load_image as hf_load_image
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    kind = str(config.get("image_processor_type") or config.get("feature_extractor_type"))
    cls = SiglipImageProcessorPil if kind.startswith("Siglip") else CLIPImageProcessorPil
    fields = {k: v for k, v in config.items() if not k.endswith("_type")}
    processor = cls(**fields)
    out = processor(images=hf_load_image(str(path)), return_tensors="np")["pixel_values"]
    return np.asarray(out[0])


@pytest.mark.parametrize(
    "config",
    [CLIP_CONFIG, SIGLIP_CONFIG, OLD_CLIP_CONFIG],
    ids=["clip", "siglip", "clip-int-sizes"],
)
@pytest.mark.parametrize("name", sorted(IMAGES))
def test_pixels_equal_the_reference_processor(tmp_path, config, name):  # type: ignore[no-untyped-def]
    data = IMAGES[name]()
    path = tmp_path / f"image.{name.split('-')[0]}"
    path.write_bytes(data)
    expected = reference_pixels(config, path)
    processor = ImagePreprocessor.from_config(config)
    ours = processor.preprocess(data)
    assert ours.dtype == np.float32 and ours.flags["C_CONTIGUOUS"]
    assert ours.shape == expected.shape == (3, *processor.output_size)  # type: ignore[misc]
    np.testing.assert_array_equal(ours, expected)
    # A path and a PIL image give the same pixels as the bytes.
    np.testing.assert_array_equal(processor.preprocess(path), ours)
    np.testing.assert_array_equal(processor.preprocess(Image.open(io.BytesIO(data))), ours)


@pytest.mark.parametrize("config", sorted(SIGLIP2_CONFIGS))
def test_naflex_patches_equal_the_reference_processor(config):  # type: ignore[no-untyped-def]
    """Each image resized to its own grid (wide, tall, square, tiny, larger than the
    budget), cut into the reference's patches in its order, with its grid in the last row."""
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    fields = {k: v for k, v in SIGLIP2_CONFIGS[config].items() if not k.endswith("_type")}
    reference = Siglip2ImageProcessorPil(**fields)
    processor = ImagePreprocessor.from_config(SIGLIP2_CONFIGS[config])
    budget, patch = fields["max_num_patches"], fields["patch_size"]
    assert processor.output_channels == 1
    assert processor.output_size == (budget + 1, 3 * patch * patch)
    sizes = [(640, 480), (480, 640), (300, 17), (5, 90), (33, 33), (1, 1), (1200, 700)]
    images = [picture(w, h, i) for i, (w, h) in enumerate(sizes)]
    images += [load_image(IMAGES[name]()) for name in sorted(IMAGES)]
    # transformers' `load_image` converts to RGB before its processor; ours converts itself.
    expected = reference(images=[image.convert("RGB") for image in images], return_tensors="np")
    grids = set()
    for index, image in enumerate(images):
        ours = processor.pixels(image)
        assert ours.dtype == np.float32 and ours.flags["C_CONTIGUOUS"]
        assert ours.shape == (1, *processor.output_size)
        height, width = expected["spatial_shapes"][index]
        count = int(expected["pixel_attention_mask"][index].sum())
        assert count == height * width <= budget
        np.testing.assert_array_equal(ours[0, :budget], expected["pixel_values"][index])
        np.testing.assert_array_equal(ours[0, budget], [height, width] + [0] * (3 * patch**2 - 2))
        grids.add((int(height), int(width)))
    assert len(grids) >= 6


def test_exif_orientation_turns_the_image_upright():  # type: ignore[no-untyped-def]
    image = load_image(rotated_jpeg())
    assert image.size == (40, 80)  # stored 80x40, shown rotated


def test_the_first_frame_of_a_gif_is_used():  # type: ignore[no-untyped-def]
    processor = ImagePreprocessor.from_config(SIGLIP_CONFIG)
    data = animated_gif()
    first_only = encode(Image.open(io.BytesIO(data)).convert("RGB"), "PNG")
    np.testing.assert_array_equal(processor.preprocess(data), processor.preprocess(first_only))


def test_bad_images_are_input_errors(tmp_path):  # type: ignore[no-untyped-def]
    processor = ImagePreprocessor.from_config(CLIP_CONFIG)
    with pytest.raises(InputError, match="not an image"):
        processor.preprocess(b"this is text, not a picture")
    jpeg = encode(picture(200, 150), "JPEG")
    with pytest.raises(InputError, match="cannot decode"):
        processor.preprocess(jpeg[: len(jpeg) // 2])
    with pytest.raises(InputError, match=r"200x150 = 30000 pixels, more than the limit of 29999"):
        processor.preprocess(jpeg, max_pixels=29_999)
    assert processor.preprocess(jpeg, max_pixels=30_000).shape == (3, 32, 32)
    with pytest.raises(InputError, match="no image file"):
        processor.preprocess(tmp_path / "missing.png")
    with pytest.raises(InputError, match="must be bytes, a path or a PIL image"):
        processor.preprocess(42)  # type: ignore[arg-type]


def test_unsupported_processor_configs_fail_clearly():  # type: ignore[no-untyped-def]
    with pytest.raises(CheckpointError, match="'ViTImageProcessor' is not supported"):
        ImagePreprocessor.from_config({"image_processor_type": "ViTImageProcessor"})
    naflex = SIGLIP2_CONFIGS["naflex-256"]
    with pytest.raises(CheckpointError, match="must resize images to its patch budget"):
        ImagePreprocessor.from_config({**naflex, "do_resize": False})
    with pytest.raises(CheckpointError, match="max_num_patches must be a positive integer"):
        ImagePreprocessor.from_config({**naflex, "max_num_patches": 0})
    with pytest.raises(CheckpointError, match="patch_size must be a positive integer"):
        ImagePreprocessor.from_config({**naflex, "patch_size": "16"})
    with pytest.raises(CheckpointError, match="unknown resample filter 9"):
        ImagePreprocessor.from_config({**CLIP_CONFIG, "resample": 9})
    with pytest.raises(CheckpointError, match="malformed size"):
        ImagePreprocessor.from_config({**CLIP_CONFIG, "size": "large"})
