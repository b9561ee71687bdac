"""Tier 2: decoder families (Llama, Mistral, Qwen2, Qwen3, Gemma2) against `transformers`.

Every case is a tiny random checkpoint saved by transformers itself; transformers runs one
sequence at a time without padding (eager attention), we run packed batches.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import (
    PAD_ID,
    hf_decoder_outputs,
    make_decoder_checkpoint,
    random_ids,
    tokenizer,
)
from reference import cosine
from tokenizers import Tokenizer, models

from trt_tei_runtime import CheckpointError, InputError, Model, UnsupportedArchitectureError
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.errors import WeightError
from trt_tei_runtime.models.heads import last_token_indices
from trt_tei_runtime.runtime import load_executor
from trt_tei_runtime.templates import QWEN3_RERANKER

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
# Very different lengths, longer than every sliding window below, and a single token.
LENGTHS = [3, 70, 17, 1]

EMBEDDER_CASES = {
    "llama-rope-llama3": ("LlamaModel", {"rope_scaling": LLAMA3_ROPE}),
    "llama-causal-lm": ("LlamaForCausalLM", {"rope_theta": 500.0}),
    "mistral-sliding-window": ("MistralModel", {"sliding_window": 16}),
    "mistral-causal-lm": ("MistralForCausalLM", {}),
    "qwen2-sliding-layers": (
        "Qwen2Model",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
    ),
    "qwen2-bidirectional": ("Qwen2Model", {"is_causal": False}),
    "qwen3": ("Qwen3Model", {}),
    "qwen3-causal-lm-tied": ("Qwen3ForCausalLM", {"tie_word_embeddings": True}),
    "gemma2-sliding-softcap": ("Gemma2Model", {}),
    "gemma2-bidirectional": ("Gemma2Model", {"is_causal": False}),
    "gemma2-causal-lm": ("Gemma2ForCausalLM", {}),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):  # type: ignore[no-untyped-def]
    """Builds each case's checkpoint once per module."""
    cache: dict[str, Path] = {}

    def get(name: str, architecture: str, **kwargs: object) -> Path:
        if name not in cache:
            folder = tmp_path_factory.mktemp(name)
            cache[name] = make_decoder_checkpoint(folder, architecture, **kwargs)
        return cache[name]

    return get


def _packed(ids: list[list[int]]) -> PackedBatch:
    return PackedBatch.from_sequences(ids)


@pytest.mark.parametrize("case", sorted(EMBEDDER_CASES))
def test_hidden_states_match_transformers(checkpoints, case):  # type: ignore[no-untyped-def]
    arch, overrides = EMBEDDER_CASES[case]
    folder = checkpoints(case, arch, **overrides)
    model = load_executor(folder)
    assert model.info.pooling == "last-token"
    ids = random_ids(LENGTHS, seed=1)
    ours = model.hidden_states(_packed(ids))
    expected = torch.cat(hf_decoder_outputs(folder, ids))
    assert cosine(ours, expected).min() >= 0.99999
    assert (ours - expected).abs().max() <= 1e-4
    pooled = model.embed(_packed(ids))
    ends = np.cumsum(LENGTHS) - 1
    assert cosine(pooled, expected[ends]).min() >= 0.99999


@pytest.mark.parametrize("case", sorted(EMBEDDER_CASES))
def test_batch_equals_one_by_one(checkpoints, case):  # type: ignore[no-untyped-def]
    arch, overrides = EMBEDDER_CASES[case]
    model = load_executor(checkpoints(case, arch, **overrides))
    ids = random_ids([3, 70], seed=2)
    batch = model.hidden_states(_packed(ids))
    single = torch.cat([model.hidden_states(_packed([s])) for s in ids])
    torch.testing.assert_close(batch, single, atol=1e-5, rtol=1e-5)


def test_rope_scaling_and_sliding_window_are_not_ignored(checkpoints):  # type: ignore[no-untyped-def]
    """The references would agree with plain RoPE / full attention if the test sequences
    were too short to tell; make sure they are not."""
    ids = random_ids([70], seed=1)
    for case in ("llama-rope-llama3", "gemma2-sliding-softcap", "mistral-sliding-window"):
        arch, overrides = EMBEDDER_CASES[case]
        folder = checkpoints(case, arch, **overrides)
        config = json.loads((folder / "config.json").read_text())
        plain = folder.parent / f"{case}-plain"
        plain.mkdir(exist_ok=True)
        for f in folder.iterdir():
            if f.is_file() and f.name != "config.json":
                (plain / f.name).write_bytes(f.read_bytes())
        config.pop("rope_scaling", None)
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
        config["sliding_window"] = None
        config.pop("layer_types", None)
        (plain / "config.json").write_text(json.dumps(config))
        a = load_executor(folder).hidden_states(_packed(ids))
        b = load_executor(plain).hidden_states(_packed(ids))
        assert (a - b).abs().max() > 1e-3, case


CLASSIFIER_CASES = {
    "LlamaForSequenceClassification": {"num_labels": 3},
    "MistralForSequenceClassification": {"num_labels": 1, "sliding_window": 16},
    "Qwen2ForSequenceClassification": {"num_labels": 2},
    "Qwen3ForSequenceClassification": {
        "num_labels": 4,
        "problem_type": "multi_label_classification",
    },
    "Gemma2ForSequenceClassification": {"num_labels": 1},
}


def _ids_with_padding() -> list[list[int]]:
    ids = random_ids([3, 70, 17, 1, 6], seed=3)
    ids[1][10] = PAD_ID  # a pad token inside: still the last token
    ids[2][-2:] = [PAD_ID, PAD_ID]  # trailing pads: the last non-pad token
    ids[4][:] = [PAD_ID] * 6  # all pads: transformers reads the first token
    return ids


@pytest.mark.parametrize("arch", sorted(CLASSIFIER_CASES))
def test_classifier_logits_match_transformers(checkpoints, arch):  # type: ignore[no-untyped-def]
    folder = checkpoints(arch, arch, **CLASSIFIER_CASES[arch])
    model = load_executor(folder)
    labels = CLASSIFIER_CASES[arch]["num_labels"]
    assert model.info.num_labels == labels
    assert model.info.model_type == ("reranker" if labels == 1 else "classifier")
    ids = _ids_with_padding()
    ours = model.predict(_packed(ids))
    expected = torch.stack(hf_decoder_outputs(folder, ids))
    assert ours.shape == (len(ids), labels)
    assert (ours - expected).abs().max() <= 1e-4
    single = torch.cat([model.predict(_packed([s])) for s in ids])
    torch.testing.assert_close(ours, single, atol=1e-5, rtol=1e-5)


def test_multi_label_head_scores_with_sigmoid(checkpoints):  # type: ignore[no-untyped-def]
    arch = "Qwen3ForSequenceClassification"
    model = load_executor(checkpoints(arch, arch, **CLASSIFIER_CASES[arch]))
    assert model.info.score_activation == "sigmoid"
    assert model.info.id2label == {str(i): f"label_{i}" for i in range(4)}


def test_classifier_without_pad_token_reads_last_token(tmp_path):  # type: ignore[no-untyped-def]
    arch = "LlamaForSequenceClassification"
    folder = make_decoder_checkpoint(tmp_path, arch, num_labels=2, pad_token_id=None)
    ids = _ids_with_padding()[:3]
    ours = load_executor(folder).predict(_packed(ids))
    expected = torch.stack(hf_decoder_outputs(folder, ids))
    assert (ours - expected).abs().max() <= 1e-4


def test_last_token_indices_follow_transformers():  # type: ignore[no-untyped-def]
    ids = torch.tensor([5, 6, 0, 7, 0, 0, 0, 0, 9, 8, 0])
    cu = torch.tensor([0, 6, 8, 11], dtype=torch.int32)
    assert last_token_indices(ids, cu, 0).tolist() == [3, 6, 9]
    assert last_token_indices(ids, cu, None).tolist() == [5, 7, 10]


def test_decoder_reranker_over_pairs(checkpoints):  # type: ignore[no-untyped-def]
    """Pairs tokenize with type id 1 on the second text; decoders ignore token types."""
    arch = "MistralForSequenceClassification"
    folder = checkpoints(arch, arch, **CLASSIFIER_CASES[arch])
    model = Model(folder)
    docs = ["paris is the capital of france", "the cat sat on the mat", "a dog"]
    pairs = [("what is the capital of france", d) for d in docs]
    enc = model.tokenizer.encode(pairs)
    expected = torch.stack(hf_decoder_outputs(folder, [e.ids for e in enc]))
    raw = model.predict(pairs, raw_scores=True)
    assert np.abs(raw - expected.numpy()).max() <= 1e-4
    ranked = model.rerank(pairs[0][0], docs)
    assert [i for i, _ in ranked] == list(np.argsort(-raw[:, 0]))
    assert ranked[0][1] == pytest.approx(float(1 / (1 + np.exp(-raw[:, 0].max()))), abs=1e-6)


def test_embed_with_named_prompt_and_pooling(tmp_path):  # type: ignore[no-untyped-def]
    prompts = {"query": "Instruct: find the document\nQuery: ", "document": ""}
    folder = make_decoder_checkpoint(tmp_path, "Qwen3Model", prompts=prompts)
    model = Model(folder)
    assert model.info.pooling == "last-token"
    texts = ["what is the capital of france", "cat", "the dog read a book about paris " * 4]
    tok = tokenizer()
    refs = hf_decoder_outputs(folder, [tok.encode(prompts["query"] + t).ids for t in texts])
    ours = model.embed(texts, prompt_name="query", normalize=False)
    assert cosine(torch.from_numpy(ours), torch.stack([r[-1] for r in refs])).min() >= 0.99999
    mean = Model(folder, pooling="mean").embed(texts, prompt_name="query", normalize=False)
    expected = torch.stack([r.mean(0) for r in refs])
    assert cosine(torch.from_numpy(mean), expected).min() >= 0.99999


# --- Qwen3-Reranker-style yes/no scoring --------------------------------------------------

YES_NO_CASES = {
    "qwen3-untied": ("Qwen3ForCausalLM", {}),
    "qwen3-tied": ("Qwen3ForCausalLM", {"tie_word_embeddings": True}),
    "gemma2-final-softcap": ("Gemma2ForCausalLM", {}),
}
QUERY = "what is the capital of france"
DOCS = ["paris is the capital of france", "the cat sat on the mat", "yes"]


def _model_card_ids(query: str, doc: str, max_length: int | None = None) -> list[int]:
    """Tokenized as the Qwen3-Reranker model card does: prefix, body and suffix apart,
    the body truncated so the suffix always fits."""
    tok = tokenizer()
    t = QWEN3_RERANKER
    prefix = tok.encode(t.prefix, add_special_tokens=False).ids
    suffix = tok.encode(t.suffix, add_special_tokens=False).ids
    body = t.body.format(instruction=t.instruction, query=query, document=doc)
    body_ids = tok.encode(body, add_special_tokens=False).ids
    if max_length is not None:
        body_ids = body_ids[: max_length - len(prefix) - len(suffix)]
    return prefix + body_ids + suffix


def _yes_no_ids() -> tuple[int, int]:
    tok = tokenizer()
    return tok.token_to_id("no"), tok.token_to_id("yes")


@pytest.mark.parametrize("case", sorted(YES_NO_CASES))
def test_yes_no_reranker_matches_transformers(checkpoints, case):  # type: ignore[no-untyped-def]
    arch, overrides = YES_NO_CASES[case]
    folder = checkpoints(f"yes-no-{case}", arch, **overrides)
    model = Model(folder, task="rerank-yes-no")
    assert model.info.model_type == "reranker"
    assert model.info.pair_template is not None
    pairs = [(QUERY, d) for d in DOCS]
    expected = torch.cat(
        hf_decoder_outputs(folder, [_model_card_ids(*p) for p in pairs], yes_no=_yes_no_ids())
    )
    raw = model.predict(pairs, raw_scores=True)[:, 0]
    assert np.abs(raw - expected.numpy()).max() <= 1e-4
    # The score is P(yes) between yes and no, as the model card computes it.
    probs = model.predict(pairs)[:, 0]
    np.testing.assert_allclose(probs, torch.sigmoid(expected).numpy(), atol=1e-6)
    ranked = model.rerank(QUERY, DOCS)
    assert [i for i, _ in ranked] == list(np.argsort(-raw))


def test_pair_template_parts_for_routers():  # type: ignore[no-untyped-def]
    parts = QWEN3_RERANKER.with_suffix_ids((7, 8)).as_dict()
    q, d = "a {document} query", "doc"
    text = parts["before_query"] + q + parts["between"] + d + parts["after_document"]
    assert text == QWEN3_RERANKER.head(q, d)
    assert parts["suffix"] == QWEN3_RERANKER.suffix and parts["suffix_ids"] == [7, 8]


def test_yes_no_truncation_keeps_the_suffix(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_decoder_checkpoint(tmp_path, "Qwen3ForCausalLM")
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 80}))
    model = Model(folder, task="rerank-yes-no")
    long_doc = "the dog read a book about paris " * 20
    ids = _model_card_ids(QUERY, long_doc, max_length=80)
    assert len(ids) == 80
    expected = torch.cat(hf_decoder_outputs(folder, [ids], yes_no=_yes_no_ids()))
    raw = model.predict([(QUERY, long_doc)], raw_scores=True)[:, 0]
    assert np.abs(raw - expected.numpy()).max() <= 1e-4
    with pytest.raises(InputError, match="maximum"):
        model.predict([(QUERY, long_doc)], truncate=False)


def test_yes_no_single_text_is_scored_as_given(checkpoints):  # type: ignore[no-untyped-def]
    arch, overrides = YES_NO_CASES["qwen3-untied"]
    folder = checkpoints("yes-no-qwen3-untied", arch, **overrides)
    model = Model(folder, task="rerank-yes-no")
    text = QWEN3_RERANKER.render(QUERY, "a custom instruction would go here")
    expected = hf_decoder_outputs(folder, [tokenizer().encode(text).ids], yes_no=_yes_no_ids())
    raw = model.predict(text, raw_scores=True)[0, 0]
    assert abs(raw - float(expected[0][0])) <= 1e-4


# --- configuration errors -----------------------------------------------------------------


def _edit_config(folder: Path, **changes: object) -> Path:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return folder


def test_unsupported_rope_type_is_named(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_decoder_checkpoint(tmp_path, "LlamaModel")
    _edit_config(folder, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4})
    with pytest.raises(CheckpointError, match="rope type 'yarn' is not supported"):
        load_executor(folder)


def test_llama3_rope_without_factors_is_named(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_decoder_checkpoint(tmp_path, "LlamaModel")
    _edit_config(folder, rope_parameters=None, rope_scaling={"rope_type": "llama3", "factor": 8})
    with pytest.raises(CheckpointError, match="needs a number 'low_freq_factor'"):
        load_executor(folder)


def test_bad_head_counts_and_layer_types(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_decoder_checkpoint(tmp_path, "Gemma2Model")
    _edit_config(folder, layer_types=["full_attention"])
    with pytest.raises(CheckpointError, match="layer_types has 1 entries for 3 layers"):
        load_executor(folder)
    _edit_config(folder, layer_types=None, num_key_value_heads=3)
    with pytest.raises(CheckpointError, match="not a multiple of num_key_value_heads 3"):
        load_executor(folder)


def test_wrong_family_fails_on_the_missing_tensor(tmp_path):  # type: ignore[no-untyped-def]
    folder = _edit_config(
        make_decoder_checkpoint(tmp_path, "LlamaModel"), architectures=["Qwen3Model"]
    )
    with pytest.raises(WeightError, match="layers.0.self_attn.q_norm.weight"):
        load_executor(folder)


def test_task_errors(tmp_path, checkpoints):  # type: ignore[no-untyped-def]
    arch, overrides = YES_NO_CASES["qwen3-untied"]
    folder = checkpoints("yes-no-qwen3-untied", arch, **overrides)
    with pytest.raises(InputError, match="unknown task 'rerank'"):
        load_executor(folder, task="rerank")
    arch, overrides = EMBEDDER_CASES["qwen3"]
    qwen3_base = checkpoints("qwen3", arch, **overrides)
    with pytest.raises(UnsupportedArchitectureError, match="does not apply to architecture"):
        load_executor(qwen3_base, task="rerank-yes-no")
    # A tokenizer without a "yes" token cannot score yes/no.
    no_yes = tmp_path / "no-yes"
    no_yes.mkdir()
    for f in folder.iterdir():
        if f.is_file():
            (no_yes / f.name).write_bytes(f.read_bytes())
    word_level = Tokenizer(models.WordLevel({"<unk>": 0, "no": 1, "maybe": 2}, unk_token="<unk>"))
    word_level.save(str(no_yes / "tokenizer.json"))
    with pytest.raises(CheckpointError, match="has no token 'yes'"):
        load_executor(no_yes, task="rerank-yes-no")
