"""Tier 5 (device): MPNet, DistilBERT, ELECTRA and DeBERTa-v2 on CUDA in bf16, with CUDA
graphs where the family runs packed attention, against fp32 `transformers` references.

MPNet's relative-position bias and DeBERTa's disentangled terms are not in the packed
kernels: those run padded attention (no graphs), which the test checks too.
Run with `make test_gpu`; CI skips these.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint
from reference import cosine, hf_encoder_outputs

from trt_tei_runtime import Model

pytestmark = pytest.mark.gpu

TEXTS = [
    "the cat",
    "a long document about the river in paris and the green tree by the blue house " * 3,
    "query",
    "sentence embedding model is fast",
]
PACKED = {"MPNet": False, "DistilBert": True, "Electra": True, "DebertaV2": False}


def _model(folder, graphs):  # type: ignore[no-untyped-def]
    return Model(folder, device="cuda", dtype="bfloat16", cuda_graphs=graphs, max_batch_tokens=512)


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("family", sorted(PACKED))
def test_embedder_bf16(tmp_path, family, graphs):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(tmp_path, f"{family}Model", pooling="mean", hidden_size=64)
    model = _model(folder, graphs)
    bulk = model.executors[0].bulk
    assert bulk.packed_attention == PACKED[family]
    assert (bulk.graphs is not None) == (graphs and PACKED[family])
    enc = model.tokenizer.encode(TEXTS)
    refs = hf_encoder_outputs(folder, [e.ids for e in enc])
    expected = torch.stack([r.mean(0) for r in refs])
    ours = torch.from_numpy(model.embed(TEXTS, normalize=False))
    assert cosine(ours, expected).min() >= 0.999
    alone = np.concatenate([model.embed([t], normalize=False) for t in TEXTS])
    assert cosine(torch.from_numpy(alone), ours).min() >= 0.9999


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("family", sorted(PACKED))
def test_cross_encoder_bf16(tmp_path, family, graphs):  # type: ignore[no-untyped-def]
    arch = f"{family}ForSequenceClassification"
    folder = make_checkpoint(tmp_path, arch, num_labels=3, hidden_size=64)
    model = _model(folder, graphs)
    pairs = [("query", t) for t in TEXTS]
    enc = model.tokenizer.encode(pairs)
    refs = torch.stack(hf_encoder_outputs(folder, [e.ids for e in enc], [e.type_ids for e in enc]))
    ours = torch.from_numpy(model.predict(pairs, raw_scores=True))
    assert cosine(ours, refs).min() >= 0.999
    assert (ours - refs).abs().max() <= 0.05 * refs.abs().max()
