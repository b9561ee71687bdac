"""Naming devices and dtypes: what `--devices`, `Model(device=...)` and `dtype=` accept."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import torch

from ..errors import InputError

# A runtime alias, so spelled for Python 3.9 (the wheel's floor).
DeviceSpec = Optional[Union[str, torch.device, Sequence[Union[str, torch.device]]]]

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def parse_device(name: str | torch.device | None) -> torch.device:
    """One device; None is the first GPU if there is one, else the CPU."""
    if name is None:
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise InputError(f"unknown device {str(name)!r}: {exc}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {str(name)!r} requested but no CUDA GPU is available")
        index = 0 if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise InputError(
                f"device {str(name)!r} requested but only {torch.cuda.device_count()} "
                "CUDA GPU(s) are visible"
            )
        device = torch.device("cuda", index)
    return device


def parse_devices(spec: DeviceSpec) -> list[torch.device]:
    """Every device a model runs on, one executor each.

    `None`: every visible GPU, else the CPU. `"all"`: every visible GPU (the CPU where
    there is none). A comma-separated string or a list names them (`"cuda:0,cuda:1"`);
    a device may repeat (`"cpu,cpu"`: two executors on the CPU, which tests use)."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return [torch.device("cpu")]
        return [torch.device("cuda", i) for i in range(count)]
    if isinstance(spec, torch.device):
        return [parse_device(spec)]
    names = [part.strip() for part in spec.split(",")] if isinstance(spec, str) else list(spec)
    if not names or any(isinstance(n, str) and not n for n in names):
        raise InputError(f"devices {spec!r}: expected 'all', 'cpu' or a list like cuda:0,cuda:1")
    return [parse_device(name) for name in names]


def parse_dtype(
    name: str | torch.dtype | None, device: torch.device, checkpoint: str | None
) -> torch.dtype:
    """Explicit dtype wins; else float32 on CPU and, on GPU, the checkpoint's own half
    precision (bfloat16 if it was saved so, float16 otherwise, as TEI does)."""
    if isinstance(name, torch.dtype):
        return name
    if name is not None:
        try:
            return _DTYPES[name.lower()]
        except KeyError:
            raise InputError(
                f"unknown dtype {name!r}; supported: float32, float16, bfloat16"
            ) from None
    if device.type == "cpu":
        return torch.float32
    return torch.bfloat16 if checkpoint == "bfloat16" else torch.float16
