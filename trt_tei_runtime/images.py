"""Image preprocessing: encoded image bytes (or a PIL image, or a path) to the float32
`[3, H, W]` pixels a checkpoint's vision tower takes, exactly as its
`preprocessor_config.json` says.

The steps and their rounding are those of transformers' PIL image processors
(`CLIPImageProcessorPil`, `SiglipImageProcessorPil`, `Siglip2ImageProcessorPil`, which the
`CLIPImageProcessor` / `SiglipImageProcessor` / `Siglip2ImageProcessor` names of a
checkpoint's config mean): the image is decoded (the first
frame of an animation), turned upright by its EXIF orientation and converted to RGB as
`transformers.image_utils.load_image` does (`Image.convert("RGB")`: alpha dropped, not
composited; greyscale and palettes expanded); then resized with Pillow and the config's
filter (CLIP: the shortest edge to `size.shortest_edge`, the other by `int(size * long /
short)`; SigLIP: to `size.height x size.width`; SigLIP 2 NaFlex: to the largest patch grid of its
aspect ratio within `max_num_patches`), centre-cropped (CLIP), rescaled in float64
and cast to float32, and normalized in float32. SigLIP 2's pixels are then cut into patches,
in the fixed-size block `image_patches.py` describes. tests/test_images.py checks the pixels equal
the reference processor's for PNG, JPEG, WebP and GIF in RGB, RGBA, greyscale and palette
modes.

Threads: Pillow releases the interpreter lock while it decodes and resizes, and numpy while
it converts, so `ImagePreprocessor.preprocess` scales over worker threads (the router calls
it from its own; `Model.embed_images` from a small pool). An `ImagePreprocessor` holds no
mutable state: one instance serves every thread.

Bad input raises `InputError`: bytes that are no image Pillow can read, a truncated file,
an image of more than `max_pixels` pixels (checked from the header, before decoding).
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .checkpoint import read_json
from .errors import CheckpointError, InputError
from .image_patches import patch_block, size_for_patch_budget

# An image may be given as encoded bytes, a path, or a decoded PIL image.
ImageSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", Image.Image]

# Images above this many pixels are refused before decoding (64 MP: every phone and most
# cameras; a decoded 64 MP image takes 192 MB).
DEFAULT_MAX_IMAGE_PIXELS = 64_000_000

PREPROCESSOR_CONFIG = "preprocessor_config.json"

# transformers' `PILImageResampling` values (Pillow's own filter numbers).
_RESAMPLE = {
    0: Image.Resampling.NEAREST,
    1: Image.Resampling.LANCZOS,
    2: Image.Resampling.BILINEAR,
    3: Image.Resampling.BICUBIC,
    4: Image.Resampling.BOX,
    5: Image.Resampling.HAMMING,
}

_OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_STANDARD_MEAN = (0.5, 0.5, 0.5)
_STANDARD_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class _Defaults:
    """A processor class's defaults, for the fields its config leaves out."""

    resample: int
    size: dict[str, int]
    crop_size: dict[str, int] | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # NaFlex processors: (patch_size, max_num_patches) rather than a size.
    patches: tuple[int, int] | None = None


_CLIP = _Defaults(
    3, {"shortest_edge": 224}, {"height": 224, "width": 224}, _OPENAI_CLIP_MEAN, _OPENAI_CLIP_STD
)
_SIGLIP = _Defaults(3, {"height": 224, "width": 224}, None, _STANDARD_MEAN, _STANDARD_STD)
_SIGLIP2 = _Defaults(2, {}, None, _STANDARD_MEAN, _STANDARD_STD, patches=(16, 256))

# Processor class names (config `image_processor_type`, or an old `feature_extractor_type`)
# -> their defaults. Fast (torchvision) and PIL variants share the PIL one's semantics.
_PROCESSORS = {
    "CLIPImageProcessor": _CLIP,
    "CLIPFeatureExtractor": _CLIP,
    "SiglipImageProcessor": _SIGLIP,
    "Siglip2ImageProcessor": _SIGLIP2,
}


@dataclass(frozen=True)
class ImagePreprocessor:
    """One checkpoint's preprocessing; `preprocess` runs it on one image."""

    # (height, width) for a fixed-size resize, or None with `shortest_edge`.
    resize_to: tuple[int, int] | None
    shortest_edge: int | None
    resample: Image.Resampling
    crop: tuple[int, int] | None  # (height, width) of the centre crop
    rescale_factor: float | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    convert_rgb: bool = True
    # NaFlex (SigLIP 2): the patch size and the most patches an image is resized to; its
    # output is then a block of patches (`image_patches.py`), not `[3, H, W]`.
    patch_size: int | None = None
    max_num_patches: int | None = None

    @property
    def output_size(self) -> tuple[int, int] | None:
        """(height, width) of every output, where the steps fix it (a crop, a fixed-size
        resize, or a block of patches); None where it follows the image's aspect ratio."""
        if self.patch_size is not None and self.max_num_patches is not None:
            return (self.max_num_patches + 1, 3 * self.patch_size**2)
        if self.crop is not None:
            return self.crop
        return self.resize_to

    @property
    def output_channels(self) -> int:
        """The first dimension of every output: 3 colour planes, or 1 block of patches."""
        return 3 if self.patch_size is None else 1

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], source: str = PREPROCESSOR_CONFIG
    ) -> ImagePreprocessor:
        """From the fields of a `preprocessor_config.json`."""
        name = str(config.get("image_processor_type") or config.get("feature_extractor_type") or "")
        base = name.removesuffix("Fast").removesuffix("Pil")
        defaults = _PROCESSORS.get(base)
        if defaults is None:
            raise CheckpointError(
                f"{source}: image processor {name or '(none named)'!r} is not supported; "
                f"supported: {', '.join(sorted(_PROCESSORS))}"
            )
        resample_id = config.get("resample", defaults.resample)
        if resample_id not in _RESAMPLE:
            raise CheckpointError(f"{source}: unknown resample filter {resample_id!r}")
        if defaults.patches is not None:
            return cls._patches_from_config(config, source, defaults.patches, resample_id)
        resize_to, shortest = None, None
        if config.get("do_resize", True):
            size = _size(config.get("size", defaults.size), source, "size")
            if "shortest_edge" in size:
                shortest = size["shortest_edge"]
            elif "height" in size and "width" in size:
                resize_to = (size["height"], size["width"])
            else:
                raise CheckpointError(
                    f"{source}: size must hold 'shortest_edge' or 'height' and 'width', got {size}"
                )
        crop = None
        if config.get("do_center_crop", defaults.crop_size is not None):
            crop_size = _size(
                config.get("crop_size", defaults.crop_size), source, "crop_size", square=True
            )
            if "height" not in crop_size or "width" not in crop_size:
                raise CheckpointError(f"{source}: crop_size must hold 'height' and 'width'")
            crop = (crop_size["height"], crop_size["width"])
        return cls(
            resize_to=resize_to,
            shortest_edge=shortest,
            resample=_RESAMPLE[resample_id],
            crop=crop,
            **_value_steps(config, source, defaults),
        )

    @classmethod
    def _patches_from_config(
        cls, config: Mapping[str, Any], source: str, defaults: tuple[int, int], resample_id: int
    ) -> ImagePreprocessor:
        if not config.get("do_resize", True):
            raise CheckpointError(
                f"{source}: do_resize is false: a NaFlex processor must resize images to its "
                "patch budget (max_num_patches)"
            )
        patch = config.get("patch_size", defaults[0])
        budget = config.get("max_num_patches", defaults[1])
        for field, value in (("patch_size", patch), ("max_num_patches", budget)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CheckpointError(
                    f"{source}: {field} must be a positive integer, got {value!r}"
                )
        return cls(
            resize_to=None,
            shortest_edge=None,
            resample=_RESAMPLE[resample_id],
            crop=None,
            patch_size=patch,
            max_num_patches=budget,
            **_value_steps(config, source, _SIGLIP2),
        )

    @classmethod
    def from_folder(cls, model_dir: Path) -> ImagePreprocessor:
        path = model_dir / PREPROCESSOR_CONFIG
        config = read_json(path)
        assert config is not None
        return cls.from_config(config, str(path))

    def steps(self) -> dict[str, Any]:
        """The steps as plain data (`Backend.info()["image_input"]["steps"]`), from which the
        router runs them itself where it matches them exactly (rust_router/src/images/pixels)."""
        resize: dict[str, int] | None = None
        if self.resize_to is not None:
            resize = {"height": self.resize_to[0], "width": self.resize_to[1]}
        elif self.shortest_edge is not None:
            resize = {"shortest_edge": self.shortest_edge}
        return {
            "resize": resize,
            "resample": self.resample.name.lower(),
            "crop": None if self.crop is None else list(self.crop),
            "rescale_factor": self.rescale_factor,
            "mean": None if self.mean is None else list(self.mean),
            "std": None if self.std is None else list(self.std),
            "convert_rgb": self.convert_rgb,
            "patch_size": self.patch_size,
            "max_num_patches": self.max_num_patches,
        }

    def preprocess(
        self, source: ImageSource, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    ) -> np.ndarray:
        """The image's float32 pixels `[3, H, W]` (NaFlex: its block of patches,
        `[1, max_num_patches + 1, 3 * patch * patch]`), C-contiguous. `InputError` for what is
        not a readable image, a truncated one, or one above `max_pixels` (None: no limit)."""
        image = load_image(source, max_pixels)
        return self.pixels(image)

    def pixels(self, image: Image.Image) -> np.ndarray:
        """The steps after decoding, on an upright image (`load_image`'s)."""
        if self.convert_rgb and image.mode != "RGB":
            image = image.convert("RGB")
        if self.patch_size is not None and self.max_num_patches is not None:
            width, height = image.size
            height, width = size_for_patch_budget(
                height, width, self.patch_size, self.max_num_patches
            )
            image = image.resize((width, height), resample=self.resample)
        if self.resize_to is not None:
            height, width = self.resize_to
            image = image.resize((width, height), resample=self.resample)
        elif self.shortest_edge is not None:
            image = image.resize(
                _shortest_edge_size(image.size, self.shortest_edge), resample=self.resample
            )
        array = np.asarray(image)
        if array.ndim == 2:
            array = array[:, :, None]
        if self.crop is not None:
            array = _center_crop(array, *self.crop)
        if self.rescale_factor is not None:
            # float64 first, as the reference rescales; then float32.
            out = (array.astype(np.float64) * self.rescale_factor).astype(np.float32)
        else:
            out = array.astype(np.float32)
        if self.mean is not None and self.std is not None:
            mean, std = np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)
            out = np.divide(np.subtract(out, mean), std, dtype=np.float32)
        if self.patch_size is not None and self.max_num_patches is not None:
            return patch_block(out, self.patch_size, self.max_num_patches)
        return np.ascontiguousarray(out.transpose(2, 0, 1))


def load_image(
    source: ImageSource, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
) -> Image.Image:
    """A decoded, upright image (EXIF orientation applied), the first frame of an animated
    one, in its own mode. Encoded bytes and paths are checked against `max_pixels` from
    their header before their pixels are decoded."""
    if isinstance(source, Image.Image):
        _check_pixels(source, max_pixels)
        return ImageOps.exif_transpose(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        stream: Any = io.BytesIO(bytes(source))
        name = "the bytes"
    elif isinstance(source, (str, os.PathLike)):
        stream, name = Path(source), str(source)
        if not stream.is_file():
            raise InputError(f"no image file at {name}")
    else:
        raise InputError(
            f"an image must be bytes, a path or a PIL image, got {type(source).__name__}"
        )
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb check warns below twice its limit; ours is `max_pixels`.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(stream) as opened:
                _check_pixels(opened, max_pixels)
                opened.seek(0)
                opened.load()
                image = ImageOps.exif_transpose(opened)
                if image is opened:
                    image = opened.copy()
    except InputError:
        raise
    except UnidentifiedImageError:
        raise InputError(
            f"{name} are not an image Pillow can read (PNG, JPEG, WebP, GIF, ...)"
        ) from None
    except Image.DecompressionBombError as exc:
        raise InputError(f"the image is too large: {exc}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        # A truncated or corrupt file fails while its pixels are decoded.
        raise InputError(f"cannot decode the image: {exc}") from None
    return image


def _check_pixels(image: Image.Image, max_pixels: int | None) -> None:
    width, height = image.size
    if max_pixels is not None and width * height > max_pixels:
        raise InputError(
            f"the image has {width}x{height} = {width * height} pixels, more than the limit "
            f"of {max_pixels}"
        )


def _shortest_edge_size(size: tuple[int, int], shortest_edge: int) -> tuple[int, int]:
    """(width, height) with the shorter side `shortest_edge` and the longer
    `int(shortest_edge * long / short)`, as transformers' `get_resize_output_image_size`."""
    width, height = size
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(shortest_edge * long / short)
    if width <= height:
        return shortest_edge, new_long
    return new_long, shortest_edge


def _center_crop(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre `height x width` of an `[h, w, c]` array, zero-padded where the image is
    smaller (transformers' `center_crop`)."""
    h, w = array.shape[:2]
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0:
        return array[top : top + height, left : left + width]
    new_h, new_w = max(height, h), max(width, w)
    padded = np.zeros((new_h, new_w, array.shape[2]), dtype=array.dtype)
    top_pad, left_pad = -(-(new_h - h) // 2), -(-(new_w - w) // 2)
    padded[top_pad : top_pad + h, left_pad : left_pad + w] = array
    top, left = top + top_pad, left + left_pad
    return padded[max(0, top) : min(new_h, top + height), max(0, left) : min(new_w, left + width)]


def _size(value: Any, source: str, field: str, square: bool = False) -> dict[str, int]:
    """A size field as a dict: an int means the shortest edge (CLIP's and SigLIP's
    `default_to_square=False`), or a square for a crop size."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"height": value, "width": value} if square else {"shortest_edge": value}
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return {"height": int(value[0]), "width": int(value[1])}
    if isinstance(value, Mapping) and all(isinstance(v, int) and v > 0 for v in value.values()):
        return {str(k): int(v) for k, v in value.items()}
    raise CheckpointError(f"{source}: malformed {field} {value!r}")


def _value_steps(config: Mapping[str, Any], source: str, defaults: _Defaults) -> dict[str, Any]:
    """The steps on pixel values every processor shares: RGB conversion, rescale,
    normalization, as `ImagePreprocessor` fields."""
    rescale = None
    if config.get("do_rescale", True):
        rescale = float(config.get("rescale_factor", 1 / 255))
    mean = std = None
    if config.get("do_normalize", True):
        mean = _channels(config.get("image_mean", defaults.mean), source, "image_mean")
        std = _channels(config.get("image_std", defaults.std), source, "image_std")
    return {
        "rescale_factor": rescale,
        "mean": mean,
        "std": std,
        "convert_rgb": bool(config.get("do_convert_rgb", True)),
    }


def _channels(value: Any, source: str, field: str) -> tuple[float, ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value),) * 3
    if isinstance(value, (list, tuple)) and len(value) == 3:
        return tuple(float(v) for v in value)
    raise CheckpointError(f"{source}: {field} must be a number or three numbers, got {value!r}")
