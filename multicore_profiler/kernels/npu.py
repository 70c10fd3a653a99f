"""The Ascend NPU as a backend: buffers in device memory, the cycle frequency it runs at.

``torch_npu`` is imported only when an ``NpuBackend`` is made (``pip install
'multicore_profiler[npu]'``). The records carry ``GetSystemCycle()`` values, so the
backend must know that counter's frequency; it takes the first of:

1. ``frequency_hz`` given by the user (source ``override``);
2. the system counter frequency the device reports through torch_npu (``device``);
3. the ``freq`` a torch_npu profiler capture wrote to ``profiler_info[_<rank>].json``
   (``profiler_info``), when one is given;
4. the SoC table, by the chip's name as torch_npu reports it (``soc_table``).

A chip the table does not know, with nothing reported, raises ``FrequencyError``
rather than guess: every time of the run would be off by the guess's error.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np
import orjson
import torch

from multicore_profiler.abi import check_frequency
from multicore_profiler.errors import BackendError, FrequencyError

SOC_FREQUENCIES: tuple[tuple[str, float], ...] = (
    ("ascend910b*", 50e6),
    ("ascend910c*", 50e6),
    ("ascend910_93*", 50e6),
)
"""System counter frequency by normalized SoC name (a glob), as hyper-parallel assumes."""

FREQUENCY_SOURCES = ("override", "device", "profiler_info", "soc_table")
"""Where an NPU backend's frequency came from, first wins (see the module docstring)."""

_INSTALL_HINT = "pip install 'multicore_profiler[npu]' on a machine with CANN"


@dataclass(frozen=True)
class CycleFrequency:
    """A cycle counter frequency and where it came from."""

    hz: float
    source: str
    """One of ``FREQUENCY_SOURCES`` (``host`` for the CPU backend)."""
    detail: str = ""
    """What the source was: the file read, the SoC pattern matched."""


def normalize_soc(name: str) -> str:
    """A SoC name as the table keys it: lower case, no spaces or hyphens
    (``Ascend910B4`` -> ``ascend910b4``, ``Ascend 910_9372`` -> ``ascend910_9372``)."""
    return re.sub(r"[\s-]+", "", name).lower()


def soc_frequency(soc: str) -> CycleFrequency | None:
    """The table's frequency for a SoC name, or None for a chip it does not know."""
    normalized = normalize_soc(soc)
    for pattern, hz in SOC_FREQUENCIES:
        if fnmatch.fnmatchcase(normalized, pattern):
            return CycleFrequency(hz, "soc_table", f"{soc} matches {pattern}")
    return None


def _checked(value: Any, where: str, *, unit: Literal["Hz", "MHz"] = "Hz") -> float:
    """A frequency in Hz from ``value`` in ``unit``, or ``FrequencyError`` naming where."""
    if isinstance(value, bool | str):
        raise FrequencyError(f"{where}: the cycle frequency must be a number, got {value!r}")
    try:
        return check_frequency(value, unit=unit)
    except FrequencyError as exc:
        raise FrequencyError(f"{where}: {exc}") from None


def profiler_info_file(path: str | Path, rank: int | None = None) -> Path:
    """The ``profiler_info`` file of a torch_npu capture: ``path`` itself, or in a
    directory ``profiler_info_<rank>.json`` (with a rank) else ``profiler_info.json``, at
    any depth. Raises ``FrequencyError`` when there is none or several."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FrequencyError(f"profiler info {path} does not exist")
    names = [f"profiler_info_{rank}.json"] if rank is not None else []
    names.append("profiler_info.json")
    for name in names:
        found = sorted(path.rglob(name))
        if len(found) > 1:
            raise FrequencyError(
                f"{path} holds {len(found)} files named {name} ({found[0]}, {found[1]}, ...); "
                "give the one of this capture"
            )
        if found:
            return found[0]
    ranked = sorted(path.rglob("profiler_info_*.json"))
    if rank is None and len(ranked) == 1:
        return ranked[0]
    raise FrequencyError(
        f"{path} holds no {' or '.join(names)}"
        + (f" (but {len(ranked)} other ranks' files)" if ranked else "")
    )


def profiler_info_frequency(path: str | Path, rank: int | None = None) -> CycleFrequency | None:
    """The system counter frequency a torch_npu capture recorded, or None where it did
    not read one (``syscnt_enable`` false: its ``freq`` is then a default, not the chip's).

    torch_npu writes ``{"start_info": {"syscnt_enable": true, "freq": 100, ...}}`` in MHz;
    a ``syscnt freq`` key is read the same way.
    """
    file = profiler_info_file(path, rank)
    try:
        info = orjson.loads(file.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise FrequencyError(f"profiler info {file} cannot be read: {exc}") from exc
    start = info.get("start_info") if isinstance(info, dict) else None
    if not isinstance(start, dict):
        raise FrequencyError(f"profiler info {file} has no start_info object")
    if not start.get("syscnt_enable", True):
        return None
    for key in ("freq", "syscnt freq", "syscnt_freq"):
        if key in start:
            hz = _checked(start[key], f"{file} start_info.{key} (MHz)", unit="MHz")
            return CycleFrequency(hz, "profiler_info", str(file))
    raise FrequencyError(f"profiler info {file}: start_info has no freq")


def resolve_frequency(
    soc: str | None,
    *,
    override_hz: float | None = None,
    device_hz: float | None = None,
    profiler_info: str | Path | None = None,
    rank: int | None = None,
) -> CycleFrequency:
    """The first frequency of: the override, the device's report, the profiler info, the
    SoC table; ``FrequencyError`` when none applies."""
    if override_hz is not None:
        return CycleFrequency(_checked(override_hz, "frequency_hz"), "override", "given")
    if device_hz is not None:
        return CycleFrequency(device_hz, "device", "torch_npu system counter")
    if profiler_info is not None:
        found = profiler_info_frequency(profiler_info, rank)
        if found is not None:
            return found
    if soc is not None:
        found = soc_frequency(soc)
        if found is not None:
            return found
    known = ", ".join(pattern for pattern, _ in SOC_FREQUENCIES)
    raise FrequencyError(
        f"the cycle frequency of SoC {soc!r} is unknown: the device reported none"
        + ("" if profiler_info is None else f", {profiler_info} has none")
        + f" and the SoC table knows {known}; give frequency_hz"
    )


def _torch_npu() -> ModuleType:
    """torch_npu, imported now (it registers ``torch.npu`` and the ``npu`` device)."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError as exc:
        raise BackendError(f"the NPU backend needs torch_npu ({exc}); {_INSTALL_HINT}") from exc


def reported_frequency(torch_npu: ModuleType) -> float | None:
    """The system counter frequency the device reports through torch_npu (as its profiler
    reads it), or None where this torch_npu cannot read one."""
    profiler = getattr(getattr(torch_npu, "_C", None), "_profiler", None)
    enabled = getattr(profiler, "_get_syscnt_enable", None)
    read = getattr(profiler, "_get_freq", None)
    if enabled is None or read is None or not enabled():
        return None
    return _checked(read(), "torch_npu system counter (MHz)", unit="MHz")


def _distributed_rank() -> int | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None


class NpuBackend:
    """An Ascend NPU: profile buffers in its memory, its SoC and counter frequency.

    ``device`` is an index, ``"npu:N"`` or a ``torch.device`` (default: torch.npu's
    current device). ``frequency_hz`` overrides every other source of the frequency;
    ``profiler_info`` is a torch_npu capture's ``profiler_info[_<rank>].json`` or its
    directory, read when the device reports no frequency (see the module docstring).
    Its launches are asynchronous: a kernel has finished once ``synchronize`` returns.
    """

    launch_blocks = False

    def __init__(
        self,
        device: int | str | torch.device | None = None,
        *,
        frequency_hz: float | None = None,
        profiler_info: str | Path | None = None,
    ) -> None:
        torch_npu = _torch_npu()
        npu = getattr(torch, "npu", None)
        if npu is None:
            raise BackendError(f"torch_npu was imported but torch.npu is missing; {_INSTALL_HINT}")
        if not npu.is_available():
            raise BackendError("torch.npu reports no NPU on this machine (is CANN's driver up?)")
        self._npu = npu
        self._device = _npu_device(device, npu)
        self._soc: str = str(npu.get_device_name(self._device.index))
        self.cycle_frequency = resolve_frequency(
            self._soc,
            override_hz=frequency_hz,
            device_hz=None if frequency_hz is not None else reported_frequency(torch_npu),
            profiler_info=profiler_info,
            rank=_distributed_rank(),
        )
        self._placeholder = torch.empty(0, dtype=torch.uint8, device=self._device)

    @property
    def device(self) -> torch.device:
        """The NPU, as ``npu:N``."""
        return self._device

    @property
    def device_index(self) -> int:
        """The NPU's number on this host."""
        return int(self._device.index)

    @property
    def frequency_hz(self) -> float:
        """The system counter frequency the records are converted with."""
        return self.cycle_frequency.hz

    @property
    def frequency_source(self) -> str:
        """Where the frequency came from: one of ``FREQUENCY_SOURCES``."""
        return self.cycle_frequency.source

    @property
    def soc(self) -> str:
        """The chip's name as torch.npu reports it, e.g. ``Ascend910B4``."""
        return self._soc

    @property
    def placeholder(self) -> torch.Tensor:
        """The empty device buffer of unprofiled calls."""
        return self._placeholder

    def allocate(self, nbytes: int) -> torch.Tensor:
        """A new zeroed buffer in the NPU's memory."""
        return torch.zeros(nbytes, dtype=torch.uint8, device=self._device)

    def synchronize(self) -> None:
        """Wait for every kernel launched on the NPU to finish."""
        self._npu.synchronize(self._device)

    def to_host(self, buffer: torch.Tensor, out: np.ndarray) -> None:
        """Copy a device buffer into ``out`` in host memory (the caller synchronized first)."""
        torch.from_numpy(out).copy_(buffer)

    def __repr__(self) -> str:
        frequency = self.cycle_frequency
        return (
            f"NpuBackend({self._device}, soc={self._soc!r}, "
            f"{frequency.hz / 1e6:g} MHz from {frequency.source})"
        )


def _npu_device(device: int | str | torch.device | None, npu: Any) -> torch.device:
    """The ``npu:N`` device a user named (default: the current one), checked."""
    if device is None:
        return torch.device("npu", int(npu.current_device()))
    try:
        parsed = torch.device("npu", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BackendError(f"{device!r} is not an NPU device: {exc}") from None
    if parsed.type != "npu":
        raise BackendError(f"{device!r} is not an NPU device (its type is {parsed.type})")
    if parsed.index is None:
        parsed = torch.device("npu", int(npu.current_device()))
    count = int(npu.device_count())
    if not 0 <= parsed.index < count:
        raise BackendError(f"{parsed} does not exist: torch.npu sees {count} device(s)")
    return parsed
