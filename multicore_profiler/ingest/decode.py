"""Decode and validate device profile buffers into Arrow tables of cores and records.

Every buffer is checked against the layout the host planned: a header that
contradicts its slot, a record that cannot be a measurement (one that ends before it
starts, or lies 2^63 cycles or more from its buffer's anchor) or a buffer with no
record at all raises a ``DecodeError`` naming the buffer, slot, record and field;
nothing partial is ever returned. Dropped records are no error: the decoder warns and
keeps every record, also where a slot that is not full counts drops. The work is
vectorized, so that a batch of a few small buffers costs little more than a few dozen
numpy calls: the headers of all buffers are gathered and checked at once (the checks
that name a problem run only once one is seen), and records are taken a cache-sized
piece of a batch at a time by one gather of the valid 32-byte records and one copy per
field type, their slots' ids repeated for the whole batch at once.
"""

from __future__ import annotations

import functools
import os
import struct
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from multicore_profiler.abi import (
    DESC_TERMINATE_TASK,
    DESC_TRIGGER_EVENT,
    DESC_WAIT_DEPENDENCY,
    MAX_CAPACITY,
    PHASES,
    RECORD_BYTES,
    RECORD_DTYPE,
    SLOT_HEADER_BYTES,
    SLOT_HEADER_DTYPE,
    BufferLayout,
    CoreType,
    check_frequency,
    numbers_graph_stages,
)
from multicore_profiler.errors import (
    BufferSizeError,
    DecodeError,
    DroppedRecordsWarning,
    EmptyBufferError,
    GenerationError,
    RecordError,
    SlotError,
)
from multicore_profiler.storage.location import special_file

BufferLike = Any
"""bytes, bytearray, memoryview, a contiguous numpy array or a contiguous CPU torch tensor."""

_PHASE_TYPE = pa.dictionary(pa.int8(), pa.string())
_CONTROL = (DESC_WAIT_DEPENDENCY, DESC_TRIGGER_EVENT, DESC_TERMINATE_TASK)
"""The control desc ids, in the order of their phase codes 1, 2 and 3 (0 is compute)."""
_CONTROL_BASE = np.uint32(min(_CONTROL))
_PHASE_CODES = np.zeros(max(_CONTROL) - min(_CONTROL) + 2, np.int8)
"""Phase code of ``desc_id - _CONTROL_BASE``, clipped to the last entry (compute)."""
_PHASE_CODES[np.subtract(_CONTROL, min(_CONTROL))] = (1, 2, 3)


@functools.cache
def phase_dictionary() -> pa.StringArray:
    """The dictionary of ``records.phase``: ``PHASES``. Made on first use, as pyarrow imports
    pandas to convert Python values, which importing this module must not."""
    return pa.array(PHASES, pa.string())


_CHUNK_RECORDS = 16384
"""Record capacity gathered at a time, so that the gather and the field copies stay in cache."""


def as_byte_array(buffer: BufferLike) -> np.ndarray:
    """View a buffer as a uint8 numpy array of the same shape (bytes last), without copying."""
    if type(buffer).__module__.startswith("torch"):
        if buffer.device.type != "cpu":
            raise DecodeError(
                f"the buffer is a tensor on {buffer.device}; copy it to the host before decoding"
            )
        if not buffer.is_contiguous():
            raise DecodeError("the buffer tensor is not contiguous")
        buffer = buffer.detach().numpy()
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise DecodeError("the buffer array is not C-contiguous")
        return buffer.view(np.uint8) if buffer.ndim else buffer.reshape(1).view(np.uint8)
    try:
        return np.frombuffer(buffer, dtype=np.uint8)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"cannot read a {type(buffer).__name__} as a byte buffer: {exc}") from exc


def read_buffer_file(
    path: str | os.PathLike[str], layout: BufferLayout | None = None
) -> np.ndarray:
    """The bytes of one buffer file, as a uint8 array, read in bounded time.

    Anything but a regular file (a directory, a FIFO a read would wait on forever, a
    device, a socket), a missing or unreadable file, and with ``layout`` a file whose
    size is not the layout's, raise a ``DecodeError`` naming the path and what it is.
    The file is opened without blocking, checked again once open, and read to at most
    its expected size + 1 bytes, so one that changes size meanwhile is refused too.
    """
    path = Path(path)
    try:
        kind = special_file(os.stat(path).st_mode)
        if kind is not None:
            raise DecodeError(f"buffer file {path} is {kind}, not a regular file")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise DecodeError(f"cannot read buffer file {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb", buffering=0) as file:
        info = os.fstat(fd)
        kind = special_file(info.st_mode)
        if kind is not None:
            raise DecodeError(f"buffer file {path} became {kind} while it was opened")
        if layout is not None:
            _check_size(info.st_size, layout, suffix=f" (buffer file {path})")
        data = np.empty(info.st_size + 1, np.uint8)
        view, size = memoryview(data), 0
        try:
            while size < len(data) and (got := file.readinto(view[size:])):
                size += got
        except OSError as exc:
            raise DecodeError(f"cannot read buffer file {path}: {exc.strerror or exc}") from None
    if size != info.st_size:
        raise DecodeError(
            f"buffer file {path} changed while it was read: {info.st_size} bytes when opened, "
            f"{'more' if size > info.st_size else size} when read"
        )
    return data[:size]


@dataclass(frozen=True)
class DecodedBuffers:
    """What a batch of buffers of one layout holds, raw, as Arrow tables.

    ``layout`` is the layout decoded against, with its ABI generation (the one it named,
    else the one inferred). ``cores`` has a row per slot that is not idle, ``records`` a
    row per record; both carry ``buffer``, the index of the buffer in the batch.
    Per-buffer arrays give each buffer's anchor cycle (the smallest entry cycle of a slot
    with records), record count and dropped count.
    """

    layout: BufferLayout
    frequency_hz: float
    cores: pa.Table
    records: pa.Table
    anchor_cycles: np.ndarray
    record_counts: np.ndarray
    dropped_counts: np.ndarray

    @property
    def buffers(self) -> int:
        """Number of buffers decoded."""
        return len(self.anchor_cycles)

    def timed_records(self) -> pa.Table:
        """``records`` with ``ts_us`` and ``dur_us``: (cycle - anchor) / frequency, in us.

        The decoder refuses a record 2^63 cycles or more from its anchor, so the cycle
        difference is an exact signed 64-bit count, with its sign, before it is divided.
        """
        start = self.records.column("start_cycle").to_numpy()
        end = self.records.column("end_cycle").to_numpy()
        anchor = self.anchor_cycles[self.records.column("buffer").to_numpy()]
        cycles_per_us = self.frequency_hz / 1e6
        ts = (start - anchor).view(np.int64) / cycles_per_us
        dur = (end - start) / cycles_per_us
        return self.records.append_column("ts_us", pa.array(ts)).append_column(
            "dur_us", pa.array(dur)
        )

    @property
    def partial_slots(self) -> pa.ListArray:
        """Per buffer, the slots (indices in the buffer, as in ``cores.slot``) that count
        dropped records although they are not full; an empty list where none does.

        A recorder that reserves a task's records together drops them all when they do
        not all fit, so such a slot is valid; its records are kept as written.
        """
        if not self.dropped_counts.any():
            return _empty_lists(self.buffers)
        partial = _partial(self.cores)
        buffers = self.cores["buffer"].to_numpy()[partial]
        offsets = np.zeros(self.buffers + 1, np.int32)
        np.cumsum(np.bincount(buffers, minlength=self.buffers), out=offsets[1:])
        slots = pa.array(self.cores["slot"].to_numpy()[partial], pa.uint32())
        return pa.ListArray.from_arrays(pa.array(offsets), slots)


@functools.lru_cache(maxsize=16)
def _empty_lists(count: int) -> pa.ListArray:
    """``count`` empty lists of slots: the ``partial_slots`` of a batch without drops."""
    return pa.ListArray.from_arrays(
        pa.array(np.zeros(count + 1, np.int32)), pa.array([], pa.uint32())
    )


def _partial(slots: pa.Table | np.ndarray) -> np.ndarray:
    """Which slots (cores rows or header entries) count drops without being full."""
    dropped, count, capacity = (
        np.asarray(slots[name]) for name in ("dropped_count", "record_count", "record_capacity")
    )
    return (dropped > 0) & (count < capacity)


_IDENTITY = ("core_type", "block_id", "record_capacity", "reserved")
"""The header fields a slot's place in the layout fixes; they lie next to each other."""
_IDENTITY_WORDS = slice(
    SLOT_HEADER_DTYPE.fields[_IDENTITY[0]][1] // 4,
    SLOT_HEADER_DTYPE.fields[_IDENTITY[-1]][1] // 4 + 1,
)
"""Where they lie in a header read as 32-bit words."""
_NO_ANCHOR = np.iinfo(np.uint64).max
"""What a slot without records gives the smallest entry cycle of its buffer: nothing."""


@dataclass(frozen=True)
class _Slots:
    """Per-slot facts of a layout, as read-only arrays indexed by slot."""

    core_type: np.ndarray
    block_id: np.ndarray
    capacity: np.ndarray
    identity: np.ndarray
    """The ``_IDENTITY`` words each slot's header must hold (slot x 4)."""
    start: np.ndarray
    """The byte offset of each slot in a buffer."""
    header: np.ndarray
    """Where each slot's header lies in a buffer, in 64-byte units (every slot starts at a
    multiple of 64 bytes: its stride is 64 + capacity x 32 bytes, capacity a multiple of 16)."""
    dropped: np.ndarray
    """Where each slot's ``dropped_count`` lies in a buffer, in 32-bit words."""
    count: np.ndarray
    """Where each slot's ``record_count`` lies in a buffer, in 32-bit words."""


@functools.lru_cache(maxsize=16)
def _slots_of(layout: BufferLayout) -> _Slots:
    """The per-slot facts of a layout, made once."""
    kinds = (CoreType.AIC, CoreType.AIV)
    counts = [layout.slots(k) for k in kinds]
    core_type = np.repeat(np.array(kinds, np.uint8), counts)
    block_id = np.concatenate([np.arange(n, dtype=np.uint32) for n in counts])
    capacity = np.repeat([layout.capacity(k) for k in kinds], counts)
    start = np.concatenate(
        [
            layout.offset(k) + layout.stride(k) * np.arange(n)
            for k, n in zip(kinds, counts, strict=True)
        ]
    )
    slots = _Slots(
        core_type=core_type,
        block_id=block_id,
        capacity=capacity,
        identity=np.stack([core_type, block_id, capacity, np.zeros_like(capacity)], 1).astype(
            np.uint32
        ),
        start=start,
        header=start // SLOT_HEADER_BYTES,
        dropped=(start + SLOT_HEADER_DTYPE.fields["dropped_count"][1]) // 4,
        count=(start + SLOT_HEADER_DTYPE.fields["record_count"][1]) // 4,
    )
    for array in vars(slots).values():
        array.flags.writeable = False
    return slots


@functools.lru_cache(maxsize=16)
def _dropped_counts(layout: BufferLayout) -> struct.Struct:
    """Unpacks the ``dropped_count`` of every slot of a buffer of ``layout``, at once."""
    fields, at = ["<"], 0
    for word in _slots_of(layout).dropped.tolist():
        fields.append(f"{word * 4 - at}xI")
        at = word * 4 + 4
    return struct.Struct("".join(fields))


def dropped_records(buffers: np.ndarray, layout: BufferLayout) -> tuple[int, int]:
    """The records the device dropped in ``buffers``, ``uint8`` bytes of one or more
    consecutive buffers of ``layout`` (a step's launches of one kernel), read without
    decoding them (what a capture session warns about at the end of a step): the
    ``dropped_count`` of their full slots, and that of slots whose ``record_count`` is below
    their capacity.

    It runs on the job's thread after the kernel, where caches are cold: buffers that
    dropped nothing (the common case) are answered by one ``struct`` unpack each, which
    costs that thread about 0.035 ms less per launch than numpy's indexing."""
    counts = _dropped_counts(layout)
    if not any(
        any(counts.unpack_from(buffers, at)) for at in range(0, len(buffers), layout.total_bytes)
    ):
        return 0, 0
    slots = _slots_of(layout)
    words = buffers.view(np.uint32).reshape(-1, layout.total_bytes // 4)
    dropped = words[:, slots.dropped]
    total = int(dropped.sum())
    full = int(dropped[words[:, slots.count] >= slots.capacity].sum())
    return full, total - full


class _Locator:
    """Names where something is in a batch: 'buffer 3, slot 27 (AIV block 3)'."""

    def __init__(self, slots: _Slots, batch: int) -> None:
        self.slots, self.batch = slots, batch

    def __call__(self, buffer: int, slot: int) -> str:
        prefix = f"buffer {buffer}, " if self.batch > 1 else ""
        kind = CoreType(int(self.slots.core_type[slot])).name
        return f"{prefix}slot {slot} ({kind} block {self.slots.block_id[slot]})"

    def core(self, buffer: int, slot: int) -> str:
        """A core's short name, as its track is named: 'AIV/3' (with its buffer in a batch)."""
        prefix = f"buffer {buffer} " if self.batch > 1 else ""
        kind = CoreType(int(self.slots.core_type[slot])).name
        return f"{prefix}{kind}/{self.slots.block_id[slot]}"

    def slot_error(
        self,
        bad: np.ndarray,
        headers: np.ndarray,
        field: str | None,
        message: str,
        kind: type[SlotError] = SlotError,
    ) -> SlotError:
        """The error for the first (buffer, slot) set in ``bad``, counting the others."""
        buffer, slot = (int(i) for i in np.argwhere(bad)[0])
        more = int(bad.sum()) - 1
        tail = f" (and {more} more slot{'s' if more > 1 else ''})" if more else ""
        value = f"{field} is {headers[field][buffer, slot]}, " if field else ""
        expected = message.format(
            core=f"{self.slots.core_type[slot]} ({CoreType(int(self.slots.core_type[slot])).name})",
            block=self.slots.block_id[slot],
            capacity=self.slots.capacity[slot],
        )
        return kind(
            f"{self(buffer, slot)}: {value}{expected}{tail}", slot=slot, field=field, buffer=buffer
        )


_HEADER_CHECKS = (
    ("core_type", lambda h, s: h["core_type"] != s.core_type, "expected {core}"),
    ("block_id", lambda h, s: h["block_id"] != s.block_id, "expected {block}"),
    (
        "record_capacity",
        lambda h, s: h["record_capacity"] != s.capacity,
        "expected the planned {capacity}",
    ),
    ("reserved", lambda h, s: h["reserved"] != 0, "expected 0"),
    ("record_count", lambda h, s: h["record_count"] > s.capacity, "above the capacity {capacity}"),
)

_FAR = np.uint64(1 << 63)
"""Cycles from a buffer's anchor at which a record is refused: a signed 64-bit count
cannot hold the difference, and no counter runs that long in one launch."""
_WHY_FAR = (
    "a signed 64-bit cycle count holds at most 2^63 - 1, and no cycle counter runs that long "
    "in one launch (2^63 cycles are over 2.9 years even at 100 GHz)"
)


def _as_groups(
    buffers: Sequence[BufferLike] | np.ndarray, layout: BufferLayout
) -> list[np.ndarray]:
    """The buffers as 2-D uint8 arrays (buffer x byte) without copying: one for a 2-D
    array, one per buffer for a sequence."""
    if isinstance(buffers, np.ndarray) or type(buffers).__module__.startswith("torch"):
        rows = as_byte_array(buffers)
        if rows.ndim > 2:
            raise DecodeError(f"a batch of buffers must be 2-D (buffer x byte), got {rows.ndim}-D")
        rows = rows.reshape(-1, rows.shape[-1])
        _check_size(rows.shape[1], layout)
        return [rows]
    arrays = [as_byte_array(b).reshape(-1) for b in buffers]
    for index, data in enumerate(arrays):
        _check_size(data.nbytes, layout, prefix=f"buffer {index}: " if len(arrays) > 1 else "")
    return [data.reshape(1, -1) for data in arrays]


def _check_size(nbytes: int, layout: BufferLayout, *, prefix: str = "", suffix: str = "") -> None:
    """Raise ``BufferSizeError`` unless a buffer of ``nbytes`` has the layout's size."""
    if nbytes != layout.total_bytes:
        raise BufferSizeError(
            f"{prefix}the buffer holds {nbytes} bytes but its layout {layout} "
            f"needs {layout.total_bytes}{suffix}"
        )


def decode_buffers(
    buffers: Sequence[BufferLike] | np.ndarray,
    layout: BufferLayout,
    *,
    frequency_hz: float,
    warn_dropped: bool = True,
) -> DecodedBuffers:
    """Decode a batch of buffers that share one planned layout.

    ``buffers`` is a sequence of buffers or a 2-D array (buffer x byte). The layout's
    generation, where it names none, is inferred: ``b`` where a capacity is above 256
    records or a record's desc id is a graph stage 0x30000..0x3FFFF (only generation b
    writes either), else ``a``; where it names ``a``, a header above 256 records raises
    ``GenerationError`` (graph stage ids are accepted there: a buffer the host says is
    generation a is decoded as one). Raises a ``DecodeError`` subclass for the first problem found;
    warns with ``DroppedRecordsWarning`` when the device dropped records (from full slots,
    or from slots that are not full: see ``DecodedBuffers.partial_slots``), unless
    ``warn_dropped`` is false (a caller that reports drops itself, from another thread).
    """
    frequency = check_frequency(frequency_hz)
    groups = _as_groups(buffers, layout)
    named, layout = layout.generation, layout.resolved
    count = sum(len(g) for g in groups)
    if count == 0:
        raise DecodeError("no buffer to decode")
    slots = _slots_of(layout)
    where = _Locator(slots, count)

    parts = [np.take(g.view(f"V{SLOT_HEADER_BYTES}"), slots.header, axis=1) for g in groups]
    raw = (parts[0] if len(parts) == 1 else np.concatenate(parts)).view("<u4")
    raw = raw.reshape(count, layout.total_slots, -1)
    headers = raw.view(SLOT_HEADER_DTYPE)[..., 0]
    active = raw.any(axis=2)
    wrong = (raw[..., _IDENTITY_WORDS] != slots.identity).any(axis=2)
    wrong |= headers["record_count"] > slots.capacity
    if (wrong & active).any():
        if named == "a":
            _check_generation(where, headers, active)
        for field, check, message in _HEADER_CHECKS:
            bad = check(headers, slots) & active
            if bad.any():
                raise where.slot_error(bad, headers, field, message)

    counts = headers["record_count"].astype(np.int64) * active
    per_buffer = counts.sum(axis=1)
    if not per_buffer.all():
        empty = int(np.flatnonzero(per_buffer == 0)[0])
        prefix = f"buffer {empty}: " if count > 1 else ""
        raise EmptyBufferError(
            f"{prefix}no slot of the buffer holds a record ({layout.total_slots} slots, "
            f"{int(active[empty].sum())} not idle); was profiling enabled for this launch?"
        )

    records = _gather(groups, layout, counts, ~active, where, headers)
    if named is None and layout.generation == "a" and numbers_graph_stages(records["desc_id"]):
        layout = replace(layout, generation="b")
    entry = headers["entry_cycle"]
    anchors = np.where(counts > 0, entry, _NO_ANCHOR).min(axis=1)
    _check_distances(where, layout, headers, active, anchors, records)
    phase = records.pop("phase")
    records["phase"] = pa.DictionaryArray.from_buffers(
        _PHASE_TYPE, len(phase), [None, pa.py_buffer(phase)], phase_dictionary()
    )
    dropped = headers["dropped_count"].astype(np.int64) * active
    if warn_dropped and dropped.any():
        partial = _partial(headers) & active
        if (dropped * ~partial).any():
            _warn_dropped(where, dropped * ~partial)
        if partial.any():
            _warn_partial(where, headers, partial)

    live = np.flatnonzero(active)
    core_header = headers.reshape(-1)[live]
    core_buffer, core_slot = np.divmod(live.astype(np.uint32), np.uint32(layout.total_slots))
    cores = pa.table(
        {
            "buffer": core_buffer,
            "slot": core_slot,
            "core_type": slots.core_type[core_slot],
            "block_id": slots.block_id[core_slot],
            "entry_cycle": core_header["entry_cycle"],
            "record_count": core_header["record_count"],
            "dropped_count": core_header["dropped_count"],
            "record_capacity": core_header["record_capacity"],
        }
    )
    return DecodedBuffers(
        layout=layout,
        frequency_hz=frequency,
        cores=cores,
        records=pa.table(records),
        anchor_cycles=anchors,
        record_counts=per_buffer,
        dropped_counts=dropped.sum(axis=1),
    )


def _check_generation(where: _Locator, headers: np.ndarray, active: np.ndarray) -> None:
    """Raise ``GenerationError`` for the first slot whose header holds more than 256 records,
    in a buffer said to be of generation a: only generation b writes such a slot."""
    beyond = active & (headers["record_capacity"] > MAX_CAPACITY)
    if beyond.any():
        raise where.slot_error(
            beyond,
            headers,
            "record_capacity",
            f"above generation a's cap of {MAX_CAPACITY} records, so generation b wrote this "
            "buffer (decode it as generation b, --abi-generation b, with the capacities it "
            "planned)",
            GenerationError,
        )


def decode_buffer(
    buffer: BufferLike, layout: BufferLayout, *, frequency_hz: float
) -> DecodedBuffers:
    """Decode one buffer against its planned layout (see ``decode_buffers``)."""
    return decode_buffers([buffer], layout, frequency_hz=frequency_hz)


@dataclass(frozen=True)
class _Order:
    """The slots of a batch in the order their records are gathered: a cache-sized chunk
    of a group's buffers at a time, its AIC slots then its AIV slots, buffer after buffer.

    Each array has an entry per slot in that order. ``spans`` cuts them into pieces of a
    group and of about ``_PIECE_RECORDS`` records of capacity, gathered one at a time.
    """

    slot: np.ndarray
    """The slot's index in the batch's (buffer x slot) headers, flattened."""
    buffer: np.ndarray
    core_type: np.ndarray
    block_id: np.ndarray
    word: np.ndarray
    """Where the slot's first record lies in its group, in 32-byte words."""
    spans: tuple[tuple[int, int], ...]
    """(group, end) of each piece: its slots end at ``end`` in this order."""


_PIECE_RECORDS = 4096
"""Record capacity gathered at a time: small enough that the piece's index arrays and
records stay in cache and come from memory the last piece freed."""


@functools.lru_cache(maxsize=16)
def _order(layout: BufferLayout, groups: tuple[int, ...]) -> _Order:
    """The gathering order of a batch whose groups hold these numbers of buffers."""
    slots = _slots_of(layout)
    total = layout.total_slots
    per_buffer = layout.aic_slots * layout.aic_capacity + layout.aiv_slots * layout.aiv_capacity
    step = max(1, _CHUNK_RECORDS // max(per_buffer, 1))
    kinds = [
        np.arange(layout.slots(kind)) + layout.slot_index(kind, 0)
        for kind in (CoreType.AIC, CoreType.AIV)
        if layout.slots(kind) and layout.capacity(kind)
    ]
    flat, owner = [], []
    row = 0
    for group, size in enumerate(groups):
        for chunk in range(0, size, step):
            buffers = np.arange(row + chunk, row + min(chunk + step, size))
            for kind in kinds:
                flat.append((buffers[:, None] * total + kind).ravel())
                owner.append(np.full(flat[-1].size, group))
        row += size
    slot, group = np.concatenate(flat), np.concatenate(owner)
    buffer, index = np.divmod(slot, total)
    capacity = slots.capacity[index]
    piece = (np.cumsum(capacity) - capacity) // _PIECE_RECORDS
    ends = [*(np.flatnonzero((np.diff(piece) != 0) | (np.diff(group) != 0)) + 1), len(slot)]
    first_buffer = np.cumsum([0, *groups])[group]
    words = (slots.start[index] + SLOT_HEADER_BYTES) // RECORD_BYTES
    return _Order(
        slot=slot,
        buffer=buffer.astype(np.uint32),
        core_type=slots.core_type[index],
        block_id=slots.block_id[index],
        word=(buffer - first_buffer) * (layout.total_bytes // RECORD_BYTES) + words,
        spans=tuple((int(group[end - 1]), int(end)) for end in ends),
    )


def _gather(
    groups: list[np.ndarray],
    layout: BufferLayout,
    counts: np.ndarray,
    idle: np.ndarray,
    where: _Locator,
    headers: np.ndarray,
) -> dict[str, np.ndarray]:
    """Copy the valid records of every slot into one contiguous column per field.

    Takes the records a piece at a time in the order of ``_Order``, by one gather of
    their 32-byte words and one transposing copy per field type, so that the data stays
    in cache while it is gathered and split into fields; gives every record its slot's
    ids, then derives the phase and checks the cycles of all records at once. The phase
    is its code (int8) in ``PHASES``.
    """
    if idle.any():
        _check_idle_slots(groups, layout, idle, where, headers)
    order = _order(layout, tuple(len(g) for g in groups))
    per_slot = counts.reshape(-1)[order.slot]
    ends = np.cumsum(per_slot)
    starts = ends - per_slot
    total = int(ends[-1])
    # The record fields as rows of two arrays, so that one transposing copy per array
    # splits a gathered block into fields; each row is one contiguous column.
    cycles = np.empty((2, total), np.uint64)
    ids = np.empty((4, total), np.uint32)
    index = np.empty(total, np.uint32)
    first = position = 0
    for group, end in order.spans:
        stop = int(ends[end - 1])
        span, counted = slice(position, stop), per_slot[first:end]
        # A record's word is its slot's first word + its index in the slot (its position
        # less the slot's start); one array holds the words, then the indices.
        at = np.repeat(order.word[first:end] - starts[first:end], counted)
        at += np.arange(position, stop)
        words = groups[group].reshape(-1).view("<u8").reshape(-1, 4)
        valid = np.take(words, at, axis=0)
        at -= np.repeat(order.word[first:end], counted)
        index[span] = at
        cycles[:, span] = valid[:, :2].T
        ids[:, span] = valid[:, 2:].view("<u4").T
        first, position = end, stop
    names = RECORD_DTYPE.names
    out = {
        "buffer": np.repeat(order.buffer, per_slot),
        "core_type": np.repeat(order.core_type, per_slot),
        "block_id": np.repeat(order.block_id, per_slot),
        "record_index": index,
        **dict(zip(names[:2], cycles, strict=True)),
        **dict(zip(names[2:], ids, strict=True)),
    }
    late = out["end_cycle"] < out["start_cycle"]
    if late.any():
        i = int(np.flatnonzero(late)[0])
        raise _record_error(
            where,
            layout,
            out,
            i,
            "end_cycle",
            f"end_cycle {out['end_cycle'][i]} is before start_cycle {out['start_cycle'][i]} "
            f"({int(late.sum())} such record(s) in all)",
        )
    codes = out["desc_id"] - _CONTROL_BASE
    np.minimum(codes, len(_PHASE_CODES) - 1, out=codes)
    return {**out, "phase": _PHASE_CODES[codes]}


def _check_idle_slots(
    groups: list[np.ndarray],
    layout: BufferLayout,
    idle: np.ndarray,
    where: _Locator,
    headers: np.ndarray,
) -> None:
    """Raise if an idle slot (all-zero header) of any buffer has a record byte set,
    naming the first of its group and core type."""
    kinds = [
        (kind, layout.slot_index(kind, 0), layout.slots(kind))
        for kind in (CoreType.AIC, CoreType.AIV)
        if layout.slots(kind) and layout.capacity(kind)
    ]
    row = 0
    for group in groups:
        for kind, first, n in kinds:
            block = idle[row : row + len(group), first : first + n]
            _check_idle(layout.slot_bytes(group, kind), block, (row, first), where, headers)
        row += len(group)


def _check_idle(
    region: np.ndarray,
    idle: np.ndarray,
    origin: tuple[int, int],
    where: _Locator,
    headers: np.ndarray,
) -> None:
    """Raise if a slot whose header is all zero (an idle core) has any record byte set.

    ``idle`` covers the region's buffers and slots; ``origin`` is its first (buffer, slot).
    """
    if not idle.any():
        return
    words = region[:, :, SLOT_HEADER_BYTES:].view("<u8")
    if words[idle].any():
        bad = np.zeros(headers.shape, bool)
        buffers, slots = np.nonzero(idle & words.any(axis=2))
        bad[buffers + origin[0], slots + origin[1]] = True
        raise where.slot_error(
            bad, headers, None, "the header is all zero (an idle core) but its records are not"
        )


def _record_error(
    where: _Locator,
    layout: BufferLayout,
    out: dict[str, np.ndarray],
    i: int,
    field: str,
    text: str,
) -> RecordError:
    """The error for record ``i`` of the gathered columns: its buffer, slot and index."""
    buffer, index = int(out["buffer"][i]), int(out["record_index"][i])
    slot = layout.slot_index(CoreType(int(out["core_type"][i])), int(out["block_id"][i]))
    return RecordError(
        f"{where(buffer, slot)}, record {index}: {text}",
        slot=slot,
        field=field,
        record=index,
        buffer=buffer,
    )


def _distance(cycles: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    """|cycles - anchor| of unsigned 64-bit cycles, exactly (as uint64)."""
    return np.maximum(cycles, anchor) - np.minimum(cycles, anchor)


def _check_distances(
    where: _Locator,
    layout: BufferLayout,
    headers: np.ndarray,
    active: np.ndarray,
    anchors: np.ndarray,
    records: dict[str, np.ndarray],
) -> None:
    """Raise if a slot's entry cycle or a record's start or end lies 2^63 cycles or more
    from its buffer's anchor (see ``_FAR``).

    The common case costs a min and a max over the cycle columns: when all of a batch's
    cycles lie within 2^63 of each other, none can be that far from an anchor.
    """
    entry = headers["entry_cycle"]
    start, end = records["start_cycle"], records["end_cycle"]
    live = entry[active]  # every buffer has a record, so neither this nor start is empty
    if max(live.max(), end.max()) - min(live.min(), start.min()) < _FAR:
        return
    far = active & (_distance(entry, anchors[:, None]) >= _FAR)
    if far.any():
        buffer = int(np.argwhere(far)[0][0])
        raise where.slot_error(
            far,
            headers,
            "entry_cycle",
            f"2^63 cycles or more from the buffer's anchor cycle {anchors[buffer]} (the "
            f"smallest entry cycle of a slot with records): {_WHY_FAR}",
        )
    anchor = anchors[records["buffer"]]
    for field, cycles in (("start_cycle", start), ("end_cycle", end)):
        far = _distance(cycles, anchor) >= _FAR
        if far.any():
            i = int(np.flatnonzero(far)[0])
            raise _record_error(
                where,
                layout,
                records,
                i,
                field,
                f"{field} {cycles[i]} is {_distance(cycles[i], anchor[i])} cycles from the "
                f"buffer's anchor cycle {anchor[i]} (the smallest entry cycle of a slot with "
                f"records): {_WHY_FAR} ({int(far.sum())} such record(s) in all)",
            )


def _named(lossy: np.ndarray, name: Callable[[int, int], str], separator: str) -> str:
    """The first eight of ``lossy`` (buffer, slot) positions named, and how many more."""
    names = separator.join(name(int(b), int(s)) for b, s in lossy[:8])
    return names + (f" and {len(lossy) - 8} more" if len(lossy) > 8 else "")


def _warn_dropped(where: _Locator, dropped: np.ndarray) -> None:
    """Warn that full slots dropped records, naming up to 8 cores."""
    lossy = np.argwhere(dropped)
    names = _named(lossy, lambda b, s: f"{where.core(b, s)} ({dropped[b, s]})", ", ")
    warnings.warn(
        DroppedRecordsWarning(
            f"device dropped {int(dropped.sum())} records on {len(lossy)} core(s): "
            f"{names}; their slots were full (plan a larger capacity)"
        ),
        stacklevel=3,
    )


def _warn_partial(where: _Locator, headers: np.ndarray, partial: np.ndarray) -> None:
    """Warn that slots that are not full count dropped records, naming up to 8 of them."""
    lossy = np.argwhere(partial)
    names = _named(
        lossy,
        lambda b, s: (
            f"{where(b, s)}: {headers['dropped_count'][b, s]} dropped, "
            f"{headers['record_count'][b, s]} of {headers['record_capacity'][b, s]} records"
        ),
        "; ",
    )
    warnings.warn(
        DroppedRecordsWarning(
            f"device dropped {int(headers['dropped_count'][partial].sum())} records on "
            f"{len(lossy)} slot(s) that are not full ({names}); every record written is kept, "
            "and the invocation lists the slots in partial_slots"
        ),
        stacklevel=3,
    )
