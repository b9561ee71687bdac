"""The linear layers' residual contract (`Linear.forward(x, into=, with_bias=)`): every
linear a model may hold (plain, FP8, with LoRA adapters) adds its output into the residual
stream in place, with or without its bias, and the norms take the bias back as a row."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trt_tei_runtime.layers import LayerNorm, Linear
from trt_tei_runtime.layers.fp8 import Fp8Linear
from trt_tei_runtime.layers.lora import AdaptedLinear, AdapterSelection, LowRankDelta

TOKENS, IN, OUT = 7, 16, 12


def _linear(bias: bool = True) -> Linear:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(OUT, IN, generator=g)
    return Linear(weight, torch.randn(OUT, generator=g) if bias else None)


def _adapted(selection: AdapterSelection) -> AdaptedLinear:
    g = torch.Generator().manual_seed(1)
    # Two adapters of rank 2, stacked: rows 0-1 belong to adapter 1, rows 2-3 to adapter 2.
    delta = LowRankDelta(
        torch.randn(4, IN, generator=g),
        torch.randn(OUT, 4, generator=g),
        torch.tensor([1, 1, 2, 2]),
    )
    return AdaptedLinear(_linear(), delta, selection)


def _cases() -> list[tuple[str, torch.nn.Module]]:
    selection = AdapterSelection()
    selection.token_adapters = torch.tensor([0, 1, 2, 1, 0, 2, 2])
    return [
        ("linear", _linear()),
        ("linear without bias", _linear(bias=False)),
        ("fp8", Fp8Linear.from_linear(_linear())),
        ("adapted", _adapted(selection)),
    ]


@pytest.mark.parametrize("name,linear", _cases(), ids=[name for name, _ in _cases()])
@pytest.mark.parametrize("with_bias", [True, False])
def test_a_linear_adds_into_the_stream_in_place(name, linear, with_bias):  # type: ignore[no-untyped-def]
    x = torch.randn(TOKENS, IN)
    stream = torch.randn(TOKENS, OUT)
    before = stream.clone()
    plain = linear(x)
    bias = linear.bias
    expected = before + plain - (0 if with_bias or bias is None else bias)

    out = linear(x, into=stream, with_bias=with_bias)

    assert out.data_ptr() == stream.data_ptr(), "the sum must be written into the stream"
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_with_bias_false_without_a_stream_leaves_the_bias_out():  # type: ignore[no-untyped-def]
    linear = _linear()
    x = torch.randn(TOKENS, IN)
    torch.testing.assert_close(linear(x, with_bias=False), F.linear(x, linear.weight))


def test_layer_norm_adds_a_row_to_every_token():  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(2)
    norm = LayerNorm(torch.rand(OUT, generator=g) + 0.5, torch.randn(OUT, generator=g), 1e-12)
    x, row = torch.randn(TOKENS, OUT, generator=g), torch.randn(OUT, generator=g)
    expected = F.layer_norm(x + row, (OUT,), norm.weight, norm.bias, 1e-12)
    torch.testing.assert_close(norm(x, residual=row), expected)
