"""Ahead-of-time engines: build (convert, fuse, quantize) once, load fast, run with graphs."""

from .config import BuilderConfig, BuilderConfigError

ENGINE_FORMAT = "trt-tei-engine"
ENGINE_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "engine.safetensors"

__all__ = [
    "ENGINE_FORMAT",
    "ENGINE_VERSION",
    "MANIFEST",
    "WEIGHTS",
    "BuilderConfig",
    "BuilderConfigError",
]
