"""A device worker: the process the router starts per device with `--device-workers processes`
(`python -m trt_tei_runtime.device_worker SPEC`, never by hand).

It loads the backend for its one device and serves the router's batches for it, handed over
through shared memory (`rust_router/src/backend/process`). Its own interpreter, so the devices
of one server no longer share an interpreter lock.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    from . import _router

    # Ctrl-C and SIGTERM are the router's: it drains its requests, then closes this worker's
    # lanes, and the worker ends with them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if len(sys.argv) != 2:
        sys.exit("usage: python -m trt_tei_runtime.device_worker SPEC (started by the router)")
    code = _router.run_device_worker(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: the device's memory goes with the process.
    os._exit(code)


if __name__ == "__main__":
    main()
