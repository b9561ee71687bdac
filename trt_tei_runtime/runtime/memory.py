"""Whether a model fits its device, checked before it loads.

A server may load several models onto one device (the router's `--model-id`, given more than
once), one after the other. Without a check, the model that does not fit fails somewhere in
its loading or graph capture with an allocator message that names neither the model nor the
figures. So before each model loads, its size is estimated from its weight files' headers
(no tensor is read) and from the batch it must hold, and compared with what the device has
free, less the share of the device left alone (`memory_fraction`); loading stops with both
figures when it does not fit, and an out-of-memory error while loading is reported the same
way.

The estimate is a lower bound: the weights at the dtype they load in, and one layer's
activations over the largest batch per lane. Workspaces, graph pools and the allocator's
rounding come on top, so a model that passes may still run out while it loads; one that
fails cannot fit.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..checkpoint import read_json, resolve_model_dir
from ..errors import RuntimeErrorBase
from .devices import parse_dtype
from .engine_files import read_engine_manifest

GIB = 1024**3

# Bytes per element of the dtypes safetensors names; floating ones load in the model's dtype.
_STORED_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
_CONVERTED = {"F64", "F32", "F16", "BF16"}


class DeviceMemoryError(RuntimeErrorBase):
    """A model does not fit the memory its device has left."""


@dataclass(frozen=True)
class DeviceMemory:
    free: int
    total: int

    @classmethod
    def of(cls, device: torch.device) -> DeviceMemory:
        """What the device has free now, and in all. The CPU's memory is the host's: what
        the kernel reports available."""
        if device.type == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            return cls(free=free, total=total)
        return _host_memory()

    def budget(self, fraction: float) -> int:
        """What a model may take: the free memory less the part of the device (1 - fraction
        of it) that is left alone."""
        return max(0, self.free - int((1.0 - fraction) * self.total))


@dataclass(frozen=True)
class MemoryEstimate:
    """At least what a model takes on its device."""

    weights: int
    batch: int  # one layer's activations over the largest batch, per lane

    @property
    def total(self) -> int:
        return self.weights + self.batch


def estimate_model_memory(
    model_dir: Path,
    config: dict[str, Any],
    dtype: torch.dtype,
    max_num_tokens: int,
    lanes: int,
    engine: bool,
) -> MemoryEstimate:
    """The weights at `dtype` (an engine's as they are stored) and one layer's activations
    over `max_num_tokens` tokens in each of `lanes` lanes."""
    elem = torch.empty((), dtype=dtype).element_size()
    weights = sum(
        _tensor_bytes(stored, numel, elem, engine) for stored, numel in _weight_headers(model_dir)
    )
    # Text-and-image models keep their sizes per tower; the wider one bounds a layer.
    towers = [config.get(k) for k in ("text_config", "vision_config")]
    sizes = [config, *(t for t in towers if isinstance(t, dict))]
    hidden = max(int(c.get("hidden_size") or 0) for c in sizes)
    intermediate = max(int(c.get("intermediate_size") or 4 * hidden) for c in sizes)
    batch = lanes * max_num_tokens * (4 * hidden + intermediate) * elem
    return MemoryEstimate(weights=weights, batch=batch)


def estimate_for_loading(
    model_id: str | os.PathLike[str],
    device: torch.device,
    *,
    revision: str | None,
    dtype: str | None,
    max_num_tokens: int,
    lanes: int,
) -> MemoryEstimate:
    """The estimate for a model as `load_model` will load it: in its dtype (an engine's as
    built), with batches of `max_num_tokens` (unless an engine's manifest says otherwise)."""
    model_dir = resolve_model_dir(model_id, revision)
    config = read_json(model_dir / "config.json") or {}
    manifest = read_engine_manifest(model_dir)
    if manifest is not None:
        dtype = manifest["dtype"]
        max_num_tokens = manifest.get("max_num_tokens", max_num_tokens)
    torch_dtype = parse_dtype(dtype, device, config.get("torch_dtype") or config.get("dtype"))
    return estimate_model_memory(
        model_dir, config, torch_dtype, max_num_tokens, lanes, engine=manifest is not None
    )


def check_fits(
    model_id: str,
    device: torch.device,
    estimate: MemoryEstimate,
    memory: DeviceMemory,
    fraction: float,
) -> None:
    """Raises `DeviceMemoryError`, with the figures, where the estimate exceeds the budget."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"memory_fraction must be in (0, 1], got {fraction}")
    budget = memory.budget(fraction)
    if estimate.total <= budget:
        return
    raise DeviceMemoryError(
        f"{model_id} does not fit {device}: it needs at least {_gib(estimate.total)} "
        f"(weights {_gib(estimate.weights)}, batch buffers {_gib(estimate.batch)}), and "
        f"{device} has {_gib(memory.free)} free of {_gib(memory.total)}, "
        f"{_gib(budget)} of it usable with memory_fraction {fraction:g}. Serve fewer or "
        "smaller models on it, lower --max-batch-tokens, or load it in a smaller dtype"
    )


def out_of_memory(model_id: str, device: torch.device, estimate: MemoryEstimate) -> str:
    """What to say when loading ran out of memory after the check passed."""
    memory = DeviceMemory.of(device)
    return (
        f"{model_id} ran out of memory on {device} while loading (estimated at least "
        f"{_gib(estimate.total)}; {_gib(memory.free)} free of {_gib(memory.total)} now). "
        "Serve fewer or smaller models on it, or lower --max-batch-tokens"
    )


def _gib(size: int) -> str:
    return f"{size / GIB:.2f} GiB"


def _tensor_bytes(stored: str, numel: int, elem: int, engine: bool) -> int:
    if stored in _CONVERTED and not engine:
        return numel * elem
    return numel * _STORED_BYTES.get(stored, 4)


def _weight_headers(model_dir: Path) -> list[tuple[str, int]]:
    """(stored dtype, element count) of every tensor in the folder's safetensors files; a
    `pytorch_model.bin` counts as float32 by its size."""
    files = sorted(model_dir.glob("*.safetensors"))
    headers: list[tuple[str, int]] = []
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                tensor = handle.get_slice(key)
                headers.append((tensor.get_dtype(), math.prod(tensor.get_shape())))
    if not files:
        bin_path = model_dir / "pytorch_model.bin"
        if bin_path.is_file():
            headers.append(("F32", bin_path.stat().st_size // 4))
    return headers


def _host_memory() -> DeviceMemory:
    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                name, _, value = line.partition(":")
                fields[name] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if "MemAvailable" in fields and "MemTotal" in fields:
        return DeviceMemory(free=fields["MemAvailable"], total=fields["MemTotal"])
    pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    available = os.sysconf("SC_AVPHYS_PAGES")
    return DeviceMemory(free=available * page, total=pages * page)
