"""`--device-workers`: whether a local job's devices run in this process or one worker
process each (the server's flag of the same name, with the same meaning).

One `Model` over several devices runs a thread per device in one interpreter, and past one
GPU those threads wait for its lock more than they run (at 4 GPUs, 53 % of the time: the
server's measurement, docs/performance.md). A process per device gives each its own, so
`auto` picks processes for several GPUs."""

from __future__ import annotations

from typing import Optional

from ..errors import InputError
from .errors import CorpusError

DEVICE_WORKER_MODES = ("auto", "threads", "processes")


def process_devices(mode: str, devices: Optional[str]) -> Optional[list[str]]:
    """The device of each worker process to start, or None to run in this process.

    `threads`: this process. `processes`: a worker per device, whatever the devices (a
    single device included; `cpu,cpu` is how tests run two). `auto`: a worker per device
    when there are several GPUs, else this process (the server's `auto`). Measured on 4
    H200s (bert-large, benchmarks/RESULTS.md section 6), processes made 0.95 x 4 x one
    GPU's engine and threads 0.58-0.80."""
    if mode not in DEVICE_WORKER_MODES:
        raise CorpusError(f"--device-workers must be one of {DEVICE_WORKER_MODES}, got {mode!r}")
    if mode == "threads":
        return None
    from ..runtime.devices import parse_device, parse_devices

    try:
        # Model(device=None) is one device, not every GPU: the same here.
        found = [parse_device(None)] if devices is None else parse_devices(devices)
    except InputError as exc:
        raise CorpusError(f"--devices: {exc}") from exc
    if mode == "auto" and sum(1 for device in found if device.type == "cuda") < 2:
        return None
    return [str(device) for device in found]
