"""LoRA adapters per request (`models.peft`, `models.lora`): PEFT folders loaded onto a
BERT and a decoder checkpoint, compared with PEFT's own model (unmerged and merged) in
fp32 on the CPU; adapters of different ranks and targets, one batch mixing the base
weights and several adapters; the errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint, make_decoder_checkpoint, make_family_checkpoint
from checkpoints.lora import make_lora_adapter, peft_hidden, peft_model
from reference import cosine

from trt_tei_runtime import InputError, Model
from trt_tei_runtime.backend import Backend
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.errors import CheckpointError
from trt_tei_runtime.runtime import Executor, load_executor
from trt_tei_runtime.runtime.stream import Chunk, run_chunks
from trt_tei_runtime.token_ids import TokenIds

LENGTHS = [3, 40, 17, 1, 25]
TEXTS = ["the cat sat on the mat", "paris is a city", "a", "what is deep learning"]

# Per family: two adapters of different ranks and targets, one with rsLoRA. BERT's
# `output.dense` is both the attention output and the MLP's down projection; q/k/v are
# one fused GEMM here, as are the decoder's gate/up.
FAMILIES = {
    "bert": (
        lambda folder: make_checkpoint(folder, "BertModel", pooling="mean"),
        {
            "small": dict(r=4, targets=["query", "value"], alpha=8),
            "wide": dict(
                r=16,
                targets=["key", "intermediate.dense", "output.dense"],
                alpha=24,
                use_rslora=True,
            ),
        },
    ),
    "qwen3": (
        lambda folder: make_decoder_checkpoint(folder, "Qwen3Model"),
        {
            "small": dict(r=4, targets=["q_proj", "v_proj", "o_proj"], alpha=8),
            "wide": dict(
                r=16,
                targets=["k_proj", "gate_proj", "up_proj", "down_proj"],
                alpha=32,
                use_rslora=True,
            ),
        },
    ),
}


def _ids(lengths: list[int], vocab: int, seed: int = 0, low: int = 5) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(low, vocab, (n,), generator=gen).tolist() for n in lengths]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    make, specs = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    base = make(root / "base")
    adapters = {}
    for seed, (name, spec) in enumerate(specs.items()):
        adapters[name] = make_lora_adapter(base, root / name, seed=10 + seed, **spec)
    return base, adapters


def _hidden(executor: Executor, ids: list[list[int]], types: list[int]) -> torch.Tensor:
    stride = executor.info.adapter_type_stride
    batch = PackedBatch.from_sequences(ids, [[t * stride] * len(s) for t, s in zip(types, ids)])
    return executor.hidden_states(batch).float()


def test_each_adapter_matches_peft_unmerged_and_merged(family):  # type: ignore[no-untyped-def]
    base, adapters = family
    executor = load_executor(base, lora_adapters=adapters)
    assert executor.info.lora_adapters == {"small": 1, "wide": 2}
    ids = _ids(LENGTHS, executor.model.network.vocab_size, seed=3)
    for name, index in [(None, 0), *executor.info.lora_adapters.items()]:
        ours = _hidden(executor, ids, [index] * len(ids))
        for merged in (False, True):
            folder = None if name is None else adapters[name]
            expected = peft_hidden(peft_model(base, folder, merged=merged), ids)
            assert cosine(ours, expected).min() >= 0.99999, (name, merged)
            assert (ours - expected).abs().max() <= 1e-4, (name, merged)
    # The adapters change the output (a test of nothing otherwise).
    plain = _hidden(executor, ids, [0] * len(ids))
    for index in (1, 2):
        assert (_hidden(executor, ids, [index] * len(ids)) - plain).abs().max() > 1e-2


@pytest.mark.parametrize(
    ("architecture", "targets"),
    [
        # Checkpoint names differ from transformers' (and PEFT's) module names here.
        ("NomicBertModel", ["q_proj", "o_proj", "gate_proj", "down_proj"]),
        # q/k/v and gate/up fused in the checkpoint itself.
        ("ModernBertModel", ["Wqkv", "Wi", "Wo"]),
    ],
)
def test_other_families_match_peft(tmp_path, architecture, targets):  # type: ignore[no-untyped-def]
    base = make_family_checkpoint(tmp_path / "base", architecture)
    folder = make_lora_adapter(base, tmp_path / "a", r=8, targets=targets, seed=3)
    executor = load_executor(base, lora_adapters={"a": folder})
    ids = _ids([5, 17], executor.model.network.vocab_size, seed=2)
    ours = _hidden(executor, ids, [1, 1])
    expected = peft_hidden(peft_model(base, folder), ids)
    assert cosine(ours, expected).min() >= 0.99999
    assert (ours - expected).abs().max() <= 1e-4
    assert (_hidden(executor, ids, [0, 0]) - expected).abs().max() > 1e-2


def test_batch_of_mixed_adapters_equals_one_by_one(family):  # type: ignore[no-untyped-def]
    base, adapters = family
    executor = load_executor(base, lora_adapters=adapters)
    ids = _ids(LENGTHS, executor.model.network.vocab_size, seed=5)
    chosen = [0, 2, 1, 0, 2]
    mixed = _hidden(executor, ids, chosen)
    alone = torch.cat([_hidden(executor, [s], [a]) for s, a in zip(ids, chosen)])
    torch.testing.assert_close(mixed, alone, atol=1e-5, rtol=1e-5)


def test_model_embed_with_an_adapter_and_mixed_stream(family):  # type: ignore[no-untyped-def]
    base, adapters = family
    model = Model(base, lora_adapters={k: str(v) for k, v in adapters.items()})
    alone = {name: model.embed(TEXTS, adapter=name) for name in (None, "small", "wide")}
    assert not np.allclose(alone["small"], alone[None], atol=1e-3)
    assert not np.allclose(alone["wide"], alone["small"], atol=1e-3)
    # Token ids in, the same vectors out.
    ids = model.tokenize_ids(TEXTS)
    np.testing.assert_allclose(model.embed_ids(ids, adapter="wide"), alone["wide"], atol=1e-6)
    [(_, streamed)] = list(model.embed_ids_stream([("k", ids)], adapter="small"))
    np.testing.assert_allclose(streamed, alone["small"], atol=1e-6)
    # One chunk, one batch: base, small and wide inputs side by side, through the stream
    # that serves `embed` (each input's type ids carry its adapter).
    names = [None, "small", "wide", "small"]
    stride = model.info.adapter_type_stride
    types = np.concatenate(
        [
            np.full(
                ids.offsets[i + 1] - ids.offsets[i], model.info.lora_adapters.get(n, 0) * stride
            )
            for i, n in enumerate(names)
        ]
    ).astype(np.uint32)
    chunk = Chunk(0, ids, TokenIds(types, ids.offsets))
    [(_, rows)] = list(
        run_chunks(model.executors, [chunk], Executor.embed, 4096, model.info.position_offset)
    )
    assert rows is not None
    mixed = torch.nn.functional.normalize(rows, dim=-1).numpy()
    for i, name in enumerate(names):
        np.testing.assert_allclose(mixed[i], alone[name][i], atol=1e-5)


def test_backend_serves_adapters_by_type_id(family):  # type: ignore[no-untyped-def]
    base, adapters = family
    backend = Backend(
        str(base), device="cpu", lora_adapters={k: str(v) for k, v in adapters.items()}
    )
    info = backend.model.info
    assert info.lora_adapters == {"small": 1, "wide": 2}
    ids = _ids([5, 9, 4], backend.model.model.network.vocab_size, seed=7)
    chosen = [2, 0, 1]
    stride = info.adapter_type_stride
    flat = [t for s in ids for t in s]
    types = [a * stride for a, s in zip(chosen, ids) for _ in s]
    positions = [p + info.position_offset for s in ids for p in range(len(s))]
    cu = np.cumsum([0, *map(len, ids)])
    arrays = [np.asarray(a, dtype="<u4").tobytes() for a in (flat, types, positions, cu)]
    pooled = backend.embed(*arrays)
    model = Model(base, lora_adapters=adapters)
    for i, (seq, a) in enumerate(zip(ids, chosen)):
        name = {0: None, 1: "small", 2: "wide"}[a]
        expected = model.embed_ids([seq], normalize=False, adapter=name)[0]
        np.testing.assert_allclose(pooled[i], expected, atol=1e-5)
    # An adapter index past the loaded ones is refused, not run as the base weights.
    bad = [np.asarray(a, dtype="<u4").tobytes() for a in ([7], [3 * stride], [0], [0, 1])]
    with pytest.raises(InputError, match="token type id"):
        backend.embed(*bad)


def test_classifier_pairs_keep_their_token_types_under_an_adapter(tmp_path):  # type: ignore[no-untyped-def]
    """BERT reads two token types: a pair's second text keeps type 1 under an adapter (type
    ids `index * 2 + type`), and the adapter's names carry the task checkpoint's `bert.`."""
    base = make_checkpoint(tmp_path / "base", "BertForSequenceClassification", num_labels=3)
    folder = make_lora_adapter(base, tmp_path / "a", r=8, targets=["query", "value", "key"])
    model = Model(base, lora_adapters={"a": folder})
    assert model.info.adapter_type_stride == 2
    pairs = [("what is a cat", "a cat is an animal"), ("paris", "the city of france")]
    ours = model.predict(pairs, raw_scores=True, adapter="a")
    reference = peft_model(base, folder)
    with torch.no_grad():
        for i, enc in enumerate(model.tokenizer.encode(pairs)):
            assert 1 in enc.type_ids
            expected = reference(
                input_ids=torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids])
            ).logits[0]
            np.testing.assert_allclose(ours[i], expected.numpy(), atol=1e-4)
    assert np.abs(model.predict(pairs, raw_scores=True) - ours).max() > 1e-3


def test_unknown_adapter_names_the_loaded_ones(family):  # type: ignore[no-untyped-def]
    base, adapters = family
    model = Model(base, lora_adapters=adapters)
    for call in (
        lambda: model.embed(TEXTS, adapter="nope"),
        lambda: model.embed_ids([[5, 6]], adapter="nope"),
    ):
        with pytest.raises(InputError, match=r"unknown adapter 'nope'.*'small', 'wide'"):
            call()
    with pytest.raises(InputError, match="loaded adapters: none"):
        Model(base).embed(TEXTS, adapter="small")


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.fixture(scope="module")
def bert(tmp_path_factory):  # type: ignore[no-untyped-def]
    return make_checkpoint(tmp_path_factory.mktemp("bert") / "base", "BertModel")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"use_dora": True}, "use_dora=True is not supported"),
        ({"bias": "all"}, "bias='all' is not supported"),
        ({"modules_to_save": ["pooler"]}, r"modules_to_save=\['pooler'\] is not supported"),
        ({"alpha_pattern": {"query": 3}}, "alpha_pattern=.* is not supported"),
        ({"peft_type": "IA3"}, "only LoRA adapters are supported, got peft_type 'IA3'"),
        ({"r": 128}, "rank r=128 is above the supported 64"),
    ],
)
def test_unsupported_adapter_configs_are_refused_by_name(bert, tmp_path, changes, message):  # type: ignore[no-untyped-def]
    folder = make_lora_adapter(bert, tmp_path / "a", r=4, targets=["query"])
    _edit_config(folder, **changes)
    with pytest.raises(CheckpointError, match=message):
        Model(bert, lora_adapters={"a": folder})


def test_adapters_of_embeddings_or_pooler_are_refused_by_module(bert, tmp_path):  # type: ignore[no-untyped-def]
    for targets, module in (
        (["word_embeddings", "query"], "embeddings.word_embeddings"),
        (["pooler.dense"], "pooler.dense"),
    ):
        folder = make_lora_adapter(bert, tmp_path / module, r=4, targets=targets)
        with pytest.raises(
            CheckpointError, match=rf"adapter 'x' .* targets '{module}'.*cannot adapt"
        ):
            Model(bert, lora_adapters={"x": folder})


def test_rank_above_the_limit_is_refused_from_the_tensors(bert, tmp_path):  # type: ignore[no-untyped-def]
    # `rank_pattern` gives a module another rank than `r`: the tensors' rank is checked.
    folder = make_lora_adapter(
        bert, tmp_path / "a", r=4, targets=["query"], rank_pattern={"query": 65}
    )
    with pytest.raises(CheckpointError, match="has rank 65, above the supported 64"):
        Model(bert, lora_adapters={"a": folder})


def test_not_an_adapter_folder_and_duplicate_names(bert, tmp_path):  # type: ignore[no-untyped-def]
    with pytest.raises(CheckpointError, match="is not a PEFT adapter folder"):
        Model(bert, lora_adapters={"a": tmp_path})
    folder = make_lora_adapter(bert, tmp_path / "a", r=4, targets=["query"])
    with pytest.raises(InputError, match="adapter names must be non-empty"):
        Model(bert, lora_adapters={"": folder})


def test_deberta_refuses_adapters(tmp_path):  # type: ignore[no-untyped-def]
    base = make_checkpoint(tmp_path / "base", "DebertaV2Model")
    folder = make_lora_adapter(base, tmp_path / "a", r=4, targets=["query_proj"])
    with pytest.raises(CheckpointError, match="not supported on DebertaV2Model"):
        Model(base, lora_adapters={"a": folder})
