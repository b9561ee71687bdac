"""A device worker: the process the router starts per device with `--device-workers processes`
(`main(SPEC)` under the router's interpreter and import path; never by hand).

It loads the backend for its one device and serves the router's batches for it, handed over
through shared memory (`rust_router/src/backend/process`). Its own interpreter, so the devices
of one server no longer share an interpreter lock.
"""

from __future__ import annotations

import os
import signal
import sys


def main(spec: str) -> None:
    from . import _router

    # Ctrl-C and SIGTERM are the router's: it drains its requests, then closes this worker's
    # lanes, and the worker ends with them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = _router.run_device_worker(spec)
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: the device's memory goes with the process.
    os._exit(code)
