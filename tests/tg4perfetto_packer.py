"""``.perfetto-trace`` files in exactly tg4perfetto's layout (flashinfer-ai/tg4perfetto @
2c1248a, ``_core.py``/``_tgen.py``), written with Perfetto's generated protos, and the three
producers' exports from a raw buffer (FlashInfer ``flashinfer/profiler/__init__.py``, Mirage
``mpk/profiler_persistent.py``, Triton-distributed ``tools/profiler/viewer.py``), replayed
here so that one buffer gives both the raw file and its trace. Plus a synthetic FlashInfer
trace for the benchmark and a plain decode as its baseline."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb2
from tagged_packer import EMPTY_TRITON

FIRST_UUID = 1234567
SEQUENCE = 2
NEEDS_STATE = 2


class TraceWriter:
    """tg4perfetto's ``TraceGenerator``: the same packets, field for field, in the same
    order (its flushes only cut the stream of packets into several ``Trace`` messages,
    which on disk is the same bytes)."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._uuid = FIRST_UUID
        self._pid = 1
        self._iids: dict[str, int] = {}
        head = pb2.TracePacket(trusted_packet_sequence_id=1)
        for clock in range(1, 7):
            head.clock_snapshot.clocks.add(clock_id=clock, timestamp=0)
        head.clock_snapshot.primary_trace_clock = pb2.BUILTIN_CLOCK_BOOTTIME
        self._put(head)
        config = pb2.TracePacket(trusted_packet_sequence_id=1)
        config.trace_config.buffers.add().size_kb = 1024
        config.trace_config.data_sources.add().config.name = "track_event"
        self._put(config)
        defaults = pb2.TracePacket(trusted_packet_sequence_id=SEQUENCE, sequence_flags=1)
        defaults.trace_packet_defaults.track_event_defaults.track_uuid = 1
        defaults.trace_packet_defaults.timestamp_clock_id = 1
        self._put(defaults)

    def _put(self, packet: pb2.TracePacket) -> None:
        self._out.write(pb2.Trace(packet=[packet]).SerializeToString())

    def _event(self, ts: int) -> pb2.TracePacket:
        return pb2.TracePacket(
            timestamp=ts, trusted_packet_sequence_id=SEQUENCE, sequence_flags=NEEDS_STATE
        )

    def create_group(self, process_name: str, track_name: str | None = None) -> int:
        """A process track (``create_group``); its pid counts from 1 with every track."""
        packet = self._event(0)
        packet.track_descriptor.uuid = self._uuid
        packet.track_descriptor.process.pid = self._pid
        packet.track_descriptor.process.process_name = process_name
        packet.track_descriptor.name = process_name if track_name is None else track_name
        self._pid += 1
        return self._put_track(packet)

    def create_track(self, parent: int, name: str) -> int:
        """A child track (``Group.create_track``, ``create_group``, ``GroupTrack.create_track``
        all write this packet)."""
        packet = self._event(0)
        packet.track_descriptor.uuid = self._uuid
        packet.track_descriptor.name = name
        if parent:
            packet.track_descriptor.parent_uuid = parent
        self._pid += 1
        return self._put_track(packet)

    def _put_track(self, packet: pb2.TracePacket) -> int:
        self._put(packet)
        self._uuid += 1
        return self._uuid - 1

    def open(self, track: int, ts: int, name: str) -> None:
        packet = self._event(ts)
        if name not in self._iids:
            self._iids[name] = len(self._iids) + 1
            packet.interned_data.event_names.add(iid=self._iids[name], name=name)
        packet.track_event.name_iid = self._iids[name]
        packet.track_event.category_iids.append(1)
        packet.track_event.type = pb2.TrackEvent.TYPE_SLICE_BEGIN
        packet.track_event.track_uuid = track
        self._put(packet)

    def close(self, track: int, ts: int) -> None:
        packet = self._event(ts)
        packet.track_event.track_uuid = track
        packet.track_event.type = pb2.TrackEvent.TYPE_SLICE_END
        self._put(packet)

    def instant(self, track: int, ts: int, name: str) -> None:
        packet = self._event(ts)
        packet.track_event.category_iids.append(1)
        packet.track_event.type = pb2.TrackEvent.TYPE_INSTANT
        packet.track_event.track_uuid = track
        packet.track_event.name = name
        self._put(packet)


def _slots(buffer: np.ndarray, first: int) -> list[tuple[int, int]]:
    """``(tag, time)`` of each written slot from ``first`` on, in slot order."""
    return [(int(v) & 0xFFFF_FFFF, int(v) >> 32) for v in buffer[first:] if v != 0]


def flashinfer_trace(path: str | Path, buffer: np.ndarray, event_names: Sequence[str]) -> None:
    """FlashInfer's ``export_to_perfetto_trace``: one SM_%03d group per SM in order of first
    record, a ``blk{b}_g{g}`` track per (field // ngroups, field % ngroups) of the tag."""
    ngroups = int(buffer[0]) >> 32
    with open(path, "wb") as out:
        writer = TraceWriter(out)
        sms: dict[int, int] = {}
        tracks: dict[tuple[int, int], int] = {}
        for tag, ts in _slots(buffer, 1):
            sm, field, event, kind = tag >> 24, tag >> 12 & 0xFFF, tag >> 2 & 0x3FF, tag & 3
            if sm not in sms:
                sms[sm] = writer.create_group(f"SM_{sm:03d}")
            key = field // ngroups, field % ngroups
            if key not in tracks:
                tracks[key] = writer.create_track(sms[sm], f"blk{key[0]}_g{key[1]}")
            if kind == 0:
                writer.open(tracks[key], ts, event_names[event])
            elif kind == 1:
                writer.close(tracks[key], ts)
            elif kind == 2:
                writer.instant(tracks[key], ts, event_names[event])


def mpk_trace(path: str | Path, buffer: np.ndarray, names: dict[int, str]) -> None:
    """Mirage's ``export_to_perfetto_trace``: a ``block_{i}`` group per block and a
    ``group_{g}`` group in it, created up front; one track per (worker field, group, task
    type); slices ``<name>_<event_no>``."""
    nblocks, ngroups = int(buffer[0]) & 0xFFFF_FFFF, int(buffer[0]) >> 32
    with open(path, "wb") as out:
        writer = TraceWriter(out)
        groups = {}
        for block in range(nblocks):
            process = writer.create_group(f"block_{block}")
            for group in range(ngroups):
                groups[block, group] = (writer.create_track(process, f"group_{group}"), group)
        tracks: dict[tuple[int, int, int], int] = {}
        for tag, ts in _slots(buffer, 1):
            field, event, kind = tag >> 11 & 0xFF, tag >> 2 & 0x1FF, tag & 3
            key = field // ngroups, field % ngroups, event
            name = f"{names[event]}_{tag >> 19}"
            if key not in tracks:
                parent, group = groups[key[:2]]
                tracks[key] = writer.create_track(parent, f"group_{group}")
            if kind == 0:
                writer.open(tracks[key], ts, name)
            elif kind == 1:
                writer.close(tracks[key], ts)
            elif kind == 2:
                writer.instant(tracks[key], ts, name)


def triton_trace(path: str | Path, buffer: np.ndarray, task_names: Sequence[str]) -> None:
    """Triton-distributed's ``export_to_perfetto_trace``: spans paired per (block, group,
    type), sorted by raw start, then laid greedily on sub-tracks of a group per SM."""
    nblocks, ngroups = int(buffer[0]) & 0xFFFF_FFFF, int(buffer[0]) >> 32
    meta = [(int(v) & 0xFFFF_FFFF, int(v) >> 32) for v in buffer[1 : 1 + nblocks]]
    with open(path, "wb") as out:
        writer = TraceWriter(out)
        master = writer.create_group("tracks of all SMs") if ngroups == 1 else 0
        sm_of = {}
        parents = {}
        for block, sm in meta:
            sm_of[block] = sm
            parents[block] = master or writer.create_group(f"block_{block}_sm_{sm}")
        opened: dict[tuple[int, int, int], int] = {}
        spans = []
        for tag, ts in _slots(buffer, 1 + nblocks):
            if (tag | ts << 32) == EMPTY_TRITON:
                continue
            field, kind = tag >> 12, tag >> 1 & 0x7FF
            key = field // ngroups, field % ngroups, kind
            if tag & 1:
                opened[key] = ts
            else:
                spans.append((key[0], kind, opened.pop(key), ts))
        spans.sort(key=lambda span: span[2])
        trackers: dict[int, tuple[int, list[list[int]]]] = {}
        for block, kind, start, end in spans:
            sm = sm_of[block]
            if sm not in trackers:
                trackers[sm] = (writer.create_track(parents[block], str(sm)), [])
            group, lanes = trackers[sm]
            lane = next((lane for lane in lanes if lane[1] <= start), None)
            if lane is None:
                lane = [writer.create_track(group, str(sm)), end]
                lanes.append(lane)
            lane[1] = end
            writer.open(lane[0], start, f"{task_names[kind]}:{block}")
            writer.close(lane[0], end)


def write_synthetic(path: str | Path, records: int) -> int:
    """A FlashInfer trace of about ``records`` slices on 132 SMs (one group): each block
    alternates events 0..8 with 100 ns steps, exported as FlashInfer does. Returns the
    slices."""
    nblocks = 132
    rows = max(2, (records // nblocks) * 2)
    k = np.arange(rows, dtype=np.uint64)[:, None]
    block = np.arange(nblocks, dtype=np.uint64)[None, :]
    tag = k % 2 | (k // 2 % 9) << np.uint64(2) | block << np.uint64(12) | block << np.uint64(24)
    time = np.uint64(1000) + k * np.uint64(100) + block
    buffer = np.empty(1 + rows * nblocks, dtype=np.uint64)
    buffer[0] = nblocks | 1 << 32
    buffer[1:] = (tag | time << np.uint64(32)).reshape(-1)
    flashinfer_trace(path, buffer, [f"event_{i}" for i in range(9)])
    return rows * nblocks // 2


def numpy_decode(path: str | Path) -> int:
    """The baseline: the trace's track events counted by Perfetto's own protos, a block of
    packets at a time, no mapping and no checks."""
    data = Path(path).read_bytes()
    events = 0
    for packet in pb2.Trace.FromString(data).packet:
        events += packet.HasField("track_event")
    return events
