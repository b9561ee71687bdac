"""Tier 2: every encoder architecture against `transformers` on a tiny random checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint
from reference import cosine, hf_encoder_outputs

from trt_tei_runtime import Model
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.runtime import load_executor

TEXTS = [
    "the cat",
    "a long document about the river in paris, france, and the green tree by the blue house "
    "where the dog reads a book while the server writes text for the search engine " * 2,
    "query",
    "x",
    "sentence embedding model is fast",
]
PAIRS = [(TEXTS[2], t) for t in TEXTS]

EMBEDDERS = [
    "BertModel",
    "RobertaModel",
    "XLMRobertaModel",
    "DistilBertModel",
    "ElectraModel",
    "MPNetModel",
    "DebertaV2Model",
]
CLASSIFIERS = [
    "BertForSequenceClassification",
    "XLMRobertaForSequenceClassification",
    "DistilBertForSequenceClassification",
    "ElectraForSequenceClassification",
    "MPNetForSequenceClassification",
    "DebertaV2ForSequenceClassification",
]


def _weight_scale(arch: str) -> dict[str, float]:
    """MPNet and DeBERTa at ten times the default weight scale: their relative-position
    terms then move the states far beyond the tolerance (test_mpnet_bias_changes_the_states)
    instead of hiding below it."""
    return {"initializer_range": 0.2} if arch.startswith(("MPNet", "DebertaV2")) else {}


@pytest.fixture(scope="module", params=EMBEDDERS)
def embedder_dir(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    extra = _weight_scale(request.param)
    return make_checkpoint(
        tmp_path_factory.mktemp(request.param), request.param, pooling="mean", **extra
    )


@pytest.mark.parametrize("pooling", ["mean", "cls", "last-token"])
def test_embedder_matches_transformers(embedder_dir, pooling):  # type: ignore[no-untyped-def]
    model = Model(embedder_dir, pooling=pooling)
    enc = model.tokenizer.encode(TEXTS)
    ids = [e.ids for e in enc]
    refs = hf_encoder_outputs(embedder_dir, ids)

    # Per-token states of the whole packed batch against each sequence alone.
    batch = PackedBatch.from_sequences(ids, [e.type_ids for e in enc], model.info.position_offset)
    hidden = model.executors[0].hidden_states(batch)
    for i, ref in enumerate(refs):
        ours = hidden[batch.cu_seqlens[i] : batch.cu_seqlens[i + 1]]
        assert cosine(ours, ref).min() >= 0.99999, (i, cosine(ours, ref))

    pooled_ref = {
        "mean": torch.stack([r.mean(0) for r in refs]),
        "cls": torch.stack([r[0] for r in refs]),
        "last-token": torch.stack([r[-1] for r in refs]),
    }[pooling]
    ours = torch.from_numpy(model.embed(TEXTS, normalize=False))
    assert cosine(ours, pooled_ref).min() >= 0.99999


def test_batch_equals_one_by_one(embedder_dir):  # type: ignore[no-untyped-def]
    model = Model(embedder_dir)
    together = model.embed(TEXTS)
    alone = np.concatenate([model.embed([t]) for t in TEXTS])
    np.testing.assert_allclose(together, alone, atol=2e-6)
    # A token budget so small that every text runs in its own batch changes nothing either.
    tiny_budget = Model(embedder_dir, max_batch_tokens=1)
    np.testing.assert_allclose(tiny_budget.embed(TEXTS), together, atol=2e-6)


@pytest.mark.parametrize("arch", CLASSIFIERS)
@pytest.mark.parametrize("num_labels", [1, 3])
def test_classifier_logits_match_transformers(tmp_path, arch, num_labels):  # type: ignore[no-untyped-def]
    extra = _weight_scale(arch)
    folder = make_checkpoint(tmp_path, arch, num_labels=num_labels, **extra)
    model = Model(folder)
    assert model.info.model_type == ("reranker" if num_labels == 1 else "classifier")
    assert model.info.id2label == {str(i): f"label_{i}" for i in range(num_labels)}
    enc = model.tokenizer.encode(PAIRS)
    refs = torch.stack(hf_encoder_outputs(folder, [e.ids for e in enc], [e.type_ids for e in enc]))

    raw = torch.from_numpy(model.predict(PAIRS, raw_scores=True))
    assert raw.shape == (len(PAIRS), num_labels)
    assert (raw - refs).abs().max() <= 1e-5
    scores = torch.from_numpy(model.predict(PAIRS))
    expected = torch.sigmoid(refs) if num_labels == 1 else torch.softmax(refs, -1)
    assert (scores - expected).abs().max() <= 1e-6
    alone = np.concatenate([model.predict([p], raw_scores=True) for p in PAIRS])
    np.testing.assert_allclose(alone, raw.numpy(), atol=2e-6)


def test_multi_label_classifier_uses_sigmoid(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(
        tmp_path,
        "BertForSequenceClassification",
        num_labels=4,
        problem_type="multi_label_classification",
    )
    model = Model(folder)
    raw = model.predict(TEXTS, raw_scores=True)
    np.testing.assert_allclose(model.predict(TEXTS), 1 / (1 + np.exp(-raw)), rtol=1e-5)


def test_rerank_orders_by_score(tmp_path):  # type: ignore[no-untyped-def]
    model = Model(make_checkpoint(tmp_path, "BertForSequenceClassification", num_labels=1))
    ranked = model.rerank("query", TEXTS)
    scores = model.predict([("query", t) for t in TEXTS])[:, 0]
    assert [i for i, _ in ranked] == list(np.argsort(-scores, kind="stable"))
    assert [s for _, s in ranked] == pytest.approx(sorted(scores, reverse=True))
    assert len(model.rerank("query", TEXTS, top_n=2)) == 2


def test_reranker_cannot_embed_and_embedder_cannot_rerank(tmp_path, embedder_dir):  # type: ignore[no-untyped-def]
    reranker = Model(make_checkpoint(tmp_path, "BertForSequenceClassification", num_labels=1))
    with pytest.raises(ValueError, match="use predict, not embed"):
        reranker.embed(["x"])
    with pytest.raises(ValueError, match="rerank needs a single-label reranker"):
        Model(embedder_dir).rerank("q", ["d"])


def test_position_offset_is_padding_index_plus_one(tmp_path):  # type: ignore[no-untyped-def]
    model = load_executor(make_checkpoint(tmp_path, "XLMRobertaModel"))
    assert model.info.position_offset == 2
    assert model.info.max_input_length == 128  # 130 positions minus the offset


def test_mpnet_relative_buckets_match_transformers():  # type: ignore[no-untyped-def]
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from trt_tei_runtime.models.mpnet import relative_position_buckets

    length = 300  # past max_distance (128), where the buckets saturate
    pos = torch.arange(length)
    expected = MPNetEncoder.relative_position_bucket(pos[None, :] - pos[:, None])
    assert torch.equal(relative_position_buckets(length, torch.device("cpu")), expected)


def test_mpnet_bias_changes_the_states(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The comparison with transformers above would catch a dropped bias: without it the
    per-token states are off by far more than the 1e-5 the test allows."""
    from trt_tei_runtime.models.mpnet import MPNetModel

    # Weights ten times the default scale: attention moves the states visibly.
    folder = make_checkpoint(tmp_path, "MPNetModel", initializer_range=0.2)
    with_bias = Model(folder)
    enc = with_bias.tokenizer.encode(TEXTS[1:2])
    batch = PackedBatch.from_sequences([enc[0].ids], [enc[0].type_ids], 2)
    ours = with_bias.executors[0].hidden_states(batch)
    monkeypatch.setattr(MPNetModel, "attention_context", lambda self, meta: None)
    without = Model(folder).executors[0].hidden_states(batch)
    assert cosine(ours, without).min() < 0.9999, 1 - cosine(ours, without)


def test_deberta_relative_positions_match_transformers():  # type: ignore[no-untyped-def]
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    from trt_tei_runtime.models.deberta_v2 import parse_config, relative_positions

    config = parse_config(
        {
            "vocab_size": 10,
            "hidden_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 8,
            "relative_attention": True,
            "position_buckets": 256,
            "max_relative_positions": -1,
            "max_position_embeddings": 512,
        }
    )
    x = torch.zeros(1, 700, 8)  # past the 256 buckets and the 512 positions
    expected = build_relative_position(x, x, bucket_size=256, max_position=512)[0]
    assert torch.equal(relative_positions(700, config, torch.device("cpu")), expected)


@pytest.mark.parametrize(
    "overrides",
    [
        # DeBERTa-v2 style: separate position projections, absolute positions, token types,
        # narrow embeddings; and attention without relative terms.
        {
            "share_att_key": False,
            "position_biased_input": True,
            "type_vocab_size": 2,
            "embedding_size": 16,
            "norm_rel_ebd": "none",
        },
        {"relative_attention": False},
    ],
    ids=["v2-layout", "no-relative-attention"],
)
def test_deberta_variants_match_transformers(tmp_path, overrides):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(
        tmp_path,
        "DebertaV2ForSequenceClassification",
        num_labels=2,
        initializer_range=0.2,
        **overrides,
    )
    model = Model(folder)
    enc = model.tokenizer.encode(PAIRS)
    refs = torch.stack(hf_encoder_outputs(folder, [e.ids for e in enc], [e.type_ids for e in enc]))
    raw = torch.from_numpy(model.predict(PAIRS, raw_scores=True))
    assert (raw - refs).abs().max() <= 1e-4


def test_deberta_conv_layer_is_refused(tmp_path):  # type: ignore[no-untyped-def]
    from trt_tei_runtime import CheckpointError

    folder = make_checkpoint(tmp_path, "DebertaV2Model", conv_kernel_size=3)
    with pytest.raises(CheckpointError, match="conv_kernel_size"):
        Model(folder)
