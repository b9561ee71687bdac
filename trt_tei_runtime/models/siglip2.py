"""SigLIP 2 NaFlex (`Siglip2Model`, e.g. google/siglip2-base-patch16-naflex): SigLIP's text
tower and heads, and a vision tower that takes each image at its own aspect ratio, as a grid
of up to `max_num_patches` patches (`image_patches.py` says how an image's block holds its
patches and its grid).

The vision tower embeds the flattened patches with a linear layer, adds the learned square
grid of position embeddings resized (bilinear, antialiased, in float32) to the image's grid,
and packs the images as sequences of their real patches only, so the encoder layers (the
packed varlen ones the text runs on) spend nothing on padding; the MAP head then pools each
image over its own patches. The fixed-resolution SigLIP 2 checkpoints are `SiglipModel`s
(`siglip.py`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CheckpointError, InputError
from ..images import ImagePreprocessor
from ..layers import AttentionMetadata
from ..weights import WeightReader
from .base import ImageTower
from .bert import take_layer_norm
from .config import ConfigReader
from .contrastive import TowerConfig, encoder_layers
from .linears import take_linear
from .siglip import TEXT_DEFAULTS, AttentionPoolingHead, SiglipModel

# transformers' Siglip2VisionConfig defaults.
VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "num_patches": 256,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}


class Siglip2VisionTower(ImageTower):
    """Images as blocks `[n, 1, max_num_patches + 1, channels * patch * patch]`; the patch
    budget comes from the preprocessor (`fit_preprocessor`), as the checkpoint may be run
    with another budget than the one it was trained at."""

    variable_length: ClassVar[bool] = True

    def __init__(self, cfg: ConfigReader, reader: WeightReader) -> None:
        super().__init__()
        tower = TowerConfig.read(cfg)
        self.tower = tower
        h, eps = tower.hidden_size, tower.layer_norm_eps
        self.patch_size = cfg.int("patch_size")
        self.patch_width = cfg.int("num_channels") * self.patch_size**2
        positions = cfg.int("num_patches")
        self.grid_side = math.isqrt(positions)
        if self.grid_side**2 != positions:
            raise CheckpointError(f"{cfg.source}: num_patches {positions} is not a square")
        self.channels = 1
        self.embedding_size = h
        self._set_budget(positions)
        prefix = "vision_model.embeddings"
        self.patch_embedding = take_linear(reader, f"{prefix}.patch_embedding", h, self.patch_width)
        grid = reader.take(f"{prefix}.position_embedding.weight", (positions, h))
        # As [1, H, side, side], the layout the resize takes.
        self.position_grid = nn.Parameter(
            grid.reshape(self.grid_side, self.grid_side, h).permute(2, 0, 1)[None].contiguous(),
            requires_grad=False,
        )
        self.layers = encoder_layers(reader, "vision_model", tower)
        self.post_norm = take_layer_norm(reader, "vision_model.post_layernorm", h, eps)
        self.head = AttentionPoolingHead(reader, "vision_model.head", tower)

    def _set_budget(self, max_num_patches: int) -> None:
        self.tokens_per_image = max_num_patches
        self.image_size = (max_num_patches + 1, self.patch_width)

    def fit_preprocessor(self, preprocessor: ImagePreprocessor, source: str) -> None:
        if preprocessor.patch_size is None or preprocessor.max_num_patches is None:
            raise CheckpointError(
                f"{source}: a Siglip2Model (NaFlex) takes images as patches: its processor "
                "must be a Siglip2ImageProcessor"
            )
        if preprocessor.patch_size != self.patch_size:
            raise CheckpointError(
                f"{source}: patch_size {preprocessor.patch_size}; the vision tower's patches "
                f"are {self.patch_size}"
            )
        self._set_budget(preprocessor.max_num_patches)

    def blank_pixels(self, images: int) -> torch.Tensor:
        """Images of a full `1 x max_num_patches` grid."""
        pixels = torch.zeros((images, *self.image_size))
        pixels[:, -1, :2] = torch.tensor([1.0, float(self.tokens_per_image)])
        return pixels[:, None]

    def grids(self, pixels: torch.Tensor) -> list[tuple[int, int]]:
        """Each image's patch grid (height, width), read from its block's last row."""
        rows = pixels[:, 0, -1, :2].to("cpu", torch.float64)
        grids = []
        for index, (height, width) in enumerate(rows.tolist()):
            whole = height >= 1 and width >= 1 and height.is_integer() and width.is_integer()
            if not whole:  # NaN and infinity included
                raise InputError(
                    f"image {index}: its block's last row must hold its patch grid (two "
                    f"positive integers), got {height} x {width}"
                )
            if height * width > self.tokens_per_image:
                raise InputError(
                    f"image {index}: a {int(height)}x{int(width)} patch grid exceeds the "
                    f"budget of {self.tokens_per_image} patches"
                )
            grids.append((int(height), int(width)))
        return grids

    def positions(self, grids: list[tuple[int, int]], dtype: torch.dtype) -> torch.Tensor:
        """The position embeddings of every real patch, packed `[sum h*w, H]`: the square
        grid resized to each image's grid, as transformers does (in float32, as it does on
        the CPU; on a GPU it resizes in the model dtype, less exactly)."""
        grid = self.position_grid.float()
        resized: dict[tuple[int, int], torch.Tensor] = {}  # one resize per distinct grid
        for height, width in grids:
            if (height, width) not in resized:
                out = F.interpolate(
                    grid,
                    size=(height, width),
                    mode="bilinear",
                    align_corners=False,
                    antialias=True,
                )
                resized[height, width] = out.reshape(self.embedding_size, -1).t().to(dtype)
        return torch.cat([resized[g] for g in grids])

    def forward(self, pixels: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        n, rows = pixels.shape[0], self.tokens_per_image + 1
        grids = self.grids(pixels)
        lengths = torch.tensor([h * w for h, w in grids])
        device = pixels.device
        # Where each real patch lies among the blocks' n * rows rows, and the packed sequences.
        starts = torch.repeat_interleave(torch.arange(n) * rows, lengths)
        offsets = torch.arange(int(lengths.sum())) - torch.repeat_interleave(
            torch.cumsum(lengths, 0) - lengths, lengths
        )
        index = (starts + offsets).to(device, non_blocking=True)
        cu_seqlens = F.pad(torch.cumsum(lengths, 0), (1, 0)).to(device, torch.int32)
        packed = AttentionMetadata.build(
            cu_seqlens, int(lengths.max()), packed=meta.pad_index is None
        )
        dtype = self.patch_embedding.weight.dtype
        patches = pixels.reshape(n * rows, -1).index_select(0, index)
        x = self.patch_embedding(patches.to(dtype)) + self.positions(grids, dtype)
        for layer in self.layers:
            x = layer(x, packed)
        x = self.post_norm(x)
        # The head pools each image over its own patches, padded to the longest image.
        pad_index, key_mask = packed.padding(x.shape[0])
        padded = x.new_zeros((n * packed.max_seqlen, x.shape[1]))
        padded[pad_index] = x
        return self.head(padded.view(n, packed.max_seqlen, -1), key_mask)


class Siglip2Model(SiglipModel):
    text_defaults: ClassVar[dict[str, Any]] = TEXT_DEFAULTS
    vision_defaults: ClassVar[dict[str, Any]] = VISION_DEFAULTS
    family: ClassVar[str] = "SigLIP 2"

    def vision_tower(self, vision: ConfigReader, reader: WeightReader) -> ImageTower:
        return Siglip2VisionTower(vision, reader)
