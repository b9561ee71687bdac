"""Tier 5 (device): each Triton kernel against its torch reference on random data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trt_tei_runtime.kernels import reference

triton_kernels = pytest.importorskip("trt_tei_runtime.kernels.triton_kernels")

pytestmark = pytest.mark.gpu
DTYPES = [torch.bfloat16, torch.float16]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    # Same rounding points; float32 reductions may differ in order: one ulp of the dtype.
    torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)
    assert not torch.isnan(a).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [64, 384, 1000, 4096])
@pytest.mark.parametrize("gemma", [False, True])
def test_add_rms_norm(dtype, cols, gemma):  # type: ignore[no-untyped-def]
    x = torch.randn(257, cols, device="cuda", dtype=dtype)
    r = torch.randn_like(x)
    w = torch.randn(cols, device="cuda", dtype=dtype)
    for residual in (None, r):
        out, summed = triton_kernels.add_rms_norm(x, residual, w, 1e-6, gemma)
        ref_out, ref_sum = reference.add_rms_norm(x, residual, w, 1e-6, gemma)
        torch.testing.assert_close(summed, ref_sum, rtol=0, atol=0)
        _close(out, ref_out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [384, 1024, 1000])
def test_add_layer_norm(dtype, cols):  # type: ignore[no-untyped-def]
    x, r = (torch.randn(300, cols, device="cuda", dtype=dtype) for _ in range(2))
    w, b = (torch.randn(cols, device="cuda", dtype=dtype) for _ in range(2))
    _close(
        triton_kernels.add_layer_norm(x, r, w, b, 1e-12),
        reference.add_layer_norm(x, r, w, b, 1e-12),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_layer_norm_of_a_broadcast_row(dtype):  # type: ignore[no-untyped-def]
    # A post-norm adds the output bias its GEMM left out as a row with stride 0.
    x = torch.randn(300, 1024, device="cuda", dtype=dtype)
    w, b, row = (torch.randn(1024, device="cuda", dtype=dtype) for _ in range(3))
    _close(
        triton_kernels.add_layer_norm(x, row.expand_as(x), w, b, 1e-12),
        reference.add_layer_norm(x, row, w, b, 1e-12),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_of_a_broadcast_row(dtype):  # type: ignore[no-untyped-def]
    # A pre-norm adds a pending output bias the same way.
    x = torch.randn(300, 1024, device="cuda", dtype=dtype)
    w, row = (torch.randn(1024, device="cuda", dtype=dtype) for _ in range(2))
    out, summed = triton_kernels.add_rms_norm(x, row.expand_as(x), w, 1e-6, False)
    ref_out, ref_sum = reference.add_rms_norm(x, row, w, 1e-6, False)
    torch.testing.assert_close(summed, ref_sum, rtol=0, atol=0)
    _close(out, ref_out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_adds_into_the_stream_in_its_gemm(dtype, with_bias):  # type: ignore[no-untyped-def]
    from trt_tei_runtime.layers import Linear

    x = torch.randn(2048, 1024, device="cuda", dtype=dtype)
    linear = Linear(
        torch.randn(1024, 1024, device="cuda", dtype=dtype) * 0.03,
        torch.randn(1024, device="cuda", dtype=dtype),
    )
    stream = torch.randn(2048, 1024, device="cuda", dtype=dtype)
    expected = stream.float() + linear(x, with_bias=with_bias).float()
    out = linear(x, into=stream, with_bias=with_bias)
    assert out.data_ptr() == stream.data_ptr()
    # One rounding of the sum instead of two: within one half-precision step.
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("ffn", [3072, 1000])
def test_gated_activation(dtype, activation, ffn):  # type: ignore[no-untyped-def]
    gate_up = torch.randn(129, 2 * ffn, device="cuda", dtype=dtype) * 3
    _close(
        triton_kernels.gated_activation(gate_up, activation),
        reference.gated_activation(gate_up, activation),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128, 80])
@pytest.mark.parametrize("with_norm", [False, True])
def test_rotary_on_strided_views(dtype, head_dim, with_norm):  # type: ignore[no-untyped-def]
    tokens, hq, hk = 77, 8, 2
    qkv = torch.randn(tokens, (hq + 2 * hk) * head_dim, device="cuda", dtype=dtype)
    q, k, _ = qkv.split([hq * head_dim, hk * head_dim, hk * head_dim], dim=-1)
    q, k = q.view(tokens, hq, head_dim), k.view(tokens, hk, head_dim)
    positions = torch.randint(0, 30000, (tokens,), device="cuda")
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device="cuda").float() / head_dim))
    w = torch.randn(head_dim, device="cuda", dtype=dtype) if with_norm else None
    for x in (q, k):
        ours = triton_kernels.rotate(x, positions, inv_freq, w, 1e-6)
        _close(ours, reference.rotate(x, positions, inv_freq, w, 1e-6))
    # q and k in one launch, each with its own norm weight (Qwen3's q_norm / k_norm).
    wk = torch.randn(head_dim, device="cuda", dtype=dtype) if with_norm else None
    ours_q, ours_k = triton_kernels.rotate_qk(q, k, positions, inv_freq, w, wk, 1e-6)
    _close(ours_q, reference.rotate(q, positions, inv_freq, w, 1e-6))
    _close(ours_k, reference.rotate(k, positions, inv_freq, wk, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_attention_native_gqa_matches_repeated_heads(dtype):  # type: ignore[no-untyped-def]
    from torch.nn.attention.varlen import varlen_attn

    lengths = [5, 130, 64, 1]
    cu = torch.tensor(
        [0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32
    )
    tokens = sum(lengths)
    q = torch.randn(tokens, 16, 128, device="cuda", dtype=dtype)
    k, v = (torch.randn(tokens, 4, 128, device="cuda", dtype=dtype) for _ in range(2))
    for window in ((-1, -1), (-1, 0)):
        native = varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths), window_size=window)
        repeated = varlen_attn(
            q,
            k.repeat_interleave(4, 1),
            v.repeat_interleave(4, 1),
            cu,
            cu,
            max(lengths),
            max(lengths),
            window_size=window,
        )
        torch.testing.assert_close(native, repeated, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "lengths", [[24], [3, 17, 9, 1, 128], [512, 64, 300, 77, 511]], ids=["query", "small", "long"]
)
def test_packed_attention_takes_triton_and_matches_flash(dtype, causal, lengths, monkeypatch):  # type: ignore[no-untyped-def]
    """Packed batches run the Triton kernel (FlashAttention 2 is not called) and agree with
    FlashAttention 2, with a CUDA graph's layout: empty sequences after the real ones."""
    from trt_tei_runtime.layers import attention

    torch.manual_seed(0)
    tokens = sum(lengths)
    ends = torch.tensor(lengths).cumsum(0).tolist()
    cu = torch.tensor([0, *ends, tokens, tokens], device="cuda", dtype=torch.int32)
    q = torch.randn(tokens, 16, 128, device="cuda", dtype=dtype)
    k, v = (torch.randn(tokens, 8, 128, device="cuda", dtype=dtype) for _ in range(2))
    meta = attention.AttentionMetadata.build(cu, max(lengths), packed=True)
    expected = attention._flash(q, k, v, meta, causal, None, None)

    def no_flash(*args):  # type: ignore[no-untyped-def]
        raise AssertionError("FlashAttention 2 ran on a packed CUDA batch")

    monkeypatch.setattr(attention, "_flash", no_flash)
    ours = attention.varlen_attention(q, k, v, meta, causal=causal)
    torch.testing.assert_close(ours, expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"), [(16, 16, 64), (16, 8, 128), (4, 1, 256)]
)
@pytest.mark.parametrize(
    ("causal", "window", "softcap"),
    [
        (False, None, None),
        (True, None, None),
        (True, 100, None),
        (False, 48, None),
        (True, None, 30.0),
    ],
)
def test_block_table_attention_equals_the_grid_kernel(  # type: ignore[no-untyped-def]
    dtype, heads, kv_heads, head_dim, causal, window, softcap
):
    """The persistent block-table kernel (the bulk graphs') computes every listed block as
    the grid kernel does, bit for bit, with a graph's layout: a junk sequence and empty
    slots after the real ones, not listed in the table."""
    from trt_tei_runtime.layers import triton_attention as ta

    torch.manual_seed(0)
    lengths = [512, 64, 300, 1, 77, 1000, 128, 3]
    real = sum(lengths)
    bucket = real + 50  # the junk sequence: the bucket's padding
    ends = torch.tensor(lengths).cumsum(0).tolist()
    cu_host = np.array([0, *ends, bucket, bucket, bucket], np.int32)
    table_host = np.zeros(ta.block_table_capacity(bucket, cu_host.size), np.int32)
    ta.fill_block_table(cu_host[: len(lengths) + 1], table_host)
    cu = torch.from_numpy(cu_host).cuda()
    table = torch.from_numpy(table_host).cuda()
    q = torch.randn(bucket, heads, head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(bucket, kv_heads, head_dim, device="cuda", dtype=dtype) for _ in "kv")
    options = {"causal": causal, "sliding_window": window, "scale": head_dim**-0.5}
    grid = ta.attention(q, k, v, cu, max(lengths), softcap=softcap, **options)
    # A graph's static metadata: the bucket's whole length as the longest sequence; as
    # many programs as the device holds, or a few, each then taking many blocks in turn.
    for programs in (None, 7):
        ours = ta.attention(
            q, k, v, cu, bucket, softcap=softcap, block_table=table, programs=programs, **options
        )
        torch.testing.assert_close(ours[:real], grid[:real], rtol=0, atol=0)
        assert not torch.isnan(ours[:real]).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [1024, 3072, 12288, 1000])
def test_quantize_fp8_rowwise(dtype, cols):  # type: ignore[no-untyped-def]
    x = (
        torch.randn(333, cols, device="cuda", dtype=dtype)
        * torch.rand(333, 1, device="cuda", dtype=dtype)
        * 10
    )
    q, scale = triton_kernels.quantize_fp8_rowwise(x)
    ref_q, ref_scale = reference.quantize_fp8_rowwise(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (333, 1)
    torch.testing.assert_close(scale, ref_scale, rtol=0, atol=0)
    # Triton's float32 division may differ from IEEE by an ulp: a value on a rounding
    # boundary can land on the neighbouring E4M3 step, nothing more.
    differ = q.float() != ref_q.float()
    assert differ.float().mean() < 1e-3
    step = (ref_q.float().abs() / 8).clamp(min=2**-9)
    assert ((q.float() - ref_q.float()).abs() <= step)[differ].all()
    dequantized = q.float() * scale
    assert ((dequantized - x.float()).abs() <= x.float().abs().amax(1, keepdim=True) / 16).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gelu_epilogue_matches_exact_gelu(dtype):  # type: ignore[no-untyped-def]
    from trt_tei_runtime.layers import Linear, linear_activation

    x = torch.randn(24, 1024, device="cuda", dtype=dtype)
    linear = Linear(
        torch.randn(4096, 1024, device="cuda", dtype=dtype) * 0.03,
        torch.randn(4096, device="cuda", dtype=dtype) * 0.1,
    )
    calls: list[object] = []
    linear.register_forward_pre_hook(lambda module, args: calls.append(module))
    fused = linear_activation(linear, x, "gelu", torch.nn.functional.gelu)
    assert calls == [linear], "the fused GEMM runs through the module: the gate's hooks fire"
    exact = torch.nn.functional.gelu(linear(x).float())
    # tanh-form GELU in the epilogue against erf GELU: within half-precision rounding.
    torch.testing.assert_close(fused.float(), exact, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden_size", [384, 1024, 1000])
def test_segment_mean(dtype, hidden_size):  # type: ignore[no-untyped-def]
    lengths = [1, 24, 513, 7, 100]
    cu = torch.tensor(
        [0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32
    )
    hidden = torch.randn(sum(lengths), hidden_size, device="cuda", dtype=dtype)
    ours = triton_kernels.segment_mean(hidden, cu)
    assert ours.dtype == torch.float32 and ours.shape == (len(lengths), hidden_size)
    torch.testing.assert_close(ours, reference.segment_mean(hidden, cu), rtol=1e-5, atol=1e-5)


def test_segment_mean_of_empty_sequences_is_zero():  # type: ignore[no-untyped-def]
    """A CUDA graph pools over its unused sequence slots too (empty, at the end)."""
    hidden = torch.randn(10, 384, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 4, 10, 10, 10], device="cuda", dtype=torch.int32)
    ours = triton_kernels.segment_mean(hidden, cu)
    assert ours[2:].abs().max() == 0
    torch.testing.assert_close(ours, reference.segment_mean(hidden, cu), rtol=1e-5, atol=1e-5)


def _gated_reference(x: torch.Tensor, w: torch.Tensor, activation: str) -> torch.Tensor:
    return reference.gated_activation(torch.nn.functional.linear(x, w), activation)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize(
    ("rows", "hidden", "ffn"), [(300, 64, 200), (4096, 1024, 3072), (129, 72, 64)]
)
def test_gated_matmul(dtype, activation, rows, hidden, ffn):  # type: ignore[no-untyped-def]
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper or later")
    gen = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, hidden, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(2 * ffn, hidden, device="cuda", generator=gen) * hidden**-0.5).to(dtype)
    assert triton_kernels.gated_matmul_supported(x, w, activation)
    out = triton_kernels.gated_matmul(x, w, activation)
    assert out.shape == (rows, ffn) and out.dtype == dtype
    # Same rounding points; the GEMMs sum in another order: a few ulps of the dtype.
    torch.testing.assert_close(
        out.float(), _gated_reference(x, w, activation).float(), rtol=2e-2, atol=2e-2
    )


def test_gated_matmul_runs_where_it_measured_faster(monkeypatch):  # type: ignore[no-untyped-def]
    from trt_tei_runtime.kernels import fused

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper or later")
    monkeypatch.setattr(fused, "_gated_matmul_pays", {})
    w = (torch.randn(2 * 256, 128, device="cuda") * 0.1).bfloat16()
    small = torch.randn(fused.GATED_MATMUL_MIN_TOKENS - 1, 128, device="cuda").bfloat16()
    assert fused.gated_matmul(small, w, "silu") is None  # queries keep the two steps
    assert fused._gated_matmul_pays == {}
    x = torch.randn(fused.GATED_MATMUL_MIN_TOKENS, 128, device="cuda").bfloat16()
    out = fused.gated_matmul(x, w, "silu")
    (pays,) = fused._gated_matmul_pays.values()  # measured once, then remembered
    assert (out is not None) == pays
    for forced in (True, False):
        fused._gated_matmul_pays[next(iter(fused._gated_matmul_pays))] = forced
        out = fused.gated_matmul(x, w, "silu")
        if forced:
            assert out is not None
            torch.testing.assert_close(
                out.float(), _gated_reference(x, w, "silu").float(), rtol=2e-2, atol=2e-2
            )
        else:
            assert out is None
    assert fused.gated_matmul(x, w, "gelu") is None  # an activation the kernel lacks
