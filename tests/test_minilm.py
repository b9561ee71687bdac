"""Tier 3: the real all-MiniLM-L6-v2 against sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest
from sentences import SENTENCES

from trt_tei_runtime import Model


@pytest.fixture(scope="module")
def st_embeddings(minilm_dir):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_dir), device="cpu")
    assert st.max_seq_length == 256
    return st.encode(SENTENCES, batch_size=8, convert_to_numpy=True, normalize_embeddings=False)


@pytest.fixture(scope="module")
def minilm(minilm_dir):  # type: ignore[no-untyped-def]
    return Model(minilm_dir, device="cpu")


def test_minilm_info(minilm):  # type: ignore[no-untyped-def]
    assert minilm.info.pooling == "mean"
    assert (
        minilm.info.max_input_length == 256
    )  # sentence_bert_config.json, not tokenizer.json's 128
    assert minilm.info.hidden_size == 384


def test_minilm_matches_sentence_transformers(minilm, st_embeddings):  # type: ignore[no-untyped-def]
    ours = minilm.embed(SENTENCES)
    ref = st_embeddings / np.linalg.norm(st_embeddings, axis=1, keepdims=True)
    cos = (ours.astype(np.float64) * ref).sum(1)
    assert cos.min() >= 0.99999, list(zip(SENTENCES, cos))
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_minilm_truncates_at_256_keeping_special_tokens(minilm):  # type: ignore[no-untyped-def]
    long_text = SENTENCES[-5]
    enc = minilm.tokenizer.encode([long_text])[0]
    assert len(enc.ids) == 256
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    with pytest.raises(ValueError, match="more than the model's maximum of 256"):
        minilm.embed([long_text], truncate=False)


def test_minilm_matryoshka_truncates_before_normalizing(minilm):  # type: ignore[no-untyped-def]
    full = minilm.embed(SENTENCES[:4], normalize=False)
    short = minilm.embed(SENTENCES[:4], dimensions=64)
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, atol=1e-6)
    for bad in (0, 385):
        with pytest.raises(ValueError, match="dimensions must be between 1 and 384"):
            minilm.embed(["x"], dimensions=bad)
