"""Decode and validate device profile buffers into Arrow tables of cores and records.

Every buffer is checked against the layout the host planned: a header that
contradicts its slot, a record that cannot be a measurement (one that ends before it
starts, or lies 2^63 cycles or more from its buffer's anchor) or a buffer with no
record at all raises a ``DecodeError`` naming the buffer, slot, record and field;
nothing partial is ever returned. Dropped records are no error: the decoder warns and
keeps every record, also where a slot that is not full counts drops. The work is
vectorized: the headers of all buffers are checked at once, and records are taken a
cache-sized batch of buffers at a time by one boolean gather of the valid 32-byte
records and one copy per field.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from multicore_profiler.abi import (
    DESC_TERMINATE_TASK,
    DESC_TRIGGER_EVENT,
    DESC_WAIT_DEPENDENCY,
    PHASES,
    RECORD_BYTES,
    RECORD_DTYPE,
    SLOT_HEADER_BYTES,
    SLOT_HEADER_DTYPE,
    BufferLayout,
    CoreType,
    check_frequency,
)
from multicore_profiler.errors import (
    BufferSizeError,
    DecodeError,
    DroppedRecordsWarning,
    EmptyBufferError,
    RecordError,
    SlotError,
)
from multicore_profiler.storage.location import special_file

BufferLike = Any
"""bytes, bytearray, memoryview, a contiguous numpy array or a contiguous CPU torch tensor."""

_PHASE_DICTIONARY = pa.array(PHASES, pa.string())
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

    ``cores`` has a row per slot that is not idle, ``records`` a row per record; both
    carry ``buffer``, the index of the buffer in the batch. Per-buffer arrays give each
    buffer's anchor cycle (the smallest entry cycle of a slot with records), record
    count and dropped count.
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
        partial = _partial(self.cores)
        buffers = self.cores["buffer"].to_numpy()[partial]
        offsets = np.zeros(self.buffers + 1, np.int32)
        np.cumsum(np.bincount(buffers, minlength=self.buffers), out=offsets[1:])
        slots = pa.array(self.cores["slot"].to_numpy()[partial], pa.uint32())
        return pa.ListArray.from_arrays(pa.array(offsets), slots)


def _partial(slots: pa.Table | np.ndarray) -> np.ndarray:
    """Which slots (cores rows or header entries) count drops without being full."""
    dropped, count, capacity = (
        np.asarray(slots[name]) for name in ("dropped_count", "record_count", "record_capacity")
    )
    return (dropped > 0) & (count < capacity)


@dataclass(frozen=True)
class _Slots:
    """Per-slot facts of a layout, as arrays indexed by slot."""

    core_type: np.ndarray
    block_id: np.ndarray
    capacity: np.ndarray

    @classmethod
    def of(cls, layout: BufferLayout) -> _Slots:
        kinds = (CoreType.AIC, CoreType.AIV)
        counts = [layout.slots(k) for k in kinds]
        return cls(
            core_type=np.repeat(np.array(kinds, np.uint8), counts),
            block_id=np.concatenate([np.arange(n, dtype=np.uint32) for n in counts]),
            capacity=np.repeat([layout.capacity(k) for k in kinds], counts),
        )


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
        self, bad: np.ndarray, headers: np.ndarray, field: str | None, message: str
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
        return SlotError(
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

    ``buffers`` is a sequence of buffers or a 2-D array (buffer x byte). Raises a
    ``DecodeError`` subclass for the first problem found; warns with
    ``DroppedRecordsWarning`` when the device dropped records (from full slots, or from
    slots that are not full: see ``DecodedBuffers.partial_slots``), unless
    ``warn_dropped`` is false (a caller that reports drops itself, from another thread).
    """
    frequency = check_frequency(frequency_hz)
    groups = _as_groups(buffers, layout)
    count = sum(len(g) for g in groups)
    if count == 0:
        raise DecodeError("no buffer to decode")
    slots = _Slots.of(layout)
    where = _Locator(slots, count)

    raw = np.concatenate(
        [
            np.concatenate(
                [
                    layout.slot_bytes(g, kind)[:, :, :SLOT_HEADER_BYTES]
                    for kind in (CoreType.AIC, CoreType.AIV)
                ],
                axis=1,
            )
            for g in groups
        ]
    )
    headers = raw.view(SLOT_HEADER_DTYPE)[..., 0]
    active = raw.any(axis=2)
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
    entry = headers["entry_cycle"]
    anchors = np.where(counts > 0, entry, np.iinfo(np.uint64).max).min(axis=1)
    _check_distances(where, layout, headers, active, anchors, records)
    dropped = headers["dropped_count"].astype(np.int64) * active
    if warn_dropped and dropped.any():
        partial = _partial(headers) & active
        if (dropped * ~partial).any():
            _warn_dropped(where, dropped * ~partial)
        if partial.any():
            _warn_partial(where, headers, partial)

    live = np.flatnonzero(active.reshape(-1))
    core_header = headers.reshape(-1)[live]
    core_slot = (live % layout.total_slots).astype(np.uint32)
    cores = pa.table(
        {
            "buffer": (live // layout.total_slots).astype(np.uint32),
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
        records=records,
        anchor_cycles=anchors,
        record_counts=per_buffer,
        dropped_counts=dropped.sum(axis=1),
    )


def decode_buffer(
    buffer: BufferLike, layout: BufferLayout, *, frequency_hz: float
) -> DecodedBuffers:
    """Decode one buffer against its planned layout (see ``decode_buffers``)."""
    return decode_buffers([buffer], layout, frequency_hz=frequency_hz)


_SLOT_COLUMNS = {
    "buffer": np.uint32,
    "core_type": np.uint8,
    "block_id": np.uint32,
    "record_index": np.uint16,
}


@functools.lru_cache(maxsize=16)
def _blocks(buffers: int, slots: int) -> np.ndarray:
    """Block id of every slot of a region, buffer after buffer."""
    return np.tile(np.arange(slots, dtype=np.uint32), buffers)


@functools.lru_cache(maxsize=16)
def _ramp(buffers: int, slots: int, capacity: int) -> np.ndarray:
    """Record index of every record position of a region, for one gather with its mask."""
    ramp = np.broadcast_to(np.arange(capacity, dtype=np.uint16), (buffers, slots, capacity)).copy()
    ramp.flags.writeable = False
    return ramp


def _gather(
    groups: list[np.ndarray],
    layout: BufferLayout,
    counts: np.ndarray,
    idle: np.ndarray,
    where: _Locator,
    headers: np.ndarray,
) -> pa.Table:
    """Copy the valid records of every slot into one contiguous column per field.

    Works a cache-sized batch of buffers and one core type at a time, so that the data
    stays in cache while it is gathered, split into fields and given its slot's ids;
    then derives the phase and checks the cycles of all records at once.
    """
    total = int(counts.sum())
    out = {name: np.empty(total, dtype) for name, dtype in _SLOT_COLUMNS.items()}
    # The record fields as rows of two arrays, so that one transposing copy per array
    # splits a gathered block into fields; each row is one contiguous column.
    cycles = np.empty((2, total), np.uint64)
    ids = np.empty((4, total), np.uint32)
    names = RECORD_DTYPE.names
    out.update(zip(names[:2], cycles, strict=True))
    out.update(zip(names[2:], ids, strict=True))
    per_buffer = layout.aic_slots * layout.aic_capacity + layout.aiv_slots * layout.aiv_capacity
    step = max(1, _CHUNK_RECORDS // max(per_buffer, 1))
    kinds = [
        (kind, layout.slot_index(kind, 0), layout.slots(kind), layout.capacity(kind))
        for kind in (CoreType.AIC, CoreType.AIV)
        if layout.slots(kind) and layout.capacity(kind)
    ]
    row = position = 0
    for group in groups:
        regions = {kind: layout.slot_bytes(group, kind) for kind, *_ in kinds}
        for kind, first, n, _ in kinds:
            block = idle[row : row + len(group), first : first + n]
            _check_idle(regions[kind], block, (row, first), where, headers)
        for chunk in range(0, len(group), step):
            rows = slice(row + chunk, min(row + chunk + step, row + len(group)))
            b = rows.stop - rows.start
            for kind, first, n, capacity in kinds:
                area = regions[kind][chunk : chunk + b, :, SLOT_HEADER_BYTES:]
                region_counts = counts[rows, first : first + n]
                mask = np.arange(capacity) < region_counts[..., None]
                valid = area.view(f"V{RECORD_BYTES}")[mask].view("<u8").reshape(-1, 4)
                span = slice(position, position + len(valid))
                cycles[:, span] = valid[:, :2].T
                ids[:, span] = valid[:, 2:].view("<u4").T
                if b == 1:
                    out["buffer"][span] = rows.start
                else:
                    out["buffer"][span] = np.repeat(
                        np.arange(rows.start, rows.stop), region_counts.sum(axis=1)
                    )
                out["block_id"][span] = np.repeat(_blocks(b, n), region_counts.ravel())
                out["record_index"][span] = _ramp(b, n, capacity)[mask]
                out["core_type"][span] = kind
                position = span.stop
        row += len(group)
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
    desc = out["desc_id"]
    phase = (desc == DESC_WAIT_DEPENDENCY).view(np.int8)
    phase += 2 * (desc == DESC_TRIGGER_EVENT).view(np.int8)
    phase += 3 * (desc == DESC_TERMINATE_TASK).view(np.int8)
    return pa.table({**out, "phase": pa.DictionaryArray.from_arrays(phase, _PHASE_DICTIONARY)})


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
    records: pa.Table,
) -> None:
    """Raise if a slot's entry cycle or a record's start or end lies 2^63 cycles or more
    from its buffer's anchor (see ``_FAR``).

    The common case costs a min and a max over the cycle columns: when all of a batch's
    cycles lie within 2^63 of each other, none can be that far from an anchor.
    """
    entry = headers["entry_cycle"]
    start, end = (records[name].to_numpy() for name in ("start_cycle", "end_cycle"))
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
    located = {
        k: records[k].to_numpy() for k in ("buffer", "record_index", "core_type", "block_id")
    }
    anchor = anchors[located["buffer"]]
    for field, cycles in (("start_cycle", start), ("end_cycle", end)):
        far = _distance(cycles, anchor) >= _FAR
        if far.any():
            i = int(np.flatnonzero(far)[0])
            raise _record_error(
                where,
                layout,
                located,
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
