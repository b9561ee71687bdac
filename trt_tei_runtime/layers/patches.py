"""Patch embeddings of vision transformers: a convolution whose stride is its kernel is a
linear map of each patch's pixels, so it runs as one GEMM over the patches of a batch."""

from __future__ import annotations

import torch
from torch import nn

from .linear import Linear


def patchify(pixels: torch.Tensor, patch_size: int) -> torch.Tensor:
    """`[n, C, H, W]` → `[n * (H // p) * (W // p), C * p * p]`: each image's patches in
    row-major order (the order of a convolution's output, flattened), each patch's values in
    the order of a `Conv2d` kernel (channel, row, column). Rows and columns past the last
    whole patch are left out, as the strided convolution leaves them (SigLIP so400m: 384
    pixels, patches of 14, 27 a side)."""
    n, channels, height, width = pixels.shape
    p = patch_size
    rows, columns = height // p, width // p
    if rows * p != height or columns * p != width:
        pixels = pixels[:, :, : rows * p, : columns * p]
    grid = pixels.reshape(n, channels, rows, p, columns, p)
    return grid.permute(0, 2, 4, 1, 3, 5).reshape(-1, channels * p * p)


class PatchEmbedding(nn.Module):
    """A `Conv2d(C, D, kernel_size=p, stride=p)` as a linear over patches:
    `[n, C, H, W]` → `[n * patches, D]`."""

    def __init__(self, conv_weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        out_channels, _, self.patch_size, width = conv_weight.shape
        assert self.patch_size == width, "square patches"
        self.linear = Linear(conv_weight.reshape(out_channels, -1), bias)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.linear(patchify(pixels.to(self.linear.weight.dtype), self.patch_size))
