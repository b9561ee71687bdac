"""Issue 15's families against `transformers` (and sentence-transformers / peft) on tiny
random checkpoints: ModernBERT (+ sequence classification), NomicBERT, jina-embeddings-v3
with its LoRA task adapters chosen per request, EmbeddingGemma with its Dense modules.

transformers runs one sequence at a time without padding (eager attention); we run packed
batches. Sequences are longer than every sliding window, so a wrong window cannot hide."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import (
    JINA_PROMPTS,
    JINA_TASKS,
    add_embeddinggemma_modules,
    add_jina_adapters,
    hf_jina_outputs,
    make_family_checkpoint,
)
from reference import cosine, hf_encoder_outputs

from trt_tei_runtime import InputError, Model
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.runtime import load_executor

LENGTHS = [3, 40, 17, 1, 25]


def _ids(lengths: list[int], vocab: int, seed: int = 0, low: int = 5) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(low, vocab, (n,), generator=gen).tolist() for n in lengths]


def _hf_hidden(folder: Path, ids: list[list[int]]) -> torch.Tensor:
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    model = getattr(transformers, config.architectures[0]).from_pretrained(
        folder, attn_implementation="eager"
    )
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([s])).last_hidden_state[0] for s in ids])


CASES = {
    "modernbert": ("ModernBertModel", {}),
    "nomic": ("NomicBertModel", {}),
    "jina-no-adapters": ("JinaEmbeddingsV3Model", {}),
    "embeddinggemma": ("Gemma3TextModel", {"use_bidirectional_attention": True}),
    "gemma3-causal": ("Gemma3TextModel", {}),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):  # type: ignore[no-untyped-def]
    cache: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in cache:
            arch, overrides = CASES[case]
            cache[case] = make_family_checkpoint(tmp_path_factory.mktemp(case), arch, **overrides)
        return cache[case]

    return get


@pytest.mark.parametrize("case", sorted(CASES))
def test_hidden_states_match_transformers(folders, case):  # type: ignore[no-untyped-def]
    folder = folders(case)
    executor = load_executor(folder)
    ids = _ids(LENGTHS, executor.model.network.vocab_size, seed=1)
    ours = executor.hidden_states(PackedBatch.from_sequences(ids))
    expected = _hf_hidden(folder, ids)
    assert cosine(ours, expected).min() >= 0.99999
    assert (ours - expected).abs().max() <= 1e-4
    # A batch equals its sequences run one by one.
    single = torch.cat([executor.hidden_states(PackedBatch.from_sequences([s])) for s in ids])
    torch.testing.assert_close(ours, single, atol=1e-5, rtol=1e-5)


def test_sliding_windows_and_rope_bases_are_not_ignored(folders, tmp_path):  # type: ignore[no-untyped-def]
    """With full attention and one rotary base everywhere the outputs must differ: the
    sequences are long enough to tell."""
    import json

    ids = _ids([40], 100, seed=2)
    for case in ("modernbert", "embeddinggemma"):
        folder = folders(case)
        config = json.loads((folder / "config.json").read_text())
        plain = tmp_path / case
        plain.mkdir()
        for f in folder.iterdir():
            if f.is_file() and f.name != "config.json":
                (plain / f.name).write_bytes(f.read_bytes())
        config["layer_types"] = ["full_attention"] * len(config["layer_types"])
        (plain / "config.json").write_text(json.dumps(config))
        a = load_executor(folder).hidden_states(PackedBatch.from_sequences(ids))
        b = load_executor(plain).hidden_states(PackedBatch.from_sequences(ids))
        assert (a - b).abs().max() > 1e-3, case


def test_modernbert_classifier_matches_transformers(tmp_path):  # type: ignore[no-untyped-def]
    for pooling, labels in (("cls", 1), ("mean", 3)):
        folder = make_family_checkpoint(
            tmp_path / pooling,
            "ModernBertForSequenceClassification",
            num_labels=labels,
            classifier_pooling=pooling,
            classifier_bias=True,
        )
        executor = load_executor(folder)
        ids = _ids(LENGTHS, executor.model.network.vocab_size, seed=3)
        ours = executor.predict(PackedBatch.from_sequences(ids))
        expected = torch.stack(hf_encoder_outputs(folder, ids))
        assert ours.shape == (len(ids), labels)
        assert (ours - expected).abs().max() <= 1e-4
        single = torch.cat([executor.predict(PackedBatch.from_sequences([s])) for s in ids])
        torch.testing.assert_close(ours, single, atol=1e-5, rtol=1e-5)


def test_nomic_prompts_and_mean_pooling_match_sentence_transformers(tmp_path):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    prompts = {"query": "search_query: ", "document": "search_document: "}
    folder = make_family_checkpoint(tmp_path, "NomicBertModel", pooling="mean", prompts=prompts)
    model = Model(folder)
    reference = SentenceTransformer(str(folder), device="cpu")
    texts = ["what is the capital of france", "paris is a city on a river"]
    for name in ("query", "document"):
        ours = model.embed(texts, prompt_name=name)
        expected = reference.encode(texts, prompt_name=name, normalize_embeddings=True)
        assert cosine(torch.from_numpy(ours), torch.from_numpy(expected)).min() >= 0.99999


def test_embeddinggemma_dense_modules_match_sentence_transformers(tmp_path):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    folder = make_family_checkpoint(tmp_path, "Gemma3TextModel", use_bidirectional_attention=True)
    add_embeddinggemma_modules(folder, hidden=64)
    model = Model(folder)
    assert model.info.pooling == "mean"
    assert model.info.hidden_size == 64
    reference = SentenceTransformer(str(folder), device="cpu")
    texts = ["the cat sat on the mat and the dog read a book about paris", "yes no", "a"]
    for name in ("query", "document"):
        ours = model.embed(texts, prompt_name=name)
        expected = reference.encode(texts, prompt_name=name)
        assert cosine(torch.from_numpy(ours), torch.from_numpy(expected)).min() >= 0.99999
        assert np.abs(ours - expected).max() <= 1e-4


@pytest.fixture(scope="module")
def jina(tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = make_family_checkpoint(
        tmp_path_factory.mktemp("jina"),
        "JinaEmbeddingsV3Model",
        pooling="mean",
        prompts=JINA_PROMPTS,
    )
    add_jina_adapters(folder)
    return folder


def test_jina_each_adapter_matches_transformers_with_it_set(jina):  # type: ignore[no-untyped-def]
    executor = load_executor(jina)
    network = executor.model.network
    ids = _ids(LENGTHS, network.vocab_size, seed=4)
    for task in [None, *JINA_TASKS]:
        index = 0 if task is None else network.adapter_index(task)
        assert index is not None
        types = [[index] * len(s) for s in ids]
        ours = executor.hidden_states(PackedBatch.from_sequences(ids, types))
        expected = torch.cat(hf_jina_outputs(jina, ids, task))
        assert cosine(ours, expected).min() >= 0.99999, task
        assert (ours - expected).abs().max() <= 1e-4, task


def test_jina_batch_of_mixed_adapters_equals_one_by_one(jina):  # type: ignore[no-untyped-def]
    executor = load_executor(jina)
    ids = _ids(LENGTHS, executor.model.network.vocab_size, seed=5)
    adapters = [0, 1, 5, 3, 2]
    batch = PackedBatch.from_sequences(ids, [[a] * len(s) for a, s in zip(adapters, ids)])
    mixed = executor.hidden_states(batch)
    single = torch.cat(
        [
            executor.hidden_states(PackedBatch.from_sequences([s], [[a] * len(s)]))
            for a, s in zip(adapters, ids)
        ]
    )
    torch.testing.assert_close(mixed, single, atol=1e-5, rtol=1e-5)


def test_jina_prompt_name_picks_the_adapter_in_model_embed(jina):  # type: ignore[no-untyped-def]
    model = Model(jina)
    # Every prompt of the checkpoint names one adapter, by its own spelling.
    assert model.info.adapters == {
        "retrieval.query": 3,
        "retrieval.passage": 2,
        "separation": 4,
        "classification": 1,
        "text-matching": 5,
    }
    texts = ["what is the capital of france", "paris"]
    ours = model.embed(texts, prompt_name="retrieval.query")
    prompt = JINA_PROMPTS["retrieval.query"]
    ids = [e.ids for e in model.tokenizer.encode([prompt + t for t in texts])]
    hidden = hf_jina_outputs(jina, ids, "retrieval_query")
    expected = torch.nn.functional.normalize(torch.stack([h.mean(0) for h in hidden]), dim=-1)
    assert cosine(torch.from_numpy(ours), expected).min() >= 0.99999
    plain = model.embed(texts, prompt_name="separation")
    assert np.abs(plain - model.embed(texts, prompt_name="text-matching")).max() > 1e-3
    with pytest.raises(InputError, match="unknown prompt_name 'retrieval'"):
        model.embed(texts, prompt_name="retrieval")
