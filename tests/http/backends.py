"""Backends for the integration tests: the real runtime with faults injected.

Loaded by the router through `--python-backend-class backends:FaultyBackend` (conftest puts
this folder on the server's PYTHONPATH), which is also how any other Python backend with the
same contract is plugged in.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from trt_tei_runtime.backend import Backend
from trt_tei_runtime.errors import DeviceError


class FaultyBackend(Backend):
    """The runtime's Backend, except that a batch holding the token id `$TEST_POISON_ID`
    raises, a sequence holding `$TEST_NAN_ID` comes back as NaN (as a float16 overflow would)
    while the rest of its batch stays right, and every batch first sleeps
    `$TEST_BATCH_DELAY_S` seconds (keeping requests in flight long enough to overload or
    interrupt the server), or computes for `$TEST_BATCH_BUSY_S` seconds (torch's thread pool
    busy, as in a long forward pass on a CPU)."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._poison = int(os.environ.get("TEST_POISON_ID", "-1"))
        self._nan = int(os.environ.get("TEST_NAN_ID", "-1"))
        self._delay = float(os.environ.get("TEST_BATCH_DELAY_S", "0"))
        self._busy = float(os.environ.get("TEST_BATCH_BUSY_S", "0"))

    def _nan_rows(self, out, input_ids, cu_seqlens, per_token: bool):  # type: ignore[no-untyped-def]
        if self._nan < 0:
            return out
        ids = np.frombuffer(input_ids, dtype="<u4")
        cu = np.frombuffer(cu_seqlens, dtype="<u4")
        out = np.array(out, copy=True)
        for i in range(len(cu) - 1):
            a, b = int(cu[i]), int(cu[i + 1])
            if self._nan in ids[a:b]:
                if per_token:
                    out[a:b] = np.nan
                else:
                    out[i] = np.nan
        return out

    def _before(self, input_ids) -> None:  # type: ignore[no-untyped-def]
        if isinstance(input_ids, (bytes, bytearray)):
            ids = np.frombuffer(input_ids, dtype="<u4")
        else:
            ids = np.asarray(input_ids)
        if self._delay:
            time.sleep(self._delay)
        if self._busy:
            x = torch.randn(512, 512)
            until = time.monotonic() + self._busy
            while time.monotonic() < until:
                x = torch.tanh(x @ x)
        if self._poison in ids:
            raise ValueError(f"poison token {self._poison} in this batch")

    def embed(self, input_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._before(input_ids)
        out = super().embed(input_ids, *args, **kwargs)
        return self._nan_rows(out, input_ids, args[2], per_token=False)

    def embed_all(self, input_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._before(input_ids)
        out = super().embed_all(input_ids, *args, **kwargs)
        return self._nan_rows(out, input_ids, args[2], per_token=True)

    def predict(self, input_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._before(input_ids)
        out = super().predict(input_ids, *args, **kwargs)
        return self._nan_rows(out, input_ids, args[2], per_token=False)


class DeviceFailingBackend(FaultyBackend):
    """FaultyBackend over several devices, where device `$TEST_FAIL_DEVICE` breaks as a lost
    GPU would once the file `$TEST_FAIL_DEVICE_FILE` exists: from then on every call on that
    device (a batch or a health check) raises `DeviceError`, which makes the router take it
    out of service."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._fail_device = int(os.environ.get("TEST_FAIL_DEVICE", "-1"))
        self._fail_file = os.environ.get("TEST_FAIL_DEVICE_FILE", "")

    def _check_device(self, device: int) -> None:
        if device == self._fail_device and self._fail_file and os.path.exists(self._fail_file):
            raise DeviceError(f"device {device} failed: CUDA error: an illegal memory access")

    def health(self, device: int = 0) -> None:
        self._check_device(device)
        super().health(device=device)

    def embed(self, *args, device: int = 0, **kwargs):  # type: ignore[no-untyped-def]
        self._check_device(device)
        return super().embed(*args, device=device, **kwargs)

    def embed_all(self, *args, device: int = 0, **kwargs):  # type: ignore[no-untyped-def]
        self._check_device(device)
        return super().embed_all(*args, device=device, **kwargs)

    def predict(self, *args, device: int = 0, **kwargs):  # type: ignore[no-untyped-def]
        self._check_device(device)
        return super().predict(*args, device=device, **kwargs)


class OneDeviceBackend(Backend):
    """A backend whose constructor takes no `devices` argument (as a third-party one may
    not): `--devices` must be refused at start-up, `--device` still works."""

    def __init__(  # type: ignore[no-untyped-def]
        self, model_id, revision=None, dtype=None, pooling=None, device=None
    ):
        super().__init__(model_id, revision=revision, dtype=dtype, pooling=pooling, device=device)


class LaneClaimingBackend(Backend):
    """The runtime's Backend on a CPU, claiming an interactive lane as it does on a GPU: the
    router then sets up what it sets up for a GPU (its second backend thread, the tokenizer
    pool's class). Batches sent with `interactive=True` run on the bulk lane."""

    def info(self):  # type: ignore[no-untyped-def]
        return {**super().info(), "interactive_lane": True}


class WarmFailingBackend(LaneClaimingBackend):
    """A lane-claiming backend whose `warm_query` fails as a lost device would, and notes
    each call in the file `TRT_TEI_TEST_WARM_LOG` names: warming between queries must not
    cost a query anything, even when it fails."""

    def warm_query(self, device: int = 0) -> None:
        with open(os.environ["TRT_TEI_TEST_WARM_LOG"], "a") as log:
            log.write(f"{device}\n")
        raise DeviceError("CUDA error: an illegal memory access was encountered (injected)")


class UnnamedDevicesBackend(Backend):
    """A backend that cannot say which devices a `devices` spec means (as a third-party one
    may not): `--device-workers processes` must be refused at start-up."""

    device_names = None  # type: ignore[assignment]
