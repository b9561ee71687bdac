"""Building blocks shared by every architecture. Platform choices live here, not in models."""

from ..kernels import gated_activation
from .activation import gated_activation_name, get_activation
from .attention import AttentionMetadata, varlen_attention
from .linear import Linear, add_into_stream, add_to_stream, gated_hidden, linear_activation
from .norm import GemmaRMSNorm, LayerNorm, RMSNorm
from .rotary import RopeAngles, RopeConfig, RotaryEmbedding, apply_rotary_qk

__all__ = [
    "AttentionMetadata",
    "GemmaRMSNorm",
    "LayerNorm",
    "Linear",
    "RMSNorm",
    "RopeAngles",
    "RopeConfig",
    "RotaryEmbedding",
    "add_into_stream",
    "add_to_stream",
    "apply_rotary_qk",
    "gated_activation",
    "gated_activation_name",
    "gated_hidden",
    "get_activation",
    "linear_activation",
    "varlen_attention",
]
