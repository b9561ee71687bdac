"""The router ↔ runtime contract: packed uint32 buffers in, float32 arrays out."""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints import make_checkpoint

from trt_tei_runtime import InputError, Model
from trt_tei_runtime.backend import Backend

TEXTS = ["the cat", "a dog in paris reads a book", "blue"]


def _pack(model: Model, items, offset: int):  # type: ignore[no-untyped-def]
    enc = model.tokenizer.encode(items)
    ids = np.concatenate([e.ids for e in enc]).astype("<u4")
    types = np.concatenate([e.type_ids for e in enc]).astype("<u4")
    positions = np.concatenate([np.arange(len(e.ids)) + offset for e in enc]).astype("<u4")
    cu = np.concatenate([[0], np.cumsum([len(e.ids) for e in enc])]).astype("<u4")
    # What the router sends: four buffers, no max_length.
    return (ids.tobytes(), types.tobytes(), positions.tobytes(), cu.tobytes())


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(tmp_path_factory.mktemp("xlmr"), "XLMRobertaModel", pooling="mean")
    return Backend(str(folder)), Model(folder)


def test_info_describes_the_model(embedder):  # type: ignore[no-untyped-def]
    backend, _ = embedder
    info = backend.info()
    assert info["model_type"] == "embedding"
    assert info["architecture"] == "XLMRobertaModel"
    assert info["position_offset"] == 2 and info["max_input_length"] == 128
    assert info["hidden_size"] == 32 and info["pooling"] == "mean"
    assert info["tokenizer_path"].endswith("tokenizer.json")
    assert (info["dtype"], info["device"]) == ("float32", "cpu")
    # No CUDA streams on the CPU: the router keeps one backend thread.
    assert info["interactive_lane"] is False
    backend.health()


def test_info_is_exactly_the_routers_contract(embedder):  # type: ignore[no-untyped-def]
    router = pytest.importorskip("trt_tei_runtime._router")
    backend, _ = embedder
    assert sorted(backend.info()) == sorted(router.model_info_fields())


def test_embed_from_bytes_matches_model(embedder):  # type: ignore[no-untyped-def]
    backend, model = embedder
    pooled = backend.embed(*_pack(model, TEXTS, 2))
    assert pooled.dtype == np.float32 and pooled.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(pooled, model.embed(TEXTS, normalize=False), atol=1e-6)
    # Without an interactive lane, interactive batches run like the others.
    np.testing.assert_array_equal(backend.embed(*_pack(model, TEXTS, 2), interactive=True), pooled)
    tokens = backend.embed_all(*_pack(model, TEXTS, 2))
    assert tokens.shape == (sum(len(e.ids) for e in model.tokenizer.encode(TEXTS)), 32)
    with pytest.raises(InputError, match="use predict, not embed"):
        Backend(str(make_reranker_dir(model))).embed(*_pack(model, TEXTS, 2))


def test_warming_does_nothing_without_a_direct_query_path(embedder):  # type: ignore[no-untyped-def]
    backend, model = embedder
    backend.warm_query()
    rows = backend.embed(*_pack(model, TEXTS, 2), interactive=True)
    # The CPU has no interactive lane, so no query took the direct path to repeat.
    assert backend._last_queries == {}
    backend.warm_query()
    np.testing.assert_array_equal(backend.embed(*_pack(model, TEXTS, 2), interactive=True), rows)


def test_launch_returns_what_the_method_returns(embedder):  # type: ignore[no-untyped-def]
    """`launch` then `result` gives the method's rows, for two batches in flight at once (as
    the router's bulk thread holds them on a GPU); on a CPU the runtime does not pipeline."""
    backend, model = embedder
    assert backend.pipelines() is False
    first = backend.launch("embed", *_pack(model, TEXTS, 2))
    second = backend.launch("embed_all", *_pack(model, TEXTS[:1], 2))
    np.testing.assert_array_equal(second.result(), backend.embed_all(*_pack(model, TEXTS[:1], 2)))
    pooled = first.result()
    assert pooled.dtype == np.float32 and pooled.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(pooled, backend.embed(*_pack(model, TEXTS, 2)))
    with pytest.raises(ValueError, match="unknown method 'health'"):
        backend.launch("health", *_pack(model, TEXTS, 2))
    ids, types, positions, cu = _pack(model, TEXTS, 2)
    with pytest.raises(InputError, match="not a multiple of 4"):
        backend.launch("embed", ids[:-1], types, positions, cu)


def test_launch_goes_through_a_subclass_override(embedder):  # type: ignore[no-untyped-def]
    """A backend class that wraps `embed` (as tests/http/backends.py does to inject faults)
    sees every launched batch too."""
    _, model = embedder

    class Wrapped(Backend):
        calls = 0

        def embed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            Wrapped.calls += 1
            return super().embed(*args, **kwargs) + 1

    wrapped = Wrapped(str(model.info.model_dir))
    arrays = _pack(model, TEXTS, 2)
    rows = wrapped.launch("embed", *arrays).result()
    assert Wrapped.calls == 1
    np.testing.assert_allclose(rows, model.embed(TEXTS, normalize=False) + 1, atol=1e-6)


def make_reranker_dir(model: Model):  # type: ignore[no-untyped-def]
    return make_checkpoint(
        model.info.model_dir.parent / "reranker", "XLMRobertaForSequenceClassification"
    )


def test_predict_returns_raw_logits(embedder):  # type: ignore[no-untyped-def]
    _, model = embedder
    folder = make_reranker_dir(model)
    backend, reranker = Backend(str(folder)), Model(folder)
    info = backend.info()
    assert (info["model_type"], info["num_labels"], info["score_activation"]) == (
        "reranker",
        1,
        "sigmoid",
    )
    pairs = [("query", t) for t in TEXTS]
    logits = backend.predict(*_pack(reranker, pairs, 2))
    np.testing.assert_allclose(logits, reranker.predict(pairs, raw_scores=True), atol=1e-6)


def test_inconsistent_batches_are_rejected(embedder):  # type: ignore[no-untyped-def]
    backend, model = embedder
    ids, types, positions, cu = _pack(model, TEXTS, 2)
    max_len = max(len(e.ids) for e in model.tokenizer.encode(TEXTS))
    with pytest.raises(InputError, match="must all hold cu_seqlens"):
        backend.embed(ids[:-4], types, positions, cu, max_len)
    with pytest.raises(InputError, match="not a multiple of 4"):
        backend.embed(ids[:-1], types, positions, cu, max_len)
    with pytest.raises(InputError, match="below the longest sequence"):
        backend.embed(ids, types, positions, cu, 2)
    bad_ids = np.frombuffer(ids, "<u4").copy()
    bad_ids[0] = 10_000
    with pytest.raises(InputError, match="token id 10000 is outside the vocabulary"):
        backend.embed(bad_ids.tobytes(), types, positions, cu, max_len)
    with pytest.raises(InputError, match="strictly increasing"):
        backend.embed(
            ids, types, positions, np.array([0, 3, 3, len(ids) // 4], "<u4").tobytes(), max_len
        )


def test_the_lane_switch_interval_comes_from_the_environment(monkeypatch):  # type: ignore[no-untyped-def]
    from trt_tei_runtime.backend import LANE_SWITCH_INTERVAL_S, lane_switch_interval_s

    monkeypatch.delenv("TRT_TEI_SWITCH_INTERVAL_US", raising=False)
    assert lane_switch_interval_s() == LANE_SWITCH_INTERVAL_S
    monkeypatch.setenv("TRT_TEI_SWITCH_INTERVAL_US", "20")
    assert lane_switch_interval_s() == pytest.approx(20e-6)
    for bad in ("0", "-5", "fast", "nan", "inf"):
        monkeypatch.setenv("TRT_TEI_SWITCH_INTERVAL_US", bad)
        with pytest.raises(ValueError, match="TRT_TEI_SWITCH_INTERVAL_US"):
            lane_switch_interval_s()


def test_a_failing_cuda_driver_call_is_a_device_failure():  # type: ignore[no-untyped-def]
    from trt_tei_runtime.backend import _is_device_failure
    from trt_tei_runtime.runtime.cuda_driver import CudaDriverError

    assert _is_device_failure(CudaDriverError("CUDA error: CUDA_ERROR_ILLEGAL_ADDRESS in x"))


@pytest.mark.parametrize("sequences", [1, 3])
def test_host_arrays_check_one_sequence_as_they_check_several(sequences):  # type: ignore[no-untyped-def]
    from trt_tei_runtime.batch import HostArrays

    lengths = [4, 7, 2][:sequences]
    tokens = sum(lengths)
    ids = np.arange(tokens, dtype="<u4").tobytes()
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype("<u4")
    batch = HostArrays.check(ids, ids, ids, cu.tobytes())
    assert (batch.num_seqs, batch.num_tokens, batch.max_seqlen) == (
        sequences,
        tokens,
        max(lengths),
    )
    assert batch.packed().cu_seqlens.tolist() == cu.tolist()
    with pytest.raises(InputError, match="below the longest sequence"):
        HostArrays.check(ids, ids, ids, cu.tobytes(), max_length=max(lengths) - 1)
    empty_last = np.concatenate([cu, [cu[-1]]]).astype("<u4")
    with pytest.raises(InputError, match="strictly increasing"):
        HostArrays.check(ids, ids, ids, empty_last.tobytes())
    with pytest.raises(InputError, match="strictly increasing"):
        HostArrays.check(b"", b"", b"", np.array([0, 0], "<u4").tobytes())
    with pytest.raises(InputError, match="start at 0"):
        HostArrays.check(ids, ids, ids, (cu + 1).tobytes())
