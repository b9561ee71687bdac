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


class DeviceError(RuntimeErrorBase, RuntimeError):
    """The device itself failed (a CUDA error, a lost GPU), not the input: the batch it was
    running is lost and the device should take no more work. The router marks the device
    unhealthy when it sees this class."""
