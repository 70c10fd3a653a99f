"""Device ABI v1: the byte layout of a MegaKernel profile buffer, its capacity plan and
the cycle frequencies a host may decode it at.

A buffer has no global header. It is ``aic_slots`` AIC slots followed by
``aiv_slots`` AIV slots; a slot is a 64-byte header and ``capacity`` 32-byte
records, the capacity being fixed per core type. Everything is little-endian and
compatible with mindspore-ai/hyper-parallel's MegaKernel profiling.

Two generations of hyper-parallel write these same bytes (``GENERATIONS``): ``a``, its
first, caps a slot at 256 records; ``b``, its newer one, plans a slot for the busiest
worker whatever its size, up to ``MAX_CAPACITY_B`` records. The buffer does not say which
wrote it: the layout the host planned does, or else a capacity above 256 or a graph stage
id (0x30000..0x3FFFF) in its records shows ``b``.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np

from multicore_profiler.errors import ArgumentError, FrequencyError, LayoutError
from multicore_profiler.limits import FREQUENCY_HZ, FREQUENCY_MHZ

SLOT_HEADER_BYTES = 64
RECORD_BYTES = 32
CAPACITY_ALIGN = 16
MAX_CAPACITY = 256
"""Generation a's cap on a slot's records (hyper-parallel's first generation)."""
MAX_CAPACITY_B = (
    (0xFFFF_FFFF - SLOT_HEADER_BYTES) // RECORD_BYTES // CAPACITY_ALIGN * CAPACITY_ALIGN
)
"""Generation b's cap: the most records (134,217,712, a multiple of 16) whose slot's byte
size, 64 + capacity x 32, still fits 32 bits. Offsets within a buffer need 64 bits."""

Generation = Literal["a", "b"]
"""An ABI generation: ``a`` (hyper-parallel's first) or ``b`` (its newer one)."""
GENERATIONS: dict[str, int] = {"a": MAX_CAPACITY, "b": MAX_CAPACITY_B}
"""Each generation and the largest slot capacity it allows."""

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
    """Core type as written in a slot header (``core_type`` field), and the core types of
    other profilers' records imported into the store (a GPU's SM by its hardware id; a
    thread block where the producer records no SM)."""

    AIC = 1
    AIV = 2
    SM = 3
    CTA = 4


CORE_NAMES = {core_type.value: core_type.name for core_type in CoreType}
"""Display name of each core type (``AIC``, ``AIV``, ``SM``, ``CTA``)."""
ASCEND_CORE_NAMES = {code: CORE_NAMES[code] for code in (CoreType.AIC, CoreType.AIV)}
"""The core types an Ascend device has, the only ones hyper-parallel's traces name."""


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


def check_generation(generation: object) -> Generation:
    """``generation`` if it names an ABI generation (``a`` or ``b``), else ``LayoutError``."""
    if not isinstance(generation, str) or generation not in GENERATIONS:
        raise LayoutError(
            f"an ABI generation is one of {', '.join(GENERATIONS)}, got {generation!r}"
        )
    return generation  # type: ignore[return-value]


def infer_generation(*capacities: int) -> Generation:
    """The generation slots of these capacities show: ``b`` when one holds more than 256
    records (generation a cannot), else ``a``."""
    return "b" if max(capacities, default=0) > MAX_CAPACITY else "a"


GRAPH_STAGE_IDS = 0x10000
"""How many graph stage ids there are: ``DESC_GRAPH_STAGE`` .. 0x3FFFF."""


def numbers_graph_stages(desc_ids: np.ndarray) -> bool:
    """Whether any of these desc ids (uint32) is a graph stage 0x30000..0x3FFFF: only
    generation b numbers its stages so, so a buffer whose layout names no generation and
    whose capacities fit generation a is generation b when it holds one."""
    offset = desc_ids - np.uint32(DESC_GRAPH_STAGE)  # wraps below 0x30000, so one compare
    return bool((offset < np.uint32(GRAPH_STAGE_IDS)).any())


def capacity_for(records: int, generation: Generation = "a") -> int:
    """The slot capacity a generation plans for a worker that writes ``records``: rounded up
    to 16, then capped at 256 (``a``), or refused with ``LayoutError`` above
    ``MAX_CAPACITY_B`` (``b``, which never caps, so never drops)."""
    rounded = -(-records // CAPACITY_ALIGN) * CAPACITY_ALIGN
    if check_generation(generation) == "a":
        return min(rounded, MAX_CAPACITY)
    if rounded > MAX_CAPACITY_B:
        raise LayoutError(
            f"the busiest worker writes {records} records, more than the {MAX_CAPACITY_B} a "
            "generation b slot can hold"
        )
    return rounded


def plan_capacity(queues: Iterable[Iterable[QueuedTask]], generation: Generation = "a") -> int:
    """Slot capacity for one core type: the busiest worker's records, planned by
    ``capacity_for`` (generation a: min(round_up(records, 16), 256)).

    ``queues`` holds the tasks each worker of that core type really runs.
    """
    busiest = max((sum(task_record_count(t) for t in queue) for queue in queues), default=0)
    return capacity_for(busiest, generation)


@dataclass(frozen=True)
class BufferLayout:
    """Where every slot of a profile buffer lies, as the host planned it.

    The host always decodes against the layout it planned and checks every slot
    header against it. ``generation`` is the ABI generation that wrote the buffer; None
    leaves it to the decoder, which infers it (see ``resolved``).
    """

    aic_slots: int
    aiv_slots: int
    aic_capacity: int
    aiv_capacity: int
    generation: Generation | None = None

    def __post_init__(self) -> None:
        for name in ("aic_slots", "aiv_slots", "aic_capacity", "aiv_capacity"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise LayoutError(f"{name} must be a non-negative integer, got {value!r}")
        if self.aic_slots + self.aiv_slots == 0:
            raise LayoutError(
                "a buffer layout needs at least one slot (aic_slots + aiv_slots is 0)"
            )
        if self.generation is not None:
            check_generation(self.generation)
        cap = self.max_capacity
        for name in ("aic_capacity", "aiv_capacity"):
            value = getattr(self, name)
            if value % CAPACITY_ALIGN or value > cap:
                why = ""
                if value > cap:
                    lift = (
                        ""
                        if cap == MAX_CAPACITY_B
                        else f"; generation b lifts it to {MAX_CAPACITY_B}"
                    )
                    why = f" (generation {self.generation or 'b'}'s cap{lift})"
                raise LayoutError(
                    f"{name} must be a multiple of {CAPACITY_ALIGN} no larger than "
                    f"{cap}, got {value}{why}"
                )

    def __repr__(self) -> str:
        generation = "" if self.generation is None else f", generation={self.generation!r}"
        return (
            f"BufferLayout(aic_slots={self.aic_slots}, aiv_slots={self.aiv_slots}, "
            f"aic_capacity={self.aic_capacity}, aiv_capacity={self.aiv_capacity}{generation})"
        )

    @functools.cached_property
    def resolved(self) -> BufferLayout:
        """This layout with its generation: the one given, else the one its capacities show
        (``infer_generation``: ``b`` above 256 records, else ``a``; the decoder also makes it
        ``b`` for records of graph stages). Made once per layout."""
        if self.generation is not None:
            return self
        return replace(self, generation=infer_generation(self.aic_capacity, self.aiv_capacity))

    @property
    def max_capacity(self) -> int:
        """The largest capacity the layout's generation allows (256 for ``a``; None: ``b``'s)."""
        return GENERATIONS[self.generation or "b"]

    @classmethod
    def plan(
        cls,
        aic_queues: Iterable[Iterable[QueuedTask]],
        aiv_queues: Iterable[Iterable[QueuedTask]],
        *,
        aic_slots: int,
        aiv_slots: int,
        generation: Generation | None = None,
    ) -> BufferLayout:
        """Plan a layout from the task queues of the AIC and AIV workers (one queue per
        worker) by the capacity rule of ``generation`` (``capacity_for``), which it carries;
        None plans by generation a's rule and leaves the generation to the decoder's
        inference."""
        aic_queues, aiv_queues = list(aic_queues), list(aiv_queues)
        for kind, queues, slots in (("AIC", aic_queues, aic_slots), ("AIV", aiv_queues, aiv_slots)):
            if len(queues) > slots:
                raise LayoutError(
                    f"{len(queues)} {kind} workers do not fit in {slots} {kind} slots"
                )
        return cls(
            aic_slots=aic_slots,
            aiv_slots=aiv_slots,
            aic_capacity=plan_capacity(aic_queues, generation or "a"),
            aiv_capacity=plan_capacity(aiv_queues, generation or "a"),
            generation=generation,
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
