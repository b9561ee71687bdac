"""`Model.embed_ids_stream`: one pipeline over many chunks, each chunk's vectors handed back
in order, markers (chunks of no ids) in their place, failures raised."""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints import make_checkpoint

from trt_tei_runtime import InputError, Model
from trt_tei_runtime.token_ids import TokenIds

TEXTS = [f"sentence number {i} " + "word " * (i % 13) for i in range(120)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):  # type: ignore[no-untyped-def]
    return make_checkpoint(tmp_path_factory.mktemp("bert"), "BertModel", pooling="mean")


@pytest.fixture(scope="module", params=["cpu", "cpu,cpu"])
def model(request, checkpoint):  # type: ignore[no-untyped-def]
    # A small token budget: every chunk spans several batches, and with two executors the
    # batches of consecutive chunks finish out of order.
    return Model(checkpoint, device=request.param, max_batch_tokens=64)


def test_chunks_come_back_in_order_with_markers(model) -> None:  # type: ignore[no-untyped-def]
    ids = model.tokenize_ids(TEXTS)
    bounds = [0, 7, 7, 50, 51, 120]  # includes an empty chunk and a one-row chunk
    chunks = []
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        chunks.append((f"chunk{n}", ids.take(range(a, b))))
        chunks.append((f"marker{n}", TokenIds.from_lists([])))
    out = list(model.embed_ids_stream(iter(chunks), dimensions=8))
    assert [key for key, _ in out] == [key for key, _ in chunks]
    whole = model.embed(TEXTS, dimensions=8)
    for (key, vectors), (a, b) in zip(out[::2], zip(bounds[:-1], bounds[1:])):
        assert vectors.shape == (b - a, 8), key
        np.testing.assert_allclose(vectors, whole[a:b], atol=1e-5)
    for key, vectors in out[1::2]:
        assert vectors.shape == (0, 8), key


def test_list_ids_and_unnormalized(model) -> None:  # type: ignore[no-untyped-def]
    lists = model.tokenize(TEXTS[:10])
    [(key, vectors)] = list(model.embed_ids_stream([("all", lists)], normalize=False))
    np.testing.assert_allclose(vectors, model.embed(TEXTS[:10], normalize=False), atol=1e-5)


def test_failures_are_raised(model) -> None:  # type: ignore[no-untyped-def]
    good = model.tokenize_ids(TEXTS[:5])

    def failing():  # type: ignore[no-untyped-def]
        yield "a", good
        raise OSError("the input went away")

    with pytest.raises(OSError, match="the input went away"):
        list(model.embed_ids_stream(failing()))
    with pytest.raises(InputError, match="input 1 is empty after tokenization"):
        list(model.embed_ids_stream([("a", TokenIds.from_lists([[101, 102], []]))]))
    with pytest.raises(InputError, match="dimensions must be between 1 and"):
        list(model.embed_ids_stream([("a", good)], dimensions=0))
    # The model still works after a failed stream.
    assert model.embed_ids(good).shape == (5, model.info.hidden_size)


def test_a_chunk_is_assembled_in_input_order_with_narrow_blocks_padded() -> None:
    """Batches finish in any order and (sparse outputs) in different widths: each row lands
    at its input position, a narrower block right-padded with zeros."""
    import torch

    from trt_tei_runtime.runtime.stream import _Pending

    pending: _Pending[str] = _Pending("chunk", size=5, batches=2)
    pending.parts.append(([4, 0], torch.tensor([[4.0, 4.5, 4.75], [0.0, 0.5, 0.75]])))
    pending.parts.append(([2, 1, 3], torch.tensor([[2.0, 2.5], [1.0, 1.5], [3.0, 3.5]])))
    assert pending.complete
    expected = torch.tensor(
        [[0.0, 0.5, 0.75], [1.0, 1.5, 0.0], [2.0, 2.5, 0.0], [3.0, 3.5, 0.0], [4.0, 4.5, 4.75]]
    )
    assert torch.equal(pending.assemble(), expected)
    assert _Pending("none", size=0, batches=0).assemble() is None
