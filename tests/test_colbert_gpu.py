"""Tier 5 (device): ColBERT models on CUDA in bf16 against the fp32 CPU model, which
`test_colbert.py` checks against PyLate's encoder rules. Run with `make test_gpu`; CI skips
these."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints.colbert import make_colbert_checkpoint
from test_colbert_backend import host_maxsim, pack_documents

from trt_tei_runtime import Model
from trt_tei_runtime.backend import Backend

pytestmark = pytest.mark.gpu

QUERIES = ["what is the capital of france?", "cat", "the dog " * 30]
DOCUMENTS = [
    "paris is the capital of france, a city on a river.",
    "the cat is on the house!",
    "book, text, sentence... long document about the green tree " * 12,
]


@pytest.mark.parametrize("attend", [True, False], ids=["attended-expansion", "hidden-expansion"])
def test_colbert_bf16_on_gpu(tmp_path, attend):  # type: ignore[no-untyped-def]
    folder = make_colbert_checkpoint(
        tmp_path,
        attend_to_expansion_tokens=attend,
        query_length=32,
        document_length=128,
        embedding_size=32,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
    )
    ref = Model(folder, device="cpu", dtype="float32")
    model = Model(folder, device="cuda", dtype="bfloat16", cuda_graphs=True)
    bulk = model.executors[0].bulk
    # Attended expansion runs packed attention (and graphs); hidden expansion masks keys
    # per sequence, which only the padded path expresses.
    assert bulk.packed_attention is attend
    assert (bulk.graphs is not None) is attend
    for input_type, texts in [("query", QUERIES), ("document", DOCUMENTS)]:
        ours = model.embed_multivector(texts, input_type=input_type)
        theirs = ref.embed_multivector(texts, input_type=input_type)
        for o, r in zip(ours, theirs, strict=True):
            assert o.shape == r.shape
            cosine = torch.nn.functional.cosine_similarity(
                torch.from_numpy(o), torch.from_numpy(r), dim=1
            )
            assert cosine.min() >= 0.999, cosine.tolist()
    ranked = dict(model.rerank(QUERIES[0], DOCUMENTS))
    reference = dict(ref.rerank(QUERIES[0], DOCUMENTS))
    for i, score in reference.items():
        assert abs(ranked[i] - score) <= 1e-2 * abs(score) + 1e-2


@pytest.mark.parametrize("attend", [True, False], ids=["attended-expansion", "hidden-expansion"])
def test_router_maxsim_bf16_on_gpu(tmp_path, attend):  # type: ignore[no-untyped-def]
    """`Backend.maxsim` (the router's `/rerank` call) in bf16 with graphs: documents of
    two queries in one batch score as the fp32 CPU model's vectors do (cosine of the score
    vectors >= 0.999, each within 1e-2), by `maxsim` and by `launch`."""
    folder = make_colbert_checkpoint(
        tmp_path,
        attend_to_expansion_tokens=attend,
        query_length=32,
        document_length=128,
        embedding_size=32,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
    )
    ref = Model(folder, device="cpu", dtype="float32")
    backend = Backend(str(folder), device="cuda", dtype="bfloat16")
    queries = ref.embed_multivector(QUERIES[:2], "query")
    vectors = ref.embed_multivector(DOCUMENTS, "document")
    split = len(queries[0])
    spans = np.array([[0, split]] * 2 + [[split, split + len(queries[1])]])
    which = [0, 0, 1]
    expected = np.array([host_maxsim(queries[q], d) for q, d in zip(which, vectors)])
    arrays = (
        *pack_documents(ref, DOCUMENTS),
        np.concatenate(queries).astype("<f4").tobytes(),
        (spans * 32).astype("<u4").tobytes(),
    )
    for scores in (backend.maxsim(*arrays), backend.launch("maxsim", *arrays).result()):
        ours = scores[:, 0]
        cosine = float(ours @ expected / (np.linalg.norm(ours) * np.linalg.norm(expected)))
        assert cosine >= 0.999, (ours, expected)
        assert np.all(np.abs(ours - expected) <= 1e-2 * np.abs(expected) + 1e-2), (ours, expected)
