"""MPNet, DistilBERT, ELECTRA and DeBERTa-v2 through the router: `/embed` with the checkpoint's
sentence-transformers mean pooling, and `/rerank` on their cross-encoders, each against
`transformers` on a tiny random checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint
from reference import hf_encoder_outputs
from router_harness import cosine

pytestmark = pytest.mark.integration

QUERY = "what is the capital of france"
TEXTS = ["paris is the capital of france", "the dog read a book by the river", "cat"]
FAMILIES = ["MPNet", "DistilBert", "Electra", "DebertaV2"]


def reference_tokens(folder, texts, pairs=None):  # type: ignore[no-untyped-def]
    """Token ids and types as the router makes them (the file's own truncation and padding
    ignored, as the router ignores them)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    enc = [tok.encode(t, pairs[i]) if pairs else tok.encode(t) for i, t in enumerate(texts)]
    return [e.ids for e in enc], [e.type_ids for e in enc]


@pytest.mark.parametrize("family", FAMILIES)
def test_embed_mean_pooled(start_server, tmp_path, family):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(tmp_path / family, f"{family}Model", pooling="mean", seed=7)
    server = start_server(folder)
    info = server.get("/info").json()
    assert info["model_type"]["embedding"]["pooling"] == "mean"
    r = server.post("/embed", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    ids, _ = reference_tokens(folder, TEXTS)
    expected = [h.mean(0).numpy() for h in hf_encoder_outputs(folder, ids)]
    for got, exp in zip(r.json(), expected):
        assert cosine(got, exp) >= 0.99999


@pytest.mark.parametrize("family", FAMILIES)
def test_rerank_cross_encoder(start_server, tmp_path, family):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(
        tmp_path / family, f"{family}ForSequenceClassification", num_labels=1, seed=8
    )
    server = start_server(folder)
    ids, types = reference_tokens(folder, [QUERY] * len(TEXTS), pairs=TEXTS)
    logits = torch.stack(hf_encoder_outputs(folder, ids, types))[:, 0].numpy()
    r = server.post("/rerank", {"query": QUERY, "texts": TEXTS, "raw_scores": True})
    assert r.status_code == 200, r.text
    ranks = r.json()
    assert [x["index"] for x in ranks] == list(np.argsort(-logits, kind="stable"))
    for x in ranks:
        assert abs(x["score"] - logits[x["index"]]) < 1e-4
