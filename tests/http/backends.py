"""Backends for the integration tests: the real runtime with faults injected.

Loaded by the router through `--python-backend-class backends:FaultyBackend` (conftest puts
this folder on the server's PYTHONPATH), which is also how any other Python backend with the
same contract is plugged in.
"""

from __future__ import annotations

import os
import time

import numpy as np

from trt_tei_runtime.backend import Backend


class FaultyBackend(Backend):
    """The runtime's Backend, except that a batch holding the token id `$TEST_POISON_ID`
    raises, and every batch first sleeps `$TEST_BATCH_DELAY_S` seconds (keeping requests in
    flight long enough to overload or interrupt the server)."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._poison = int(os.environ.get("TEST_POISON_ID", "-1"))
        self._delay = float(os.environ.get("TEST_BATCH_DELAY_S", "0"))

    def _before(self, input_ids) -> None:  # type: ignore[no-untyped-def]
        if isinstance(input_ids, (bytes, bytearray)):
            ids = np.frombuffer(input_ids, dtype="<u4")
        else:
            ids = np.asarray(input_ids)
        if self._delay:
            time.sleep(self._delay)
        if self._poison in ids:
            raise ValueError(f"poison token {self._poison} in this batch")

    def embed(self, input_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._before(input_ids)
        return super().embed(input_ids, *args, **kwargs)

    def embed_all(self, input_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._before(input_ids)
        return super().embed_all(input_ids, *args, **kwargs)

    def predict(self, input_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._before(input_ids)
        return super().predict(input_ids, *args, **kwargs)
