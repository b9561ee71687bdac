"""SigLIP 2 NaFlex images as patches: each image keeps its aspect ratio, resized to the
largest patch grid within a budget of `max_num_patches` patches, and is cut into flattened
patches rather than fed as a `[3, H, W]` picture.

The router treats an image's preprocessed pixels as a fixed-size float32 block, so every
image becomes the same block, `[1, max_num_patches + 1, channels * patch * patch]`:
- rows `0 .. h*w - 1`: the image's patches in row-major grid order, each flattened as
  transformers' `convert_image_to_patches` does (patch row, patch column, channel);
- rows `h*w .. max_num_patches - 1`: zeros (padding, never attended to);
- the last row: the grid's height `h` and width `w` (in patches) as its first two values,
  then zeros. Small integers are exact in float32.
The vision tower (`models/siglip2.py`) reads the grid back from that last row.
"""

from __future__ import annotations

import math

import numpy as np


def size_for_patch_budget(
    height: int, width: int, patch: int, max_num_patches: int, eps: float = 1e-5
) -> tuple[int, int]:
    """(height, width) in pixels, multiples of `patch`, of the largest scale of the image
    whose patch grid holds at most `max_num_patches` patches: the same bisection over the
    scale as transformers' `get_image_size_for_max_num_patches`, so the same sizes."""

    def scaled(scale: float, size: int) -> int:
        return max(patch, math.ceil(size * scale / patch) * patch)

    low, high = eps / 10, 100.0
    while high - low >= eps:
        scale = (low + high) / 2
        patches = (scaled(scale, height) / patch) * (scaled(scale, width) / patch)
        if patches <= max_num_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def patch_block(pixels: np.ndarray, patch: int, max_num_patches: int) -> np.ndarray:
    """An image's float32 pixels `[H, W, C]` (H and W multiples of `patch`) as the block
    described above, `[1, max_num_patches + 1, C * patch * patch]`."""
    height, width, channels = pixels.shape
    rows, cols = height // patch, width // patch
    count = rows * cols
    if count > max_num_patches:
        raise ValueError(f"{count} patches, more than the budget of {max_num_patches}")
    patches = (
        pixels.reshape(rows, patch, cols, patch, channels)
        .transpose(0, 2, 1, 3, 4)
        .reshape(count, patch * patch * channels)
    )
    block = np.zeros((1, max_num_patches + 1, patch * patch * channels), dtype=np.float32)
    block[0, :count] = patches
    block[0, max_num_patches, :2] = (rows, cols)
    return block
