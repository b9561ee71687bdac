"""Qwen2: Llama's decoder with biases on the query/key/value projections and optional
sliding-window layers (`use_sliding_window`, from layer `max_window_layers` on)."""

from __future__ import annotations

from typing import Any, ClassVar

from .base import ConfigReader
from .llama import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    DecoderSequenceClassification,
    LlamaConfig,
    LlamaModel,
    YesNoReranker,
    layer_windows,
    optional_positive_int,
)


def qwen_sliding_windows(data: dict[str, Any]) -> tuple[int | None, ...]:
    """Qwen2/Qwen3: no window unless `use_sliding_window`; then `layer_types`, or every
    layer from `max_window_layers` on."""
    cfg = ConfigReader(data)
    layers = cfg.int("num_hidden_layers")
    use_window = data.get("use_sliding_window") is True
    window = optional_positive_int(data, "sliding_window", 4096) if use_window else None
    first_sliding = cfg.int("max_window_layers", 28)
    default = [
        SLIDING_ATTENTION if window is not None and i >= first_sliding else FULL_ATTENTION
        for i in range(layers)
    ]
    return layer_windows(data, layers, window, default)


class Qwen2Config(LlamaConfig):
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlamaConfig:
        return cls.parse(data, qkv_bias=True, sliding_windows=qwen_sliding_windows(data))


class Qwen2Model(LlamaModel):
    config_cls: ClassVar[type[LlamaConfig]] = Qwen2Config


class Qwen2ForCausalLM(Qwen2Model):
    unused: ClassVar[tuple[str, ...]] = (*Qwen2Model.unused, r"^lm_head\.")


class Qwen2ForSequenceClassification(DecoderSequenceClassification, Qwen2Model):
    pass


class Qwen2YesNoReranker(YesNoReranker, Qwen2Model):
    pass
