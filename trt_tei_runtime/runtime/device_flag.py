"""A flag in page-locked host memory that a CUDA stream can wait on.

The preemption gate (`preemption.LayerGate`) raises it while an interactive batch is in
flight; before each step of an eager bulk batch, the bulk stream runs a one-program
kernel that spins while the flag is raised. So the bulk thread can queue a whole batch
ahead of the GPU, and still a query that arrives waits only for the step the GPU is
running: the check happens on the device, when the step is reached, not on the host when
it is launched.

The wait is a kernel with a time limit rather than the driver's stream memory operations
(`cuStreamWaitValue32`): the driver does not see that wait, and may serialize another
stream's work behind it, which here would be the very query that must lower the flag.
A kernel that gives up after `MAX_HOLD_MS` can at worst delay the bulk stream that long.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import globaltimer
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

# Longer than any interactive batch takes; past it, bulk work resumes beside the query.
MAX_HOLD_MS = 50.0

if triton is not None:

    @triton.jit
    def _wait_while_raised(flag_ptr, max_hold_ns):
        start = globaltimer()
        raised = tl.load(flag_ptr, volatile=True) != 0
        while raised:
            raised = (tl.load(flag_ptr, volatile=True) != 0) & (globaltimer() - start < max_hold_ns)


class DeviceFlag:
    """One int32 in pinned host memory: raised (1) or lowered (0) by the host at once, read
    by the GPU whenever a stream reaches `wait_on_current_stream`."""

    def __init__(self, device: torch.device, max_hold_ms: float = MAX_HOLD_MS) -> None:
        self.device = device
        self.max_hold_ns = int(max_hold_ms * 1e6)
        self._flag = torch.zeros(1, dtype=torch.int32).pin_memory()
        self._host = self._flag.numpy()

    @classmethod
    def create(cls, device: torch.device) -> DeviceFlag | None:
        """A flag for a CUDA device where Triton runs; None elsewhere."""
        if device.type != "cuda" or triton is None:
            return None
        return cls(device)

    @property
    def raised(self) -> bool:
        return bool(self._host[0])

    def raise_(self) -> None:
        self._host[0] = 1

    def lower(self) -> None:
        self._host[0] = 0

    def wait_on_current_stream(self) -> None:
        """Work queued on the current stream after this runs once the flag is lowered (or
        `max_hold_ms` after the GPU reached it)."""
        _wait_while_raised[(1,)](self._flag, self.max_hold_ns, num_warps=1)
