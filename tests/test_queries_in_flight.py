"""One device, several models (`runtime.preemption.QueriesInFlight`): a query of any model
loaded on a device holds every model's bulk batches there, not only its own model's."""

from __future__ import annotations

import threading

import pytest
import torch

from trt_tei_runtime.runtime.preemption import LayerGate, QueriesInFlight


def test_models_on_one_device_share_its_queries_in_flight():
    first = QueriesInFlight.on(torch.device("cpu"))
    assert QueriesInFlight.on(torch.device("cpu")) is first
    assert QueriesInFlight.on(torch.device("meta")) is not first


def test_a_query_of_one_model_holds_another_models_bulk_step():
    queries = QueriesInFlight()
    embedder = LayerGate(queries=queries)
    reranker = LayerGate(queries=queries)
    held = threading.Event()
    stepped = threading.Event()

    def bulk_step() -> None:
        held.set()
        # What `LayerGate.step` waits on before the embedder's next bulk step.
        embedder._no_queries.wait()
        stepped.set()

    with reranker.interactive():
        assert not embedder._no_queries.is_set()
        thread = threading.Thread(target=bulk_step)
        thread.start()
        held.wait(5)
        assert not stepped.wait(0.05), "the bulk step ran while the other model's query did"
    assert stepped.wait(5), "the bulk step stayed held after the query ended"
    thread.join()


def test_gates_left_on_their_own_do_not_hold_each_other():
    first, second = LayerGate(), LayerGate()
    with second.interactive(), second.interactive():
        assert first._no_queries.is_set()
        assert not second._no_queries.is_set()
    assert second._no_queries.is_set()


@pytest.mark.gpu
def test_two_models_on_one_gpu_hold_each_others_bulk_batches(tmp_path):  # type: ignore[no-untyped-def]
    from checkpoints import make_checkpoint

    from trt_tei_runtime.runtime import load_executor

    first = make_checkpoint(tmp_path / "a", seed=1)
    second = make_checkpoint(tmp_path / "b", seed=2)
    a = load_executor(first, device="cuda:0", dtype="float16", max_num_tokens=512)
    b = load_executor(second, device="cuda:0", dtype="float16", max_num_tokens=512)
    assert a.interactive is not None and b.interactive is not None
    assert a.bulk.gate is not None and b.bulk.gate is not None
    assert a.bulk.gate.queries is b.bulk.gate.queries
    with b.interactive.active():
        assert not a.bulk.gate._no_queries.is_set()
    assert a.bulk.gate._no_queries.is_set()
