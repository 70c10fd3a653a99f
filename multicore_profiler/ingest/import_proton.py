"""Triton Proton's intra-kernel profiles: the instrumentation host buffer and the chrome trace.

Proton (``proton.start(..., backend="instrumentation")``) records, per profiled warp of each
CTA, 8-byte entries ``{end flag, scope id, clock bits 42..32 | clock bits 31..0}`` into a
circular segment, plus a per-CTA header with ``globaltimer`` anchors (init, pre-final and
post-final ns). Two artefacts carry them; ``read`` tells them apart by their content:

- the **host buffer** (``InstrumentationHook.host_buffer``, the test/debug hook): every
  entry and every anchor, raw. It is read a group of SMs at a time from a memory map
  whose pages are released after each group;
- the **chrome trace** (``<name>.chrome_trace``, ``StreamChromeTraceWriter``): one ``X``
  event per scope instance, its cycles made relative to its CTA's first record and placed
  by the CTA's init time, as Proton's viewer shows them. It is read in chunks by the trace
  reader; its events' columns (about 80 bytes an event, a fraction of their JSON text) are
  held, since a launch's CTAs, clocks and per-SM order need all of them.

Both become the same store rows: core SM ``hw id``, owner the warp ``cta x warps + warp``
(owner label ``warp``), task id the CTA's program id, desc id the scope id, one ``compute``
record per scope instance. SM cycle counters are not synchronized, so the launch's clock
domain is ``anchored``: each SM's offset places its (first) CTA's first record at the CTA's
init time, at ``options.frequency_hz`` (default 1 GHz, as Proton assumes).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.abi import CoreType
from multicore_profiler.errors import (
    ArgumentError,
    ClockAnchorWarning,
    DroppedRecordsWarning,
    ImportFormatError,
    TraceFormatError,
)
from multicore_profiler.ingest.imported import (
    RECORD_COLUMNS,
    CoreClock,
    ImportedInvocation,
    phase_column,
)
from multicore_profiler.ingest.mapped_file import MappedFile
from multicore_profiler.ingest.trace_reader import EventBlock, field_name, read_trace

if TYPE_CHECKING:
    from multicore_profiler.ingest.imports import ImportOptions

PRODUCER = "proton"
FREQUENCY_HZ = 1e9
"""The cycle frequency Proton assumes (its chrome trace writes ``Frequency (MHz)`` 1000)."""
KERNEL_NAME = "proton"
"""The kernel's name where neither the options nor the file give one (the host buffer)."""
PREAMBLE = 0xDEADBEEF
HOST_FIELDS = 10
"""u32 fields of the host header before its uid list."""
CTA_HEADER_BYTES = 40
"""preamble, program id, hw id, data bytes (u32 each), init, pre-final, post-final (u64)."""
ENTRY_BYTES = 8
CLOCK_BITS = 43
CLOCK_MODULUS = 1 << CLOCK_BITS
NAMED_SCOPES_FROM = 0x100
"""The first desc id given to a scope that a chrome trace names without its id."""
CHUNK_ENTRIES = 1 << 19
"""Entries decoded at once (whole SMs: an SM's CTAs share its counter and its records'
order); a chunk's records are at most half as many."""
HEAD_READ_BYTES = 16 << 20
"""The blocks whose CTA headers are read between two releases of the map's pages."""
CHROME_ARGS = (
    "Init Time (ns)",
    "Post Final Time (ns)",
    "Finalization Time (ns)",
    "Frequency (MHz)",
)
CHROME_MHZ = 1000
"""The ``Frequency (MHz)`` Proton's writer puts in every event (it assumes 1 GHz)."""
CHROME_SKIPPED_CATS = ("async", "flow")
"""Newer writers' async-event categories: not scopes, and not read."""
_PID = r"^(?P<kernel>.*) Core(?P<core>\d{1,9}) CTA(?P<cta>\d{1,9})$"
_TID = r"^warp (?P<warp>\d{1,4}) \(line (?P<line>\d+)\)$"
"""A CTA's process and a warp's thread, with ids the store's 32-bit columns hold."""
_SCOPE_NAME = re.compile(r"scope_(\d+)")
_UINT32 = 1 << 32


def read(path: Path, options: ImportOptions) -> Iterator[ImportedInvocation]:
    """The launches of a Proton file: one for a host buffer, one per kernel launch for a
    chrome trace."""
    with open(path, "rb") as file:
        head = file.read(4096)
    text = head.lstrip(b" \t\r\n")
    if text[:1] in (b"{", b"[") or head[:2] == b"\x1f\x8b":
        yield from _chrome_launches(path, options)
    elif len(head) >= 4 and int.from_bytes(head[:4], "little") == 1:
        yield _buffer_launch(path, options)
    else:
        raise ImportFormatError(
            f"{path}: neither a Proton host buffer (it starts with version 1) nor a Proton "
            "chrome trace (JSON)"
        )


def _frequency(options: ImportOptions) -> float:
    """The counter's frequency: the options', else Proton's 1 GHz."""
    if options.frequency_hz is None:
        return FREQUENCY_HZ
    frequency = float(options.frequency_hz)
    if not (math.isfinite(frequency) and frequency > 0):
        raise ArgumentError(
            f"the cycle frequency must be a positive number of Hz, got {frequency!r}"
        )
    return frequency


# --- the host buffer ---------------------------------------------------------------------


@dataclass
class _HostBuffer:
    """A host buffer's headers, checked, and its CTA blocks as a memory map."""

    path: Path
    blocks: np.ndarray
    """``(block_num, scratch_mem_size)`` bytes (a view of ``mapped``)."""
    mapped: MappedFile
    blocks_at: int
    """The file offset of block 0."""
    device_type: int
    total_unit: int
    uids: np.ndarray
    data_bytes: int
    profiled: np.ndarray
    """Indices of the profiled blocks (preamble ``0xdeadbeef``)."""
    program: np.ndarray
    hw: np.ndarray
    init: np.ndarray
    prefinal: np.ndarray
    counts: np.ndarray
    """``(block_num, uid_num)``: the words each profiled warp wrote."""

    @property
    def meta(self) -> int:
        return CTA_HEADER_BYTES + 4 * self.total_unit

    @property
    def segment_entries(self) -> int:
        return self.data_bytes // self.uids.size // ENTRY_BYTES

    def entry_at(self, block: int, segment: int, slot: int) -> int:
        """The file offset of an entry."""
        segment_bytes = self.data_bytes // self.uids.size
        return (
            self.blocks_at
            + block * self.blocks.shape[1]
            + self.meta
            + segment * segment_bytes
            + slot * ENTRY_BYTES
        )

    def where(self, block: int, segment: int | None = None) -> str:
        """How messages name a CTA (and a warp) of the buffer."""
        place = f"CTA block {block} (program id {int(self.program[block])})"
        if segment is not None:
            place += f", warp {int(self.uids[segment])}"
        return place


def _open_buffer(path: Path) -> _HostBuffer:
    """Read and check the host header and every CTA header (``ImportFormatError`` naming
    the byte or CTA where they contradict each other or the file's size)."""
    size = path.stat().st_size
    if size < 4 * HOST_FIELDS:
        raise ImportFormatError(
            f"{path}: truncated: {size} bytes hold no Proton host header ({4 * HOST_FIELDS})"
        )
    mapping = MappedFile(path)
    mapped = mapping.array(np.uint8)
    fields = mapped[: 4 * HOST_FIELDS].view("<u4").astype(np.int64)
    (version, header_offset, header_size, payload_offset, payload_size, device_type) = (
        int(v) for v in fields[:6]
    )
    block_num, total_unit, scratch, uid_num = (int(v) for v in fields[6:])

    def refuse(byte: int, problem: str) -> ImportFormatError:
        return ImportFormatError(f"{path}: host header at byte {byte}: {problem}")

    if version != 1:
        raise refuse(0, f"version {version}; only version 1 is known")
    if header_offset != 4:
        raise refuse(4, f"header_offset {header_offset}, not 4")
    if device_type not in (1, 2):
        raise refuse(20, f"device_type {device_type} is neither 1 (CUDA) nor 2 (HIP)")
    if total_unit < 1 or not 1 <= uid_num <= total_unit:
        raise refuse(28, f"{uid_num} profiled warps of {total_unit}")
    if header_size != 4 * HOST_FIELDS + 4 * uid_num:
        raise refuse(
            8,
            f"header_size {header_size}, but {uid_num} uids make it "
            f"{4 * HOST_FIELDS + 4 * uid_num}",
        )
    if payload_offset != header_size:
        raise refuse(12, f"payload_offset {payload_offset} is not header_size {header_size}")
    if size < header_size:
        raise ImportFormatError(f"{path}: truncated: {size} bytes, its header alone {header_size}")
    uids = mapped[4 * HOST_FIELDS : header_size].view("<u4").astype(np.int64)
    if np.any(uids >= total_unit) or np.any(np.diff(uids) <= 0):
        raise refuse(40, f"uids {uids.tolist()} are not increasing warp ids below {total_unit}")
    if scratch < 1 or block_num < 1:
        raise refuse(24, f"{block_num} blocks of {scratch} bytes")
    if not block_num * scratch <= payload_size < (block_num + 1) * scratch:
        raise refuse(
            16,
            f"payload_size {payload_size} does not hold block_num {block_num} "
            f"blocks of scratch_mem_size {scratch} (and less than one more)",
        )
    if size != payload_offset + payload_size:
        raise ImportFormatError(
            f"{path}: {'truncated' if size < payload_offset + payload_size else 'too long'}: "
            f"{size} bytes, but its header says {payload_offset + payload_size}"
        )
    meta = CTA_HEADER_BYTES + 4 * total_unit
    if scratch < meta:
        raise refuse(32, f"scratch_mem_size {scratch} is smaller than a CTA header ({meta})")
    blocks = mapped[payload_offset : payload_offset + block_num * scratch].reshape(
        block_num, scratch
    )
    head = np.empty((block_num, meta), np.uint8)
    # A header's read maps the pages around it too: a batch of blocks at a time, released.
    step = max(1, HEAD_READ_BYTES // scratch)
    for at in range(0, block_num, step):
        head[at : at + step] = blocks[at : at + step, :meta]
        mapping.release()
    words = head[:, :16].view("<u4").astype(np.int64)
    times = head[:, 16:40].view("<u8").astype(np.int64)
    counts = head[:, 40:meta].view("<u4").astype(np.int64)[:, uids]
    preamble = words[:, 0]
    odd = np.flatnonzero((preamble != 0) & (preamble != PREAMBLE))
    buffer = _HostBuffer(
        path, blocks, mapping, payload_offset, device_type, total_unit, uids, 0,
        np.flatnonzero(preamble == PREAMBLE), words[:, 1], words[:, 2], times[:, 0],
        times[:, 1], counts,
    )  # fmt: skip
    if odd.size:
        block = int(odd[0])
        raise ImportFormatError(
            f"{path}: CTA block {block} (at byte {payload_offset + block * scratch}) starts "
            f"with {int(preamble[block]):#010x}, neither 0xdeadbeef nor 0 (not profiled)"
        )
    _check_blocks(buffer, words[:, 3], times, scratch)
    return buffer


def _check_blocks(
    buffer: _HostBuffer, data_bytes: np.ndarray, times: np.ndarray, scratch: int
) -> None:
    """The profiled CTA headers agree with the host header and with each other."""
    profiled = buffer.profiled
    if not profiled.size:
        return
    sizes = data_bytes[profiled]
    first = int(sizes[0])
    uid_num = buffer.uids.size
    if np.any(sizes != first):
        block = int(profiled[np.flatnonzero(sizes != first)[0]])
        raise ImportFormatError(
            f"{buffer.path}: {buffer.where(block)}: {int(data_bytes[block])} data bytes, but "
            f"CTA block "
            f"{int(profiled[0])} has {first}"
        )
    if first < 1 or first % (uid_num * ENTRY_BYTES) or buffer.meta + first > scratch:
        raise ImportFormatError(
            f"{buffer.path}: {buffer.where(int(profiled[0]))}: {first} data bytes are not "
            f"{uid_num} whole "
            f"segments of 8-byte entries within its {scratch}-byte block"
        )
    buffer.data_bytes = first
    ordered = (times[profiled, 0] <= times[profiled, 1]) & (
        times[profiled, 1] <= times[profiled, 2]
    )
    if not ordered.all():
        block = int(profiled[np.flatnonzero(~ordered)[0]])
        raise ImportFormatError(
            f"{buffer.path}: {buffer.where(block)}: its init, pre-final and post-final times "
            f"{times[block].tolist()} are not in order"
        )
    odd = buffer.counts[profiled] % 2 == 1
    if odd.any():
        row, segment = (int(v) for v in np.argwhere(odd)[0])
        block = int(profiled[row])
        count_at = buffer.blocks_at + block * scratch + CTA_HEADER_BYTES
        count_at += 4 * int(buffer.uids[segment])
        raise ImportFormatError(
            f"{buffer.path}: {buffer.where(block, segment)}: wrote "
            f"{int(buffer.counts[block, segment])} words, "
            f"an odd number (entries are 2 words; count at byte {count_at})"
        )
    programs, index = np.unique(buffer.program[profiled], return_index=True)
    if programs.size != profiled.size:
        again = np.setdiff1d(np.arange(profiled.size), index)[0]
        block = int(profiled[again])
        raise ImportFormatError(
            f"{buffer.path}: {buffer.where(block)}: another profiled CTA block has the same "
            "program id"
        )
    if (int(programs[-1]) + 1) * buffer.total_unit > _UINT32:
        raise ImportFormatError(
            f"{buffer.path}: program id {int(programs[-1])} x {buffer.total_unit} warps does not "
            "fit the store's 32-bit owner id"
        )


@dataclass
class _Chunk:
    """The scope instances of some whole SMs, and what their warps lost."""

    blocks: np.ndarray
    """Block index of each instance."""
    segments: np.ndarray
    scopes: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    block_ids: np.ndarray
    """The blocks decoded (each warp row of the per-warp arrays below is one of theirs)."""
    lost: np.ndarray
    """``(len(block_ids), uid_num)``: entries overwritten in the circular segment."""
    unpaired: np.ndarray
    """Kept entries without a partner (a begin with no end, an end with no begin)."""
    orphaned: np.ndarray
    """Of those, ends whose begin the overwrite took (first of their scope in the window)."""
    occurrence: np.ndarray | None
    """Each instance's number among its warp's instances of its scope, where their starts
    come in order (else None: ``_records`` sorts them)."""


def _decode(buffer: _HostBuffer, block_ids: np.ndarray, numbered: bool = True) -> _Chunk:
    """Decode the kept entries of some blocks (sorted by hw id: whole SMs) in time order,
    unwrap each SM's 43-bit clock, and pair begins with ends per (CTA, warp, scope);
    ``numbered``: also number each (warp, scope)'s instances (``_Chunk.occurrence``)."""
    uid_num, capacity = buffer.uids.size, buffer.segment_entries
    written = buffer.counts[block_ids] // 2
    kept = np.minimum(written, capacity).ravel()
    first_slot = np.where(written > capacity, written % capacity, 0).ravel()
    data = np.ascontiguousarray(
        buffer.blocks[block_ids, buffer.meta : buffer.meta + buffer.data_bytes]
    )
    buffer.mapped.release()  # copied: the file's pages need not stay in memory
    words = data.view("<u4").reshape(-1, 2)
    warps = np.repeat(np.arange(kept.size, dtype=np.int32), kept)
    warp_at = np.cumsum(kept) - kept  # each warp's first entry
    if kept.size and kept.min() == capacity and not first_slot.any():
        entries = words  # every segment full and in order: no gather
    else:
        position = np.arange(warps.size) - np.repeat(warp_at, kept)
        slots = (first_slot[warps] + position) % capacity
        entries = words[warps.astype(np.int64) * capacity + slots]
        del position, slots
    word0 = entries[:, 0]
    ends = (word0 >> 31).astype(bool)
    scopes = (word0 >> 23).astype(np.uint8)  # the byte below the end bit
    cycles = ((word0 & 0x7FF).astype(np.int64) << 32) | entries[:, 1]
    _unwrap(cycles, buffer.hw[block_ids], kept.reshape(-1, uid_num).sum(axis=1))

    order = np.argsort(scopes, kind="stable")  # by scope, then warp and time: groups adjacent
    group_warps, group_scopes, group_ends = warps[order], scopes[order], ends[order]
    same = (group_warps[1:] == group_warps[:-1]) & (group_scopes[1:] == group_scopes[:-1])
    pairs = np.flatnonzero(same & ~group_ends[:-1] & group_ends[1:])
    unpaired = orphan = None  # where every entry is paired, and where no segment wrapped
    if 2 * pairs.size < order.size:
        unpaired = np.ones(order.size, bool)
        unpaired[pairs] = unpaired[pairs + 1] = False
    wrapped = (written > capacity).ravel()
    if wrapped.any() and order.size:
        first_of_scope = np.concatenate([[True], ~same])
        orphan = first_of_scope & group_ends & wrapped[group_warps]
    begin, end = order[pairs], order[pairs + 1]
    starts, finishes = cycles[begin], cycles[end]
    backwards = np.flatnonzero(finishes < starts)
    if backwards.size:
        at = int(end[backwards[0]])
        row, segment = divmod(int(warps[at]), uid_num)
        block = int(block_ids[row])
        warp = int(warps[at])
        slot = (int(first_slot[warp]) + at - int(warp_at[warp])) % capacity
        raise ImportFormatError(
            f"{buffer.path}: {buffer.where(block, segment)}: the end of scope {int(scopes[at])} "
            "at byte "
            f"{buffer.entry_at(block, segment, slot)} has cycle {int(cycles[at])}, "
            f"before its begin's {int(starts[backwards[0]])}"
        )
    shape = (block_ids.size, uid_num)
    counted = [
        np.bincount(group_warps[m], minlength=kept.size).reshape(shape)
        if m is not None
        else np.zeros(shape, np.int64)
        for m in (unpaired, orphan)
    ]
    rows, segments = np.divmod(warps[begin], uid_num)
    # The pairs come by scope, then warp (one owner each: program ids and uids are unique),
    # then entry order: each (owner, scope)'s instances are adjacent, numbered in a run.
    occurrence = None
    if numbered:
        new = np.concatenate([[True], (group_scopes[pairs[1:]] != group_scopes[pairs[:-1]])
                              | (group_warps[pairs[1:]] != group_warps[pairs[:-1]])])  # fmt: skip
        if not np.any((starts[1:] < starts[:-1]) & ~new[1:]):
            runs = np.flatnonzero(new)
            occurrence = np.arange(starts.size) - np.repeat(
                runs, np.diff(np.append(runs, starts.size))
            )
    return _Chunk(
        block_ids[rows], segments, scopes[begin], starts, finishes, block_ids,
        (written - kept.reshape(shape)), *counted, occurrence,
    )  # fmt: skip


def _unwrap(cycles: np.ndarray, hw: np.ndarray, entries: np.ndarray) -> None:
    """Add 2^43 to the low cycles of an SM whose cycles span more than half the clock's
    range: its 43-bit counter wrapped while it ran (entries of one SM are adjacent; block
    i, on SM ``hw[i]``, has ``entries[i]`` of them)."""
    if not cycles.size:
        return
    hw = hw[entries > 0]
    at = (np.cumsum(entries) - entries)[entries > 0]
    starts = at[np.concatenate([[True], hw[1:] != hw[:-1]])]
    span = np.maximum.reduceat(cycles, starts) - np.minimum.reduceat(cycles, starts)
    wrapped = span > CLOCK_MODULUS // 2
    if wrapped.any():
        sm = np.repeat(wrapped, np.diff(np.append(starts, cycles.size)))
        cycles[sm & (cycles < CLOCK_MODULUS // 2)] += CLOCK_MODULUS


def _sm_groups(buffer: _HostBuffer) -> list[np.ndarray]:
    """The profiled blocks sorted by hw id, cut into groups of whole SMs of about
    ``CHUNK_ENTRIES`` kept entries."""
    blocks = buffer.profiled[np.lexsort((buffer.profiled, buffer.hw[buffer.profiled]))]
    if not blocks.size:
        return []
    entries = np.minimum(buffer.counts[blocks] // 2, buffer.segment_entries).sum(axis=1)
    hw = buffer.hw[blocks]
    new_sm = np.concatenate([[True], hw[1:] != hw[:-1]])
    sm = np.cumsum(new_sm) - 1
    sm_entries = np.bincount(sm, weights=entries).astype(np.int64)
    group = ((np.cumsum(sm_entries) - sm_entries) // CHUNK_ENTRIES)[sm]
    cuts = np.flatnonzero(np.diff(group)) + 1
    return np.split(blocks, cuts)


def _buffer_launch(path: Path, options: ImportOptions) -> ImportedInvocation:
    """A host buffer as one launch: a first pass over its SMs finds each CTA's first and
    last record, what each warp lost and the SMs' clocks; the records are decoded again,
    group by group, as the writer reads them."""
    buffer = _open_buffer(path)
    groups = _sm_groups(buffer)
    block_num, uid_num = buffer.blocks.shape[0], buffer.uids.size
    first = np.full(block_num, np.iinfo(np.int64).max)
    last = np.full(block_num, -1)
    records = np.zeros(block_num, np.int64)
    lost = np.zeros((block_num, uid_num), np.int64)
    unpaired = np.zeros_like(lost)
    orphaned = np.zeros_like(lost)
    kept: _Chunk | None = None
    seen = np.zeros(256, bool)
    for blocks in groups:
        chunk = _decode(buffer, blocks, numbered=len(groups) == 1)
        seen[chunk.scopes] = True
        np.minimum.at(first, chunk.blocks, chunk.starts)
        np.maximum.at(last, chunk.blocks, chunk.ends)
        records += np.bincount(chunk.blocks, minlength=block_num)
        lost[blocks], unpaired[blocks], orphaned[blocks] = (
            chunk.lost,
            chunk.unpaired,
            chunk.orphaned,
        )
        kept = chunk if len(groups) == 1 else None
    recorded = np.flatnonzero(records)
    if not recorded.size:
        raise ImportFormatError(
            f"{path}: no scope instance: {buffer.profiled.size} of {block_num} CTA blocks were "
            "profiled, and none of their warps holds a begin with its end"
        )
    frequency = _frequency(options)
    clocks = _sm_clocks(
        path, buffer.hw[recorded], buffer.init[recorded], buffer.prefinal[recorded],
        first[recorded], last[recorded], buffer.program[recorded], frequency,
    )  # fmt: skip
    dropped = _dropped(buffer, lost, unpaired, orphaned)
    names = {s: options.names.get(s, f"scope_{s}") for s in np.flatnonzero(seen).tolist()}

    def chunks() -> Iterator[pa.Table]:
        for blocks in groups:
            chunk = kept if kept is not None else _decode(buffer, blocks)
            if chunk.starts.size:
                yield _records(
                    buffer.hw[chunk.blocks], chunk.starts, chunk.ends, chunk.scopes,
                    buffer.program[chunk.blocks],
                    buffer.program[chunk.blocks] * buffer.total_unit + buffer.uids[chunk.segments],
                    chunk.occurrence,
                )  # fmt: skip

    return ImportedInvocation(
        kernel_name=options.kernel_name or KERNEL_NAME,
        frequency_hz=frequency,
        producer=PRODUCER,
        producer_format="host-buffer/1",
        records=chunks(),
        source=str(path),
        clock_domain="anchored",
        stage_names=names,
        owner_label="warp",
        dropped=dropped,
        clocks=clocks,
        rank=options.rank or 0,
        soc={1: "cuda", 2: "hip"}[buffer.device_type],
    )


def _dropped(
    buffer: _HostBuffer, lost: np.ndarray, unpaired: np.ndarray, orphaned: np.ndarray
) -> dict[tuple[int, int], int]:
    """Scope instances lost per SM, warned about: a warp whose segment wrapped lost
    ``ceil((overwritten + orphaned ends) / 2)`` (each overwritten entry is half of a lost
    instance, and an end whose begin was overwritten completes one), and every other entry
    without a partner is one lost instance."""
    wrapped = lost > 0
    per_warp = np.where(wrapped, (lost + orphaned + 1) // 2 + unpaired - orphaned, unpaired)
    per_block = per_warp.sum(axis=1)
    blocks = np.flatnonzero(per_block)
    if not blocks.size:
        return {}
    dropped: dict[tuple[int, int], int] = {}
    for block in blocks.tolist():
        key = (int(CoreType.SM), int(buffer.hw[block]))
        dropped[key] = dropped.get(key, 0) + int(per_block[block])
    block, segment = (int(v) for v in np.unravel_index(np.argmax(lost), lost.shape))
    detail = (
        f"{int(lost.sum())} entries were overwritten in {int(wrapped.sum())} warps' circular "
        f"segments of {buffer.segment_entries} entries (the most: {buffer.where(block, segment)} "
        f"wrote {int(buffer.counts[block, segment]) // 2} and kept {buffer.segment_entries})"
        if wrapped.any()
        else "no segment wrapped"
    )
    warnings.warn(
        f"{buffer.path}: {sum(dropped.values())} scope instances lost on {len(dropped)} SMs: "
        f"{detail}; {int(unpaired.sum())} kept entries had no partner, "
        f"{int(orphaned.sum())} of them ends whose begin was overwritten",
        DroppedRecordsWarning,
        stacklevel=3,
    )
    return dropped


# --- the clock anchors -------------------------------------------------------------------


def _sm_clocks(
    path: Path,
    hw: np.ndarray,
    init: np.ndarray,
    prefinal: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    program: np.ndarray,
    frequency: float,
) -> dict[tuple[int, int], CoreClock]:
    """Each SM's offset and interval from its CTAs' anchors (arrays per CTA with records).

    ``T(t) = (t - earliest init) x frequency / 1e9`` cycles. CTA c allows the offsets that
    put its first record at or after its init and its last at or before its pre-final time:
    ``low_c = ceil(T(init_c)) - first_c``, ``high_c = floor(T(prefinal_c)) - last_c``. The
    CTAs of one SM share its counter: its interval is their intersection, and its offset
    the interval's low end (the binding CTA's first record exactly at its init)."""
    rate = Fraction(frequency) / 10**9
    origin = int(init.min())
    clocks: dict[tuple[int, int], list[int]] = {}
    for h, t0, t1, begin, end in zip(
        *(a.tolist() for a in (hw, init, prefinal, first, last)), strict=True
    ):
        low = math.ceil((t0 - origin) * rate) - begin
        high = math.floor((t1 - origin) * rate) - end
        bounds = clocks.setdefault(h, [low, high])
        bounds[0], bounds[1] = max(bounds[0], low), min(bounds[1], high)
    empty = sorted(h for h, (low, high) in clocks.items() if low > high)
    if empty:
        window = np.maximum(prefinal - init, 1)
        worst = int(np.argmax((last - first) / window))
        needed = (int(last[worst]) - int(first[worst])) / int(window[worst]) * 1e9
        warnings.warn(
            f"{path}: the clock anchors of {len(empty)} SMs (hw ids {empty[:8]}) allow no "
            f"offset at {frequency / 1e6:g} MHz: e.g. CTA {int(program[worst])} spans "
            f"{int(last[worst]) - int(first[worst])} cycles between init and pre-final times "
            f"{int(window[worst])} ns apart, so its counter runs at {needed / 1e6:.0f} MHz or "
            "more; each such SM is placed at its interval's low end (pass the SM clock as the "
            "frequency to place them exactly)",
            ClockAnchorWarning,
            stacklevel=3,
        )
    return {(int(CoreType.SM), h): CoreClock(low, low, high) for h, (low, high) in clocks.items()}


# --- records -----------------------------------------------------------------------------


def _records(
    hw: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    scopes: np.ndarray,
    tasks: np.ndarray,
    owners: np.ndarray,
    occurrence: np.ndarray | None = None,
) -> pa.Table:
    """Record rows of whole SMs: numbered in time order on each SM (start, then warp, scope
    and end), each the n-th instance of its scope in its warp (``stage_task_index``; given
    as ``occurrence`` where the caller knows it)."""
    if occurrence is None:
        by_warp = np.lexsort((starts, scopes, owners))
        occurrence = np.empty(starts.size, np.int64)
        new = np.concatenate([[True], (owners[by_warp][1:] != owners[by_warp][:-1])
                              | (scopes[by_warp][1:] != scopes[by_warp][:-1])])  # fmt: skip
        runs = np.flatnonzero(new)
        occurrence[by_warp] = np.arange(starts.size) - np.repeat(
            runs, np.diff(np.append(runs, starts.size))
        )
    order = _in_time(hw, starts, ends, scopes, owners)
    hw = hw[order]
    core_new = np.flatnonzero(np.concatenate([[True], hw[1:] != hw[:-1]]))
    index = np.arange(order.size) - np.repeat(core_new, np.diff(np.append(core_new, order.size)))
    count = order.size
    return pa.table(
        {
            "core_type": pa.array(np.full(count, int(CoreType.SM), np.uint8)),
            "block_id": pa.array(hw.astype(np.uint32)),
            "record_index": pa.array(index.astype(np.uint32)),
            "start_cycle": pa.array(starts[order].astype(np.uint64)),
            "end_cycle": pa.array(ends[order].astype(np.uint64)),
            "desc_id": pa.array(scopes[order].astype(np.uint32)),
            "task_id": pa.array(tasks[order].astype(np.uint32)),
            "stage_task_index": pa.array(occurrence[order].astype(np.uint32)),
            "owner_id": pa.array(owners[order].astype(np.uint32)),
            "phase": phase_column(np.zeros(count, np.int8)),
        }
    ).select(list(RECORD_COLUMNS))


def _in_time(
    hw: np.ndarray, starts: np.ndarray, ends: np.ndarray, scopes: np.ndarray, owners: np.ndarray
) -> np.ndarray:
    """The rows by SM, start, then owner, scope and end: one sort of (SM, start) packed in
    an integer where their ranges allow and no two rows tie on it, else a lexsort."""
    if starts.size:
        low, high = int(starts.min()), int(starts.max())
        if int(hw.max()) < 1 << 20:  # hw ids: a table of the SMs present
            seen = np.bincount(hw) > 0
            sms, dense = np.flatnonzero(seen), (np.cumsum(seen) - 1)[hw]
        else:
            sms, dense = np.unique(hw, return_inverse=True)
        bits = (high - low).bit_length()
        if low >= 0 and (sms.size - 1).bit_length() + bits <= 62:
            key = (dense.astype(np.int64) << bits) | (starts - low)
            order = np.argsort(key, kind="stable")
            key = key[order]
            if not np.any(key[1:] == key[:-1]):
                return order
    return np.lexsort((ends, scopes, owners, starts, hw))


# --- the chrome trace --------------------------------------------------------------------


@dataclass
class _ChromeEvents:
    """The scope events of a chrome trace, as columns."""

    kernels: pa.Array
    names: pa.Array
    hw: np.ndarray
    cta: np.ndarray
    warp: np.ndarray
    ts: np.ndarray
    """``ts`` x 1000: the writer's cycles (it assumes 1 GHz)."""
    dur: np.ndarray
    init: np.ndarray
    post: np.ndarray
    finalization: np.ndarray
    index: np.ndarray
    """Each event's index in the file, for messages."""


def _chrome_events(path: Path) -> _ChromeEvents:
    """Read the file's scope events (``X`` events whose pid is ``<kernel> Core<hw> CTA<c>``
    and tid ``warp <w> (line <l>)``), refusing any other event but newer writers' async
    ones, which are counted and skipped."""
    columns: dict[str, list] = {key: [] for key in _ChromeEvents.__dataclass_fields__}
    skipped = 0
    try:
        with read_trace(path, args_keys=CHROME_ARGS) as trace:
            for block in trace.blocks:
                skipped += _chrome_block(path, block, columns)
    except TraceFormatError as exc:
        raise ImportFormatError(f"not a Proton chrome trace: {exc}") from None
    if skipped:
        warnings.warn(
            f"{path}: {skipped} async/flow events skipped (only scopes are imported)",
            UserWarning,
            stacklevel=4,
        )
    if not sum(map(len, columns["ts"])):
        raise ImportFormatError(f"{path}: a chrome trace without any scope event")
    joined = {}
    for key in list(columns):  # a column's blocks are freed once joined: one held twice
        parts = columns.pop(key)
        joined[key] = (
            pa.concat_arrays(parts) if key in ("kernels", "names") else np.concatenate(parts)
        )
        del parts
    return _ChromeEvents(**joined)


def _chrome_block(path: Path, block: EventBlock, columns: dict[str, list]) -> int:
    """Append a block's scope events to ``columns``; return the async events skipped."""
    count = len(block)
    ph = block.strings("ph")
    cat = block.strings("cat")
    skip = pc.fill_null(pc.is_in(cat, pa.array(CHROME_SKIPPED_CATS)), False).to_numpy(False)
    not_x = np.flatnonzero(~pc.fill_null(pc.equal(ph, "X"), False).to_numpy(False) & ~skip)
    if not_x.size:
        raise _refused(block, "ph", int(not_x[0]), "is not X: Proton writes X events only")
    keep = np.flatnonzero(~skip)
    pid = pc.extract_regex(block.strings("pid"), _PID)
    tid = pc.extract_regex(block.strings("tid"), _TID)
    for key, parsed, shape in (("pid", pid, "<kernel> Core<hw> CTA<cta>"),
                               ("tid", tid, "warp <w> (line <l>)")):  # fmt: skip
        bad = np.flatnonzero(~pc.is_valid(parsed).to_numpy(False)[keep])
        if bad.size:
            raise _refused(block, key, int(keep[bad[0]]), f"is not {shape!r}")
    kernels = pc.struct_field(pid, "kernel")
    mismatch = np.flatnonzero(~pc.fill_null(pc.equal(kernels, cat), False).to_numpy(False)[keep])
    if mismatch.size:
        raise _refused(block, "cat", int(keep[mismatch[0]]), "is not the kernel its pid names")
    values = {}
    for key, decimals in (("ts", 3), ("dur", 3), *((a, 0) for a in CHROME_ARGS[:3]),
                          (CHROME_ARGS[3], 3)):  # fmt: skip
        read = block.numbers(key, decimals)
        bad = np.flatnonzero(~read.number[keep] | read.overflow[keep] | (read.value[keep] < 0))
        if bad.size:
            raise _refused(block, key, int(keep[bad[0]]), "is not a number >= 0")
        values[key] = read.value[keep]
    wrong = np.flatnonzero(values[CHROME_ARGS[3]] != CHROME_MHZ * 1000)
    if wrong.size:
        raise _refused(
            block, CHROME_ARGS[3], int(keep[wrong[0]]), "is not the 1000.0 Proton writes"
        )
    names = block.strings("name").take(pa.array(keep))
    if names.null_count:
        raise _refused(block, "name", int(keep[np.flatnonzero(names.is_null().to_numpy(False))[0]]),
                       "is not a string")  # fmt: skip
    columns["kernels"].append(kernels.take(pa.array(keep)))
    columns["names"].append(names)
    for key, field in (("hw", (pid, "core")), ("cta", (pid, "cta")), ("warp", (tid, "warp"))):
        text = pc.struct_field(field[0], field[1]).take(pa.array(keep))
        columns[key].append(np.asarray(pc.cast(text, pa.int64()).to_numpy(False)))
    columns["ts"].append(values["ts"])
    columns["dur"].append(values["dur"])
    columns["init"].append(values[CHROME_ARGS[0]])
    columns["post"].append(values[CHROME_ARGS[1]])
    columns["finalization"].append(values[CHROME_ARGS[2]])
    columns["index"].append(block.first_index + keep)
    return count - keep.size


def _refused(block: EventBlock, key: str, row: int, problem: str) -> ImportFormatError:
    """The error for event ``row``'s value of ``key`` (or for its lack of one)."""
    if block.span(key)[0][row] < 0:
        return ImportFormatError(
            f"{block.path}: event {block.first_index + row} has no {field_name(key)}, which "
            "every event of a Proton chrome trace has"
        )
    return ImportFormatError(str(block.value_error(key, row, problem)))


def _chrome_launches(path: Path, options: ImportOptions) -> Iterator[ImportedInvocation]:
    """A chrome trace's launches. A CTA is one ``(kernel, CTA id, init time)``; the n-th
    init time of a kernel's CTA id belongs to the kernel's n-th launch."""
    events = _chrome_events(path)
    kernel_ids, kernel_names = _codes(events.kernels)
    key = np.lexsort((events.init, events.cta, kernel_ids))
    k, c, t = kernel_ids[key], events.cta[key], events.init[key]
    new = np.concatenate([[True], (k[1:] != k[:-1]) | (c[1:] != c[:-1]) | (t[1:] != t[:-1])])
    instance = np.empty(key.size, np.int64)
    instance[key] = np.cumsum(new) - 1
    heads = key[new]
    for column, what in ((events.hw, "hw id"), (events.post, "post-final time"),
                         (events.finalization, "finalization time")):  # fmt: skip
        differs = np.flatnonzero(column != column[heads][instance])
        if differs.size:
            raise ImportFormatError(
                f"{path}: event {int(events.index[differs[0]])} has another {what} than the "
                f"other events of CTA {int(events.cta[differs[0]])} with its init time"
            )
    count = heads.size
    lowest = np.full(count, np.iinfo(np.int64).max)
    np.minimum.at(lowest, instance, events.ts)
    origin = events.init[heads] - lowest  # the writer's earliest init, seen from each CTA
    if np.any(origin != origin[0]):
        other = int(np.flatnonzero(origin != origin[0])[0])
        bad = int(heads[other])
        raise ImportFormatError(
            f"{path}: event {int(events.index[bad])} (CTA {int(events.cta[bad])}): its CTA's "
            f"earliest ts places the writer's earliest init at {int(origin[other])} ns, other "
            f"CTAs at {int(origin[0])} ns: not the timestamps Proton writes"
        )
    relative = events.ts - (events.init - origin[0])
    head_kernel, head_cta = kernel_ids[heads], events.cta[heads]
    same_cta = np.concatenate([[False], (head_kernel[1:] == head_kernel[:-1])
                               & (head_cta[1:] == head_cta[:-1])])  # fmt: skip
    runs = np.flatnonzero(~same_cta)
    launch_of = np.arange(count) - np.repeat(runs, np.diff(np.append(runs, count)))
    launch = launch_of[instance]
    codes, names = _codes(events.names)
    ids = _scope_ids(names, options.names)
    scopes = ids[codes]
    stage_names = {
        int(i): options.names.get(int(i), n) for i, n in zip(ids.tolist(), names, strict=True)
    }
    for kernel in range(len(kernel_names)):
        for number in range(int(launch_of[head_kernel == kernel].max()) + 1):
            rows = np.flatnonzero((kernel_ids == kernel) & (launch == number))
            ctas = _Ctas(instance[rows], heads)
            yield _chrome_launch(
                path, options, events, rows, ctas, relative, scopes, stage_names,
                kernel_names[kernel],
            )  # fmt: skip


def _codes(strings: pa.Array) -> tuple[np.ndarray, list[str]]:
    """Integer codes of strings in order of first appearance, and the strings."""
    encoded = pc.dictionary_encode(strings).combine_chunks() if isinstance(
        strings, pa.ChunkedArray) else pc.dictionary_encode(strings)  # fmt: skip
    return encoded.indices.to_numpy(False).astype(np.int64), encoded.dictionary.to_pylist()


class _Ctas:
    """A launch's CTA instances (``heads``: each instance's first event), numbered in
    order of init time, then CTA id; ``of_row``: each of the launch's events' number."""

    def __init__(self, instances: np.ndarray, heads: np.ndarray) -> None:
        present = np.flatnonzero(np.bincount(instances, minlength=heads.size))
        self.heads = heads[present]
        self._instances = instances
        self._present = present

    def numbered(self, init: np.ndarray, cta: np.ndarray) -> np.ndarray:
        """The events' CTA numbers, the instances sorted by ``(init, cta)`` of their heads
        (``self.heads`` is put in that order)."""
        by = np.lexsort((cta[self.heads], init[self.heads]))
        self.heads = self.heads[by]
        number = np.zeros(self._present[-1] + 1, np.int64)
        number[self._present[by]] = np.arange(by.size)
        return number[self._instances]


def _chrome_launch(
    path: Path,
    options: ImportOptions,
    events: _ChromeEvents,
    rows: np.ndarray,
    launch_ctas: _Ctas,
    relative: np.ndarray,
    scopes: np.ndarray,
    stage_names: Mapping[int, str],
    kernel: str,
) -> ImportedInvocation:
    """One launch of a chrome trace: its CTAs' records on their SMs' clocks."""
    instance = launch_ctas.numbered(events.init, events.cta)
    heads = launch_ctas.heads  # hw and the anchors are one per CTA instance (checked)
    ctas = np.stack([events.init[heads], events.cta[heads]])
    sm_of_cta = events.hw[heads]
    cta_prefinal = events.post[heads] - events.finalization[heads]
    hw, cta, warp = events.hw[rows], events.cta[rows], events.warp[rows]
    starts = relative[rows]
    ends = starts + events.dur[rows]
    frequency = _frequency(options)
    # Place every CTA of an SM as the writer did, by its own init: on the SM's clock, the
    # CTA that started first (lowest init, then CTA id) begins at 0.
    rate = Fraction(frequency) / 10**9
    origin = int(ctas[0].min())
    placed = np.array([math.ceil((t - origin) * rate) for t in ctas[0].tolist()], np.int64)
    base = {}
    for h, p in zip(sm_of_cta.tolist(), placed.tolist(), strict=True):
        base.setdefault(h, p)  # ctas are sorted by init, then CTA id
    shift = placed - np.array([base[h] for h in sm_of_cta.tolist()], np.int64)
    starts = starts + shift[instance]
    ends = ends + shift[instance]
    first = np.full(ctas.shape[1], np.iinfo(np.int64).max)
    last = np.full(ctas.shape[1], -1)
    np.minimum.at(first, instance, starts)
    np.maximum.at(last, instance, ends)
    del instance
    clocks = _sm_clocks(path, sm_of_cta, ctas[0], cta_prefinal, first, last, ctas[1], frequency)
    scopes = scopes[rows]
    warps = int(warp.max()) + 1
    if (int(cta.max()) + 1) * warps > _UINT32:
        raise ImportFormatError(
            f"{path}: CTA {int(cta.max())} x {warps} warps does not fit the 32-bit owner id"
        )
    names = {int(i): stage_names[int(i)] for i in np.unique(scopes).tolist()}
    owners = cta * warps + warp
    del warp
    by_sm = np.argsort(hw, kind="stable")

    def chunks() -> Iterator[pa.Table]:
        """Whole SMs at a time (an SM's records are numbered together), in hw order."""
        for group in _whole_sms(hw[by_sm], CHUNK_ENTRIES // 2):
            rows = by_sm[group]
            yield _records(hw[rows], starts[rows], ends[rows], scopes[rows], cta[rows],
                           owners[rows])  # fmt: skip

    return ImportedInvocation(
        kernel_name=options.kernel_name or kernel,
        frequency_hz=frequency,
        producer=PRODUCER,
        producer_format="chrome-trace",
        records=chunks(),
        source=f"{path} (kernel {kernel})",
        clock_domain="anchored",
        stage_names=names,
        owner_label="warp",
        clocks=clocks,
        rank=options.rank or 0,
    )


def _whole_sms(hw: np.ndarray, step: int) -> list[slice]:
    """Slices of sorted ``hw`` of whole SMs, a new one at the first SM that starts ``step``
    or more rows after the slice's start."""
    firsts = np.flatnonzero(np.concatenate([[True], hw[1:] != hw[:-1]]))
    cuts, at = [], 0
    for first in firsts.tolist():
        if first - at >= step:
            cuts.append(first)
            at = first
    bounds = [0, *cuts, hw.size]
    return [slice(a, b) for a, b in pairwise(bounds)]


def _scope_ids(names: list[str], given: Mapping[int, str]) -> np.ndarray:
    """Desc ids of scope names: ``scope_<id>`` is ``id``; a name the options give an id
    takes it; any other name an id from ``NAMED_SCOPES_FROM`` on, in order of appearance."""
    by_name = {name: int(i) for i, name in given.items()}
    ids = []
    fresh = NAMED_SCOPES_FROM
    for name in names:
        matched = _SCOPE_NAME.fullmatch(name)
        if name in by_name:
            ids.append(by_name[name])
        elif matched and int(matched[1]) < NAMED_SCOPES_FROM:
            ids.append(int(matched[1]))
        else:
            ids.append(fresh)
            fresh += 1
    return np.array(ids, np.int64)
