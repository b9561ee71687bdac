"""Ahead-of-time engines, build time only: convert, fuse and quantize a checkpoint once and
write an engine directory. Loading and running one is the runtime's (`runtime/`)."""

from ..runtime.engine_files import ENGINE_FORMAT, ENGINE_VERSION, MANIFEST, WEIGHTS
from .config import BuilderConfig, BuilderConfigError

__all__ = [
    "ENGINE_FORMAT",
    "ENGINE_VERSION",
    "MANIFEST",
    "WEIGHTS",
    "BuilderConfig",
    "BuilderConfigError",
]
