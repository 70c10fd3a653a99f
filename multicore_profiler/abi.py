"""Device ABI v1: the byte layout of a MegaKernel profile buffer, its capacity plan and
the cycle frequencies a host may decode it at.

A buffer has no global header. It is ``aic_slots`` AIC slots followed by
``aiv_slots`` AIV slots; a slot is a 64-byte header and ``capacity`` 32-byte
records, the capacity being fixed per core type. Everything is little-endian and
compatible with mindspore-ai/hyper-parallel's MegaKernel profiling.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from multicore_profiler.errors import ArgumentError, FrequencyError, LayoutError
from multicore_profiler.limits import FREQUENCY_HZ, FREQUENCY_MHZ

SLOT_HEADER_BYTES = 64
RECORD_BYTES = 32
MAX_CAPACITY = 256
CAPACITY_ALIGN = 16

DESC_WAIT_DEPENDENCY = 0x10000
DESC_TERMINATE_TASK = 0x10006
DESC_TRIGGER_EVENT = 0x10007
CONTROL_DESC_IDS = (DESC_WAIT_DEPENDENCY, DESC_TERMINATE_TASK, DESC_TRIGGER_EVENT)
"""The ids the runtime itself writes; the ids between them (0x10001..0x10005) are stage ids."""
DESC_COMPUTE_FALLBACK = 0x20000
"""A compute record whose task has no stage id carries ``DESC_COMPUTE_FALLBACK + task_type``."""
MAX_TASK_TYPE = 0xFFFF
"""Task types fit in 16 bits, so fallback ids lie in 0x20000..0x2FFFF."""
FALLBACK_DESC_IDS = range(DESC_COMPUTE_FALLBACK, DESC_COMPUTE_FALLBACK + MAX_TASK_TYPE + 1)
DESC_GRAPH_STAGE = 0x30000
"""The newer generation's stage ids: the k-th operator of the compute graph, in
topological order, is stage ``DESC_GRAPH_STAGE + k``."""
TERMINATE_TASK_TYPE = 0
"""The task type of hyper-parallel's TerminateTask tasks (its ``TaskType.TASK_TERMINATE``)."""


def is_stage_desc_id(desc_id: int) -> bool:
    """Whether a kernel may use ``desc_id`` for a stage: any non-zero 32-bit id but the
    control ids and the fallback ids 0x20000..0x2FFFF (what hyper-parallel reserves)."""
    return (
        1 <= desc_id <= 0xFFFFFFFF
        and desc_id not in CONTROL_DESC_IDS
        and desc_id not in FALLBACK_DESC_IDS
    )


NO_OWNER = 0xFFFFFFFF

PHASES = ("compute", "wait", "trigger", "terminate")
"""Phase names in the order of their codes; everything that is not a control id is compute."""


class CoreType(enum.IntEnum):
    """Core type as written in a slot header (``core_type`` field)."""

    AIC = 1
    AIV = 2


SLOT_HEADER_DTYPE = np.dtype(
    {
        "names": [
            "entry_cycle",
            "record_count",
            "dropped_count",
            "core_type",
            "block_id",
            "record_capacity",
            "reserved",
        ],
        "formats": ["<u8", "<u4", "<u4", "<u4", "<u4", "<u4", "<u4"],
        "offsets": [0, 8, 12, 16, 20, 24, 28],
        "itemsize": SLOT_HEADER_BYTES,
    }
)
"""Slot header: 32 bytes of fields, then 32 bytes of padding."""

RECORD_DTYPE = np.dtype(
    [
        ("start_cycle", "<u8"),
        ("end_cycle", "<u8"),
        ("desc_id", "<u4"),
        ("task_id", "<u4"),
        ("stage_task_index", "<u4"),
        ("owner_id", "<u4"),
    ]
)


def slot_dtype(capacity: int) -> np.dtype:
    """The dtype of one whole slot (header and records) of a core type with this capacity."""
    return np.dtype([("header", SLOT_HEADER_DTYPE), ("records", RECORD_DTYPE, (capacity,))])


class QueuedTask(Protocol):
    """What the capacity planner needs to know of a task in a worker's queue."""

    @property
    def waits(self) -> bool:
        """The task waits on a dependent event (one WaitDependency record)."""
        ...

    @property
    def triggers(self) -> bool:
        """The task triggers an event when done (one TriggerEvent record)."""
        ...


@dataclass(frozen=True)
class TaskShape:
    """The plainest ``QueuedTask``: whether a task waits and whether it triggers."""

    waits: bool
    triggers: bool


def task_record_count(task: QueuedTask) -> int:
    """Records one task writes: its compute record, plus one per event it waits on or triggers."""
    return 1 + bool(task.waits) + bool(task.triggers)


def plan_capacity(queues: Iterable[Iterable[QueuedTask]]) -> int:
    """Slot capacity for one core type: min(round_up(busiest worker's records, 16), 256).

    ``queues`` holds the tasks each worker of that core type really runs.
    """
    busiest = max((sum(task_record_count(t) for t in queue) for queue in queues), default=0)
    rounded = -(-busiest // CAPACITY_ALIGN) * CAPACITY_ALIGN
    return min(rounded, MAX_CAPACITY)


@dataclass(frozen=True)
class BufferLayout:
    """Where every slot of a profile buffer lies, as the host planned it.

    The host always decodes against the layout it planned and checks every slot
    header against it.
    """

    aic_slots: int
    aiv_slots: int
    aic_capacity: int
    aiv_capacity: int

    def __post_init__(self) -> None:
        for name in ("aic_slots", "aiv_slots", "aic_capacity", "aiv_capacity"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise LayoutError(f"{name} must be a non-negative integer, got {value!r}")
        if self.aic_slots + self.aiv_slots == 0:
            raise LayoutError(
                "a buffer layout needs at least one slot (aic_slots + aiv_slots is 0)"
            )
        for name in ("aic_capacity", "aiv_capacity"):
            value = getattr(self, name)
            if value % CAPACITY_ALIGN or value > MAX_CAPACITY:
                raise LayoutError(
                    f"{name} must be a multiple of {CAPACITY_ALIGN} no larger than "
                    f"{MAX_CAPACITY}, got {value}"
                )

    @classmethod
    def plan(
        cls,
        aic_queues: Iterable[Iterable[QueuedTask]],
        aiv_queues: Iterable[Iterable[QueuedTask]],
        *,
        aic_slots: int,
        aiv_slots: int,
    ) -> BufferLayout:
        """Plan a layout from the task queues of the AIC and AIV workers (one queue per worker)."""
        aic_queues, aiv_queues = list(aic_queues), list(aiv_queues)
        for kind, queues, slots in (("AIC", aic_queues, aic_slots), ("AIV", aiv_queues, aiv_slots)):
            if len(queues) > slots:
                raise LayoutError(
                    f"{len(queues)} {kind} workers do not fit in {slots} {kind} slots"
                )
        return cls(
            aic_slots=aic_slots,
            aiv_slots=aiv_slots,
            aic_capacity=plan_capacity(aic_queues),
            aiv_capacity=plan_capacity(aiv_queues),
        )

    def slots(self, core_type: CoreType) -> int:
        """Number of slots of a core type."""
        return self.aic_slots if core_type == CoreType.AIC else self.aiv_slots

    def capacity(self, core_type: CoreType) -> int:
        """Record capacity of every slot of a core type."""
        return self.aic_capacity if core_type == CoreType.AIC else self.aiv_capacity

    def stride(self, core_type: CoreType) -> int:
        """Bytes from one slot of a core type to the next: 64 + capacity x 32."""
        return SLOT_HEADER_BYTES + self.capacity(core_type) * RECORD_BYTES

    def offset(self, core_type: CoreType) -> int:
        """Byte offset of the first slot of a core type (AIC slots come first)."""
        return 0 if core_type == CoreType.AIC else self.aic_slots * self.stride(CoreType.AIC)

    @property
    def total_slots(self) -> int:
        """Slots of both core types."""
        return self.aic_slots + self.aiv_slots

    @property
    def total_bytes(self) -> int:
        """Size of the whole buffer in bytes."""
        return self.offset(CoreType.AIV) + self.aiv_slots * self.stride(CoreType.AIV)

    def slot_index(self, core_type: CoreType, block_id: int) -> int:
        """Index of a core's slot in the buffer (AIV slots are numbered after the AIC ones)."""
        return block_id if core_type == CoreType.AIC else self.aic_slots + block_id

    def slot_bytes(self, buffers: np.ndarray, core_type: CoreType) -> np.ndarray:
        """The slots of one core type as bytes (no copy): ``(..., slots, stride)`` of a
        uint8 buffer, or of a 2-D batch of them (buffer x byte)."""
        start = self.offset(core_type)
        area = buffers[..., start : start + self.slots(core_type) * self.stride(core_type)]
        return area.reshape(*buffers.shape[:-1], self.slots(core_type), self.stride(core_type))

    def region(self, buffers: np.ndarray, core_type: CoreType) -> np.ndarray:
        """The slots of one core type in a uint8 buffer (or a 2-D batch of them), as a
        structured view (no copy).

        The result has fields ``header`` and ``records`` (shape ``(..., slots,
        capacity)``); writing to it writes the buffer, which is how a kernel fills its
        slots.
        """
        slots = self.slot_bytes(buffers, core_type)
        return slots.view(slot_dtype(self.capacity(core_type)))[..., 0]

    def new_buffer(self) -> np.ndarray:
        """A zeroed buffer of this layout, as a kernel receives it before its launch."""
        return np.zeros(self.total_bytes, dtype=np.uint8)


_FREQUENCY_RANGES = {"Hz": (FREQUENCY_HZ, 1.0), "MHz": (FREQUENCY_MHZ, 1e6)}


def check_frequency(frequency: float, *, unit: Literal["Hz", "MHz"] = "Hz") -> float:
    """Return a cycle frequency given in ``unit`` as a float in Hz, or raise
    ``FrequencyError``: it must be a positive finite number within ``limits.FREQUENCY_HZ``
    (1 kHz to 100 GHz), since a value outside (MHz given as Hz, 1e-320) makes every later
    time wrong or infinite. The message names the value and the range in ``unit``."""
    try:
        value = float(frequency)
    except (TypeError, ValueError):
        raise FrequencyError(f"cycle frequency must be a number, got {frequency!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise FrequencyError(
            f"cycle frequency must be positive and finite, got {frequency!r} {unit}"
        )
    bounds, scale = _FREQUENCY_RANGES[unit]
    try:
        return float(bounds.check(value, "cycle frequency")) * scale
    except ArgumentError as exc:
        raise FrequencyError(str(exc)) from None
