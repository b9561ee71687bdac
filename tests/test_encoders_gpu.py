"""Tier 5 (device): encoders on CUDA in fp16/bf16 against fp32 references.

Run with `make test_gpu` on a machine with a GPU; CI skips these.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint
from reference import cosine, hf_encoder_outputs
from sentences import SENTENCES

from trt_tei_runtime import Model

pytestmark = pytest.mark.gpu

HALF = ["bfloat16", "float16"]
TEXTS = [
    "the cat",
    "a long document about the river in paris and the green tree by the blue house " * 3,
    "query",
    "sentence embedding model is fast",
]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("arch", ["BertModel", "XLMRobertaModel"])
def test_embedder_half_precision_on_gpu(tmp_path, arch, dtype):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(tmp_path, arch, pooling="mean", hidden_size=64)
    model = Model(folder, device="cuda", dtype=dtype)
    assert model.executors[0].bulk.packed_attention, "half precision on CUDA: packed attention"
    enc = model.tokenizer.encode(TEXTS)
    refs = hf_encoder_outputs(folder, [e.ids for e in enc])
    expected = torch.stack([r.mean(0) for r in refs])
    ours = torch.from_numpy(model.embed(TEXTS, normalize=False))
    assert cosine(ours, expected).min() >= 0.999


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "arch", ["BertForSequenceClassification", "XLMRobertaForSequenceClassification"]
)
def test_classifier_half_precision_on_gpu(tmp_path, arch, dtype):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(tmp_path, arch, num_labels=3, hidden_size=64)
    model = Model(folder, device="cuda", dtype=dtype)
    pairs = [("query", t) for t in TEXTS]
    enc = model.tokenizer.encode(pairs)
    refs = torch.stack(hf_encoder_outputs(folder, [e.ids for e in enc], [e.type_ids for e in enc]))
    ours = torch.from_numpy(model.predict(pairs, raw_scores=True))
    assert cosine(ours, refs).min() >= 0.999
    assert (ours - refs).abs().max() <= 0.05 * refs.abs().max()


def test_fp32_on_gpu_uses_exact_fallback(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(tmp_path, "BertModel", pooling="cls", hidden_size=64)
    gpu = Model(folder, device="cuda", dtype="float32")
    cpu = Model(folder, device="cpu")
    assert (
        cosine(torch.from_numpy(gpu.embed(TEXTS)), torch.from_numpy(cpu.embed(TEXTS))).min()
        >= 0.99999
    )


@pytest.mark.parametrize("dtype", HALF)
def test_minilm_half_precision_matches_sentence_transformers(minilm_dir, dtype):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(
        str(minilm_dir), device="cpu", model_kwargs={"dtype": torch.float32}
    ).encode(SENTENCES, normalize_embeddings=True)
    model = Model(minilm_dir, device="cuda", dtype=dtype)
    ours = model.embed(SENTENCES)
    cos = (ours.astype(np.float64) * ref).sum(1)
    assert cos.min() >= 0.999, list(zip(SENTENCES, cos))
    # Batch equals one-by-one within half-precision rounding.
    alone = np.concatenate([model.embed([s]) for s in SENTENCES[:3]])
    assert (alone * ours[:3]).sum(1).min() >= 0.9999
