"""SigLIP (and the fixed-resolution SigLIP 2 checkpoints, which are `SiglipModel`s): a
bidirectional text tower trained on texts padded to their full length (64 tokens) and
pooled at the last one, then a linear head with bias; a vision tower without a class token,
whose last hidden states (layer-normed) are pooled by a multi-head attention head with one
learned query (the MAP head), whose output is the image embedding.

`Siglip2Model` (NaFlex: each image resized to its own patch grid) is `siglip2.py`."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CheckpointError
from ..layers import Linear, get_activation, linear_activation
from ..weights import WeightReader
from .base import ImageTower
from .bert import take_layer_norm
from .config import ConfigReader
from .contrastive import ContrastiveModel, TowerConfig, VisionTower
from .linears import take_linear

# transformers' SiglipTextConfig / SiglipVisionConfig defaults.
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 64,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}


class AttentionPoolingHead(nn.Module):
    """SigLIP's MAP head: one learned query (`probe`) attends over an image's tokens
    (`nn.MultiheadAttention`'s packed in-projection and output projection), then a
    residual MLP after a layer norm. Every image has the same number of tokens, so the
    attention runs on `[n, heads, t, d]` at once."""

    def __init__(self, reader: WeightReader, prefix: str, tower: TowerConfig) -> None:
        super().__init__()
        h = tower.hidden_size
        self.num_heads = tower.num_attention_heads
        self.head_dim = h // self.num_heads
        self.probe = nn.Parameter(
            reader.take(f"{prefix}.probe", (1, 1, h))[0, 0], requires_grad=False
        )
        weight = reader.take(f"{prefix}.attention.in_proj_weight", (3 * h, h))
        bias = reader.take(f"{prefix}.attention.in_proj_bias", (3 * h,))
        self.query = Linear(weight[:h], bias[:h])
        self.key_value = Linear(weight[h:], bias[h:])
        self.attn_out = take_linear(reader, f"{prefix}.attention.out_proj", h, h)
        self.norm = take_layer_norm(reader, f"{prefix}.layernorm", h, tower.layer_norm_eps)
        self.up = take_linear(reader, f"{prefix}.mlp.fc1", tower.intermediate_size, h)
        self.down = take_linear(reader, f"{prefix}.mlp.fc2", h, tower.intermediate_size)
        self.act_name = tower.hidden_act
        self.act = get_activation(tower.hidden_act)

    def forward(self, hidden: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`[n, t, H]` → `[n, H]`; `key_mask` `[n, 1, 1, t]` (True: a real token) where
        images have fewer tokens than `t` (SigLIP 2 NaFlex)."""
        n, t, h = hidden.shape
        q = self.query(self.probe).view(1, self.num_heads, 1, self.head_dim)
        kv = self.key_value(hidden).view(n, t, 2, self.num_heads, self.head_dim)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        # One query per image; contiguous, as some attention kernels want a batch stride.
        pooled = F.scaled_dot_product_attention(
            q.expand(n, -1, -1, -1).contiguous(), k, v, attn_mask=key_mask
        )
        pooled = self.attn_out(pooled.reshape(n, h))
        return pooled + self.down(
            linear_activation(self.up, self.norm(pooled), self.act_name, self.act)
        )


class SiglipVisionTower(VisionTower):
    def __init__(self, vision: ConfigReader, reader: WeightReader) -> None:
        super().__init__(vision, reader, class_token=False, patch_bias=True, pre_norm=False)
        self.head = AttentionPoolingHead(reader, "vision_model.head", self.tower)

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.post_norm(hidden))


class SiglipModel(ContrastiveModel):
    text_defaults: ClassVar[dict[str, Any]] = TEXT_DEFAULTS
    vision_defaults: ClassVar[dict[str, Any]] = VISION_DEFAULTS
    causal_text: ClassVar[bool] = False
    pads_texts: ClassVar[bool] = True
    # The family's name in errors; `vision_tower` builds its tower.
    family: ClassVar[str] = "SigLIP"

    def build_text_head(
        self, config: dict[str, Any], text: ConfigReader, reader: WeightReader
    ) -> Linear:
        size = text.optional_int("projection_size") or self.hidden_size
        return take_linear(reader, "text_model.head", size, self.hidden_size)

    def build_image_tower(
        self, config: dict[str, Any], vision: ConfigReader, reader: WeightReader
    ) -> ImageTower:
        if not vision.bool("vision_use_head", True):
            raise CheckpointError(
                "config.json vision_config: vision_use_head is false: without its attention "
                f"pooling head a {self.family} vision tower gives no image embedding"
            )
        return self.vision_tower(vision, reader)

    def vision_tower(self, vision: ConfigReader, reader: WeightReader) -> ImageTower:
        return SiglipVisionTower(vision, reader)
