"""The torch versions of the fused kernels: run on CPU and define the numbers."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    gemma: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    summed = x if residual is None else x + residual
    xf = summed.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if gemma:
        return (xf * (1.0 + weight.float())).to(x.dtype), summed
    return weight * xf.to(x.dtype), summed


def add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    summed = x + residual
    return F.layer_norm(summed, (summed.shape[-1],), weight, bias, eps)


def gated_activation(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "silu":
        act = F.silu(gate)
    elif activation == "gelu_tanh":
        act = F.gelu(gate, approximate="tanh")
    else:
        act = F.gelu(gate)
    return act * up


def rotate(
    x: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    norm_weight: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """Optional per-head RMSNorm (Qwen3's q/k norm), then rotate-half RoPE, `[T, H, D]`."""
    if norm_weight is not None:
        x = add_rms_norm(x, None, norm_weight, eps, gemma=False)[0]
    freqs = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448


def quantize_fp8_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x [M, K]` → (E4M3 values, float32 scale `[M, 1]`) with x ≈ values * scale."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def segment_mean(hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Mean of each sequence's rows of `hidden [T, H]`, accumulated in float32 → `[n, H]`."""
    starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
    lengths = ends - starts
    # output_size: no device-to-host sync to learn the length (it is the token count).
    seq_of_token = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=hidden.device), lengths, output_size=hidden.shape[0]
    )
    sums = torch.zeros(
        (lengths.numel(), hidden.shape[1]), dtype=torch.float32, device=hidden.device
    )
    sums.index_add_(0, seq_of_token, hidden.float())
    return sums / lengths.clamp(min=1)[:, None].float()  # an empty sequence: zeros
