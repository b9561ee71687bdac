"""pytest-benchmark micro-benchmarks of the fused kernels against their torch references.

    python -m pytest benchmarks/bench_kernels.py --benchmark-columns=median,ops -p no:cacheprovider

Reports only; CI does not run it (needs CUDA and pytest-benchmark).
"""

from __future__ import annotations

import pytest
import torch

from trt_tei_runtime.kernels import reference, triton_kernels

if not torch.cuda.is_available():
    pytest.skip("kernel benchmarks need CUDA", allow_module_level=True)

TOKENS = 16384
IMPLS = {"triton": triton_kernels, "torch": reference}


def _sync(fn):  # type: ignore[no-untyped-def]
    def run():  # type: ignore[no-untyped-def]
        out = fn()
        torch.cuda.synchronize()
        return out

    return run


@pytest.mark.parametrize("impl", IMPLS)
def test_add_rms_norm_1024(benchmark, impl):  # type: ignore[no-untyped-def]
    x, r = (torch.randn(TOKENS, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    benchmark(_sync(lambda: IMPLS[impl].add_rms_norm(x, r, w, 1e-6, False)))


@pytest.mark.parametrize("impl", IMPLS)
def test_add_layer_norm_1024(benchmark, impl):  # type: ignore[no-untyped-def]
    x, r = (torch.randn(TOKENS, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w, b = (torch.randn(1024, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    benchmark(_sync(lambda: IMPLS[impl].add_layer_norm(x, r, w, b, 1e-12)))


@pytest.mark.parametrize("impl", IMPLS)
def test_silu_and_mul_3072(benchmark, impl):  # type: ignore[no-untyped-def]
    gate_up = torch.randn(TOKENS, 2 * 3072, device="cuda", dtype=torch.bfloat16)
    benchmark(_sync(lambda: IMPLS[impl].gated_activation(gate_up, "silu")))


@pytest.mark.parametrize("impl", IMPLS)
def test_qk_norm_rotary_qwen3_q(benchmark, impl):  # type: ignore[no-untyped-def]
    q = torch.randn(TOKENS, 16, 128, device="cuda", dtype=torch.bfloat16)
    positions = torch.arange(TOKENS, device="cuda") % 512
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    benchmark(_sync(lambda: IMPLS[impl].rotate(q, positions, inv_freq, w, 1e-6)))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("cols", [4096, 12288])
def test_quantize_fp8_rowwise(benchmark, impl, cols):  # type: ignore[no-untyped-def]
    x = torch.randn(TOKENS, cols, device="cuda", dtype=torch.bfloat16)
    benchmark(_sync(lambda: IMPLS[impl].quantize_fp8_rowwise(x)))


@pytest.mark.parametrize("impl", IMPLS)
def test_segment_mean_1024(benchmark, impl):  # type: ignore[no-untyped-def]
    lengths = torch.full((64,), TOKENS // 64)
    cu = torch.cat([torch.zeros(1), lengths.cumsum(0)]).to(device="cuda", dtype=torch.int32)
    hidden = torch.randn(TOKENS, 1024, device="cuda", dtype=torch.bfloat16)
    benchmark(_sync(lambda: IMPLS[impl].segment_mean(hidden, cu)))
