"""Building blocks shared by every architecture. Platform choices live here, not in models."""

from .activation import get_activation
from .attention import AttentionMetadata, varlen_attention
from .linear import Linear
from .norm import LayerNorm, RMSNorm

__all__ = [
    "AttentionMetadata",
    "LayerNorm",
    "Linear",
    "RMSNorm",
    "get_activation",
    "varlen_attention",
]
