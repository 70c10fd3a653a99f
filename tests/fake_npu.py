"""A fake Ascend NPU for tests of the NPU backend on a machine with none.

``install()`` makes ``npu`` a real torch device type (torch's Python backend hook for
PrivateUse1, renamed ``npu`` as torch_npu does), whose tensors hold their bytes in host
memory, and registers ``FakeNpu`` as ``torch.npu``. It cannot be undone, so it is done
once per process. The device is asynchronous like a real one: ``launch`` queues a
kernel's writes to a buffer, and only ``synchronize`` lands them, so a host copy taken
before synchronizing reads zeros.

``fake_torch_npu(npu)`` is the ``torch_npu`` module a test puts in ``sys.modules``: its
``_C._profiler`` reports the system counter frequency as torch_npu's does (in MHz).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from torch.utils._pytree import tree_map
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend


class FakeNpuTensor(torch.Tensor):
    """A tensor on an ``npu`` device whose storage is the host tensor ``inner``."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor, device: torch.device) -> FakeNpuTensor:
        tensor = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device=device, strides=inner.stride()
        )
        tensor.inner = inner
        return tensor

    @classmethod
    def __torch_dispatch__(
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        devices = [a.device for a in args if isinstance(a, FakeNpuTensor)]

        def inner(value: Any) -> Any:
            return value.inner if isinstance(value, FakeNpuTensor) else value

        out = func(*tree_map(inner, args), **tree_map(inner, kwargs))
        target = kwargs.get("device")
        if func is torch.ops.aten._to_copy.default and target is not None and target.type == "cpu":
            return out
        return tree_map(
            lambda v: FakeNpuTensor(v, devices[0]) if isinstance(v, torch.Tensor) else v, out
        )


@dataclass
class FakeNpu:
    """``torch.npu`` of a host with ``len(names)`` NPUs; its fields are the test's knobs."""

    names: list[str] = field(default_factory=lambda: ["Ascend910B4"])
    current: int = 0
    syscnt_enable: bool = True
    freq_mhz: float = 50.0
    pending: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    synchronized: list[int] = field(default_factory=list)
    """The device index of each ``synchronize`` call, in order."""

    def reset(self) -> None:
        """Back to one idle Ascend910B4 reporting 50 MHz."""
        fresh = FakeNpu()
        self.names, self.current = fresh.names, fresh.current
        self.syscnt_enable, self.freq_mhz = fresh.syscnt_enable, fresh.freq_mhz
        self.pending.clear()
        self.synchronized.clear()

    def is_available(self) -> bool:
        return bool(self.names)

    def is_initialized(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        """Nothing to seed."""

    def device_count(self) -> int:
        return len(self.names)

    def current_device(self) -> int:
        return self.current

    def set_device(self, index: int) -> None:
        self.current = index

    def get_device_name(self, index: int | None = None) -> str:
        return self.names[self.current if index is None else index]

    def launch(self, buffer: torch.Tensor, data: torch.Tensor) -> None:
        """A kernel that will write ``data`` into ``buffer`` by the next synchronize."""
        self.pending.append((buffer, data))

    def synchronize(self, device: int | torch.device | None = None) -> None:
        index = device.index if isinstance(device, torch.device) else device
        self.synchronized.append(self.current if index is None else index)
        for buffer, data in self.pending:
            buffer.inner.copy_(data)
        self.pending.clear()


NPU = FakeNpu()
_library: torch.library.Library | None = None


def _empty(
    size: list[int],
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    memory_format: Any = None,
) -> FakeNpuTensor:
    return FakeNpuTensor(torch.empty(size, dtype=dtype), device)


def install() -> FakeNpu:
    """Make ``npu`` a device type served by ``NPU`` in this process (once)."""
    global _library
    if _library is None:
        _setup_privateuseone_for_python_backend(rename="npu", backend_module=NPU)
        _library = torch.library.Library("aten", "IMPL")
        _library.impl("empty.memory_format", _empty, "PrivateUse1")
    return NPU


def fake_torch_npu(npu: FakeNpu) -> ModuleType:
    """A ``torch_npu`` module whose profiler reads ``npu``'s system counter."""
    module = ModuleType("torch_npu")
    module.npu = npu  # type: ignore[attr-defined]
    module._C = SimpleNamespace(  # type: ignore[attr-defined]
        _profiler=SimpleNamespace(
            _get_syscnt_enable=lambda: npu.syscnt_enable, _get_freq=lambda: npu.freq_mhz
        )
    )
    return module
