"""`--device-workers`: whether a local job's devices run in this process or one worker
process each (the server's flag of the same name, with the same meaning).

One `Model` over several devices runs a thread per device in one interpreter, and past one
GPU those threads wait for its lock more than they run (at 4 GPUs, 53 % of the time: the
server's measurement, docs/performance.md). A process per device gives each its own."""

from __future__ import annotations

from typing import Optional

from ..errors import InputError
from .errors import CorpusError

DEVICE_WORKER_MODES = ("auto", "threads", "processes")


def process_devices(mode: str, devices: Optional[str]) -> Optional[list[str]]:
    """The device of each worker process to start, or None to run in this process.

    `threads`: this process. `processes`: a worker per device, whatever the devices (a
    single device included; `cpu,cpu` is how tests run two). `auto`: this process, for now:
    measured on 4 H200s (bert-large, benchmarks/RESULTS.md section 6) the job in processes
    made 695 k tokens/s in all, less than one GPU in this process (783 k): its driver, not
    the devices, sets the pace, while one process over 4 GPUs made 2.57 M."""
    if mode not in DEVICE_WORKER_MODES:
        raise CorpusError(f"--device-workers must be one of {DEVICE_WORKER_MODES}, got {mode!r}")
    if mode in ("threads", "auto"):
        return None
    from ..runtime.devices import parse_device, parse_devices

    try:
        # Model(device=None) is one device, not every GPU: the same here.
        found = [parse_device(None)] if devices is None else parse_devices(devices)
    except InputError as exc:
        raise CorpusError(f"--devices: {exc}") from exc
    names = [str(device) for device in found]
    return names
