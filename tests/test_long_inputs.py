"""`Model.embed(..., long_input="chunk")` against the rule computed with sentence-transformers
(tests/long_input_rule.py) on tiny mean- and CLS-pooled BERT folders (limit 16 tokens), and
its refusals."""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints import make_checkpoint
from long_input_rule import ChunkRule, cosine, document

from trt_tei_runtime import Model
from trt_tei_runtime.errors import InputError

LIMIT = 16
WINDOW = LIMIT - 2
TEXTS = [
    document(40 * WINDOW, seed=1),
    "the cat",
    document(WINDOW, seed=2),
    document(5 * WINDOW + 1, seed=3),
]


@pytest.fixture(scope="module", params=["mean", "cls"])
def folder(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp(f"long_{request.param}")
    return make_checkpoint(root, "BertModel", pooling=request.param, max_seq_length=LIMIT)


@pytest.mark.parametrize("overlap", [0, 4])
def test_chunked_embeddings_match_the_rule(folder, overlap):  # type: ignore[no-untyped-def]
    rule = ChunkRule(folder, LIMIT)
    model = Model(folder)
    got = model.embed(TEXTS, long_input="chunk", chunk_overlap=overlap)
    assert got.shape[0] == len(TEXTS)
    for text, vector in zip(TEXTS, got):
        assert cosine(vector, rule.embed(text, overlap)) >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_long_input_modes_and_refusals(folder):  # type: ignore[no-untyped-def]
    model = Model(folder)
    truncated = model.embed(TEXTS[:2], truncate=True)
    np.testing.assert_array_equal(model.embed(TEXTS[:2], long_input="truncate"), truncated)
    with pytest.raises(InputError, match="input 0 has"):
        model.embed(TEXTS[:2], long_input="error")
    with pytest.raises(InputError, match="long_input must be"):
        model.embed(TEXTS[:2], long_input="split")
    with pytest.raises(InputError, match="chunk_overlap must be at least 0"):
        model.embed(TEXTS[:2], long_input="chunk", chunk_overlap=-1)
    with pytest.raises(InputError, match=r"`chunk_overlap` \(14\) must be smaller"):
        model.embed(TEXTS[:2], long_input="chunk", chunk_overlap=14)
    with pytest.raises(InputError, match=r"input 2 needs 6 windows, more than max_chunks \(5\)"):
        model.embed(TEXTS[1:], long_input="chunk", max_chunks=5)
