"""Tier 5 (device): decoder families on CUDA in bfloat16 against transformers in float32.

Run with `make test_gpu` on a machine with a GPU; CI skips these.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints import hf_decoder_outputs, make_decoder_checkpoint, random_ids, tokenizer
from reference import cosine
from test_decoders import LLAMA3_ROPE, QUERY, _model_card_ids

from trt_tei_runtime import Model
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.runtime import load_executor

pytestmark = pytest.mark.gpu

LENGTHS = [3, 70, 200, 1, 33]
EMBEDDERS = {
    "llama-rope-llama3": ("LlamaModel", {"rope_scaling": LLAMA3_ROPE}),
    "mistral-sliding-window": ("MistralModel", {"sliding_window": 16}),
    "qwen2-sliding-layers": (
        "Qwen2Model",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
    ),
    "qwen2-bidirectional": ("Qwen2Model", {"is_causal": False}),
    "qwen3-causal-lm": ("Qwen3ForCausalLM", {}),
    "gemma2-sliding-softcap": ("Gemma2Model", {}),
    "gemma2-bidirectional": ("Gemma2Model", {"is_causal": False}),
}
CLASSIFIERS = {
    "LlamaForSequenceClassification": 3,
    "MistralForSequenceClassification": 1,
    "Qwen2ForSequenceClassification": 2,
    "Qwen3ForSequenceClassification": 1,
}


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("case", sorted(EMBEDDERS))
def test_decoder_bf16_hidden_states(tmp_path, case, graphs):  # type: ignore[no-untyped-def]
    arch, overrides = EMBEDDERS[case]
    folder = make_decoder_checkpoint(tmp_path, arch, **overrides)
    model = load_executor(
        folder, device="cuda", dtype="bfloat16", cuda_graphs=graphs, max_num_tokens=512
    )
    assert (model.bulk.graphs is not None) == graphs
    assert model.bulk.packed_attention, "bfloat16 on CUDA must use varlen FlashAttention"
    ids = random_ids(LENGTHS, seed=1)
    ours = model.hidden_states(PackedBatch.from_sequences(ids)).float().cpu()
    expected = torch.cat(hf_decoder_outputs(folder, ids))
    assert cosine(ours, expected).min() >= 0.999
    pooled = model.embed(PackedBatch.from_sequences(ids)).cpu()
    assert cosine(pooled, expected[np.cumsum(LENGTHS) - 1]).min() >= 0.999


@pytest.mark.parametrize("case", sorted(EMBEDDERS))
def test_decoder_bulk_graphs_equal_eager(tmp_path, case):  # type: ignore[no-untyped-def]
    """A batch above MAX_GRAPH_TOKENS replays the bulk graphs (attention from a block
    table: causal, sliding windows, soft-capping, grouped k/v heads) and gives an eager
    pass's hidden states."""
    arch, overrides = EMBEDDERS[case]
    folder = make_decoder_checkpoint(tmp_path, arch, **overrides)
    graphs = load_executor(folder, device="cuda", dtype="bfloat16", max_num_tokens=4096)
    eager = load_executor(folder, device="cuda", dtype="bfloat16", cuda_graphs=False)
    lengths = [256, 3, 200, 1, 255, 70] * 6  # 4,710 tokens: two batches of the bulk graphs
    ids = random_ids(lengths, seed=3)
    for part in (ids[:18], ids[18:]):
        batch = PackedBatch.from_sequences(part)
        assert graphs.bulk.large_graphs is not None and graphs.bulk.large_graphs.can_run(batch)
        assert batch.num_tokens > 2048
        ours = graphs.hidden_states(batch).float().cpu()
        expected = eager.hidden_states(batch).float().cpu()
        assert cosine(ours, expected).min() >= 0.999


def test_decoder_bulk_batches_through_the_gated_gemm(tmp_path, forced_gated_gemm):  # type: ignore[no-untyped-def]
    """A bulk batch large enough for the gated GEMM (`kernels.gated_matmul`, forced on here
    whatever it measures) against transformers."""
    from trt_tei_runtime.kernels import fused

    calls = forced_gated_gemm
    folder = make_decoder_checkpoint(tmp_path, "Qwen3Model")
    model = load_executor(folder, device="cuda", dtype="bfloat16", cuda_graphs=False)
    lengths = [200] * 22  # 4,400 tokens
    assert sum(lengths) >= fused.GATED_MATMUL_MIN_TOKENS
    ids = random_ids(lengths, seed=5)
    calls.clear()
    ours = model.hidden_states(PackedBatch.from_sequences(ids)).float().cpu()
    assert calls, "the gated GEMM did not run"
    expected = torch.cat(hf_decoder_outputs(folder, ids))
    assert cosine(ours, expected).min() >= 0.999


@pytest.mark.parametrize("arch", sorted(CLASSIFIERS))
def test_decoder_bf16_classifier_logits(tmp_path, arch):  # type: ignore[no-untyped-def]
    folder = make_decoder_checkpoint(tmp_path, arch, num_labels=CLASSIFIERS[arch])
    model = load_executor(folder, device="cuda", dtype="bfloat16")
    ids = random_ids(LENGTHS, seed=2)
    ours = model.predict(PackedBatch.from_sequences(ids)).cpu()
    expected = torch.stack(hf_decoder_outputs(folder, ids))
    assert (ours - expected).abs().max() <= 0.05 * expected.abs().max() + 0.02
    if CLASSIFIERS[arch] > 1:
        assert cosine(ours, expected).min() >= 0.999


def test_yes_no_reranker_bf16(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_decoder_checkpoint(tmp_path, "Qwen3ForCausalLM", tie_word_embeddings=True)
    model = Model(folder, device="cuda", dtype="bfloat16", task="rerank-yes-no")
    docs = ["paris is the capital of france", "the cat sat on the mat", "yes", "no no no"]
    tok = tokenizer()
    yes_no = (tok.token_to_id("no"), tok.token_to_id("yes"))
    ids = [_model_card_ids(QUERY, d) for d in docs]
    expected = torch.cat(hf_decoder_outputs(folder, ids, yes_no=yes_no)).numpy()
    raw = model.predict([(QUERY, d) for d in docs], raw_scores=True)[:, 0]
    assert np.abs(raw - expected).max() <= 0.05 * np.abs(expected).max() + 0.02


@pytest.mark.parametrize("case", ["gemma2-sliding-softcap", "qwen2-sliding-layers"])
def test_decoder_fp32_on_gpu_matches_cpu(tmp_path, case):  # type: ignore[no-untyped-def]
    arch, overrides = EMBEDDERS[case]
    folder = make_decoder_checkpoint(tmp_path, arch, **overrides)
    ids = random_ids(LENGTHS, seed=3)
    gpu = load_executor(folder, device="cuda", dtype="float32")
    cpu = load_executor(folder, device="cpu")
    a = gpu.hidden_states(PackedBatch.from_sequences(ids)).cpu()
    b = cpu.hidden_states(PackedBatch.from_sequences(ids))
    assert cosine(a, b).min() >= 0.99999


@pytest.mark.parametrize("softcap", [3.0, None], ids=["softcap", "plain"])
@pytest.mark.parametrize("head_dim", [16, 80, 256])
@pytest.mark.parametrize(
    "causal, window", [(True, None), (True, 7), (False, None), (False, 5)], ids=str
)
def test_triton_attention_matches_padded_reference(head_dim, causal, window, softcap):  # type: ignore[no-untyped-def]
    """The Triton kernel against the padded paths (explicit scores, SDPA), float32 inputs."""
    from trt_tei_runtime.layers import attention
    from trt_tei_runtime.layers.triton_attention import attention as triton_attention

    torch.manual_seed(0)
    lengths = [1, 130, 3, 64, 17]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32).cuda()
    tokens = int(cu[-1])
    q = torch.randn(tokens, 8, head_dim, device="cuda", dtype=torch.bfloat16) * 2
    k = torch.randn(tokens, 2, head_dim, device="cuda", dtype=torch.bfloat16) * 2
    v = torch.randn(tokens, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    kwargs = dict(causal=causal, sliding_window=window, scale=0.2, softcap=softcap)
    ours = triton_attention(q, k, v, cu, max(lengths), **kwargs).float()
    meta = attention.AttentionMetadata.build(cu, max(lengths), packed=False)
    ref = attention.varlen_attention(q.float(), k.float(), v.float(), meta, **kwargs)
    assert (ours - ref).abs().max() <= 2e-2
    assert cosine(ours.flatten(1), ref.flatten(1)).min() >= 0.9999
