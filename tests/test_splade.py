"""SPLADE sparse encoders against sentence-transformers' `SparseEncoder` on the same folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint, make_splade_checkpoint

from trt_tei_runtime import Model
from trt_tei_runtime.backend import Backend
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.errors import CheckpointError, InputError
from trt_tei_runtime.sparse import (
    SpladeConfig,
    sequence_groups,
    splade_pool,
    top_active,
    unpack_active,
)

TEXTS = [
    "the cat",
    "a long document about the river in paris, france, and the green tree by the blue house "
    "where the dog reads a book while the server writes text for the search engine " * 2,
    "query",
    "x",
    "sentence embedding model is fast",
]


def sparse_encoder(folder):  # type: ignore[no-untyped-def]
    from sentence_transformers import SparseEncoder

    return SparseEncoder(str(folder), device="cpu")


def as_dense(rows: list[dict[int, float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        for j, v in row.items():
            out[i, j] = v
    return out


def assert_same_sparse(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Same active dimensions, values within 1e-4."""
    assert ours.shape == ref.shape
    assert torch.equal(ours > 0, ref > 0), (ours > 0).sum(1).tolist()
    assert (ours - ref).abs().max() <= 1e-4


@pytest.fixture(scope="module")
def splade_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    return make_splade_checkpoint(tmp_path_factory.mktemp("splade"))


@pytest.mark.parametrize("strategy", ["max", "sum"])
@pytest.mark.parametrize("activation", ["relu", "log1p_relu"])
def test_matches_sparse_encoder(tmp_path, strategy, activation):  # type: ignore[no-untyped-def]
    folder = make_splade_checkpoint(
        tmp_path, pooling_strategy=strategy, activation_function=activation, seed=3
    )
    ref = sparse_encoder(folder).encode(TEXTS, convert_to_sparse_tensor=False)
    model = Model(folder, device="cpu")
    assert model.info.model_type == "sparse"
    assert model.info.hidden_size == ref.shape[1]
    rows = model.embed_sparse(TEXTS)
    assert isinstance(rows, list)
    assert all(list(row) == sorted(row) for row in rows)  # index order
    assert_same_sparse(as_dense(rows, ref.shape[1]), ref)
    # The torch form: one sparse COO tensor, as SparseEncoder.encode returns by default.
    tensor = model.embed_sparse(TEXTS, sparse_tensor=True)
    assert isinstance(tensor, torch.Tensor) and tensor.layout == torch.sparse_coo
    assert_same_sparse(tensor.to_dense(), ref)


@pytest.mark.parametrize(
    ("strategy", "activation"), [("max", "relu"), ("max", "log1p_relu"), ("sum", "relu")]
)
def test_distilbert_matches_sparse_encoder(tmp_path, strategy, activation):  # type: ignore[no-untyped-def]
    """DistilBERT SPLADE (OpenSearch's neural-sparse encoders): `vocab_transform`,
    `vocab_layer_norm`, `vocab_projector` tied to the word embeddings."""
    folder = make_splade_checkpoint(
        tmp_path,
        "DistilBertForMaskedLM",
        pooling_strategy=strategy,
        activation_function=activation,
        seed=9,
    )
    ref = sparse_encoder(folder).encode(TEXTS, convert_to_sparse_tensor=False)
    rows = Model(folder, device="cpu").embed_sparse(TEXTS)
    assert_same_sparse(as_dense(rows, ref.shape[1]), ref)  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", ["RobertaForMaskedLM", "XLMRobertaForMaskedLM"])
def test_roberta_family_matches_transformers(tmp_path, arch):  # type: ignore[no-untyped-def]
    """RoBERTa's masked-LM head (`lm_head.*`, GELU) against transformers' own logits, pooled
    as SpladePooling does. (SparseEncoder's AutoTokenizer does not read the test's WordPiece
    tokenizer as a RoBERTa one, so the reference starts from our token ids instead.)"""
    import transformers

    folder = make_splade_checkpoint(tmp_path, arch, seed=7, max_seq_length=64)
    model = Model(folder, device="cpu")
    hf = getattr(transformers, arch).from_pretrained(folder).eval()
    ref = []
    with torch.no_grad():
        for ids in model.tokenize(TEXTS):
            logits = hf(input_ids=torch.tensor([ids])).logits[0]
            ref.append(torch.log1p(torch.relu(logits)).amax(0))
    rows = model.embed_sparse(TEXTS)
    assert_same_sparse(as_dense(rows, model.info.hidden_size), torch.stack(ref))  # type: ignore[arg-type]


def test_masked_lm_architectures_are_listed() -> None:
    from trt_tei_runtime.models import ARCHITECTURES, Task

    for name in (
        "BertForMaskedLM",
        "RobertaForMaskedLM",
        "XLMRobertaForMaskedLM",
        "DistilBertForMaskedLM",
    ):
        assert ARCHITECTURES[name].task is Task.SPARSE_EMBEDDING


def test_untied_decoder_and_bert_prefix(tmp_path):  # type: ignore[no-untyped-def]
    """A checkpoint whose decoder has its own weight (tie_word_embeddings false)."""
    folder = make_splade_checkpoint(tmp_path, seed=5)
    make_checkpoint(folder, "BertForMaskedLM", seed=5, tie_word_embeddings=False)
    ref = sparse_encoder(folder).encode(TEXTS, convert_to_sparse_tensor=False)
    model = Model(folder, device="cpu")
    assert not model.loaded_model.network.head.tied  # type: ignore[union-attr]
    assert_same_sparse(as_dense(model.embed_sparse(TEXTS), ref.shape[1]), ref)  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [1, 5])
def test_max_active_dims_as_sparse_encoder(splade_dir, k):  # type: ignore[no-untyped-def]
    ref = sparse_encoder(splade_dir).encode(
        TEXTS, convert_to_sparse_tensor=False, max_active_dims=k
    )
    per_call = Model(splade_dir, device="cpu").embed_sparse(TEXTS, max_active_dims=k)
    assert all(len(row) == k for row in per_call)
    assert_same_sparse(as_dense(per_call, ref.shape[1]), ref)  # type: ignore[arg-type]
    at_load = Model(splade_dir, device="cpu", max_active_dims=k).embed_sparse(TEXTS)
    assert at_load == per_call


def test_batch_equals_one_by_one(tmp_path):  # type: ignore[no-untyped-def]
    # 16-token batches: the call runs in several batches, each as wide as its most active
    # row, and the rows come back padded to one width and in input order.
    folder = make_splade_checkpoint(tmp_path, max_seq_length=16)
    model = Model(folder, device="cpu", max_batch_tokens=16)
    together = model.embed_sparse(TEXTS)
    assert len({len(row) for row in together}) > 1
    for text, row in zip(TEXTS, together):
        alone = model.embed_sparse(text)[0]  # type: ignore[index]
        assert alone.keys() == row.keys()
        assert max(abs(alone[j] - row[j]) for j in row) <= 1e-5


def test_chunked_pooling_equals_whole(splade_dir):  # type: ignore[no-untyped-def]
    """Groups of whole sequences, split wherever the token budget says, pool the same."""
    model = Model(splade_dir, device="cpu")
    ids = model.tokenize(TEXTS)
    batch = PackedBatch.from_sequences(ids)
    executor = model.executors[0]
    hidden = executor.hidden_states(batch)
    cu = batch.cu_seqlens.tolist()
    for strategy in ("max", "sum"):
        config = SpladeConfig(strategy, "relu")  # type: ignore[arg-type]
        head = executor.model.network.token_logits
        whole = splade_pool(head, hidden, cu, config, chunk_tokens=10_000)
        for chunk in (1, 7, 40):
            assert torch.allclose(splade_pool(head, hidden, cu, config, chunk), whole, atol=1e-6)


def test_sequence_groups() -> None:
    assert sequence_groups([0, 3, 5, 20, 21], 6) == [(0, 2), (2, 3), (3, 4)]
    assert sequence_groups([0, 3, 5, 20, 21], 100) == [(0, 4)]
    assert sequence_groups([0, 30], 4) == [(0, 1)]


def test_top_active_packs_index_value_pairs() -> None:
    pooled = torch.tensor([[0.0, 2.0, 0.0, 1.0, 3.0], [0.5, 0.0, 0.0, 0.0, 0.0]])
    packed = top_active(pooled, None)
    assert packed.shape == (2, 6)  # the most active row has 3
    assert packed[0].tolist() == [1.0, 2.0, 3.0, 1.0, 4.0, 3.0]  # (index, value) pairs
    assert unpack_active(packed[0]) == {1: 2.0, 3: 1.0, 4: 3.0}
    assert unpack_active(packed[1]) == {0: 0.5}
    assert unpack_active(top_active(pooled, 2)[0]) == {1: 2.0, 4: 3.0}
    # Nothing active at all still gives a well-formed (empty) answer.
    assert unpack_active(top_active(torch.zeros(1, 5), None)[0]) == {}
    with pytest.raises(InputError, match="max_active_dims"):
        top_active(pooled, 0)


def test_backend_serves_packed_sparse_rows(splade_dir):  # type: ignore[no-untyped-def]
    backend = Backend(str(splade_dir), device="cpu")
    info = backend.info()
    assert info["model_type"] == "sparse"
    assert info["pooling"] == "splade"
    model = Model(splade_dir, device="cpu")
    ids = model.tokenize(TEXTS)
    batch = PackedBatch.from_sequences(ids)
    arrays = [
        t.numpy().astype(np.uint32).tobytes()
        for t in (batch.input_ids, batch.token_type_ids, batch.position_ids, batch.cu_seqlens)
    ]
    out = backend.embed_sparse(*arrays)
    assert out.dtype == np.float32 and out.shape[0] == len(TEXTS) and out.shape[1] % 2 == 0
    rows = [unpack_active(torch.from_numpy(row)) for row in out]
    assert rows == model.embed_sparse(TEXTS)
    with pytest.raises(InputError, match="embed_sparse"):
        backend.embed(*arrays)


def test_sparse_model_refuses_embed_and_dense_pooling(splade_dir):  # type: ignore[no-untyped-def]
    model = Model(splade_dir, device="cpu")
    with pytest.raises(InputError, match="SPLADE"):
        model.embed(TEXTS)
    with pytest.raises(InputError, match="pooling is 'splade'"):
        Model(splade_dir, device="cpu", pooling="mean")
    assert Model(splade_dir, device="cpu", pooling="splade").info.pooling == "splade"
    with pytest.raises(InputError, match="max_active_dims"):
        model.embed_sparse(TEXTS, max_active_dims=0)
    with pytest.raises(InputError, match="max_active_dims"):
        Model(splade_dir, device="cpu", max_active_dims=-1)


def test_dense_model_refuses_sparse(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(tmp_path, "BertModel", pooling="mean")
    model = Model(folder, device="cpu")
    with pytest.raises(InputError, match="not a SPLADE model"):
        model.embed_sparse(TEXTS)
    with pytest.raises(InputError, match="masked-LM"):
        Model(folder, device="cpu", pooling="splade")
    with pytest.raises(InputError, match="applies to SPLADE models"):
        Model(folder, device="cpu", max_active_dims=4)


def test_splade_pooling_on_a_base_model_fails(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_splade_checkpoint(tmp_path)
    make_checkpoint(folder, "BertModel")  # overwrites the weights and config only
    with pytest.raises(CheckpointError, match="SpladePooling needs a masked-LM"):
        Model(folder, device="cpu")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"pooling_strategy": "mean"}, "pooling_strategy 'mean'"),
        ({"activation_function": "gelu"}, "activation_function 'gelu'"),
    ],
)
def test_bad_splade_config(tmp_path, config, message):  # type: ignore[no-untyped-def]
    folder = make_splade_checkpoint(tmp_path)
    (folder / "1_SpladePooling" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        Model(folder, device="cpu")


def test_unsupported_sparse_module(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_splade_checkpoint(tmp_path)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append(
        {
            "idx": 2,
            "name": "2",
            "path": "2_SparseAutoEncoder",
            "type": "sentence_transformers.sparse_encoder.models.SparseAutoEncoder",
        }
    )
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match="SparseAutoEncoder is not supported"):
        Model(folder, device="cpu")


def test_masked_lm_without_sentence_transformers_files(tmp_path):  # type: ignore[no-untyped-def]
    """A bare BertForMaskedLM checkpoint pools as SPLADE v2 (max, relu)."""
    folder = make_splade_checkpoint(tmp_path / "st", seed=2)
    bare = make_checkpoint(tmp_path / "bare", "BertForMaskedLM", seed=2)
    ref = Model(folder, device="cpu").embed_sparse(TEXTS)
    assert Model(bare, device="cpu").embed_sparse(TEXTS) == ref
