"""Tier 5 (device): SPLADE encoders on CUDA in bf16/fp16 (packed attention, CUDA graphs,
the interactive lane) against the fp32 CPU reference, which `test_splade.py` checks against
sentence-transformers. Run with `make test_gpu`; CI skips these."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints import make_splade_checkpoint
from reference import cosine

from trt_tei_runtime import Model
from trt_tei_runtime.backend import Backend
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.sparse import unpack_active

pytestmark = pytest.mark.gpu

HALF = ["bfloat16", "float16"]
TEXTS = [
    "the cat",
    "a long document about the river in paris and the green tree by the blue house " * 3,
    "query",
    "sentence embedding model is fast",
]


def dense(rows: list[dict[int, float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        for j, v in row.items():
            out[i, j] = v
    return out


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("strategy", ["max", "sum"])
@pytest.mark.parametrize(
    "arch", ["BertForMaskedLM", "XLMRobertaForMaskedLM", "DistilBertForMaskedLM"]
)
def test_splade_half_precision_on_gpu(tmp_path, arch, strategy, dtype):  # type: ignore[no-untyped-def]
    folder = make_splade_checkpoint(
        tmp_path, arch, pooling_strategy=strategy, hidden_size=64, max_seq_length=64
    )
    ref_model = Model(folder, device="cpu")
    width = ref_model.info.hidden_size
    ref = dense(ref_model.embed_sparse(TEXTS), width)  # type: ignore[arg-type]
    model = Model(folder, device="cuda", dtype=dtype)
    assert model.executors[0].bulk.packed_attention, "half precision on CUDA: packed attention"
    assert model.executors[0].bulk.graphs is not None, "CUDA graphs captured (with warm-up)"
    ours = dense(model.embed_sparse(TEXTS), width)  # type: ignore[arg-type]
    assert cosine(ours, ref).min() >= 0.999
    assert (ours - ref).abs().max() <= 0.02 * ref.abs().max()
    # Every clearly active dimension is active in half precision too.
    assert bool(((ref > 0.05 * ref.abs().max()) <= (ours > 0)).all())
    # Top-k stays on the device and keeps the same largest dimensions.
    top = model.embed_sparse(TEXTS, max_active_dims=4)
    assert all(len(row) == 4 for row in top)
    ref_top = ref_model.embed_sparse(TEXTS, max_active_dims=4)
    overlap = [len(a.keys() & b.keys()) for a, b in zip(top, ref_top)]  # type: ignore[union-attr]
    assert min(overlap) >= 3, overlap


def test_splade_fp32_on_gpu_matches_cpu(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_splade_checkpoint(tmp_path, hidden_size=64)
    cpu = Model(folder, device="cpu").embed_sparse(TEXTS)
    gpu = Model(folder, device="cuda", dtype="float32").embed_sparse(TEXTS)
    for a, b in zip(cpu, gpu):  # type: ignore[arg-type]
        assert a.keys() == b.keys()
        assert max(abs(a[j] - b[j]) for j in a) <= 1e-4


@pytest.mark.parametrize("dtype", HALF)
def test_splade_backend_lanes_agree(tmp_path, dtype):  # type: ignore[no-untyped-def]
    """The router's path: bulk and interactive lanes (graphs on both) give the same rows."""
    folder = make_splade_checkpoint(tmp_path, hidden_size=64, max_seq_length=64)
    backend = Backend(str(folder), device="cuda", dtype=dtype, max_batch_tokens=512)
    assert backend.info()["model_type"] == "sparse"
    assert backend.info()["interactive_lane"]
    ids = Model(folder, device="cpu").tokenize(TEXTS)
    batch = PackedBatch.from_sequences(ids)
    arrays = [
        t.numpy().astype(np.uint32).tobytes()
        for t in (batch.input_ids, batch.token_type_ids, batch.position_ids, batch.cu_seqlens)
    ]
    bulk = backend.embed_sparse(*arrays)
    interactive = backend.embed_sparse(*arrays, interactive=True)
    rows_bulk = [unpack_active(torch.from_numpy(r)) for r in bulk]
    rows_int = [unpack_active(torch.from_numpy(r)) for r in interactive]
    for a, b in zip(rows_bulk, rows_int):
        assert a.keys() == b.keys()
        assert max(abs(a[j] - b[j]) for j in a) <= 1e-3
