"""FlashInfer, Mirage MPK and Triton-distributed ``.perfetto-trace`` files, as their
exporters write them through tg4perfetto.

Each exporter replays its raw profile buffer (see ``ingest/import_tagged.py``) into track
events: a ClockSnapshot packet first (every clock at 0, so timestamps are the raw 32-bit
``globaltimer_lo`` ns), track descriptors, then TYPE_SLICE_BEGIN (an interned ``name_iid``),
TYPE_SLICE_END (no name) and TYPE_INSTANT (an inline name) on child tracks:

- FlashInfer: a process ``SM_%03d`` per SM, a track ``blk{b}_g{g}`` per writer, slices
  named by the event.
- MPK: a process ``block_{i}`` per block, a group track ``group_{g}`` in it, a track per task
  type under that (named ``group_{g}`` too), slices ``<TASK_NAME>_<event_no>``.
- Triton-distributed: a process ("tracks of all SMs", or ``block_{b}_sm_{s}``), a group track
  per SM named by its id, greedy sub-tracks under it, slices ``<task name>:<block>``.

The file is read a block of packets at a time. Only the outer packet lengths are walked in
Python; the fields of all packets of a block are decoded together with numpy (one field of
every packet per step), and the few packets that describe tracks or intern names are read
field by field. The events of the launch are kept as five small columns; a slice ends
where its track's last open slice ends (what Perfetto shows), each track's times are
unwrapped in file order as the raw importer does, and the records are numbered over the
whole launch and handed over in chunks.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from multicore_profiler.abi import DESC_TRIGGER_EVENT, DESC_WAIT_DEPENDENCY, CoreType
from multicore_profiler.errors import DroppedRecordsWarning, ImportFormatError
from multicore_profiler.ingest.import_tagged import (
    AMBIGUOUS_STEP,
    AUX_NAMES,
    GROUP_RADIX,
    MPK_TASK_NAMES,
    SCHD_EVENTS,
    WAIT_NAME,
    WRAP,
    _chunks,
    _next_task,
    _numbered,
    _offsets,
)
from multicore_profiler.ingest.imported import ImportedInvocation
from multicore_profiler.ingest.imports import ImportOptions

BLOCK_BYTES = 8 << 20
"""Bytes read from the file at a time (a longer packet is read whole)."""
BEGIN, END, INSTANT = 1, 2, 3
"""``TrackEvent.Type`` values tg4perfetto writes."""
MPK_WORKERS = 256
"""MPK's tag holds the worker in 8 bits: the exporter files block b under ``block_{b % 256}``."""
MPK_EVENT_NO = 8192
MPK_LOCAL_TYPES = 512
"""MPK task types are 9 bits: names missing from its table take ids from here on."""


def is_perfetto_trace(path: Path) -> bool:
    """Whether the file starts as a Perfetto trace does: a TracePacket (field 1, length
    delimited) whose body starts with a valid field key."""
    with open(path, "rb") as file:
        head = file.read(16)
    if len(head) < 3 or head[0] != 0x0A:
        return False
    at, length = 1, 0
    for shift in range(0, 35, 7):
        if at >= len(head):
            return False
        length |= (head[at] & 0x7F) << shift
        at += 1
        if head[at - 1] < 0x80:
            break
    else:
        return False
    return length > 0 and at < len(head) and head[at] >> 3 > 0 and head[at] & 7 in (0, 1, 2, 5)


def read_trace(path: Path, options: ImportOptions) -> Iterator[ImportedInvocation]:
    """The one launch of a producer's ``.perfetto-trace`` (``options.format`` names the
    producer)."""
    source = str(path)
    with open(path, "rb") as file:
        events, tracks, names = _events(file, source)
    yield _launch(events, tracks, names, options, source)


# -- the packet walk ----------------------------------------------------------------------


@dataclass
class _Events:
    """The track events of a trace in file order: raw ns, type, track uuid, name code (an
    interned iid; minus one less than an inline name's index; 0 none) and packet byte
    offset."""

    ts: np.ndarray
    kind: np.ndarray
    track: np.ndarray
    name: np.ndarray
    offset: np.ndarray


@dataclass(frozen=True)
class _Track:
    name: str
    parent: int
    process: str | None
    offset: int


@dataclass
class _Names:
    interned: dict[int, str]
    inline: dict[str, int]


def _events(file: BinaryIO, source: str) -> tuple[_Events, dict[int, _Track], _Names]:
    """Every track event of the file, its tracks and its names, a block of packets at a
    time."""
    tracks: dict[int, _Track] = {}
    names = _Names({}, {})
    parts: list[tuple[np.ndarray, ...]] = []
    first = True
    for base, packet, buf, starts, ends in _packets(file, source):
        top = _fields(buf, starts, ends, base, source, {6: 2, 8: 0, 11: 2, 12: 2, 60: 2})
        if first:
            if top[6][1][0] < 0:
                raise ImportFormatError(
                    f"{source}: the first packet holds no ClockSnapshot: not a trace "
                    "tg4perfetto wrote"
                )
            first = False
        for at in np.flatnonzero(top[60][1] >= 0):
            uuid, track = _descriptor(buf, top[60], int(at), base + int(packet[at]), source)
            tracks[uuid] = track
        for at in np.flatnonzero(top[12][1] >= 0):
            _intern(buf, top[12], int(at), names, base + int(packet[at]), source)
        has_event = np.flatnonzero(top[11][1] >= 0)
        if not len(has_event):
            continue
        off, length = top[11][0][has_event], top[11][1][has_event]
        sub = _fields(buf, off, off + length, base, source, {9: 0, 10: 0, 11: 0, 23: 2})
        kind, iid, track = sub[9], sub[10], sub[11]
        ts = top[8][has_event]
        offset = base + packet[has_event]
        name = np.where(iid > 0, iid, 0)
        inline = np.flatnonzero(sub[23][1] >= 0)
        for at in inline:
            text = _text(buf, int(sub[23][0][at]), int(sub[23][1][at]), int(offset[at]), source)
            name[at] = -1 - names.inline.setdefault(text, len(names.inline))
        bad = ~np.isin(kind, (BEGIN, END, INSTANT)) | (ts < 0) | (ts >= WRAP) | (track < 0)
        bad |= (kind != END) & (name == 0)
        if np.any(bad):
            at = int(np.argmax(bad))
            raise ImportFormatError(
                f"{source}: the track event at byte {int(offset[at])} (type {int(kind[at])}, "
                f"timestamp {int(ts[at])}, track {int(track[at])}) is not a slice begin, end or "
                "instant with a 32-bit ns timestamp on a track, as tg4perfetto's producers write"
            )
        parts.append((ts, kind.astype(np.int8), track, name, offset))
    if first:
        raise ImportFormatError(f"{source}: the file is empty")
    columns = [np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64)
               for i in range(5)]  # fmt: skip
    return _Events(*columns), tracks, names


def _packets(
    file: BinaryIO, source: str
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Blocks of whole packets: the block's file offset, each packet's start in it, its
    bytes (zero padded) and each packet body's start and end."""
    base, rest = 0, b""
    while True:
        data = rest + file.read(max(BLOCK_BYTES, 2 * len(rest)))
        at_end = len(data) == len(rest)
        if not data:
            return
        packets, starts, ends, stop = _walk_packets(data, base, source)
        if at_end and stop < len(data):
            raise ImportFormatError(_truncated(data, stop, base, source))
        if len(starts):
            buf = np.frombuffer(data[:stop] + bytes(16), dtype=np.uint8)
            yield base, packets, buf, starts, ends
        base, rest = base + stop, data[stop:]


def _walk_packets(
    data: bytes, base: int, source: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The packets wholly inside ``data`` (packet starts, body starts and ends, and where
    the whole ones stop), without a loop per packet: every byte 0x0A is taken as a possible
    packet start and linked to where that packet would end; the chain from byte 0 is then
    followed by repeated squaring of the links, doubling the packets found per step."""
    size = len(data)
    buf = np.frombuffer(data + bytes(16), dtype=np.uint8)
    if buf[0] != 0x0A:
        raise _not_packet(data, 0, base, source)
    candidate = np.flatnonzero(buf[:size] == 0x0A)
    length, length_bytes = _varints(buf, candidate + 1)
    body = candidate + 1 + length_bytes
    end = body + np.minimum(length, size).astype(np.int64)
    whole = (length_bytes > 0) & (end <= size)
    sink = len(candidate)
    link = np.minimum(np.searchsorted(candidate, end), sink)
    linked = whole & (link < sink)
    linked[linked] = candidate[link[linked]] == end[linked]
    link = np.append(np.where(linked, link, sink), sink)
    chain = np.zeros(1, np.int64)  # the packets J^k(0), k < 2^i, with link = J^(2^i)
    while True:
        more = link[chain]
        more = more[more < sink]
        if not len(more):
            break
        chain = np.concatenate((chain, more))
        link = link[link]
    chain = np.sort(chain)
    chain = chain[whole[chain]]
    stop = int(end[chain[-1]]) if len(chain) else 0
    if stop < size and buf[stop] != 0x0A:
        raise _not_packet(data, stop, base, source)
    return candidate[chain], body[chain], end[chain], stop


def _not_packet(data: bytes, at: int, base: int, source: str) -> ImportFormatError:
    return ImportFormatError(
        f"{source}: byte {base + at} holds 0x{data[at]:02x}, not a TracePacket (field 1, "
        "length delimited): not a Perfetto trace"
    )


def _truncated(data: bytes, stop: int, base: int, source: str) -> str:
    return (
        f"{source}: the file is truncated: the packet at byte {base + stop} does not end "
        f"before the end of the file at byte {base + len(data)}"
    )


def _varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varints at ``pos`` (values, byte lengths); a length of 0: none ended in 10 bytes."""
    value = np.zeros(len(pos), np.uint64)
    length = np.zeros(len(pos), np.int64)
    done = np.zeros(len(pos), bool)
    limit = len(buf) - 1
    for i in range(10):
        byte = buf[np.minimum(pos + i, limit)]
        live = ~done
        value |= np.where(live, (byte & 0x7F).astype(np.uint64) << np.uint64(7 * i), 0)
        length += live
        done |= byte < 0x80
        if done.all():
            return value, length
    return value, np.where(done, length, 0)


def _fields(
    buf: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    base: int,
    source: str,
    wanted: dict[int, int],
) -> dict[int, np.ndarray | tuple[np.ndarray, np.ndarray]]:
    """Fields of many messages at once, one field of every message per step: a varint
    field (wire type 0) as int64 values (-1 absent), a length-delimited one (2) as (body
    start, length; -1 absent). The last occurrence wins, as protobuf's does."""
    n = len(start)
    out: dict[int, np.ndarray | tuple[np.ndarray, np.ndarray]] = {
        f: (np.full(n, -1, np.int64), np.full(n, -1, np.int64))
        if wire
        else np.full(n, -1, np.int64)
        for f, wire in wanted.items()
    }
    index = np.arange(n)
    cur, stop = start.copy(), end.copy()
    while len(index):
        key, key_len = _varints(buf, cur)
        field, wire = (key >> np.uint64(3)).astype(np.int64), (key & np.uint64(7)).astype(np.int64)
        at = cur + key_len
        value, value_len = _varints(buf, at)
        value = value.astype(np.int64)
        after = np.select(
            [wire == 0, wire == 2, wire == 1, wire == 5],
            [at + value_len, at + value_len + value, at + 8, at + 4],
            -1,
        )
        bad = (key_len == 0) | (field == 0) | (after < 0) | (after > stop)
        bad |= ((wire == 0) | (wire == 2)) & (value_len == 0) | (wire == 2) & (value < 0)
        if np.any(bad):
            i = int(np.argmax(bad))
            raise ImportFormatError(
                f"{source}: byte {base + int(cur[i])}: a field (number {int(field[i])}, wire type "
                f"{int(wire[i])}) that does not fit its message: a corrupt or truncated trace"
            )
        for f, kind in wanted.items():
            hit = (field == f) & (wire == kind)
            if not np.any(hit):
                continue
            if kind:
                out[f][0][index[hit]] = (at + value_len)[hit]  # type: ignore[index]
                out[f][1][index[hit]] = value[hit]  # type: ignore[index]
            else:
                out[f][index[hit]] = value[hit]  # type: ignore[index]
        keep = after < stop
        index, cur, stop = index[keep], after[keep], stop[keep]
    return out


def _message(buf: np.ndarray, start: int, length: int, offset: int, source: str) -> list:
    """``(field, value)`` of one rare message: varints as int, the rest as their bytes."""
    data, pos, out = buf[start : start + length].tobytes(), 0, []
    while pos < length:
        key, pos = _varint(data, pos, offset, source)
        if key & 7 == 0:
            value, pos = _varint(data, pos, offset, source)
        elif key & 7 == 2:
            size, pos = _varint(data, pos, offset, source)
            value, pos = data[pos : pos + size], pos + size
        elif key & 7 in (1, 5):
            step = 8 if key & 7 == 1 else 4
            value, pos = data[pos : pos + step], pos + step
        else:
            pos = length + 1
        if pos > length:
            raise ImportFormatError(f"{source}: the packet at byte {offset} is corrupt")
        out.append((key >> 3, value))
    return out


def _varint(data: bytes, pos: int, offset: int, source: str) -> tuple[int, int]:
    value, shift = 0, 0
    while pos < len(data) and shift < 64:
        value |= (data[pos] & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if data[pos - 1] < 0x80:
            return value, pos
    raise ImportFormatError(f"{source}: the packet at byte {offset} is corrupt")


def _text(buf: np.ndarray, start: int, length: int, offset: int, source: str) -> str:
    try:
        return buf[start : start + length].tobytes().decode()
    except UnicodeDecodeError as error:
        raise ImportFormatError(
            f"{source}: the packet at byte {offset}: a name is not UTF-8"
        ) from error


def _descriptor(
    buf: np.ndarray, where: tuple, at: int, offset: int, source: str
) -> tuple[int, _Track]:
    """A TrackDescriptor: uuid (1), name (2), process (3: process_name 6), parent (5)."""
    fields = dict(_message(buf, int(where[0][at]), int(where[1][at]), offset, source))
    process = None
    if 3 in fields:
        inner = np.frombuffer(bytes(fields[3]), np.uint8)
        process_fields = dict(_message(inner, 0, len(inner), offset, source))
        process = process_fields.get(6, b"").decode(errors="replace")
    name = fields.get(2, b"")
    if 1 not in fields or not isinstance(name, bytes):
        raise ImportFormatError(f"{source}: the track descriptor at byte {offset} has no uuid")
    return fields[1], _Track(name.decode(errors="replace"), fields.get(5, 0), process, offset)


def _intern(
    buf: np.ndarray, where: tuple, at: int, names: _Names, offset: int, source: str
) -> None:
    """InternedData's event names (field 2: iid 1, name 2)."""
    for field, value in _message(buf, int(where[0][at]), int(where[1][at]), offset, source):
        if field != 2:
            continue
        inner = np.frombuffer(value, np.uint8)
        entry = dict(_message(inner, 0, len(inner), offset, source))
        if 1 in entry:
            names.interned[entry[1]] = entry.get(2, b"").decode(errors="replace")


# -- the mapping --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """Where a producer's track events lie: per track uuid ``(core_type, core, owner)``;
    per name ``(desc_id, stage name, task number or -1, kind)`` (kind: 0 task, 1 trigger,
    2 wait, 3 auxiliary)."""

    cores: dict[int, tuple[int, int, int]]
    owner_label: str
    describe: Callable[[str], tuple[int, str, int, int, int]]
    """name -> (desc, stage, task or -1, kind, block or -1)"""


_FLASHINFER_TRACK = re.compile(r"blk(\d+)_g(\d+)")
_SM = re.compile(r"SM_(\d+)")
_MPK_BLOCK = re.compile(r"block_(\d+)")
_MPK_GROUP = re.compile(r"group_(\d+)")
_TRITON_PROCESS = re.compile(r"tracks of all SMs|block_(\d+)_sm_(\d+)")


def _launch(
    events: _Events,
    tracks: dict[int, _Track],
    names: _Names,
    options: ImportOptions,
    source: str,
) -> ImportedInvocation:
    if not len(events.ts):
        raise ImportFormatError(f"{source}: the trace holds no slice or instant")
    producers = {"flashinfer": _flashinfer, "mpk": _mpk, "triton-distributed": _triton}
    if options.format not in producers:
        raise ImportFormatError(
            f"{source}: tg4perfetto traces are read as {', '.join(producers)}, not "
            f"{options.format!r}"
        )
    used = np.unique(events.track)
    layout = producers[options.format](tracks, used, options, source)
    spans, dropped_at = _pair(events, tracks, source)
    start, end, track, code = spans
    if not len(start):
        raise ImportFormatError(f"{source}: no slice of the trace ends, and it holds no instant")
    text = {**names.interned, **{-1 - i: t for t, i in names.inline.items()}}
    codes, inverse = np.unique(code, return_inverse=True)
    missing = [int(c) for c in codes if int(c) not in text]
    if missing:
        raise ImportFormatError(f"{source}: slices name interned name {missing[0]}, never interned")
    # Names are numbered in the order the file first uses them.
    named, first_use = np.unique(events.name, return_index=True)
    described_by = {int(c): layout.describe(text[int(c)])
                    for c in named[np.argsort(first_use)] if int(c) in text}  # fmt: skip
    described = [described_by[int(c)] for c in codes]
    desc = np.array([d[0] for d in described], np.uint32)[inverse]
    task_of = np.array([d[2] for d in described], np.int64)[inverse]
    kind = np.array([d[3] for d in described], np.int8)[inverse]
    named_block = np.array([d[4] for d in described], np.int64)[inverse]
    stage_names = {d[0]: d[1] for d in described if d[3] in (0, 1)}
    stage_names.update(
        {int(k): str(v) for k, v in options.names.items() if str(v).lower() not in AUX_NAMES}
    )
    core_rows = np.array([layout.cores[int(t)] for t in used], np.int64).reshape(-1, 3)
    at = np.searchsorted(used, track)
    core_type = core_rows[at, 0].astype(np.uint8)
    core = core_rows[at, 1].astype(np.uint32)
    owner = np.where(named_block >= 0, named_block, core_rows[at, 2])
    # Spans in owner (the writer) then start order, as the raw importer lists them.
    order = np.lexsort((start, owner))
    start, end, desc, task_of, kind, core_type, core, owner = (
        v[order] for v in (start, end, desc, task_of, kind, core_type, core, owner)
    )
    phase = np.zeros(len(start), np.int8)
    phase[kind == 1] = 2
    phase[kind == 2] = 1
    desc[kind == 1] = DESC_TRIGGER_EVENT
    desc[kind == 2] = DESC_WAIT_DEPENDENCY
    if np.any(task_of >= 0):  # MPK: block x 8192 + event_no, as the raw importer numbers
        task = (core.astype(np.int64) * MPK_EVENT_NO + task_of).astype(np.uint32)
    else:
        task = _next_task(owner, kind >= 2)
    low = int(start.min())
    reference = int(events.ts[0])
    shift = (reference + low) % WRAP - low
    in_time = np.argsort(start, kind="stable")
    record_index = _numbered(core.astype(np.int64) << 8 | core_type, in_time)
    stage_index = _numbered(desc, in_time)
    dropped = _dropped(dropped_at, layout, source)
    columns = {
        "core_type": core_type,
        "block_id": core,
        "record_index": record_index,
        "start_cycle": start + shift,
        "end_cycle": end + shift,
        "desc_id": desc,
        "task_id": task,
        "stage_task_index": stage_index,
        "owner_id": owner.astype(np.uint32),
        "phase": phase,
    }
    return ImportedInvocation(
        kernel_name=options.kernel_name or options.format,
        frequency_hz=1e9,
        producer=options.format,
        producer_format="perfetto-trace",
        records=_chunks(columns),
        source=source,
        clock_domain="shared",
        stage_names=stage_names,
        owner_label=layout.owner_label,
        dropped=dropped,
        anchor_cycle=low + shift,
        rank=options.rank or 0,
    )


def _pair(
    events: _Events, tracks: dict[int, _Track], source: str
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Slices ``(start, end, track, name code)`` in ns from the first event, each end closing
    its track's last open slice; and the tracks of the begins never closed."""
    order = np.argsort(events.track, kind="stable")
    track, kind = events.track[order], events.kind[order]
    time = _unwrap(events.ts[order], track, events.offset[order], int(events.ts[0]), source)
    new = np.concatenate(([True], track[1:] != track[:-1]))
    change = np.where(kind == BEGIN, 1, np.where(kind == END, -1, 0))
    depth = np.cumsum(change)
    track_base = np.maximum.accumulate(np.where(new, np.arange(len(track)), 0))
    depth = depth - (depth - change)[track_base]
    if np.any(depth < 0):
        at = order[int(np.argmax(depth < 0))]
        raise ImportFormatError(
            f"{source}: the slice end at byte {int(events.offset[at])} on track "
            f"{_name(tracks, int(events.track[at]))} closes no open slice"
        )
    paired = np.flatnonzero(kind != INSTANT)
    level = np.where(kind == BEGIN, depth, depth + 1)[paired]
    by_level = paired[np.lexsort((level, track[paired]))]
    # Per (track, level) the events alternate begin, end; a trailing begin stays open.
    lev = np.where(kind == BEGIN, depth, depth + 1)[by_level]
    same = np.concatenate(([False], (track[by_level][1:] == track[by_level][:-1])
                                    & (lev[1:] == lev[:-1])))  # fmt: skip
    is_end = kind[by_level] == END
    begins_closed = by_level[:-1][is_end[1:] & same[1:]]
    ends = by_level[1:][is_end[1:] & same[1:]]
    is_begin = kind == BEGIN
    closed = np.zeros(len(kind), bool)
    closed[begins_closed] = True
    open_begin = np.flatnonzero(is_begin & ~closed)
    instants = np.flatnonzero(kind == INSTANT)
    starts = np.concatenate((begins_closed, instants))
    stops = np.concatenate((ends, instants))
    name = events.name[order]
    return (time[starts], time[stops], track[starts], name[starts]), track[open_begin]


def _unwrap(
    raw: np.ndarray, track: np.ndarray, offset: np.ndarray, reference: int, source: str
) -> np.ndarray:
    """ns from ``reference``, per track in file order: each event follows the previous one
    of its track by less than half the 32-bit wrap, and each track's first event lies
    within half a wrap of the trace's first event."""
    new = np.concatenate(([True], track[1:] != track[:-1]))
    step = np.concatenate(([0], np.diff(raw) % WRAP))
    step[new] = 0
    if np.any(step >= AMBIGUOUS_STEP):
        at = int(np.argmax(step >= AMBIGUOUS_STEP))
        raise ImportFormatError(
            f"{source}: the track event at byte {int(offset[at])} follows the previous one of "
            f"its track by {int(step[at])} ns modulo the 32-bit ns counter's 4.29 s wrap: "
            "whether the counter wrapped in between cannot be decided"
        )
    heads = _offsets(raw[new], reference)
    if heads.max() - heads.min() >= AMBIGUOUS_STEP:
        raise ImportFormatError(
            f"{source}: the tracks' first events lie {int(heads.max() - heads.min())} ns apart "
            "modulo the 4.29 s wrap: their order cannot be decided"
        )
    last = heads + np.add.reduceat(step, np.flatnonzero(new))
    step[new] = heads - np.concatenate(([0], last[:-1]))
    return np.cumsum(step)


def _name(tracks: dict[int, _Track], uuid: int) -> str:
    track = tracks.get(uuid)
    return f"{uuid}" if track is None else f"{track.name!r} (uuid {uuid})"


def _dropped(tracks: np.ndarray, layout: _Layout, source: str) -> dict[tuple[int, int], int]:
    """Begins never closed, per core, warned about."""
    dropped: dict[tuple[int, int], int] = {}
    for uuid in tracks.tolist():
        key = layout.cores[uuid][:2]
        dropped[key] = dropped.get(key, 0) + 1
    if dropped:
        warnings.warn(
            f"{source}: {len(tracks)} slices begin and never end (the producer's buffer "
            "filled, or the trace was cut at a packet boundary): counted as dropped records",
            DroppedRecordsWarning,
            stacklevel=4,
        )
    return dropped


def _parents(
    tracks: dict[int, _Track],
    used: np.ndarray,
    depth: int,
    source: str,
    producer: str,
    expected: str,
) -> dict[int, list[_Track]]:
    """Each event track with its ``depth`` ancestors, nearest first."""
    chains = {}
    for uuid in used.tolist():
        if uuid not in tracks:
            raise ImportFormatError(
                f"{source}: track events on track {uuid}, which no descriptor of the trace "
                f"describes: not {producer}'s layout ({expected})"
            )
        chain = [tracks[uuid]]
        while len(chain) <= depth:
            parent = tracks.get(chain[-1].parent)
            if parent is None:
                raise _not_layout(source, chain[0], producer, expected)
            chain.append(parent)
        chains[uuid] = chain
    return chains


def _not_layout(source: str, track: _Track, producer: str, expected: str) -> ImportFormatError:
    return ImportFormatError(
        f"{source}: the track {track.name!r} (descriptor at byte {track.offset}) is not "
        f"{producer}'s layout ({expected}): another producer's trace?"
    )


def _names_by_id(options: ImportOptions, table: dict[int, str]) -> dict[str, int]:
    given = {int(k): str(v) for k, v in options.names.items()}
    return {name: key for key, name in {**table, **given}.items()}


def _numbering(known: dict[str, int], first: int) -> Callable[[str], int]:
    """Ids of names: the known ones, else the next free id from ``first`` in order asked."""
    taken = set(known.values())
    ids = dict(known)
    free = iter(i for i in range(first, 0x10000) if i not in taken)

    def number(name: str) -> int:
        if name not in ids:
            ids[name] = next(free)
        return ids[name]

    return number


def _flashinfer(
    tracks: dict[int, _Track], used: np.ndarray, options: ImportOptions, source: str
) -> _Layout:
    """Core = the SM of the ``SM_%03d`` process; owner = b of ``blk{b}_g0``; desc = the
    event index ``options.names`` gives the name, else first-seen order."""
    cores = {}
    expected = "blk{b}_g{g} tracks in SM_%03d"
    for uuid, (track, process) in _parents(tracks, used, 1, source, "FlashInfer", expected).items():
        own, sm = _FLASHINFER_TRACK.fullmatch(track.name), _SM.fullmatch(process.process or "")
        if own is None or sm is None:
            raise _not_layout(source, track, "FlashInfer", expected)
        if int(own[2]):
            raise ImportFormatError(
                f"{source}: track {track.name!r} (byte {track.offset}) names group {own[2]}: the "
                "capture had several groups per block, and FlashInfer's exporter files all "
                "groups of block b x ngroups + g under blk{b}_g{g}, interleaving their slices "
                "on one track; their spans cannot be told apart. Import the raw buffer instead"
            )
        cores[uuid] = (int(CoreType.SM), int(sm[1]), int(own[1]))
    number = _numbering(_names_by_id(options, {}), 0)
    return _Layout(cores, "Block", lambda name: (number(name), name, -1, 0, -1))


def _mpk(
    tracks: dict[int, _Track], used: np.ndarray, options: ImportOptions, source: str
) -> _Layout:
    """Core = CTA i of the ``block_{i}`` process; owner = the block (x 1000 + group where a
    group > 0 exists); desc = the task type of ``<NAME>_<event_no>``; task = block x 8192 +
    event_no, as the raw importer numbers them."""
    blocks = [t for t in tracks.values() if t.process is not None]
    if len(blocks) > MPK_WORKERS:
        raise ImportFormatError(
            f"{source}: the trace has {len(blocks)} block groups: MPK's tag holds the worker in "
            f"8 bits, so its exporter filed the records of block b >= {MPK_WORKERS} under "
            f"block_{{b % {MPK_WORKERS}}}, mixed with that block's: import the raw buffer instead"
        )
    cores, groups = {}, {}
    expected = "group_{g} tracks in group_{g} in block_{i}"
    for uuid, (track, group, process) in _parents(tracks, used, 2, source, "MPK", expected).items():
        block, own = _MPK_BLOCK.fullmatch(process.process or ""), _MPK_GROUP.fullmatch(group.name)
        if block is None or own is None or track.name != group.name:
            raise _not_layout(source, track, "MPK", expected)
        cores[uuid] = (int(CoreType.CTA), int(block[1]), int(own[1]))
        groups[uuid] = int(own[1])
    grouped = any(groups.values())
    cores = {u: (t, b, b * GROUP_RADIX + g if grouped else b) for u, (t, b, g) in cores.items()}
    number = _numbering(_names_by_id(options, MPK_TASK_NAMES), MPK_LOCAL_TYPES)

    def describe(name: str) -> tuple[int, str, int, int, int]:
        stage, _, event_no = name.rpartition("_")
        if not stage or not event_no.isdigit() or int(event_no) >= MPK_EVENT_NO:
            raise ImportFormatError(f"{source}: slice {name!r} is not MPK's <TASK_NAME>_<event_no>")
        desc = number(stage)
        return desc, stage, int(event_no), int(desc == SCHD_EVENTS), -1

    return _Layout(cores, "BlockX1000+Group" if grouped else "Block", describe)


def _triton(
    tracks: dict[int, _Track], used: np.ndarray, options: ImportOptions, source: str
) -> _Layout:
    """Core = the SM of the group track named by its id; owner = the block of
    ``<task>:<block>``; desc = the task type ``options.names`` gives the name, else
    first-seen order; ``scoreboard_wait_deps`` spans are waits of the block's next task."""
    cores = {}
    expected = "tracks named by an SM id in one so named, in a process"
    chains = _parents(tracks, used, 2, source, "Triton-distributed", expected)
    for uuid, (track, group, process) in chains.items():
        if (
            _TRITON_PROCESS.fullmatch(process.process or "") is None
            or not group.name.isdigit()
            or track.name != group.name
        ):
            raise _not_layout(source, track, "Triton-distributed", expected)
        cores[uuid] = (int(CoreType.SM), int(group.name), -1)
    number = _numbering(_names_by_id(options, {}), 0)

    def describe(name: str) -> tuple[int, str, int, int, int]:
        task, _, block = name.rpartition(":")
        if not task or not block.isdigit():
            raise ImportFormatError(
                f"{source}: slice {name!r} is not Triton-distributed's <task>:<block>"
            )
        aux = task.lower() in AUX_NAMES
        kind = 2 if task.lower() == WAIT_NAME else 3 if aux else 0
        return number(task), task, -1, kind, int(block)

    return _Layout(cores, "Block", describe)
