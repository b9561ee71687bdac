"""Device tier: the issue-15 families on CUDA in bfloat16, eager and with CUDA graphs,
against transformers (and peft) in float32. Run with `make test_gpu`; CI skips these."""

from __future__ import annotations

import pytest
import torch
from checkpoints import add_jina_adapters, hf_jina_outputs, make_family_checkpoint
from reference import cosine, hf_encoder_outputs
from test_families import CASES, _hf_hidden, _ids

from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.runtime import load_executor

pytestmark = pytest.mark.gpu

LENGTHS = [3, 70, 120, 1, 33]


def _bf16(folder, graphs):  # type: ignore[no-untyped-def]
    executor = load_executor(
        folder, device="cuda", dtype="bfloat16", cuda_graphs=graphs, max_num_tokens=512
    )
    assert (executor.bulk.graphs is not None) == graphs
    assert executor.bulk.packed_attention
    return executor


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_family_bf16_hidden_states(tmp_path, case, graphs):  # type: ignore[no-untyped-def]
    arch, overrides = CASES[case]
    folder = make_family_checkpoint(tmp_path, arch, **overrides)
    executor = _bf16(folder, graphs)
    ids = _ids(LENGTHS, executor.model.network.vocab_size, seed=1)
    ours = executor.hidden_states(PackedBatch.from_sequences(ids)).float().cpu()
    assert cosine(ours, _hf_hidden(folder, ids)).min() >= 0.999


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_modernbert_classifier_bf16(tmp_path, graphs):  # type: ignore[no-untyped-def]
    folder = make_family_checkpoint(
        tmp_path, "ModernBertForSequenceClassification", num_labels=3, classifier_pooling="mean"
    )
    executor = _bf16(folder, graphs)
    ids = _ids(LENGTHS, executor.model.network.vocab_size, seed=3)
    ours = executor.predict(PackedBatch.from_sequences(ids)).cpu()
    expected = torch.stack(hf_encoder_outputs(folder, ids))
    assert (ours - expected).abs().max() <= 0.05


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_jina_mixed_adapters_bf16(tmp_path, graphs):  # type: ignore[no-untyped-def]
    """One batch, one adapter per sequence (0 = none), inside one graph replay."""
    folder = make_family_checkpoint(tmp_path, "JinaEmbeddingsV3Model")
    add_jina_adapters(folder)
    executor = _bf16(folder, graphs)
    names = executor.model.network.adapter_names
    ids = _ids(LENGTHS, executor.model.network.vocab_size, seed=4)
    adapters = [0, 1, 5, 3, 2]
    batch = PackedBatch.from_sequences(ids, [[a] * len(s) for a, s in zip(adapters, ids)])
    ours = executor.hidden_states(batch).float().cpu()
    start = 0
    for seq, a in zip(ids, adapters):
        expected = hf_jina_outputs(folder, [seq], None if a == 0 else names[a - 1])[0]
        got = ours[start : start + len(seq)]
        assert cosine(got, expected).min() >= 0.999, a
        start += len(seq)


def test_nomic_bulk_batches_through_the_gated_gemm(tmp_path, forced_gated_gemm):  # type: ignore[no-untyped-def]
    """NomicBERT's SwiGLU through the gated GEMM (`kernels.gated_matmul`, forced on here
    whatever it measures) on a bulk batch, against transformers."""
    from trt_tei_runtime.kernels import fused

    calls = forced_gated_gemm
    folder = make_family_checkpoint(tmp_path, "NomicBertModel")
    executor = load_executor(folder, device="cuda", dtype="bfloat16", cuda_graphs=False)
    lengths = [100] * 41  # 4,100 tokens
    assert sum(lengths) >= fused.GATED_MATMUL_MIN_TOKENS
    ids = _ids(lengths, executor.model.network.vocab_size, seed=2)
    calls.clear()
    ours = executor.hidden_states(PackedBatch.from_sequences(ids)).float().cpu()
    assert calls, "the gated GEMM did not run"
    assert cosine(ours, _hf_hidden(folder, ids)).min() >= 0.999
