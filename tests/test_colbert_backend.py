"""`Backend.maxsim`, the call the router makes for `/rerank` on a ColBERT model: documents
of several queries in one packed batch, each scored against its own query's vectors, as
`Model.embed_multivector`'s vectors score them on the host."""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints.colbert import make_colbert_checkpoint

from trt_tei_runtime import InputError, Model
from trt_tei_runtime.backend import Backend

QUERIES = ["what is the capital of france?", "cat"]
DOCUMENTS = [
    "paris is the capital of france, a city on a river.",
    "the cat is on the house!",
    "?!.",
    "book, text, sentence... long document about the green tree " * 6,
]


def host_maxsim(query: np.ndarray, document: np.ndarray) -> float:
    return float((query @ document.T).max(axis=1).sum()) if len(document) else 0.0


def pack_documents(model: Model, texts: list[str]) -> tuple[bytes, bytes, bytes, bytes]:
    """The documents as the router sends them: prefix in, cut to length, four buffers."""
    late = model.info.late_interaction
    assert late is not None
    ids, _ = model._late_tokenizer(late, "document").encode_ids(texts, truncate=True)
    inputs = late.model_inputs(ids, "document")
    lengths = np.diff(inputs.offsets)
    offset = model.info.position_offset
    positions = np.concatenate([np.arange(n) + offset for n in lengths]).astype("<u4")
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype("<u4")
    flat = inputs.ids.astype("<u4")
    return flat.tobytes(), np.zeros_like(flat).tobytes(), positions.tobytes(), cu.tobytes()


@pytest.fixture(scope="module", params=[False, True], ids=["hidden", "attended"])
def colbert(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = make_colbert_checkpoint(
        tmp_path_factory.mktemp("colbert"), attend_to_expansion_tokens=request.param
    )
    return Backend(str(folder), dtype="float32"), Model(folder, device="cpu", dtype="float32")


def test_documents_of_two_queries_in_one_batch(colbert):  # type: ignore[no-untyped-def]
    backend, model = colbert
    queries = model.embed_multivector(QUERIES, "query")
    vectors = model.embed_multivector(DOCUMENTS, "document")
    # Documents 0 and 1 against the first query, 2 and 3 against the second.
    spans = np.array([[0, len(queries[0])]] * 2 + [[len(queries[0]), sum(map(len, queries))]] * 2)
    which = [0, 0, 1, 1]
    arrays = (
        *pack_documents(model, DOCUMENTS),
        np.concatenate(queries).astype("<f4").tobytes(),
        (spans * model.info.late_interaction.embedding_size).astype("<u4").tobytes(),
    )
    expected = [host_maxsim(queries[q], d) for q, d in zip(which, vectors)]
    scores = backend.maxsim(*arrays)
    assert scores.shape == (4, 1)
    np.testing.assert_allclose(scores[:, 0], expected, atol=1e-4)
    launched = backend.launch("maxsim", *arrays).result()
    np.testing.assert_array_equal(launched, scores)


def test_bad_maxsim_arrays(colbert):  # type: ignore[no-untyped-def]
    backend, model = colbert
    docs = pack_documents(model, DOCUMENTS[:2])
    query = np.zeros((3, 16), "<f4").tobytes()

    def spans(*values: int) -> bytes:
        return (np.array(values) * 16).astype("<u4").tobytes()

    with pytest.raises(InputError, match="two per document"):
        backend.maxsim(*docs, query, spans(0, 3))
    with pytest.raises(InputError, match="outside the 3 query rows"):
        backend.maxsim(*docs, query, spans(0, 3, 0, 4))
    with pytest.raises(InputError, match="fall on rows of 16"):
        backend.maxsim(*docs, query, np.array([0, 48, 0, 47], "<u4").tobytes())
    with pytest.raises(InputError, match="not rows of 16"):
        backend.maxsim(*docs, query[:-4], spans(0, 3, 0, 3))
    with pytest.raises(InputError, match="6 arrays"):
        backend.maxsim(*docs)
