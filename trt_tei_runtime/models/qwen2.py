"""Qwen2: Llama's decoder with biases on the query/key/value projections and optional
sliding-window layers (`use_sliding_window`, from layer `max_window_layers` on)."""

from __future__ import annotations

from typing import Any, ClassVar

from .config import ConfigReader
from .decoder import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    DecoderConfig,
    DecoderModel,
    layer_windows,
)


def qwen_sliding_windows(data: dict[str, Any]) -> tuple[int | None, ...]:
    """Qwen2/Qwen3: no window unless `use_sliding_window`; then `layer_types`, or every
    layer from `max_window_layers` on."""
    cfg = ConfigReader(data)
    layers = cfg.int("num_hidden_layers")
    use_window = data.get("use_sliding_window") is True
    window = cfg.optional_int("sliding_window", 4096) if use_window else None
    first_sliding = cfg.int("max_window_layers", 28)
    default = [
        SLIDING_ATTENTION if window is not None and i >= first_sliding else FULL_ATTENTION
        for i in range(layers)
    ]
    return layer_windows(data, layers, window, default)


class Qwen2Config(DecoderConfig):
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecoderConfig:
        return cls.parse(data, qkv_bias=True, sliding_windows=qwen_sliding_windows(data))


class Qwen2Model(DecoderModel):
    config_cls: ClassVar[type[DecoderConfig]] = Qwen2Config
