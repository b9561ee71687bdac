"""Building blocks shared by every architecture. Platform choices live here, not in models."""

from .activation import get_activation
from .attention import AttentionMetadata, varlen_attention
from .linear import Linear
from .norm import GemmaRMSNorm, LayerNorm, RMSNorm
from .rotary import RopeConfig, RotaryEmbedding, apply_rotary

__all__ = [
    "AttentionMetadata",
    "GemmaRMSNorm",
    "LayerNorm",
    "Linear",
    "RMSNorm",
    "RopeConfig",
    "RotaryEmbedding",
    "apply_rotary",
    "get_activation",
    "varlen_attention",
]
