"""Two-tower models that put texts and images in one embedding space, over pre-norm
ViT-style encoders: CLIP (`clip.py`) and SigLIP (`siglip.py`) share the encoder layer, the
text tower and the vision tower's skeleton here; their files say how they differ (a causal
text tower, a class token, a pre-norm before the layers, the pooling head, the projections).

The text tower is the model's `forward`: packed tokens to the final layer norm's hidden
states; pooling takes each text's last token (CLIP's end-of-text token, which its tokenizer
puts last; SigLIP's last pad) and `project_pooled` applies the text projection. The vision
tower (`image_tower`) takes pixels: every image is a fixed number of patch tokens, packed as
sequences of equal length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..batch import PackedBatch
from ..errors import CheckpointError
from ..layers import AttentionMetadata, Linear, get_activation, linear_activation, varlen_attention
from ..layers.linear import add_into_stream
from ..layers.patches import PatchEmbedding
from ..weights import WeightReader
from .base import ImageTower, TransformerModel
from .bert import take_embedding, take_layer_norm
from .config import ConfigReader
from .linears import take_fused_linear, take_linear


def sub_config(config: dict[str, Any], key: str, defaults: dict[str, Any]) -> ConfigReader:
    """A tower's config (`text_config`, `vision_config`) over its class's defaults:
    transformers leaves out of a saved config the fields equal to them."""
    data = config.get(key) or {}
    if not isinstance(data, dict):
        raise CheckpointError(f"config.json: {key} must be an object")
    return ConfigReader({**defaults, **data}, f"config.json {key}")


@dataclass(frozen=True)
class TowerConfig:
    """What every encoder layer of a tower reads."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float

    @classmethod
    def read(cls, cfg: ConfigReader) -> TowerConfig:
        tower = cls(
            hidden_size=cfg.int("hidden_size"),
            num_hidden_layers=cfg.int("num_hidden_layers"),
            num_attention_heads=cfg.int("num_attention_heads"),
            intermediate_size=cfg.int("intermediate_size"),
            hidden_act=cfg.str("hidden_act"),
            layer_norm_eps=cfg.float("layer_norm_eps"),
        )
        if tower.hidden_size % tower.num_attention_heads:
            raise CheckpointError(
                f"{cfg.source}: hidden_size {tower.hidden_size} is not a multiple of "
                f"num_attention_heads {tower.num_attention_heads}"
            )
        return tower


class PreNormLayer(nn.Module):
    """CLIP's and SigLIP's encoder layer: `x + attn(norm1(x))`, then `x + mlp(norm2(x))`,
    with the query/key/value projections fused into one GEMM."""

    def __init__(self, reader: WeightReader, prefix: str, cfg: TowerConfig, causal: bool) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.num_heads = cfg.num_attention_heads
        self.head_dim = h // self.num_heads
        self.causal = causal
        self.norm1 = take_layer_norm(reader, f"{prefix}.layer_norm1", h, eps)
        names = [f"{prefix}.self_attn.{n}_proj" for n in ("q", "k", "v")]
        self.qkv = take_fused_linear(reader, names, [h] * 3, h)
        self.attn_out = take_linear(reader, f"{prefix}.self_attn.out_proj", h, h)
        self.norm2 = take_layer_norm(reader, f"{prefix}.layer_norm2", h, eps)
        self.up = take_linear(reader, f"{prefix}.mlp.fc1", cfg.intermediate_size, h)
        self.down = take_linear(reader, f"{prefix}.mlp.fc2", h, cfg.intermediate_size)
        self.act_name = cfg.hidden_act
        self.act = get_activation(cfg.hidden_act)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        tokens = x.shape[0]
        qkv = self.qkv(self.norm1(x)).view(tokens, 3, self.num_heads, self.head_dim)
        attn = varlen_attention(
            qkv[:, 0], qkv[:, 1], qkv[:, 2], meta, causal=self.causal, scale=self.scale
        )
        x = add_into_stream(self.attn_out, attn.reshape(tokens, -1), x)
        hidden = linear_activation(self.up, self.norm2(x), self.act_name, self.act)
        return add_into_stream(self.down, hidden, x)


def encoder_layers(
    reader: WeightReader, prefix: str, cfg: TowerConfig, causal: bool = False
) -> nn.ModuleList:
    return nn.ModuleList(
        PreNormLayer(reader, f"{prefix}.encoder.layers.{i}", cfg, causal)
        for i in range(cfg.num_hidden_layers)
    )


class VisionTower(ImageTower):
    """Patch embeddings (plus a class token where the family has one) and learned
    position embeddings, an optional layer norm before the layers, the layers, and the
    family's pooling (`pool`) of the last hidden states `[n, t, H]`."""

    def __init__(
        self,
        cfg: ConfigReader,
        reader: WeightReader,
        *,
        class_token: bool,
        patch_bias: bool,
        pre_norm: bool,
    ) -> None:
        super().__init__()
        tower = TowerConfig.read(cfg)
        self.tower = tower
        h, eps = tower.hidden_size, tower.layer_norm_eps
        size, patch = cfg.int("image_size"), cfg.int("patch_size")
        self.channels = cfg.int("num_channels")
        if patch > size:
            raise CheckpointError(
                f"{cfg.source}: patch_size {patch} is larger than image_size {size}"
            )
        self.image_size = (size, size)
        self.patch_size = patch
        self.tokens_per_image = (size // patch) ** 2 + int(class_token)
        self.embedding_size = h
        prefix = "vision_model.embeddings"
        self.patch_embedding = PatchEmbedding(
            reader.take(f"{prefix}.patch_embedding.weight", (h, self.channels, patch, patch)),
            reader.take(f"{prefix}.patch_embedding.bias", (h,)) if patch_bias else None,
        )
        self.class_embedding: nn.Parameter | None = None
        if class_token:
            self.class_embedding = nn.Parameter(
                reader.take(f"{prefix}.class_embedding", (h,)), requires_grad=False
            )
        self.position = take_embedding(
            reader, f"{prefix}.position_embedding", self.tokens_per_image, h
        )
        self.pre_norm = (
            take_layer_norm(reader, "vision_model.pre_layrnorm", h, eps) if pre_norm else None
        )
        self.layers = encoder_layers(reader, "vision_model", tower)
        self.post_norm = take_layer_norm(reader, "vision_model.post_layernorm", h, eps)

    def forward(self, pixels: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        n, h = pixels.shape[0], self.tower.hidden_size
        x = self.patch_embedding(pixels).view(n, -1, h)
        if self.class_embedding is not None:
            x = torch.cat([self.class_embedding.expand(n, 1, h), x], dim=1)
        x = (x + self.position).reshape(n * self.tokens_per_image, h)
        if self.pre_norm is not None:
            x = self.pre_norm(x)
        for layer in self.layers:
            x = layer(x, meta)
        return self.pool(x.view(n, self.tokens_per_image, h))

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """The last hidden states `[n, t, H]` to one embedding per image."""
        raise NotImplementedError


class ContrastiveModel(TransformerModel):
    """The text tower as the model, the vision tower as its `image_tower`. A family sets
    the class variables and builds its text head and vision tower."""

    default_pooling: ClassVar[str] = "last-token"
    uses_token_types: ClassVar[bool] = False
    unused: ClassVar[tuple[str, ...]] = (r"position_ids$", r"^logit_scale$", r"^logit_bias$")
    lora_unsupported: ClassVar[str | None] = "text-and-image models take no LoRA adapters"
    text_defaults: ClassVar[dict[str, Any]]
    vision_defaults: ClassVar[dict[str, Any]]
    causal_text: ClassVar[bool]

    def __init__(self, config: dict[str, Any], reader: WeightReader) -> None:
        super().__init__()
        text = sub_config(config, "text_config", self.text_defaults)
        tower = TowerConfig.read(text)
        h = tower.hidden_size
        self.hidden_size = h
        self.vocab_size = text.int("vocab_size")
        self.max_positions = text.int("max_position_embeddings")
        prefix = "text_model.embeddings"
        self.word = take_embedding(reader, f"{prefix}.token_embedding", self.vocab_size, h)
        self.position = take_embedding(
            reader, f"{prefix}.position_embedding", self.max_positions, h
        )
        self.layers = encoder_layers(reader, "text_model", tower, causal=self.causal_text)
        self.final_norm = take_layer_norm(
            reader, "text_model.final_layer_norm", h, tower.layer_norm_eps
        )
        self.text_head = self.build_text_head(config, text, reader)
        vision = sub_config(config, "vision_config", self.vision_defaults)
        tower_of_images = self.build_image_tower(config, vision, reader)
        if tower_of_images.embedding_size != self.text_head.out_features:
            raise CheckpointError(
                f"config.json: the image embeddings ({tower_of_images.embedding_size} wide) and "
                f"the text embeddings ({self.text_head.out_features}) differ in width"
            )
        self.image_tower = tower_of_images

    def build_text_head(
        self, config: dict[str, Any], text: ConfigReader, reader: WeightReader
    ) -> Linear:
        raise NotImplementedError

    def build_image_tower(
        self, config: dict[str, Any], vision: ConfigReader, reader: WeightReader
    ) -> ImageTower:
        raise NotImplementedError

    @property
    def pooled_size(self) -> int:
        return self.text_head.out_features

    def project_pooled(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.text_head(pooled.to(self.text_head.weight.dtype)).float()

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        x = F.embedding(batch.input_ids, self.word) + F.embedding(batch.position_ids, self.position)
        for layer in self.layers:
            x = layer(x, meta)
        return self.final_norm(x)

    @classmethod
    def load(cls, config: dict[str, Any], reader: WeightReader) -> TransformerModel:
        return cls(config, reader)
