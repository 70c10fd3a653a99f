"""Profile buffers reused across launches, keyed by device and size.

A recorded launch needs a zeroed private buffer; allocating device memory per
launch would cost more than the profiling itself. The pool hands out a free buffer
of the same device and size or asks the backend for a new one. Buffers come back a
step's worth at a time and are zeroed together then, in one operation (a launch's
preparation then costs no zeroing of its own).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence

import torch

from multicore_profiler.kernels.backend import Backend


class BufferPool:
    """Free buffers by (device, bytes); ``allocations`` and ``reuses`` count what it did."""

    def __init__(self) -> None:
        self._free: dict[tuple[torch.device, int], list[torch.Tensor]] = defaultdict(list)
        self._lock = threading.Lock()
        self.allocations = 0
        self.reuses = 0

    def acquire(self, backend: Backend, nbytes: int) -> torch.Tensor:
        """A zeroed ``uint8`` buffer of ``nbytes`` on the backend's device."""
        key = (backend.device, nbytes)
        with self._lock:
            free = self._free[key]
            buffer = free.pop() if free else None
            if buffer is None:
                self.allocations += 1
            else:
                self.reuses += 1
        return backend.allocate(nbytes) if buffer is None else buffer

    def release(self, buffers: Sequence[torch.Tensor]) -> None:
        """Give buffers back once nothing reads or writes them any more; they are zeroed
        for their next launch (one ``_foreach_zero_`` for all of them, on their devices'
        streams)."""
        if not buffers:
            return
        torch._foreach_zero_(list(buffers))
        with self._lock:
            for buffer in buffers:
                self._free[(buffer.device, buffer.numel())].append(buffer)

    @property
    def free_buffers(self) -> int:
        """Buffers waiting to be reused."""
        with self._lock:
            return sum(len(free) for free in self._free.values())

    def clear(self) -> None:
        """Drop every free buffer (the session is over)."""
        with self._lock:
            self._free.clear()
