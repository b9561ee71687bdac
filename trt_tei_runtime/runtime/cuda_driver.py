"""The few CUDA driver calls a query's direct path makes (`query_path`), through ctypes.

The driver library is the one every CUDA process loads (`libcuda.so.1`), so this adds no
dependency. The short calls (copies, launch, context) keep the interpreter lock: releasing
and taking it back would cost more than the call. Only the wait for the stream releases it,
so that the bulk thread runs meanwhile.

A failing call raises `CudaDriverError`, whose text starts with "CUDA error" as torch's
own do: the backend then reports the device as failed (`backend.DeviceError`).
"""

from __future__ import annotations

import ctypes
from typing import Any


class CudaDriverError(RuntimeError):
    pass


class CudaDriver:
    def __init__(self, library: str = "libcuda.so.1") -> None:
        # PyDLL keeps the interpreter lock during the call; CDLL releases it.
        quick = ctypes.PyDLL(library)
        blocking = ctypes.CDLL(library)
        self._error_name = _function(quick, "cuGetErrorName", [ctypes.c_int, ctypes.c_void_p])
        self._device_get = _function(quick, "cuDeviceGet", [ctypes.c_void_p, ctypes.c_int])
        self._primary_retain = _function(
            quick, "cuDevicePrimaryCtxRetain", [ctypes.c_void_p, ctypes.c_int]
        )
        self._ctx_get = _function(quick, "cuCtxGetCurrent", [ctypes.c_void_p])
        self._ctx_set = _function(quick, "cuCtxSetCurrent", [ctypes.c_void_p])
        copy = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self._to_device = _function(quick, "cuMemcpyHtoDAsync_v2", copy)
        self._to_host = _function(quick, "cuMemcpyDtoHAsync_v2", copy)
        self._launch = _function(quick, "cuGraphLaunch", [ctypes.c_void_p, ctypes.c_void_p])
        self._synchronize = _function(blocking, "cuStreamSynchronize", [ctypes.c_void_p])

    def primary_context(self, device_index: int) -> int:
        """The device's primary context (the one torch and the CUDA runtime use), retained
        for the life of the process."""
        device = ctypes.c_int()
        self._check(self._device_get(ctypes.byref(device), device_index), "cuDeviceGet")
        context = ctypes.c_void_p()
        self._check(self._primary_retain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        return int(context.value or 0)

    def make_current(self, context: int) -> int | None:
        """Makes `context` current on this thread; returns the one it replaced, None where
        it was current already. A thread that never made a CUDA runtime call has none, and
        the calls below need one."""
        previous = ctypes.c_void_p()
        self._check(self._ctx_get(ctypes.byref(previous)), "cuCtxGetCurrent")
        if (previous.value or 0) == context:
            return None
        self._check(self._ctx_set(context), "cuCtxSetCurrent")
        return previous.value or 0

    def set_current(self, context: int) -> None:
        self._check(self._ctx_set(context), "cuCtxSetCurrent")

    def copy_to_device(self, device_ptr: int, host_ptr: int, nbytes: int, stream: int) -> None:
        """Asynchronous on `stream` where the host memory is pinned."""
        self._check(self._to_device(device_ptr, host_ptr, nbytes, stream), "cuMemcpyHtoDAsync")

    def copy_to_host(self, host_ptr: int, device_ptr: int, nbytes: int, stream: int) -> None:
        self._check(self._to_host(host_ptr, device_ptr, nbytes, stream), "cuMemcpyDtoHAsync")

    def launch(self, graph_exec: int, stream: int) -> None:
        """An instantiated CUDA graph (e.g. torch's `CUDAGraph.raw_cuda_graph_exec()`)."""
        self._check(self._launch(graph_exec, stream), "cuGraphLaunch")

    def synchronize(self, stream: int) -> None:
        """Waits for the stream's work, the interpreter lock released."""
        self._check(self._synchronize(stream), "cuStreamSynchronize")

    def _check(self, status: int, call: str) -> None:
        if status:
            name = ctypes.c_char_p()
            self._error_name(status, ctypes.byref(name))
            text = name.value.decode() if name.value else f"CUresult {status}"
            raise CudaDriverError(f"CUDA error: {text} in {call}")


def _function(library: Any, name: str, argtypes: list[Any]) -> Any:
    function = getattr(library, name)
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function
