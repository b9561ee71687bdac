"""What runs in the server and behind `Model`: loading a checkpoint or engine onto a device
(`loader`), and an executor per device that owns that device's lanes (`executor`, `lanes`,
with `graphs` and `preemption`; a query's direct path in `query_path`, through
`cuda_driver`). Build-time code lives in `engine/`."""

from .devices import parse_device, parse_devices, parse_dtype
from .executor import Executor, load_executor, load_executors
from .lanes import InteractiveLane, Lane
from .loader import LoadedModel, ModelInfo, load_model

__all__ = [
    "Executor",
    "InteractiveLane",
    "Lane",
    "LoadedModel",
    "ModelInfo",
    "load_executor",
    "load_executors",
    "load_model",
    "parse_device",
    "parse_devices",
    "parse_dtype",
]
