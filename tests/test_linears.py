"""The residual add through a linear layer (`add_to_stream`, `add_into_stream`,
`Linear.forward(x, into=, with_bias=)`): a plain linear adds its product into the residual
stream itself and leaves its bias pending; FP8 and LoRA linears leave their whole output
pending; the norms add whatever is pending. Each way gives `stream + linear(x)`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trt_tei_runtime.layers import (
    LayerNorm,
    Linear,
    RMSNorm,
    add_into_stream,
    add_to_stream,
)
from trt_tei_runtime.layers.fp8 import Fp8Linear
from trt_tei_runtime.layers.lora import AdaptedLinear, AdapterSelection, LowRankDelta

TOKENS, IN, OUT = 7, 16, 12


def _linear(bias: bool = True) -> Linear:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(OUT, IN, generator=g)
    return Linear(weight, torch.randn(OUT, generator=g) if bias else None)


def _adapted() -> AdaptedLinear:
    g = torch.Generator().manual_seed(1)
    selection = AdapterSelection()
    selection.token_adapters = torch.tensor([0, 1, 2, 1, 0, 2, 2])
    # Two adapters of rank 2, stacked: rows 0-1 belong to adapter 1, rows 2-3 to adapter 2.
    down, up = torch.randn(4, IN, generator=g), torch.randn(OUT, 4, generator=g)
    return AdaptedLinear(_linear(), LowRankDelta(down, up, torch.tensor([1, 1, 2, 2])), selection)


CASES = {
    "linear": _linear,
    "linear without bias": lambda: _linear(bias=False),
    "fp8": lambda: Fp8Linear.from_linear(_linear()),
    "adapted": _adapted,
}


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(TOKENS, IN, generator=g), torch.randn(TOKENS, OUT, generator=g)


@pytest.mark.parametrize("case", CASES)
def test_stream_plus_pending_is_stream_plus_the_linear(case):  # type: ignore[no-untyped-def]
    linear = CASES[case]()
    x, stream = _inputs()
    expected = stream + linear(x)

    pending, summed = add_to_stream(linear, x, stream.clone())

    total = summed if pending is None else summed + pending
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-5)


def test_a_plain_linear_adds_its_product_into_the_stream_and_leaves_its_bias():  # type: ignore[no-untyped-def]
    linear = _linear()
    x, stream = _inputs()
    before = stream.clone()

    pending, summed = add_to_stream(linear, x, stream)

    assert summed.data_ptr() == stream.data_ptr(), "the product must be added in place"
    assert pending is linear.bias
    torch.testing.assert_close(summed, before + F.linear(x, linear.weight))


@pytest.mark.parametrize("case", ["fp8", "adapted"])
def test_other_linears_leave_the_stream_alone(case):  # type: ignore[no-untyped-def]
    linear = CASES[case]()
    x, stream = _inputs()
    before = stream.clone()

    pending, summed = add_to_stream(linear, x, stream)

    torch.testing.assert_close(summed, before, rtol=0, atol=0)
    assert pending is not None
    torch.testing.assert_close(pending, linear(x))


@pytest.mark.parametrize("case", CASES)
def test_add_into_stream_writes_the_whole_sum(case):  # type: ignore[no-untyped-def]
    linear = CASES[case]()
    x, stream = _inputs()
    expected = stream + linear(x)
    out = add_into_stream(linear, x, stream)
    assert out.data_ptr() == stream.data_ptr()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_linear_into_and_without_bias():  # type: ignore[no-untyped-def]
    linear = _linear()
    x, stream = _inputs()
    torch.testing.assert_close(linear(x, with_bias=False), F.linear(x, linear.weight))
    expected = stream + linear(x)
    out = linear(x, into=stream)
    assert out.data_ptr() == stream.data_ptr()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_layer_norm_adds_a_row_to_every_token():  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(2)
    norm = LayerNorm(torch.rand(OUT, generator=g) + 0.5, torch.randn(OUT, generator=g), 1e-12)
    x, row = torch.randn(TOKENS, OUT, generator=g), torch.randn(OUT, generator=g)
    expected = F.layer_norm(x + row, (OUT,), norm.weight, norm.bias, 1e-12)
    torch.testing.assert_close(norm(x, residual=row), expected)


@pytest.mark.parametrize("pending", ["none", "row", "tensor"])
def test_rms_norm_adds_whatever_is_pending(pending):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(4)
    norm = RMSNorm(torch.rand(OUT, generator=g) + 0.5, 1e-6)
    stream = torch.randn(TOKENS, OUT, generator=g)
    added = {
        "none": None,
        "row": torch.randn(OUT, generator=g),
        "tensor": torch.randn(TOKENS, OUT, generator=g),
    }[pending]
    total = stream if added is None else stream + added

    normed, summed = norm.add_and_norm(added, stream)

    torch.testing.assert_close(summed, total)
    torch.testing.assert_close(normed, norm(total))


def test_the_gated_gemm_is_a_cuda_path_only():  # type: ignore[no-untyped-def]
    import torch

    from trt_tei_runtime.kernels import fused, gated_activation
    from trt_tei_runtime.layers import Linear, gated_hidden

    x = torch.randn(fused.GATED_MATMUL_MIN_TOKENS, 16)
    linear = Linear(torch.randn(2 * 24, 16), None)
    assert fused.gated_matmul(x, linear.weight, "silu") is None
    assert torch.equal(gated_hidden(x, linear, "silu"), gated_activation(linear(x), "silu"))
