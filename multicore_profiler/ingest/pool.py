"""Profile buffers reused across launches, keyed by device and size.

A recorded launch needs a zeroed private buffer; allocating device memory per
launch would cost more than the profiling itself. The pool hands out a free buffer
of the same device and size (zeroed again) or asks the backend for a new one.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import torch

from multicore_profiler.kernels.backend import Backend


class BufferPool:
    """Free buffers by (device, bytes); ``allocations`` and ``reuses`` count what it did."""

    def __init__(self) -> None:
        self._free: dict[tuple[str, int], list[torch.Tensor]] = defaultdict(list)
        self._lock = threading.Lock()
        self.allocations = 0
        self.reuses = 0

    def acquire(self, backend: Backend, nbytes: int) -> torch.Tensor:
        """A zeroed ``uint8`` buffer of ``nbytes`` on the backend's device."""
        key = (str(backend.device), nbytes)
        with self._lock:
            free = self._free[key]
            buffer = free.pop() if free else None
            if buffer is None:
                self.allocations += 1
            else:
                self.reuses += 1
        if buffer is None:
            return backend.allocate(nbytes)
        return buffer.zero_()

    def release(self, buffer: torch.Tensor) -> None:
        """Give a buffer back once nothing reads or writes it any more."""
        with self._lock:
            self._free[(str(buffer.device), buffer.numel())].append(buffer)

    @property
    def free_buffers(self) -> int:
        """Buffers waiting to be reused."""
        with self._lock:
            return sum(len(free) for free in self._free.values())

    def clear(self) -> None:
        """Drop every free buffer (the session is over)."""
        with self._lock:
            self._free.clear()
