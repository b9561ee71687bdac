"""Fused elementwise kernels: Triton on CUDA, the same arithmetic in torch elsewhere.

Each function rounds exactly where the unfused Hugging Face code rounds (to the model
dtype after the residual add, after normalizing, after the activation), so fusing changes
how many times memory is touched, not the numbers beyond float32 reassociation.
"""

from .fused import (
    add_layer_norm,
    add_rms_norm,
    gated_activation,
    gated_matmul,
    quantize_fp8_rowwise,
    rotary_qk,
    segment_mean,
)

__all__ = [
    "add_layer_norm",
    "add_rms_norm",
    "gated_activation",
    "gated_matmul",
    "quantize_fp8_rowwise",
    "rotary_qk",
    "segment_mean",
]
