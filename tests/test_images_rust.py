"""The router's image preprocessing in Rust (rust_router/src/images/pixels) against the
runtime's (`ImagePreprocessor.preprocess`, itself checked against transformers in
tests/test_images.py), through `_router.preprocess_image`.

Pillow's resize is matched exactly, so PNG, GIF and WebP (lossless and lossy) give equal
pixels. JPEGs are decoded by zune-jpeg rather than libjpeg-turbo: their RGB values may differ
by `LOSSY_LEVELS` at most, which the decode-only comparison checks, and the pixels after
resizing by at most that many levels' worth of the normalized value."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest
from PIL import Image
from test_images import (
    CLIP_CONFIG,
    OLD_CLIP_CONFIG,
    SIGLIP2_CONFIGS,
    SIGLIP_CONFIG,
    encode,
    picture,
)

from trt_tei_runtime import _router
from trt_tei_runtime.images import DEFAULT_MAX_IMAGE_PIXELS, ImagePreprocessor

# How far the router's JPEG RGB values are from Pillow's (zune-jpeg against libjpeg-turbo:
# their IDCT, colour conversion and chroma upsampling round differently), as measured: most
# values are equal, 4:2:0 and 4:2:2 images differ by 0.4 levels on average and at most 4-5
# (1 for greyscale), and up to 12 on the last row of an image whose height is no whole
# number of chroma blocks. Lossy WebP decodes equal to libwebp's.
LOSSY_LEVELS = 12
LOSSY_MEAN_LEVELS = 0.5

CONFIGS: dict[str, dict[str, Any]] = {
    "clip": CLIP_CONFIG,
    "siglip": SIGLIP_CONFIG,
    "old-clip": OLD_CLIP_CONFIG,
    **SIGLIP2_CONFIGS,
}
# Pillow's filter numbers, NEAREST (0) aside: the router leaves that one to the runtime.
FILTERS = {"lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


def rust_pixels(
    processor: ImagePreprocessor, data: bytes, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
) -> np.ndarray:
    return steps_pixels(processor.steps(), data, max_pixels)


def steps_pixels(
    steps: dict[str, Any], data: bytes, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
) -> np.ndarray:
    shape, values = _router.preprocess_image(json.dumps(steps), data, max_pixels)
    return np.frombuffer(values, dtype="<f4").reshape(shape)


def decoded(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The RGB values of `data` as the runtime and the router decode them (no resize)."""
    raw = ImagePreprocessor(None, None, Image.Resampling.BICUBIC, None, None, None, None)
    return raw.preprocess(data), rust_pixels(raw, data)


def with_alpha(image: Image.Image, mode: str) -> Image.Image:
    alpha = np.linspace(0, 255, image.width * image.height).reshape(image.height, image.width)
    out = image.convert(mode)
    out.putalpha(Image.fromarray(alpha.astype(np.uint8), "L"))
    return out


def exif_rotated(orientation: int, fmt: str) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(picture(50, 30, orientation), fmt, exif=exif.tobytes())


def gif(transparent: bool) -> bytes:
    first = picture(60, 45, 4).convert("P", palette=Image.Palette.ADAPTIVE)
    second = picture(60, 45, 5).convert("P", palette=Image.Palette.ADAPTIVE)
    options: dict[str, Any] = {"transparency": 0} if transparent else {}
    buffer = io.BytesIO()
    first.save(buffer, format="GIF", save_all=True, append_images=[second], **options)
    return buffer.getvalue()


LOSSLESS = {
    "png-rgb": lambda: encode(picture(70, 50), "PNG"),
    "png-rgba": lambda: encode(with_alpha(picture(70, 50, 1), "RGBA"), "PNG"),
    "png-l": lambda: encode(picture(41, 63, 2).convert("L"), "PNG"),
    "png-la": lambda: encode(with_alpha(picture(41, 63, 3), "LA"), "PNG"),
    "png-p": lambda: encode(picture(33, 77, 8).convert("P"), "PNG"),
    "png-exif-6": lambda: exif_rotated(6, "PNG"),
    "png-1x1": lambda: encode(picture(1, 1), "PNG"),
    "png-1x9": lambda: encode(picture(1, 9, 9), "PNG"),
    "png-3x2": lambda: encode(picture(3, 2, 10), "PNG"),
    "png-large": lambda: encode(picture(1100, 700, 11), "PNG"),
    "gif-first-frame": lambda: gif(transparent=False),
    "webp-lossless": lambda: encode(picture(90, 60, 3), "WEBP", lossless=True),
    "webp-lossless-rgba": lambda: encode(
        with_alpha(picture(90, 60, 4), "RGBA"), "WEBP", lossless=True
    ),
}
LOSSY = {
    "jpeg-420-q75": lambda: encode(picture(96, 64, 12), "JPEG", quality=75),
    "jpeg-444-q95": lambda: encode(picture(96, 64, 13), "JPEG", quality=95, subsampling=0),
    "jpeg-422-q90": lambda: encode(picture(97, 65, 14), "JPEG", quality=90, subsampling=1),
    "jpeg-progressive": lambda: encode(picture(96, 64, 15), "JPEG", progressive=True),
    "jpeg-greyscale": lambda: encode(picture(64, 96, 2).convert("L"), "JPEG", quality=90),
    "jpeg-large-odd": lambda: encode(picture(641, 479, 16), "JPEG", quality=85),
    "webp-lossy": lambda: encode(picture(90, 60, 3), "WEBP", quality=80),
    "webp-lossy-rgba": lambda: encode(with_alpha(picture(90, 60, 4), "RGBA"), "WEBP", quality=80),
}
LOSSY.update({f"jpeg-exif-{o}": lambda o=o: exif_rotated(o, "JPEG") for o in range(1, 9)})


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(LOSSLESS))
def test_lossless_images_give_the_runtimes_pixels(config, name):  # type: ignore[no-untyped-def]
    processor = ImagePreprocessor.from_config(CONFIGS[config])
    data = LOSSLESS[name]()
    np.testing.assert_array_equal(rust_pixels(processor, data), processor.preprocess(data))


@pytest.mark.parametrize("name", sorted(LOSSY))
def test_lossy_images_decode_within_the_tolerance(name):  # type: ignore[no-untyped-def]
    pillow, rust = decoded(LOSSY[name]())
    assert pillow.shape == rust.shape
    difference = np.abs(pillow - rust)
    assert difference.max() <= LOSSY_LEVELS
    assert difference.mean() <= LOSSY_MEAN_LEVELS
    if name.startswith("webp"):
        assert difference.max() == 0


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(LOSSY))
def test_lossy_images_give_pixels_within_the_tolerance(config, name):  # type: ignore[no-untyped-def]
    processor = ImagePreprocessor.from_config(CONFIGS[config])
    data = LOSSY[name]()
    expected = processor.preprocess(data)
    scale = (processor.rescale_factor or 1.0) / min(processor.std or (1.0,))
    np.testing.assert_allclose(
        rust_pixels(processor, data), expected, rtol=0, atol=LOSSY_LEVELS * scale * 1.0001
    )


SIZES = [(1, 1), (1, 5), (7, 1), (13, 9), (50, 30), (31, 77), (224, 224), (301, 199)]


@pytest.mark.parametrize("resample", sorted(FILTERS))
@pytest.mark.parametrize("source", [(1, 1), (2, 3), (17, 11), (64, 48), (333, 250)])
def test_every_filter_resizes_as_pillow_does(resample, source):  # type: ignore[no-untyped-def]
    """Up and down, odd sizes and one-pixel images, in raw 8-bit values (no rescale)."""
    image = picture(*source, seed=source[0])
    data = encode(image, "PNG")
    for height, width in SIZES:
        config = {
            "image_processor_type": "SiglipImageProcessor",
            "size": {"height": height, "width": width},
            "resample": FILTERS[resample],
            "do_rescale": False,
            "do_normalize": False,
        }
        processor = ImagePreprocessor.from_config(config)
        np.testing.assert_array_equal(
            rust_pixels(processor, data), processor.preprocess(data), err_msg=f"{height}x{width}"
        )


@pytest.mark.parametrize("resample", sorted(FILTERS))
def test_clip_crops_with_every_filter(resample):  # type: ignore[no-untyped-def]
    processor = ImagePreprocessor.from_config({**CLIP_CONFIG, "resample": FILTERS[resample]})
    for size in [(640, 480), (480, 640), (20, 12), (5, 90)]:
        data = encode(picture(*size), "PNG")
        np.testing.assert_array_equal(rust_pixels(processor, data), processor.preprocess(data))


def test_images_the_router_leaves_to_the_runtime_are_refused():  # type: ignore[no-untyped-def]
    processor = ImagePreprocessor.from_config(CLIP_CONFIG)
    with pytest.raises(ValueError, match="not a PNG, JPEG, WebP or GIF"):
        rust_pixels(processor, b"this is text, not a picture")
    with pytest.raises(ValueError, match="not a PNG, JPEG, WebP or GIF"):
        rust_pixels(processor, encode(picture(20, 20), "BMP"))
    jpeg = encode(picture(200, 150), "JPEG")
    with pytest.raises(ValueError, match="truncated JPEG"):
        rust_pixels(processor, jpeg[: len(jpeg) // 2])
    png = encode(picture(200, 150), "PNG")
    with pytest.raises(ValueError, match="cannot decode"):
        rust_pixels(processor, png[: len(png) // 2])
    with pytest.raises(ValueError, match="transparent"):
        rust_pixels(processor, gif(transparent=True))
    with pytest.raises(ValueError, match="16-bit"):
        rust_pixels(processor, encode(Image.new("I;16", (8, 8), 300), "PNG"))


def test_the_pixel_limit_is_the_runtimes_word_for_word():  # type: ignore[no-untyped-def]
    processor = ImagePreprocessor.from_config(CLIP_CONFIG)
    jpeg = encode(picture(200, 150), "JPEG")
    with pytest.raises(ValueError) as refused:
        rust_pixels(processor, jpeg, max_pixels=29_999)
    assert (
        str(refused.value) == "the image has 200x150 = 30000 pixels, more than the limit of 29999"
    )
    assert rust_pixels(processor, jpeg, max_pixels=30_000).shape == (3, 32, 32)


def test_steps_the_router_cannot_match_are_refused():  # type: ignore[no-untyped-def]
    data = encode(picture(20, 20), "PNG")
    nearest = ImagePreprocessor.from_config({**CLIP_CONFIG, "resample": 0})
    with pytest.raises(ValueError, match="Nearest"):
        rust_pixels(nearest, data)
    grey = ImagePreprocessor.from_config({**CLIP_CONFIG, "do_convert_rgb": False})
    with pytest.raises(ValueError, match="do_convert_rgb"):
        rust_pixels(grey, data)
    with pytest.raises(ValueError, match="malformed steps"):
        steps_pixels({"resample": "bicubic"}, data)
