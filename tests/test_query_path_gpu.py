"""Tier 5 (device): a query's direct path through the interactive lane (`query_path`).

Its rows against torch's path through the same graphs (bit for bit) and against the bulk
lane, on an encoder and a decoder; bad ids refused before the GPU sees them; batches above
the lane's graphs on torch's path; a thread that never touched CUDA; the gate held while a
query runs; a failing driver call reported as the device's failure; warming between
queries runs their host steps and not the model.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint, make_decoder_checkpoint

from trt_tei_runtime import InputError
from trt_tei_runtime.backend import Backend, DeviceError
from trt_tei_runtime.batch import HostArrays, PackedBatch
from trt_tei_runtime.runtime.graphs import MAX_GRAPH_TOKENS
from trt_tei_runtime.runtime.query_path import QueryPath

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["BertModel", "Qwen3Model"])
def backend(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "BertModel":
        make_checkpoint(folder, "BertModel", pooling="mean", hidden_size=64)
    else:
        make_decoder_checkpoint(folder, "Qwen3Model", pooling="lasttoken")
    return Backend(str(folder), device="cuda", dtype="bfloat16", max_batch_tokens=4096)


def _arrays(backend: Backend, lengths: list[int], seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    high = backend.model.model.network.vocab_size
    batch = PackedBatch.from_sequences(
        [rng.integers(5, high, size=n).tolist() for n in lengths],
        position_offset=backend.model.info.position_offset,
    )
    return tuple(
        t.numpy().astype("<u4").tobytes()
        for t in (batch.input_ids, batch.token_type_ids, batch.position_ids, batch.cu_seqlens)
    )


def _torch_path(backend: Backend, arrays):  # type: ignore[no-untyped-def]
    lane = backend.model.interactive
    path, lane.query_path = lane.query_path, None
    try:
        return backend.embed(*arrays, interactive=True)
    finally:
        lane.query_path = path


def test_the_interactive_lane_has_the_direct_path(backend):  # type: ignore[no-untyped-def]
    assert isinstance(backend.model.interactive.query_path, QueryPath)
    # Its graphs were captured with cuBLASLt (`runtime.blas`); the switch did not outlive it.
    assert torch.backends.cuda.preferred_blas_library() != torch._C._BlasBackend.Cublaslt


@pytest.mark.parametrize(
    "lengths", [[24], [1], [7, 30, 2], [100] * 20, [128] * (MAX_GRAPH_TOKENS // 128)]
)
def test_rows_equal_torchs_path_bit_for_bit(backend, lengths):  # type: ignore[no-untyped-def]
    arrays = _arrays(backend, lengths)
    direct = backend.embed(*arrays, interactive=True)
    assert direct.dtype == np.float32 and direct.shape[0] == len(lengths)
    assert np.array_equal(direct, _torch_path(backend, arrays))
    bulk = backend.embed(*arrays)
    np.testing.assert_allclose(direct, bulk, atol=3e-2, rtol=3e-2)


def test_one_query_after_another_does_not_see_the_last_ones_inputs(backend):  # type: ignore[no-untyped-def]
    long, short = _arrays(backend, [128, 100], seed=1), _arrays(backend, [5], seed=2)
    backend.embed(*long, interactive=True)
    assert np.array_equal(backend.embed(*short, interactive=True), _torch_path(backend, short))


def test_a_batch_above_the_graphs_takes_torchs_path(backend):  # type: ignore[no-untyped-def]
    arrays = _arrays(backend, [128] * 20)  # 2,560 tokens > MAX_GRAPH_TOKENS
    assert backend.model.query_rows(HostArrays.check(*arrays)) is None
    rows = backend.embed(*arrays, interactive=True)
    np.testing.assert_allclose(rows, backend.embed(*arrays), atol=3e-2, rtol=3e-2)


def test_ids_outside_the_vocabulary_are_refused_and_the_device_keeps_serving(backend):  # type: ignore[no-untyped-def]
    vocab = backend.model.model.network.vocab_size
    bad = _arrays(backend, [10], seed=3)
    ids = np.frombuffer(bad[0], dtype="<u4").copy()
    ids[3] = vocab + 7
    with pytest.raises(InputError, match="outside the vocabulary"):
        backend.embed(ids.tobytes(), *bad[1:], interactive=True)
    good = _arrays(backend, [10])
    assert np.array_equal(backend.embed(*good, interactive=True), _torch_path(backend, good))


def test_a_thread_that_never_used_cuda_runs_queries(backend):  # type: ignore[no-untyped-def]
    arrays = _arrays(backend, [24])
    expected = _torch_path(backend, arrays)
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(backend.embed(*arrays, interactive=True)))
    thread.start()
    thread.join()
    assert isinstance(out[0], np.ndarray) and np.array_equal(out[0], expected)


def test_bulk_batches_are_held_while_a_query_runs(backend, monkeypatch):  # type: ignore[no-untyped-def]
    path = backend.model.interactive.query_path
    gate = backend.model.interactive.gate
    driver = path._driver
    seen: list[bool] = []
    synchronize = driver.synchronize

    def watched(stream: int) -> None:
        seen.append(gate._no_queries.is_set())
        synchronize(stream)

    monkeypatch.setattr(driver, "synchronize", watched)
    backend.embed(*_arrays(backend, [24]), interactive=True)
    assert seen == [False]
    assert gate._no_queries.is_set()


def test_a_failing_driver_call_is_the_devices_failure(backend, monkeypatch):  # type: ignore[no-untyped-def]
    driver = backend.model.interactive.query_path._driver
    illegal_address = 700  # CUDA_ERROR_ILLEGAL_ADDRESS
    monkeypatch.setattr(driver, "_launch", lambda graph, stream: illegal_address)
    with pytest.raises(DeviceError, match="CUDA_ERROR_ILLEGAL_ADDRESS in cuGraphLaunch"):
        backend.embed(*_arrays(backend, [24]), interactive=True)
    monkeypatch.undo()
    # The gate was released: a bulk batch is not held by the failed query.
    assert backend.model.interactive.gate._no_queries.is_set()


def test_warming_runs_a_querys_host_steps_but_not_the_model(backend, monkeypatch):  # type: ignore[no-untyped-def]
    path = backend.model.interactive.query_path
    gate = backend.model.interactive.gate
    driver = path._driver
    calls: list[str] = []
    for name in ("copy_to_device", "launch", "copy_to_host", "synchronize"):
        step = getattr(driver, name)
        monkeypatch.setattr(
            driver, name, lambda *a, _name=name, _step=step: (calls.append(_name), _step(*a))[1]
        )
    monkeypatch.setattr(backend, "_last_queries", {})
    backend.warm_query()  # no query yet: nothing to repeat
    assert calls == []

    arrays = _arrays(backend, [24], seed=3)
    rows = backend.embed(*arrays, interactive=True)
    calls.clear()
    pooled = next(iter(path._graphs.pooled.values()))
    before = pooled.clone()
    backend.warm_query()
    assert calls == ["copy_to_device", "copy_to_host", "synchronize"]
    assert gate._no_queries.is_set()  # the bulk lane was not held
    assert np.array_equal(pooled.cpu(), before.cpu())  # the graph did not run
    monkeypatch.undo()
    other = _arrays(backend, [9], seed=4)
    assert np.array_equal(backend.embed(*other, interactive=True), _torch_path(backend, other))
    assert np.array_equal(backend.embed(*arrays, interactive=True), rows)


def test_the_environment_turns_the_path_off(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TRT_TEI_QUERY_PATH", "torch")
    folder = make_checkpoint(tmp_path / "bert", "BertModel", pooling="mean", hidden_size=64)
    backend = Backend(str(folder), device="cuda", dtype="bfloat16", max_batch_tokens=2048)
    assert backend.model.interactive is not None
    assert backend.model.interactive.query_path is None
