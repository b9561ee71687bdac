"""Where a device flag cannot be made, the preemption gate falls back to host-side steps."""

from __future__ import annotations

import torch

from trt_tei_runtime.runtime.device_flag import DeviceFlag
from trt_tei_runtime.runtime.preemption import LayerGate


def test_no_device_flag_off_cuda() -> None:
    assert DeviceFlag.create(torch.device("cpu")) is None


def test_gate_raises_the_flag_only_while_a_query_is_in_flight() -> None:
    class RecordingFlag:
        def __init__(self) -> None:
            self.states: list[int] = []

        def raise_(self) -> None:
            self.states.append(1)

        def lower(self) -> None:
            self.states.append(0)

    flag = RecordingFlag()
    gate = LayerGate(flag=flag)  # type: ignore[arg-type]
    with gate.interactive():
        with gate.interactive():  # two at once: lowered only when the last one ends
            pass
        assert flag.states == [1, 1]
    assert flag.states == [1, 1, 0]
