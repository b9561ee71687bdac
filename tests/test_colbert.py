"""Late interaction (ColBERT): PyLate checkpoints' token vectors and MaxSim scores against
PyLate's encoder rules (`checkpoints.colbert.pylate_encode`) on tiny random checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint
from checkpoints.colbert import make_colbert_checkpoint, pylate_encode, pylate_maxsim

from trt_tei_runtime import Model
from trt_tei_runtime.errors import CheckpointError, InputError
from trt_tei_runtime.late_interaction import packed_maxsim

QUERIES = ["what is the capital of france?", "cat", "  blue river  ", "the dog " * 30]
DOCUMENTS = [
    "paris is the capital of france, a city on a river.",
    "the cat is on the house!",
    "a",
    "book, text, sentence... long document about the green tree " * 6,
    "?!.",
]


def assert_same_vectors(ours: list[np.ndarray], ref: list[torch.Tensor]) -> None:
    """Same number of vectors per input, each with cosine >= 0.99999 to PyLate's and every
    value within 1e-5 (the tiny model's vectors are close to one another: attending to the
    expansion tokens or not moves values by ~2e-3)."""
    assert [o.shape for o in ours] == [tuple(r.shape) for r in ref]
    for o, r in zip(ours, ref):
        cosine = torch.nn.functional.cosine_similarity(torch.from_numpy(o), r, dim=1)
        assert cosine.min() >= 0.99999, cosine.tolist()
        assert (torch.from_numpy(o) - r).abs().max() <= 1e-5


@pytest.fixture(
    scope="module", params=[False, True], ids=["hidden-expansion", "attended-expansion"]
)
def colbert_dir(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("colbert")
    return make_colbert_checkpoint(folder, attend_to_expansion_tokens=request.param)


@pytest.fixture(scope="module")
def colbert(colbert_dir):  # type: ignore[no-untyped-def]
    return Model(colbert_dir, device="cpu", dtype="float32")


def test_queries_match_pylate(colbert, colbert_dir):  # type: ignore[no-untyped-def]
    ours = colbert.embed_multivector(QUERIES, input_type="query")
    assert_same_vectors(ours, pylate_encode(colbert_dir, QUERIES, is_query=True))
    # Expanded queries are all query_length vectors long, the long one cut to it.
    assert {o.shape[0] for o in ours} == {12}
    np.testing.assert_allclose(np.linalg.norm(ours[0], axis=1), 1.0, rtol=1e-5)


def test_documents_match_pylate(colbert, colbert_dir):  # type: ignore[no-untyped-def]
    ours = colbert.embed_multivector(DOCUMENTS, input_type="document")
    ref = pylate_encode(colbert_dir, DOCUMENTS, is_query=False)
    assert_same_vectors(ours, ref)
    # The skiplist drops punctuation; the long document is cut to document_length.
    assert ours[4].shape[0] == 3  # [CLS] [D] [SEP]
    assert ours[3].shape[0] < 20


def test_rerank_scores_by_maxsim(colbert, colbert_dir):  # type: ignore[no-untyped-def]
    query = QUERIES[0]
    ranked = colbert.rerank(query, DOCUMENTS)
    q = pylate_encode(colbert_dir, [query], is_query=True)[0]
    ref = pylate_maxsim(q, pylate_encode(colbert_dir, DOCUMENTS, is_query=False))
    assert [i for i, _ in ranked] == sorted(range(len(DOCUMENTS)), key=lambda i: -float(ref[i]))
    for i, score in ranked:
        assert abs(score - float(ref[i])) <= 1e-4
    assert len(colbert.rerank(query, DOCUMENTS, top_n=2)) == 2


def test_query_without_expansion(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_colbert_checkpoint(tmp_path, do_query_expansion=False)
    model = Model(folder, device="cpu", dtype="float32")
    ours = model.embed_multivector(QUERIES, input_type="query")
    assert_same_vectors(ours, pylate_encode(folder, QUERIES, is_query=True))
    assert ours[1].shape[0] == 4  # [CLS] [Q] cat [SEP]: no mask tokens


def test_empty_prefix_and_batches_across_devices(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_colbert_checkpoint(tmp_path, query_prefix="", document_prefix="")
    model = Model(folder, device="cpu,cpu", dtype="float32", max_batch_tokens=40)
    texts = DOCUMENTS * 3
    ours = model.embed_multivector(texts, input_type="document")
    assert_same_vectors(ours, pylate_encode(folder, texts, is_query=False))
    queries = model.embed_multivector(QUERIES, input_type="query")
    assert_same_vectors(queries, pylate_encode(folder, QUERIES, is_query=True))


def test_info_and_no_single_vector(colbert):  # type: ignore[no-untyped-def]
    late = colbert.info.late_interaction
    assert late is not None
    assert (late.query_length, late.document_length, late.embedding_size) == (12, 20, 16)
    assert colbert.info.hidden_size == 16 and colbert.info.pooling is None
    with pytest.raises(InputError, match="late-interaction"):
        colbert.embed(["the cat"])


def test_bad_input_type(colbert):  # type: ignore[no-untyped-def]
    for bad in ["passage", "", None]:
        with pytest.raises(InputError, match="input_type must be 'query' or 'document'"):
            colbert.embed_multivector(["the cat"], input_type=bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="input 0 must be a string"):
        colbert.embed_multivector([3], input_type="query")  # type: ignore[list-item]
    assert colbert.embed_multivector([], input_type="query") == []


def test_multivector_on_a_single_vector_model(tmp_path):  # type: ignore[no-untyped-def]
    model = Model(make_checkpoint(tmp_path, pooling="mean"), device="cpu")
    with pytest.raises(InputError, match="needs a late-interaction"):
        model.embed_multivector(["the cat"], input_type="query")


def test_pooling_does_not_apply(colbert_dir):  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="pooling does not apply"):
        Model(colbert_dir, device="cpu", pooling="mean")


def test_bad_configs(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_colbert_checkpoint(tmp_path)
    path = folder / "config_sentence_transformers.json"
    cfg = json.loads(path.read_text())
    for key, value, message in [
        ("query_length", 2, "query_length must be an integer of at least 3"),
        ("document_length", 1000, "exceed the model's"),
        ("query_prefix", "[NOPE]", "has no token '\\[NOPE\\]'"),
        ("attend_to_expansion_tokens", "yes", "must be true or false"),
    ]:
        path.write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(CheckpointError, match=message):
            Model(folder, device="cpu")
    path.write_text(json.dumps(cfg))
    (folder / "modules.json").write_text(
        json.dumps(json.loads((folder / "modules.json").read_text())[:1])
    )
    with pytest.raises(CheckpointError, match="needs its Dense projection"):
        Model(folder, device="cpu")


def test_packed_maxsim_scores_each_document_against_its_own_query() -> None:
    """Documents of two queries of different lengths in one packed batch; skiplist rows
    and padding never win, an all-skiplist document scores 0."""
    torch.manual_seed(0)
    q1 = torch.nn.functional.normalize(torch.randn(3, 8), dim=1)
    q2 = torch.nn.functional.normalize(torch.randn(5, 8), dim=1)
    short = -q1[:1]  # every similarity negative: padding must not win with 0
    long = torch.nn.functional.normalize(torch.randn(7, 8), dim=1)
    other = torch.nn.functional.normalize(torch.randn(4, 8), dim=1)
    skipped = torch.nn.functional.normalize(torch.randn(2, 8), dim=1)
    docs = [short, long, other, skipped]
    vectors = torch.cat(docs)
    cu_seqlens = torch.tensor([0, 1, 8, 12, 14], dtype=torch.int32)
    kept = torch.ones(14, dtype=torch.bool)
    kept[9] = False  # one of `other`'s tokens is in the skiplist
    kept[12:] = False
    queries = torch.cat([q1, q2])
    spans = torch.tensor([[0, 3], [0, 3], [3, 8], [3, 8]])
    scores = packed_maxsim(vectors, cu_seqlens, kept, queries, spans, 7, 5)
    assert torch.allclose(scores[0], pylate_maxsim(q1, [short])[0])
    assert torch.allclose(scores[1], pylate_maxsim(q1, [long])[0])
    assert torch.allclose(scores[2], pylate_maxsim(q2, [other[[0, 2, 3]]])[0])
    assert scores[3] == 0


def test_rerank_runs_maxsim_on_the_device_it_encodes_on(colbert, monkeypatch):  # type: ignore[no-untyped-def]
    """Documents are scored by `Executor.maxsim`: their vectors are never asked for."""
    monkeypatch.setattr(
        type(colbert.executors[0]),
        "embed_multivector",
        _only_queries(type(colbert.executors[0]).embed_multivector),
    )
    assert len(colbert.rerank("cat", DOCUMENTS)) == len(DOCUMENTS)
    assert colbert.rerank("cat", []) == []


def _only_queries(embed):  # type: ignore[no-untyped-def]
    def guarded(executor, batch, lane=None):  # type: ignore[no-untyped-def]
        assert batch.num_seqs == 1, "document vectors were brought back to the host"
        return embed(executor, batch, lane)

    return guarded


@pytest.mark.parametrize("attend", [False, True], ids=["hidden-expansion", "attended-expansion"])
def test_modernbert_backbone(tmp_path, attend):  # type: ignore[no-untyped-def]
    folder = make_colbert_checkpoint(
        tmp_path, architecture="ModernBertModel", attend_to_expansion_tokens=attend
    )
    model = Model(folder, device="cpu", dtype="float32")
    for input_type, texts in [("query", QUERIES), ("document", DOCUMENTS)]:
        ours = model.embed_multivector(texts, input_type=input_type)
        assert_same_vectors(ours, pylate_encode(folder, texts, is_query=input_type == "query"))
