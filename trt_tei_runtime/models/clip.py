"""CLIP (OpenAI's, and OpenCLIP/LAION checkpoints in transformers' format): a causal text
tower pooled at its end-of-text token, a vision tower with a class token and a layer norm
before its layers, pooled at the class token; each tower's linear projection (no bias) maps
its pooled state into the shared space (`get_text_features` / `get_image_features`)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..layers import Linear
from ..weights import WeightReader
from .base import ImageTower
from .config import ConfigReader
from .contrastive import ContrastiveModel, VisionTower
from .linears import take_linear

# transformers' CLIPTextConfig / CLIPVisionConfig defaults, for fields a saved config omits.
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 49408,
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
}
VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 32,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
}
DEFAULT_PROJECTION_DIM = 512


class ClipVisionTower(VisionTower):
    """Pooled at the class token, layer-normed, then projected."""

    def __init__(self, vision: ConfigReader, reader: WeightReader, projection_dim: int) -> None:
        super().__init__(vision, reader, class_token=True, patch_bias=False, pre_norm=True)
        self.projection = take_linear(
            reader, "visual_projection", projection_dim, self.embedding_size, bias=False
        )
        self.embedding_size = projection_dim

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.projection(self.post_norm(hidden[:, 0]))


class ClipModel(ContrastiveModel):
    text_defaults: ClassVar[dict[str, Any]] = TEXT_DEFAULTS
    vision_defaults: ClassVar[dict[str, Any]] = VISION_DEFAULTS
    causal_text: ClassVar[bool] = True

    @staticmethod
    def _projection_dim(config: dict[str, Any]) -> int:
        return ConfigReader(config).int("projection_dim", DEFAULT_PROJECTION_DIM)

    def build_text_head(
        self, config: dict[str, Any], text: ConfigReader, reader: WeightReader
    ) -> Linear:
        dim = self._projection_dim(config)
        return take_linear(reader, "text_projection", dim, self.hidden_size, bias=False)

    def build_image_tower(
        self, config: dict[str, Any], vision: ConfigReader, reader: WeightReader
    ) -> ImageTower:
        return ClipVisionTower(vision, reader, self._projection_dim(config))
