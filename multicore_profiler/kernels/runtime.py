"""A MegaKernel's RuntimeConfig and the one hook through which every launch passes.

The config is bytes the kernel reads: a header (with the per-invocation profiling
flag, worker counts and the planned buffer layout) and one descriptor per task (its
type, worker, the event it waits on and the one it triggers, and the profiling
fields ``profile_desc_id``, ``profile_owner_id``, ``profile_task_index`` that the
kernel's spec fills in). Names (kernel, stages, owner label) ride along as host-side
metadata and never change those bytes. One compiled kernel serves both modes: it
reads the flag once per launch.

A launch goes through ``prepare_call(config, direction=...)``. With no capture
session, or one whose schedule is not recording, it returns the config as it is and
the backend's empty placeholder buffer: nothing is allocated, written or timed. A
recording session returns the profiling copy of the config and a zeroed buffer of
the planned layout; the launch then calls ``complete()`` (or ``cancel()`` if it
failed), or uses the call as a context manager that does so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Protocol

import numpy as np
import torch

from multicore_profiler.abi import (
    GENERATIONS,
    BufferLayout,
    CoreType,
    Generation,
    TaskShape,
    check_generation,
)
from multicore_profiler.errors import ConfigError, SessionError
from multicore_profiler.kernels.backend import Backend
from multicore_profiler.kernels.spec import ProfileMetadata, ProfileSpec, fallback_desc_ids

CONFIG_MAGIC = 0x4D43_5046  # "MCPF"
CONFIG_VERSION = 1
NO_EVENT = -1

CONFIG_HEADER_DTYPE = np.dtype(
    [
        ("magic", "<u4"),
        ("version", "<u4"),
        ("profile_enabled", "<u4"),
        ("task_count", "<u4"),
        ("event_count", "<u4"),
        ("aic_workers", "<u4"),
        ("aiv_workers", "<u4"),
        ("aic_slots", "<u4"),
        ("aiv_slots", "<u4"),
        ("aic_capacity", "<u4"),
        ("aiv_capacity", "<u4"),
        ("abi_generation", "<u4"),
    ]
)
"""The config header. ``abi_generation`` is the profile buffer's ABI generation: its index
in ``abi.GENERATIONS`` (0 = a, 1 = b)."""

TASK_SHMEM_PUT_MEM_SIGNAL = 105
"""The task type of hyper-parallel's ShmemPutMemSignal, a task that signals its event itself:
generation b's capacity rule counts no TriggerEvent record for it."""

TASK_DTYPE = np.dtype(
    [
        ("task_id", "<u4"),
        ("task_type", "<u4"),
        ("core_type", "<u4"),
        ("worker", "<u4"),
        ("tiling_position", "<u4"),
        ("input_position", "<u4"),
        ("wait_event", "<i4"),
        ("wait_count", "<u4"),
        ("trigger_event", "<i4"),
        ("args", "<u4", (4,)),
        ("profile_desc_id", "<u4"),
        ("profile_owner_id", "<u4"),
        ("profile_task_index", "<u4"),
    ]
)
"""One task descriptor. ``args`` are the kernel's own (tile, expert, ...). A
``wait_event`` of -1 means the task waits on nothing; else it waits until that
event has been triggered ``wait_count`` times. ``profile_desc_id`` 0 means no stage:
the kernel then records ``0x20000 + task_type``."""


def new_tasks(count: int) -> np.ndarray:
    """``count`` zeroed task descriptors with no events, for a kernel to fill in."""
    tasks = np.zeros(count, dtype=TASK_DTYPE)
    tasks["task_id"] = np.arange(count)
    tasks["wait_event"] = NO_EVENT
    tasks["trigger_event"] = NO_EVENT
    return tasks


def parse_config(data: np.ndarray) -> tuple[np.void, np.ndarray]:
    """The header and task descriptors of RuntimeConfig bytes (views, no copy), as a kernel
    reads them; ``ConfigError`` for bytes that are not a config of this version."""
    if data.dtype != np.uint8 or data.ndim != 1 or len(data) < CONFIG_HEADER_DTYPE.itemsize:
        raise ConfigError("config bytes must be a 1-D uint8 array holding at least a header")
    header = data[: CONFIG_HEADER_DTYPE.itemsize].view(CONFIG_HEADER_DTYPE)[0]
    if header["magic"] != CONFIG_MAGIC or header["version"] != CONFIG_VERSION:
        raise ConfigError(
            f"config is not a version {CONFIG_VERSION} RuntimeConfig "
            f"(magic {int(header['magic']):#x}, version {int(header['version'])})"
        )
    body = data[CONFIG_HEADER_DTYPE.itemsize :]
    if len(body) != int(header["task_count"]) * TASK_DTYPE.itemsize:
        raise ConfigError(
            f"config holds {len(body)} bytes of tasks but its header says "
            f"{int(header['task_count'])} tasks of {TASK_DTYPE.itemsize} bytes"
        )
    if header["abi_generation"] >= len(GENERATIONS):
        raise ConfigError(
            f"config header names ABI generation {int(header['abi_generation'])}; "
            f"0 .. {len(GENERATIONS) - 1} ({', '.join(GENERATIONS)}) are known"
        )
    return header, body.view(TASK_DTYPE)


def header_layout(header: np.void) -> BufferLayout:
    """The profile buffer layout a config header plans."""
    return BufferLayout(
        aic_slots=int(header["aic_slots"]),
        aiv_slots=int(header["aiv_slots"]),
        aic_capacity=int(header["aic_capacity"]),
        aiv_capacity=int(header["aiv_capacity"]),
        generation=tuple(GENERATIONS)[int(header["abi_generation"])],
    )


def compute_desc_ids(tasks: np.ndarray) -> np.ndarray:
    """The desc id each task's compute record carries: its stage id, else the fallback
    0x20000 + task type (what a kernel reading the descriptors writes)."""
    desc = tasks["profile_desc_id"]
    return np.where(desc != 0, desc, fallback_desc_ids(tasks["task_type"]))


def _index_within(desc: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Each task's position among the tasks of its (stage, owner), in task order."""
    order = np.lexsort((np.arange(len(desc)), owner, desc))
    d, o = desc[order], owner[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = (d[1:] != d[:-1]) | (o[1:] != o[:-1])
    group_start = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    index = np.empty(len(order), dtype=np.uint32)
    index[order] = np.arange(len(order)) - group_start
    return index


class RuntimeConfig:
    """A kernel's launch configuration: its bytes, metadata and backend; see the module
    docstring. Build one with ``build_runtime_config``; it is read-only."""

    def __init__(
        self, data: np.ndarray, *, metadata: ProfileMetadata, backend: Backend, config_id: str
    ) -> None:
        self._data = data
        data.flags.writeable = False
        self._header, self._tasks = parse_config(data)
        self._layout = header_layout(self._header)
        self._profile_enabled = bool(self._header["profile_enabled"])
        self.metadata = metadata
        self.backend = backend
        self.config_id = config_id
        """Identifies the task graph and layout (the same whether profiling is on or off)."""
        self._tensor: torch.Tensor | None = None
        self._flipped: RuntimeConfig | None = None

    @property
    def profile_enabled(self) -> bool:
        """Whether a launch with this config records into its profile buffer (read once:
        every launch asks)."""
        return self._profile_enabled

    @property
    def tasks(self) -> np.ndarray:
        """The task descriptors (read-only)."""
        return self._tasks

    @property
    def header(self) -> np.void:
        """The config header (read-only)."""
        return self._header

    @property
    def layout(self) -> BufferLayout:
        """The profile buffer layout planned from the workers' queues."""
        return self._layout

    def workers(self, core_type: CoreType) -> int:
        """Number of workers of a core type."""
        return int(self._header["aic_workers" if core_type == CoreType.AIC else "aiv_workers"])

    def to_bytes(self) -> bytes:
        """The bytes the kernel reads."""
        return self._data.tobytes()

    @property
    def tensor(self) -> torch.Tensor:
        """The config's bytes as a ``uint8`` tensor on the backend's device (made once)."""
        if self._tensor is None:
            host = torch.from_numpy(self._data.copy())
            self._tensor = host.to(self.backend.device)
        return self._tensor

    def with_profiling(self, enabled: bool = True) -> RuntimeConfig:
        """This config with the profiling flag set to ``enabled`` (a copy, made once)."""
        if enabled == self.profile_enabled:
            return self
        if self._flipped is None:
            data = self._data.copy()
            data[: CONFIG_HEADER_DTYPE.itemsize].view(CONFIG_HEADER_DTYPE)["profile_enabled"] = (
                enabled
            )
            self._flipped = RuntimeConfig(
                data, metadata=self.metadata, backend=self.backend, config_id=self.config_id
            )
            self._flipped._flipped = self
        return self._flipped

    def effective_desc_ids(self) -> np.ndarray:
        """The desc id each task's compute record carries: its stage id, else the fallback."""
        return compute_desc_ids(self._tasks)

    def __repr__(self) -> str:
        return (
            f"RuntimeConfig({self.metadata.kernel_name}, {len(self._tasks)} tasks, "
            f"profiling {'on' if self.profile_enabled else 'off'}, {self.layout})"
        )


def _check_graph(tasks: np.ndarray, event_count: int, workers: Mapping[CoreType, int]) -> None:
    core = tasks["core_type"]
    unknown = ~np.isin(core, [CoreType.AIC, CoreType.AIV])
    if unknown.any():
        task = int(tasks["task_id"][np.flatnonzero(unknown)[0]])
        raise ConfigError(f"task {task} has core_type {int(core[unknown][0])}; AIC is 1, AIV 2")
    for name in ("wait_event", "trigger_event"):
        events = tasks[name]
        bad = (events < NO_EVENT) | (events >= event_count)
        if bad.any():
            task = int(tasks["task_id"][np.flatnonzero(bad)[0]])
            raise ConfigError(
                f"task {task}: {name} {int(events[bad][0])} is not an event of 0..{event_count - 1}"
            )
    triggered = tasks["trigger_event"][tasks["trigger_event"] >= 0]
    triggers = np.bincount(triggered, minlength=event_count)
    waiting = np.flatnonzero(tasks["wait_event"] >= 0)
    short = tasks["wait_count"][waiting] > triggers[tasks["wait_event"][waiting]]
    if short.any():
        i = int(waiting[np.flatnonzero(short)[0]])
        event = int(tasks["wait_event"][i])
        raise ConfigError(
            f"task {int(tasks['task_id'][i])} waits for {int(tasks['wait_count'][i])} triggers "
            f"of event {event}, which only {int(triggers[event])} task(s) trigger: "
            "it would wait forever"
        )
    for core_type, count in workers.items():
        if count < 1 and (core == core_type).any():
            raise ConfigError(
                f"the graph has {core_type.name} tasks but no {core_type.name} worker"
            )


def build_runtime_config(
    tasks: np.ndarray,
    *,
    event_count: int,
    aic_workers: int,
    aiv_workers: int,
    backend: Backend,
    spec: ProfileSpec | None = None,
    aic_slots: int | None = None,
    aiv_slots: int | None = None,
    aic_capacity: int | None = None,
    aiv_capacity: int | None = None,
    generation: Generation = "a",
) -> RuntimeConfig:
    """Assign tasks to workers, apply the spec and plan the profile buffer: a RuntimeConfig.

    Task i of a core type goes to worker i % workers of that type. The spec writes each
    task's stage id, owner id and index within its (stage, owner); without one, the
    kernel is ``MegaKernel`` with owner label ``Owner`` and no stage names. The
    capacity of each core type is planned from the busiest worker's queue, unless
    ``aic_capacity`` / ``aiv_capacity`` force one (a test of dropped records does).
    Slots default to one per worker. Profiling is off in the result.

    ``generation`` is the ABI generation of the profile buffer, whose capacity rule plans
    it (see ``abi.capacity_for``). Generation a (hyper-parallel's first) counts a task's
    TriggerEvent record where the task triggers an event, and caps a slot at 256 records;
    generation b (its newer one, whose ``_records_for_task`` counts a trigger record for
    every task but a ShmemPutMemSignal, ``TASK_SHMEM_PUT_MEM_SIGNAL``) does not cap, so
    no record is dropped, up to 134,217,712 records a slot.
    """
    if tasks.dtype != TASK_DTYPE:
        raise ConfigError("tasks must be an array of TASK_DTYPE descriptors (see new_tasks)")
    check_generation(generation)
    tasks = tasks.copy()
    workers = {CoreType.AIC: aic_workers, CoreType.AIV: aiv_workers}
    _check_graph(tasks, event_count, workers)
    queues: dict[CoreType, list[list[TaskShape]]] = {}
    for core_type, count in workers.items():
        mine = np.flatnonzero(tasks["core_type"] == core_type)
        tasks["worker"][mine] = np.arange(len(mine)) % max(count, 1)
        if generation == "a":
            triggers = tasks["trigger_event"][mine] >= 0
        else:
            triggers = tasks["task_type"][mine] != TASK_SHMEM_PUT_MEM_SIGNAL
        shapes = [
            TaskShape(waits=bool(w >= 0), triggers=bool(t))
            for w, t in zip(tasks["wait_event"][mine], triggers, strict=True)
        ]
        queues[core_type] = [shapes[w::count] for w in range(count)]

    spec = spec or ProfileSpec()
    tasks["profile_desc_id"] = spec.desc_ids(tasks)
    tasks["profile_owner_id"] = spec.owner_ids(tasks)
    tasks["profile_task_index"] = _index_within(compute_desc_ids(tasks), tasks["profile_owner_id"])

    planned = BufferLayout.plan(
        queues[CoreType.AIC],
        queues[CoreType.AIV],
        aic_slots=aic_workers if aic_slots is None else aic_slots,
        aiv_slots=aiv_workers if aiv_slots is None else aiv_slots,
        generation=generation,
    )
    layout = BufferLayout(
        aic_slots=planned.aic_slots,
        aiv_slots=planned.aiv_slots,
        aic_capacity=planned.aic_capacity if aic_capacity is None else aic_capacity,
        aiv_capacity=planned.aiv_capacity if aiv_capacity is None else aiv_capacity,
        generation=generation,
    )
    header = np.zeros(1, dtype=CONFIG_HEADER_DTYPE)
    header["magic"] = CONFIG_MAGIC
    header["version"] = CONFIG_VERSION
    header["task_count"] = len(tasks)
    header["event_count"] = event_count
    header["aic_workers"] = aic_workers
    header["aiv_workers"] = aiv_workers
    for name in ("aic_slots", "aiv_slots", "aic_capacity", "aiv_capacity"):
        header[name] = getattr(layout, name)
    header["abi_generation"] = tuple(GENERATIONS).index(generation)
    data = np.concatenate([header.view(np.uint8), tasks.view(np.uint8)])
    metadata = ProfileMetadata(
        kernel_name=spec.kernel_name,
        owner_label=spec.owner_label,
        stage_names=dict(spec.stage_names),
    )
    config_id = hashlib.blake2b(data.tobytes(), digest_size=8).hexdigest()
    return RuntimeConfig(data, metadata=metadata, backend=backend, config_id=config_id)


class CallSink(Protocol):
    """What ``prepare_call`` hands launches to: the capture session, while one is open."""

    def prepare(self, config: RuntimeConfig, direction: str) -> PreparedCall:
        """The call a launch makes with ``config``: profiled or not."""
        ...

    def complete(self, call: PreparedCall) -> None:
        """A profiled call's kernel has been launched and will fill its buffer."""
        ...

    def cancel(self, call: PreparedCall) -> None:
        """A profiled call's launch failed: its buffer holds nothing to keep."""
        ...


class PreparedCall:
    """One launch's config and profile buffer; ``complete()`` or ``cancel()`` it once
    launched (both are idempotent, and the first one wins). A profiled call carries the
    host's ``time.perf_counter_ns()`` around its kernel, set by the capture session:
    ``host_launch_ns`` as the call was handed out, ``host_sync_ns`` once the host knew
    the kernel had finished (None until then, and in unprofiled calls)."""

    __slots__ = (
        "_sink",
        "_state",
        "buffer",
        "config",
        "direction",
        "host_launch_ns",
        "host_sync_ns",
    )

    def __init__(
        self,
        config: RuntimeConfig,
        buffer: torch.Tensor,
        *,
        direction: str = "forward",
        sink: CallSink | None = None,
    ) -> None:
        self.config = config
        self.buffer = buffer
        self.direction = direction
        self._sink = sink
        self._state = "open"
        self.host_launch_ns: int | None = None
        self.host_sync_ns: int | None = None

    @property
    def profiled(self) -> bool:
        """Whether this launch records into ``buffer``."""
        return self._sink is not None

    @property
    def state(self) -> str:
        """``open``, ``completed`` or ``cancelled``."""
        return self._state

    def complete(self) -> None:
        """The kernel was launched with this call's config and buffer."""
        if self._state == "open":
            self._state = "completed"
            if self._sink is not None:
                self._sink.complete(self)

    def cancel(self) -> None:
        """The launch did not happen or failed; the buffer is returned unread."""
        if self._state == "open":
            self._state = "cancelled"
            if self._sink is not None:
                self._sink.cancel(self)

    def __enter__(self) -> PreparedCall:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.complete()
        else:
            self.cancel()


_sink: CallSink | None = None


def install_sink(sink: CallSink) -> None:
    """Route launches to ``sink`` (a capture session); only one at a time."""
    global _sink
    if _sink is not None:
        raise SessionError(
            "a mega_kernel_profile session is already open in this process; sessions do not nest"
        )
    _sink = sink


def remove_sink(sink: CallSink) -> None:
    """Stop routing launches to ``sink``."""
    global _sink
    if _sink is sink:
        _sink = None


def active_sink() -> CallSink | None:
    """The open capture session, if any."""
    return _sink


def prepare_call(config: RuntimeConfig, direction: str = "forward") -> PreparedCall:
    """The config and profile buffer for one launch; see the module docstring."""
    sink = _sink
    if sink is None:
        return PreparedCall(config, config.backend.placeholder, direction=direction)
    return sink.prepare(config, direction)
