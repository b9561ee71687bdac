"""Dispatch: Triton kernels for CUDA tensors, `reference` for everything else."""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import reference

try:
    from . import triton_kernels
except ImportError:  # pragma: no cover - Triton ships with CUDA torch; CPU-only installs lack it
    triton_kernels = None  # type: ignore[assignment]


def _use_triton(x: torch.Tensor) -> bool:
    return triton_kernels is not None and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16)


def _rows(residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`residual` as `x`'s shape: a row `[H]` (a bias a GEMM that added into `x` left out)
    is added to every token, as a stride-0 view."""
    return residual.expand_as(x) if residual.dim() == 1 else residual


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    gemma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual); `gemma` scales by `1 + w` in float32.
    `residual` `[T, H]`, a row `[H]`, or None."""
    if residual is not None:
        residual = _rows(residual, x)
    if _use_triton(x):
        return triton_kernels.add_rms_norm(x, residual, weight, eps, gemma)
    return reference.add_rms_norm(x, residual, weight, eps, gemma)


def add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """LayerNorm(x + residual) — BERT's post-norm residual. `residual` `[T, H]` or a row
    `[H]`."""
    residual = _rows(residual, x)
    if _use_triton(x):
        return triton_kernels.add_layer_norm(x, residual, weight, bias, eps)
    return reference.add_layer_norm(x, residual, weight, bias, eps)


def gated_activation(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up for `gate_up = [gate | up]`; activation silu, gelu_tanh or gelu."""
    if _use_triton(gate_up):
        return triton_kernels.gated_activation(gate_up, activation)
    return reference.gated_activation(gate_up, activation)


# Bulk batches only: the gated GEMM's tiles are 128 rows tall, and it was measured on
# backfill batches (docs/journal/results-log.md, twelfth session).
GATED_MATMUL_MIN_TOKENS = 4096
# (device, dtype, weight shape, activation) -> whether one gated GEMM beat cuBLAS's GEMM and
# the activation pass on that device, measured the first time such a batch ran.
_gated_matmul_pays: dict[tuple[object, ...], bool] = {}


def gated_matmul(x: torch.Tensor, weight: torch.Tensor, activation: str) -> torch.Tensor | None:
    """act(x W_gate^T) * (x W_up^T) for `weight = [W_gate; W_up]` (no bias) by one Triton
    GEMM whose `[T, 2F]` product never reaches memory; None where the caller should run
    the GEMM and `gated_activation` instead: not a large CUDA batch on Hopper, or the
    kernel was slower there when measured (the first such batch, outside a CUDA graph
    capture, times both; a capture before any measurement takes the two-step path).
    On an H200 it won on qwen3-0.6b's MLP and lost on qwen3-8b's."""
    if not (
        _use_triton(x)
        and x.shape[0] >= GATED_MATMUL_MIN_TOKENS
        and triton_kernels.gated_matmul_supported(x, weight, activation)
    ):
        return None
    key = (x.device, x.dtype, tuple(weight.shape), activation)
    pays = _gated_matmul_pays.get(key)
    if pays is None:
        if torch.cuda.is_current_stream_capturing():
            return None
        pays = _gated_matmul_pays[key] = _gated_matmul_is_faster(x, weight, activation)
    return triton_kernels.gated_matmul(x, weight, activation) if pays else None


def _gated_matmul_is_faster(x: torch.Tensor, weight: torch.Tensor, activation: str) -> bool:
    """Best of three CUDA-event timings of five calls of each way back to back, after one
    call of each (compiles). Back to back, the GPU's queue stays full, so the Triton
    launch's host work (its tensor descriptors) is timed only where it holds the GPU up,
    as in a batch (measured alone, a call's host work lands between the two events)."""

    def two_steps() -> torch.Tensor:
        return gated_activation(torch.nn.functional.linear(x, weight), activation)

    def one_step() -> torch.Tensor:
        return triton_kernels.gated_matmul(x, weight, activation)

    def best_ms(fn: Callable[[], torch.Tensor]) -> float:
        fn()
        times = []
        for _ in range(3):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return min(times)

    return best_ms(one_step) < best_ms(two_steps)


def rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q `[T, Hq, D]` and k `[T, Hk, D]` (rotate-half), after optional per-head
    RMSNorms; angles computed from the positions in float32."""
    if _use_triton(q):
        q, k_out = triton_kernels.rotate_qk(q, k, positions, inv_freq, q_norm, k_norm, eps)
        return q, k_out
    return (
        reference.rotate(q, positions, inv_freq, q_norm, eps),
        reference.rotate(k, positions, inv_freq, k_norm, eps),
    )


def quantize_fp8_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (per-token) E4M3 quantization in one pass: (values, float32 scale `[M, 1]`)."""
    if _use_triton(x):
        return triton_kernels.quantize_fp8_rowwise(x)
    return reference.quantize_fp8_rowwise(x)


def segment_mean(hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Mean pooling over packed sequences in one pass, float32 `[n, H]`."""
    if _use_triton(hidden):
        return triton_kernels.segment_mean(hidden, cu_seqlens)
    return reference.segment_mean(hidden, cu_seqlens)
