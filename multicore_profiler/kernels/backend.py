"""Where a MegaKernel runs: its device, cycle counter frequency and buffer memory.

A capture session never asks the user for a device or a frequency; it asks the
kernel's backend. ``CpuBackend`` serves the CPU reference kernel (host threads,
``time.perf_counter_ns`` as the cycle counter, so 1 GHz); ``kernels.npu.NpuBackend``
an Ascend NPU. Every backend provides the same few members.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch


class Backend(Protocol):
    """What the capture session needs from the device a kernel runs on."""

    @property
    def device(self) -> torch.device:
        """The torch device of the kernel's tensors and profile buffers."""
        ...

    @property
    def device_index(self) -> int:
        """The device's number, as the ``device`` column of the store keeps it."""
        ...

    @property
    def frequency_hz(self) -> float:
        """Frequency of the cycle counter the kernel's records carry."""
        ...

    @property
    def frequency_source(self) -> str:
        """Where ``frequency_hz`` came from (stored with each invocation): ``host`` for the
        CPU; ``override``, ``device``, ``profiler_info`` or ``soc_table`` for an NPU."""
        ...

    @property
    def soc(self) -> str | None:
        """The chip's name (e.g. ``Ascend910B``), where the backend knows it."""
        ...

    @property
    def launch_blocks(self) -> bool:
        """Whether a launch returns only once its kernel has finished (the CPU's kernels
        run inside their launch); else the kernel has finished once ``synchronize``
        returns. Says when the capture session reads each launch's ``host_sync_ns``."""
        ...

    @property
    def placeholder(self) -> torch.Tensor:
        """An empty buffer passed where profiling is off; made once, never per call."""
        ...

    def allocate(self, nbytes: int) -> torch.Tensor:
        """A new zeroed ``uint8`` buffer of ``nbytes`` on the device."""
        ...

    def synchronize(self) -> None:
        """Wait until every launched kernel has finished writing its buffers."""
        ...

    def to_host(self, buffer: torch.Tensor, out: np.ndarray) -> None:
        """Copy a device buffer's bytes into ``out``, host memory the caller owns (a
        ``uint8`` array of the buffer's size; the caller synchronized first)."""
        ...


class CpuBackend:
    """The host as a device: for the CPU reference MegaKernel.

    Its kernels run synchronously inside their launch, so ``synchronize`` has nothing
    to wait for. ``allocations`` counts the buffers it has made, which is how tests
    see that an unprofiled call allocates nothing.
    """

    frequency_hz = 1e9
    frequency_source = "host"
    soc = "cpu"
    launch_blocks = True

    def __init__(self) -> None:
        self.allocations = 0
        self._placeholder = torch.empty(0, dtype=torch.uint8)
        self._device = torch.device("cpu")

    @property
    def device(self) -> torch.device:
        """The CPU (one object: a session looks it up for every launch)."""
        return self._device

    @property
    def device_index(self) -> int:
        """Always 0: the host is one device."""
        return 0

    @property
    def placeholder(self) -> torch.Tensor:
        """The empty buffer of unprofiled calls."""
        return self._placeholder

    def allocate(self, nbytes: int) -> torch.Tensor:
        """A new zeroed buffer in host memory."""
        self.allocations += 1
        return torch.zeros(nbytes, dtype=torch.uint8)

    def synchronize(self) -> None:
        """Nothing to wait for: a CPU launch returns when its workers are done."""

    def to_host(self, buffer: torch.Tensor, out: np.ndarray) -> None:
        """Copy the buffer's bytes into ``out``."""
        np.copyto(out, buffer.numpy())

    def __repr__(self) -> str:
        return "CpuBackend()"
