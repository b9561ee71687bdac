"""The memory check before a model loads (`runtime.memory`): the estimate from the weight
files' headers, the budget a device leaves, and the refusal with the figures."""

from __future__ import annotations

import pytest
import torch
from checkpoints import make_checkpoint
from safetensors import safe_open

from trt_tei_runtime.runtime import load_executor
from trt_tei_runtime.runtime.memory import (
    GIB,
    DeviceMemory,
    DeviceMemoryError,
    MemoryEstimate,
    check_fits,
    estimate_for_loading,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):  # type: ignore[no-untyped-def]
    return make_checkpoint(tmp_path_factory.mktemp("memory") / "bert")


def _stored_bytes(folder) -> int:  # type: ignore[no-untyped-def]
    total = 0
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as handle:
            total += sum(
                t.numel() * t.element_size() for t in map(handle.get_tensor, handle.keys())
            )
    return total


def test_the_estimate_counts_the_weights_in_the_dtype_they_load_in(checkpoint):  # type: ignore[no-untyped-def]
    cpu = torch.device("cpu")
    fp32 = estimate_for_loading(
        checkpoint, cpu, revision=None, dtype="float32", max_num_tokens=64, lanes=1
    )
    assert fp32.weights == _stored_bytes(checkpoint)  # saved in float32
    bf16 = estimate_for_loading(
        checkpoint, cpu, revision=None, dtype="bfloat16", max_num_tokens=64, lanes=1
    )
    assert bf16.weights * 2 == fp32.weights
    # One layer's activations per lane, over the largest batch.
    two_lanes = estimate_for_loading(
        checkpoint, cpu, revision=None, dtype="float32", max_num_tokens=64, lanes=2
    )
    assert two_lanes.batch == 2 * fp32.batch > 0
    longer = estimate_for_loading(
        checkpoint, cpu, revision=None, dtype="float32", max_num_tokens=128, lanes=1
    )
    assert longer.batch == 2 * fp32.batch


def test_the_budget_leaves_the_rest_of_the_device_alone():
    memory = DeviceMemory(free=60 * GIB, total=80 * GIB)
    assert memory.budget(1.0) == 60 * GIB
    assert memory.budget(0.95) == 56 * GIB
    assert memory.budget(0.5) == 20 * GIB
    assert memory.budget(0.2) == 0  # more than the share is in use already


def test_a_model_that_does_not_fit_is_refused_with_the_figures():
    estimate = MemoryEstimate(weights=16 * GIB, batch=2 * GIB)
    memory = DeviceMemory(free=20 * GIB, total=80 * GIB)
    check_fits("big", torch.device("cpu"), estimate, memory, 1.0)  # 18 of 20 free
    with pytest.raises(DeviceMemoryError) as refused:
        check_fits("big", torch.device("cpu"), estimate, memory, 0.95)
    message = str(refused.value)
    for figure in ("18.00 GiB", "weights 16.00 GiB", "batch buffers 2.00 GiB", "20.00 GiB free"):
        assert figure in message, message
    assert "of 80.00 GiB" in message and "16.00 GiB of it usable" in message
    with pytest.raises(ValueError, match="memory_fraction"):
        check_fits("big", torch.device("cpu"), estimate, memory, 0.0)


def test_loading_checks_before_it_loads_anything(checkpoint, monkeypatch):  # type: ignore[no-untyped-def]
    import trt_tei_runtime.runtime.executor as executor

    def never(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the model loaded though it does not fit")

    monkeypatch.setattr(executor, "load_model", never)
    monkeypatch.setattr(DeviceMemory, "of", classmethod(lambda cls, device: cls(1024, 4096)))
    with pytest.raises(DeviceMemoryError, match="does not fit cpu"):
        load_executor(checkpoint, device="cpu", max_num_tokens=64, memory_fraction=0.9)


def test_the_host_reports_its_memory():
    memory = DeviceMemory.of(torch.device("cpu"))
    assert 0 < memory.free <= memory.total
