"""The Python API: prompts, sentence-transformers modules, batching, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint
from reference import cosine, hf_encoder_outputs

from trt_tei_runtime import InputError, Model

TEXTS = ["the cat", "a dog in paris reads a book", "blue river", "fast search engine"]


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    return make_checkpoint(
        tmp_path_factory.mktemp("st"),
        "BertModel",
        pooling="cls",
        max_seq_length=12,
        normalize=True,
        dense_out=16,
        prompts={"query": "query: ", "passage": "passage: "},
        default_prompt_name="passage",
    )


@pytest.fixture(scope="module")
def st_model(st_dir):  # type: ignore[no-untyped-def]
    return Model(st_dir)


def test_sentence_transformers_modules_are_applied(st_model, st_dir):  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file

    info = st_model.info
    assert (info.pooling, info.max_input_length, info.hidden_size) == ("cls", 12, 16)
    enc = st_model.tokenizer.encode(["passage: " + t for t in TEXTS])
    refs = hf_encoder_outputs(st_dir, [e.ids for e in enc])
    dense = load_file(str(st_dir / "2_Dense" / "model.safetensors"))
    expected = torch.tanh(
        torch.stack([r[0] for r in refs]) @ dense["linear.weight"].T + dense["linear.bias"]
    )
    ours = torch.from_numpy(st_model.embed(TEXTS))
    assert cosine(ours, expected).min() >= 0.99999
    assert torch.allclose(ours.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5)


def test_named_and_default_prompts(st_model):  # type: ignore[no-untyped-def]
    default = st_model.embed(TEXTS)
    explicit = st_model.embed(TEXTS, prompt_name="passage")
    query = st_model.embed(TEXTS, prompt_name="query")
    np.testing.assert_allclose(default, explicit, atol=1e-6)
    assert not np.allclose(default, query, atol=1e-3)
    with pytest.raises(
        InputError, match=r"unknown prompt_name 'nope'; the model has \['passage', 'query'\]"
    ):
        st_model.embed(TEXTS, prompt_name="nope")


def test_truncate_false_reports_limit_and_length(st_model):  # type: ignore[no-untyped-def]
    long_text = "the cat and the dog " * 5
    assert st_model.embed([long_text]).shape == (1, 16)
    with pytest.raises(
        InputError, match="input 1 has 35 tokens, more than the model's maximum of 12"
    ):
        st_model.embed(["x", long_text], truncate=False)


def test_empty_and_bad_inputs(st_model):  # type: ignore[no-untyped-def]
    assert st_model.embed([]).shape == (0, 16)
    assert st_model.embed("one text").shape == (1, 16)
    with pytest.raises(InputError, match="input 1 must be a string, got int"):
        st_model.embed(["fine", 2])  # type: ignore[list-item]
    with pytest.raises(InputError, match="dimensions must be between 1 and 16"):
        st_model.embed(TEXTS, dimensions=17)


def test_progress_bar_for_long_lists(st_model, capsys):  # type: ignore[no-untyped-def]
    small = Model(st_model.info.model_dir, max_batch_tokens=1)
    small.embed(TEXTS * 3, show_progress_bar=True)
    err = capsys.readouterr().err
    assert "12/12" in err
    small.embed(TEXTS, show_progress_bar=False)
    assert capsys.readouterr().err == ""


def test_predict_accepts_single_pair_and_checks_items(tmp_path):  # type: ignore[no-untyped-def]
    model = Model(make_checkpoint(tmp_path, "BertForSequenceClassification", num_labels=1))
    one = model.predict(("query", "document"))
    assert one.shape == (1, 1)
    np.testing.assert_allclose(one, model.predict([("query", "document")]))
    with pytest.raises(InputError, match="input 0 must be a string or a pair of strings"):
        model.predict([("a", "b", "c")])
    with pytest.raises(InputError, match="pooling does not apply"):
        Model(model.info.model_dir, pooling="mean")


def test_bad_device_dtype_pooling(st_dir):  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="unknown dtype 'float8'"):
        Model(st_dir, dtype="float8")
    with pytest.raises(InputError, match="unknown pooling 'max'"):
        Model(st_dir, pooling="max")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="no CUDA GPU is available"):
            Model(st_dir, device="cuda")


def test_token_budget_batches_longest_first_within_budget():
    from trt_tei_runtime.batch import token_budget_batches

    lengths = [3, 10, 4, 7, 2]
    # Greedy in length order 10, 7, 4, 3, 2: 7 + 4 would pass 10, so 4 opens a batch.
    assert token_budget_batches(lengths, 10) == [[1], [3], [2, 0, 4]]
    # A sequence over the budget still runs, alone.
    assert token_budget_batches([12, 1], 10) == [[0], [1]]
    assert token_budget_batches([], 10) == []


def test_embed_ids_on_tokenize_equals_embed(st_model):  # type: ignore[no-untyped-def]
    ids = st_model.tokenize(TEXTS)
    np.testing.assert_allclose(st_model.embed_ids(ids), st_model.embed(TEXTS), atol=1e-6)
    np.testing.assert_allclose(
        st_model.embed_ids(ids, dimensions=8, normalize=False),
        st_model.embed(TEXTS, dimensions=8, normalize=False),
        atol=1e-6,
    )
    assert st_model.embed_ids([]).shape == (0, 16)
    with pytest.raises(InputError, match="input 1 is empty after tokenization"):
        st_model.embed_ids([ids[0], []])
