"""Errors the runtime raises. Each names the file, tensor or value that is wrong."""

from __future__ import annotations


class RuntimeErrorBase(Exception):
    """Base class of every error `trt_tei_runtime` raises on purpose."""


class CheckpointError(RuntimeErrorBase):
    """A checkpoint folder or hub id cannot be resolved, or one of its files is missing or bad."""


class WeightError(CheckpointError):
    """A tensor is missing, unexpected or of the wrong shape."""


class UnsupportedArchitectureError(CheckpointError):
    """config.json names an architecture this runtime does not implement."""


class InputError(RuntimeErrorBase, ValueError):
    """A caller passed bad input (too long with truncation off, bad dimensions, ...)."""
