"""The Perfetto writer: a ``Timeline`` of records of the store as Perfetto's own protobuf
trace (``.pftrace``), which Perfetto parses fastest and which is a fraction of the JSON's
size.

What the trace holds, against the Chrome JSON of the same selection (``chrome_trace``):

- one track per (run, rank), named as the JSON's process, and under it one track per core
  (``AIC/3``) and sub-track (``AIC/3 overlap 1``) in the JSON's thread order: explicit
  ``sibling_order_rank``, never merged by name;
- on each core track, an invocation slice per invocation (named by its kernel, category
  ``MegaKernelInvocation``) whose debug annotations are what the invocation and core fix:
  rank, device_id, core_type, block_id, core_entry_cycle, invocation_id, step, direction.
  Inside it, a slice per record with the JSON's name and the record's own annotations
  (task_id, desc_id, task_type, stage_task_index, task_number, owner_id, start_cycle,
  end_cycle, critical): JSON repeats the first eight on every event, Perfetto is told them
  once per core and invocation. A track on which invocations overlap in time (or a core's
  invocation is not one stretch of its records) has no invocation slices: its record
  slices carry all the annotations instead;
- the dependency arrows and the critical path's chain as flows: the id in ``flow_ids`` of
  the slice a flow leaves and in ``terminating_flow_ids`` of the end of the slice it
  enters (``Timeline(flow_ids=True)``). A flow that would end before it begins (a wait
  that ended before its trigger started) cannot be drawn this way and is counted instead;
- the ``megaKernelCycleTrace`` object as a JSON file beside the trace
  (``<trace>.meta.json``; ``sidecar_path``), and a summary of each process in its track's
  description.

Incremental state: every packet is on one trusted sequence (the writer's one thread). Its
first packet clears the incremental state, declares the clock of every timestamp (ns of
``BUILTIN_CLOCK_BOOTTIME``, the trace's own clock, in the sequence's packet defaults) and
interns every name an event uses (event names and categories, annotation names, the
direction strings), so each is defined before its first use; every event then says it
needs that state. The track descriptors follow, then the events, group by group: on each
track in nesting order (a slice's begin, its children, its end), so timestamps never
decrease along a track, and packets of one sequence with equal timestamps are imported in
file order.

Encoding: each group's packets are encoded a field at a time over whole columns by
``proto_rows.Messages`` and written in one buffer; memory grows with the group, not the
selection. The header and descriptors (a few hundred packets) go through the same
encoder. Field numbers and types are those of Perfetto's protos (protos/perfetto/trace/):
``trace.proto`` (Trace.packet = 1), ``trace_packet.proto`` (TracePacket: timestamp 8,
trusted_packet_sequence_id 10, track_event 11, interned_data 12, sequence_flags 13,
trace_packet_defaults 59, track_descriptor 60, first_packet_on_sequence 87),
``trace_packet_defaults.proto`` (timestamp_clock_id 58), ``track_event/track_event.proto``
(category_iids 3, debug_annotations 4, type 9, name_iid 10, track_uuid 11, flow_ids 47,
terminating_flow_ids 48), ``track_event/debug_annotation.proto`` (name_iid 1, uint_value 3,
int_value 4, string_value_iid 17), ``track_event/track_descriptor.proto`` (uuid 1, name 2,
parent_uuid 5, child_ordering 11, sibling_order_rank 12, description 14,
sibling_merge_behavior 15), ``interned_data/interned_data.proto`` (event_categories 1,
event_names 2, debug_annotation_names 3, debug_annotation_string_values 29; each entry
iid 1, name or str 2) and ``common/builtin_clock.proto`` (BOOTTIME 6).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from multicore_profiler.abi import NO_OWNER
from multicore_profiler.errors import ExportError
from multicore_profiler.export.chrome_trace import CATEGORY
from multicore_profiler.export.files import ExportedTrace, aside_sink, gzipped, written_aside
from multicore_profiler.export.proto_rows import Fragments, Messages, encode_field
from multicore_profiler.export.timeline import (
    GROUP_ROWS,
    LayoutChanged,
    RecordSelection,
    Timeline,
    TimelineGroup,
    numpy_column,
    open_timeline,
    task_types,
)
from multicore_profiler.prefetch import ahead
from multicore_profiler.progress import progress
from multicore_profiler.storage.store import Store

INVOCATION_CATEGORY = "MegaKernelInvocation"
"""The category of the invocation slices (the records' is the JSON's, ``CATEGORY``)."""
SEQUENCE_ID = 1
"""The trusted packet sequence of every packet: the writer's one thread."""
CLOCK_BOOTTIME = 6

CONTEXT_ARGS = (
    "rank",
    "device_id",
    "core_type",
    "block_id",
    "core_entry_cycle",
    "invocation_id",
    "step",
    "direction",
)
"""The annotations an invocation and core fix: the invocation slice's."""
RECORD_ARGS = (
    "task_id",
    "desc_id",
    "task_type",
    "stage_task_index",
    "task_number",
    "owner_id",
    "start_cycle",
    "end_cycle",
    "critical",
)
"""A record's own annotations, in the JSON's order (task_type, owner_id and critical only
where the JSON has them)."""

_PACKET = 1
_TIMESTAMP, _SEQUENCE, _TRACK_EVENT, _INTERNED, _FLAGS = 8, 10, 11, 12, 13
_DEFAULTS, _DESCRIPTOR, _FIRST_ON_SEQUENCE = 59, 60, 87
_DEFAULT_CLOCK = 58
_CATEGORY_IIDS, _ANNOTATION, _TYPE, _NAME_IID, _TRACK_UUID = 3, 4, 9, 10, 11
_FLOW_IDS, _TERMINATING_FLOW_IDS = 47, 48
_ANNOTATION_NAME, _UINT, _INT, _STRING_IID = 1, 3, 4, 17
_UUID, _TRACK_NAME, _PARENT, _CHILD_ORDERING, _ORDER_RANK = 1, 2, 5, 11, 12
_DESCRIPTION, _MERGE_BEHAVIOR = 14, 15
_INTERNED_CATEGORIES, _INTERNED_NAMES, _INTERNED_ARGS, _INTERNED_STRINGS = 1, 2, 3, 29
_SLICE_BEGIN, _SLICE_END = 1, 2
_INCREMENTAL_STATE_CLEARED, _NEEDS_INCREMENTAL_STATE = 1, 2
_EXPLICIT_ORDER, _NEVER_MERGE = 3, 2

PERFETTO_GROUP_ROWS = GROUP_ROWS // 2
"""Records of a timeline group: half the JSON writer's, as up to three groups are in memory
at once (one encoded, the next made, and the one after that being made: ``prefetch.ahead``);
at 5 M records this keeps a fresh process under 500 MB for about 5 % more time."""
PACKET_CHUNK = 1 << 16
"""Packets encoded at once: the arrays of their fields stay a few tens of MB, whatever the
size of a group."""

_ARG_IIDS = {name: number for number, name in enumerate(CONTEXT_ARGS + RECORD_ARGS, start=1)}
_RECORD_CATEGORY_IID, _INVOCATION_CATEGORY_IID = 1, 2


def sidecar_path(path: Path) -> Path:
    """Where the ``megaKernelCycleTrace`` object of the trace at ``path`` goes:
    ``run.pftrace`` (or ``run.pftrace.gz``) -> ``run.pftrace.meta.json``."""
    name = path.name[: -len(path.suffix)] if gzipped(path) else path.name
    return path.with_name(name + ".meta.json")


def export_perfetto_trace(
    store: Store,
    path: str | os.PathLike[str],
    *,
    run: str | Sequence[str] | None = None,
    step: int | None = None,
    invocation: int | None = None,
    rank: int | None = None,
    window: int | None = None,
    where: str | None = None,
    query: str | None = None,
    detailed_task_names: bool = False,
    selection: RecordSelection | None = None,
    critical_path: bool = False,
    clock_correction: bool = False,
) -> ExportedTrace:
    """Write the Perfetto trace of records of the store to ``path`` (gzipped if it ends in
    ``.gz``) and its ``megaKernelCycleTrace`` object to ``sidecar_path(path)``; return what
    was written (``events`` counts the track events).

    The records, names, ``critical_path`` marks and ``clock_correction`` are chosen as
    ``export_chrome_trace`` chooses them, with the same errors (a correction is said in the
    sidecar's ``clockCorrection`` and in each process track's description, which
    Perfetto's UI shows with the track); also ``ExportError`` for a record that ends before
    it starts (a query's made-up cycles): a Perfetto slice cannot. Nothing is left behind
    on an error (both files are written aside and renamed into place, the trace last).
    """
    selected = RecordSelection.given(
        selection, run, step, invocation, rank, window, where, query
    ).resolve(store)
    path = Path(path)
    sidecar = sidecar_path(path)
    gz = gzipped(path)
    with (
        written_aside(path, ExportError, "the trace") as aside,
        written_aside(sidecar, ExportError, "the trace's metadata") as sidecar_aside,
        open_timeline(
            store,
            selected,
            detailed_task_names=detailed_task_names,
            scratch_dir=aside.parent,
            group_rows=PERFETTO_GROUP_ROWS,
            critical_path=critical_path,
            clock_correction=clock_correction,
            flow_ids=True,
        ) as timeline,
    ):
        try:
            written = _write(timeline, aside, gz, sidecar.name)
        except LayoutChanged:
            written = _write(timeline, aside, gz, sidecar.name)
        sidecar_aside.write_bytes(orjson.dumps(written.metadata, option=orjson.OPT_INDENT_2))
    return ExportedTrace(
        path=path,
        events=written.track_events,
        records=timeline.records,
        flows=written.metadata["flowCount"],
        metadata=written.metadata,
        critical_flows=written.metadata.get("criticalFlowCount", 0),
    )


@dataclass(frozen=True)
class _Written:
    metadata: dict[str, Any]
    track_events: int


def _write(timeline: Timeline, aside: Path, gz: bool, sidecar_name: str) -> _Written:
    """One pass over the timeline's groups into ``aside``: the header, the track
    descriptors, then each group's packets (``LayoutChanged`` when the pass finds lanes)."""
    layout = _Layout(timeline)
    counts = _Counts()
    with (
        aside_sink(aside, gz) as sink,
        progress(total=timeline.records, desc="export", unit="record") as bar,
    ):
        sink.write(_header(layout))
        sink.write(_descriptors(timeline, layout, sidecar_name))
        for group in ahead(timeline.groups(), "mcprof-timeline"):
            for packets in _group_packets(group, layout, counts):
                sink.write(packets.data)
            bar.update(group.slices.num_rows)
    assert timeline.metadata is not None
    return _Written(_metadata(timeline.metadata, layout, counts), counts.track_events)


@dataclass
class _Counts:
    """What the packets of a pass hold beyond the timeline's own counts."""

    track_events: int = 0
    invocation_slices: int = 0
    undrawn_flows: int = 0
    context_tracks: int = 0


class _Layout:
    """What every group's packets look up: track uuids, each ``cores`` row's annotations,
    the interned ids of names, and the shift that keeps timestamps unsigned."""

    def __init__(self, timeline: Timeline) -> None:
        processes, tracks, cores = timeline.processes, timeline.tracks, timeline.cores
        self.process_pids = numpy_column(processes, "pid").astype(np.int64)
        keys = _track_key(numpy_column(tracks, "pid"), numpy_column(tracks, "tid"))
        self._track_order = np.argsort(keys, kind="stable")
        self._sorted_keys = keys[self._track_order]
        self.first_track_uuid = processes.num_rows + 1
        directions = cores["direction"].combine_chunks().dictionary_encode()
        self.directions: list[str] = directions.dictionary.to_pylist()
        self.context = _context_table(cores, directions.indices.to_numpy())
        kernels = timeline.invocations["kernel_name"].combine_chunks().dictionary_encode()
        self.names = [*timeline.names, *kernels.dictionary.to_pylist()]
        invocation_kernel = kernels.indices.to_numpy().astype(np.int64)
        self.core_kernel_iid = (
            invocation_kernel[numpy_column(cores, "inv_index")] + len(timeline.names) + 1
        )
        self.shift = max(0, -timeline.spans.ts[0])
        self.cores = cores

    def track_uuid(self, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """The uuid of the track of each (pid, tid)."""
        found = np.searchsorted(self._sorted_keys, _track_key(pid, tid))
        return self._track_order[found].astype(np.int64) + self.first_track_uuid


def _track_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return pid.astype(np.int64) * (1 << 32) + tid.astype(np.int64)


def _context_table(cores: pa.Table, direction_codes: np.ndarray) -> Fragments:
    """Each ``cores`` row's context annotations (``CONTEXT_ARGS``) as encoded
    ``debug_annotations`` fields."""
    rows = cores.num_rows
    values: dict[str, tuple[int, np.ndarray]] = {
        "rank": _typed(numpy_column(cores, "rank")),
        "device_id": _typed(numpy_column(cores, "device")),
        "core_type": _typed(numpy_column(cores, "core_type")),
        "block_id": _typed(numpy_column(cores, "block_id")),
        "core_entry_cycle": _typed(numpy_column(cores, "entry_cycle")),
        "invocation_id": _typed(numpy_column(cores, "invocation_id")),
        "step": _typed(numpy_column(cores, "step")),
        "direction": (_STRING_IID, direction_codes.astype(np.int64) + 1),
    }
    context = Messages(rows)
    for name in CONTEXT_ARGS:
        field, column = values[name]
        context.message(_ANNOTATION, _annotation(rows, name).varint(field, column))
    lengths = context.sizes().astype(np.int64)
    flat = np.frombuffer(context.encode(), np.uint8)
    return Fragments(flat, np.cumsum(lengths) - lengths, lengths, False)


def _typed(values: np.ndarray) -> tuple[int, np.ndarray]:
    """The annotation field of a column of integers: ``uint_value`` for unsigned types,
    ``int_value`` for signed ones, as the store types them."""
    unsigned = np.issubdtype(values.dtype, np.unsignedinteger)
    return (_UINT if unsigned else _INT), values


def _annotation(rows: int, name: str) -> Messages:
    """``rows`` debug annotations named ``name`` (by its interned id), to add a value to."""
    return Messages(rows).raw(encode_field(_ANNOTATION_NAME, _ARG_IIDS[name]))


def _header(layout: _Layout) -> bytes:
    """The first packet: it clears the sequence's incremental state, sets the clock of
    every timestamp and interns every name the events use."""
    entries = [
        (_INTERNED_CATEGORIES, [CATEGORY, INVOCATION_CATEGORY]),
        (_INTERNED_NAMES, layout.names),
        (_INTERNED_ARGS, list(_ARG_IIDS)),
        (_INTERNED_STRINGS, layout.directions),
    ]
    interned = b"".join(
        encode_field(field, encode_field(1, iid) + encode_field(2, name))
        for field, names in entries
        for iid, name in enumerate(names, start=1)
    )
    packet = (
        encode_field(_SEQUENCE, SEQUENCE_ID)
        + encode_field(_INTERNED, interned)
        + encode_field(_FLAGS, _INCREMENTAL_STATE_CLEARED)
        + encode_field(_DEFAULTS, encode_field(_DEFAULT_CLOCK, CLOCK_BOOTTIME))
        + encode_field(_FIRST_ON_SEQUENCE, 1)
    )
    return encode_field(_PACKET, packet)


def _descriptors(timeline: Timeline, layout: _Layout, sidecar_name: str) -> bytes:
    """A track descriptor packet per process, then per core track and sub-track."""
    packets = []
    for number, process in enumerate(timeline.processes.to_pylist(), start=1):
        descriptor = (
            encode_field(_UUID, number)
            + encode_field(_TRACK_NAME, process["name"])
            + encode_field(_CHILD_ORDERING, _EXPLICIT_ORDER)
            + encode_field(_ORDER_RANK, process["sort_index"])
            + encode_field(_DESCRIPTION, _description(timeline, process, sidecar_name))
        )
        packets.append(descriptor)
    tracks = timeline.tracks.select(["pid", "name", "sort_index"]).to_pylist()
    parents = np.searchsorted(
        layout.process_pids, numpy_column(timeline.tracks, "pid").astype(np.int64)
    )
    for number, (track, parent) in enumerate(zip(tracks, parents.tolist(), strict=True)):
        descriptor = (
            encode_field(_UUID, layout.first_track_uuid + number)
            + encode_field(_TRACK_NAME, track["name"])
            + encode_field(_PARENT, parent + 1)
            + encode_field(_ORDER_RANK, track["sort_index"])
            + encode_field(_MERGE_BEHAVIOR, _NEVER_MERGE)
        )
        packets.append(descriptor)
    return b"".join(
        encode_field(
            _PACKET, encode_field(_SEQUENCE, SEQUENCE_ID) + encode_field(_DESCRIPTOR, descriptor)
        )
        for descriptor in packets
    )


def _description(timeline: Timeline, process: dict[str, Any], sidecar_name: str) -> str:
    """What a process track says of itself: its run and rank, invocations, records, clock
    and dropped records, and where the whole ``megaKernelCycleTrace`` object is."""
    mine = [
        i
        for i in timeline.invocations.to_pylist()
        if i["run_id"] == process["run_id"] and i["rank"] == process["rank"]
    ]
    megahertz = ", ".join(f"{f / 1e6:g}" for f in dict.fromkeys(i["frequency_hz"] for i in mine))
    dropped = sum(i["dropped_count"] for i in mine)
    partial = int(sum(timeline.partial_dropped[i["inv_index"]] for i in mine))
    text = (
        f"MegaKernel records of run {process['run_id']} rank {process['rank']}: "
        f"{len(mine)} invocation(s), {sum(i['selected'] for i in mine)} records, "
        f"cycles at {megahertz} MHz from anchor cycle {process['anchor']}"
    )
    if dropped > partial:
        text += f"; the device dropped {dropped - partial} records (full slots)"
    if partial:
        text += f"; the device dropped {partial} records on slots that were not full"
    text += f". Selection: {timeline.described}"
    if timeline.clock_correction is not None:
        text += f". {_correction_text(timeline.clock_correction, process)}"
    return f"{text}. Metadata: {sidecar_name}."


def _correction_text(moved: pa.Table, process: dict[str, Any]) -> str:
    """The clock correction applied to a process's cores, in words: each moved core with
    its offset, or that none of its cores was moved."""
    mine = [
        row
        for row in moved.to_pylist()
        if row["run_id"] == process["run_id"] and row["rank"] == process["rank"]
    ]
    if not mine:
        return "Clock correction applied: no core of this rank was moved"
    cores = ", ".join(
        f"invocation {r['invocation_id']} {r['core']}/{r['block_id']} "
        f"{r['offset_cycles']:+d} cycles ({r['offset_ns']:+g} ns)"
        for r in mine
    )
    return f"Clock correction applied (offsets added to the recorded cycles): {cores}"


def _group_packets(group: TimelineGroup, layout: _Layout, counts: _Counts) -> Iterator[np.ndarray]:
    """The packets of one group in file order, ``PACKET_CHUNK`` at a time: each track's
    invocation slices and record slices, begin and end, in nesting order; every field of a
    chunk's packets encoded over whole columns."""
    slices = group.slices
    uuid = layout.track_uuid(numpy_column(slices, "pid"), numpy_column(slices, "tid"))
    order = np.argsort(uuid, kind="stable")
    uuid = uuid[order]
    slices = slices.take(pa.array(order))
    ts = numpy_column(slices, "ts_ns").astype(np.int64)
    end = numpy_column(slices, "end_ns").astype(np.int64)
    core = numpy_column(slices, "core").astype(np.int64)
    _refuse_backwards(slices, ts, end, layout)
    slices = _once_each(_once_each(slices, "flows_out"), "flows_in")
    # What the begins and the ends read, each taken alone for the rows of a chunk.
    starting = slices.drop_columns(["pid", "tid", "core", "ts_ns", "end_ns", "flows_in"])
    entering = slices.select(["flows_in"])
    nesting = _Nesting(uuid, ts, end, core)
    counts.context_tracks += nesting.context_tracks
    counts.invocation_slices += len(nesting.parent_first)
    drawn = len(_flow_lists(slices, "flows_in")[0])  # one id per flow, once each
    counts.undrawn_flows += (0 if group.flows is None else group.flows.num_rows) - drawn
    shift, parents = layout.shift, nesting.parent_first
    kinds: list[tuple[Callable[[np.ndarray], Messages], np.ndarray]] = [
        (
            lambda rows: _record_begins(
                starting.take(rows),
                uuid[rows],
                ts[rows] + shift,
                core[rows],
                nesting.inline[rows],
                layout,
            ),
            nesting.begin_key,
        ),
        (
            lambda rows: _record_ends(entering.take(rows), uuid[rows], end[rows] + shift),
            nesting.end_key,
        ),
        (
            lambda rows: _invocation_begins(
                uuid[parents[rows]], ts[parents[rows]] + shift, core[parents[rows]], layout
            ),
            8 * parents,
        ),
        (
            lambda rows: _invocation_ends(uuid[parents[rows]], nesting.parent_end[rows] + shift),
            8 * nesting.parent_stop - 1,
        ),
    ]
    keys = np.concatenate([key for _, key in kinds])
    kind = np.repeat(np.arange(len(kinds)), [len(key) for _, key in kinds])
    row = np.concatenate([np.arange(len(key)) for _, key in kinds])
    emitted = np.argsort(keys, kind="stable")
    counts.track_events += len(keys)
    for first in range(0, len(emitted), PACKET_CHUNK):
        picked = emitted[first : first + PACKET_CHUNK]
        built = []
        for number, (build, _) in enumerate(kinds):
            place = np.flatnonzero(kind[picked] == number)
            if len(place):
                built.append((build(row[picked[place]]), place))
        sizes = np.zeros(len(picked), dtype=np.int64)
        for messages, place in built:
            sizes[place] = messages.sizes()
        at = np.cumsum(sizes) - sizes
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        for messages, place in built:
            messages.write_into(out, at[place])
        yield out


def _refuse_backwards(slices: pa.Table, ts: np.ndarray, end: np.ndarray, layout: _Layout) -> None:
    """``ExportError`` naming the first record that ends before it starts."""
    backwards = np.flatnonzero(end < ts)
    if not backwards.size:
        return
    row = int(backwards[0])
    core = layout.cores.slice(int(numpy_column(slices, "core")[row]), 1).to_pylist()[0]
    raise ExportError(
        f"a record of invocation {core['invocation_id']} rank {core['rank']} on core "
        f"{core['core_type']}/{core['block_id']} ends before it starts (start_cycle "
        f"{slices['start_cycle'][row]}, end_cycle {slices['end_cycle'][row]}): a Perfetto "
        "slice cannot"
    )


class _Nesting:
    """Where each packet of a group goes: the sort keys of the record slices' begins and
    ends and of the invocation slices (one per run of a ``cores`` row on a track), and which
    record slices carry their context themselves.

    Slices come in track order, each track's slices by start, longest first; on a track
    they nest or follow one another (the timeline's lanes see to it), so a slice ends just
    before the first later slice that starts at or after its end, after the slices opened
    since (its children). A record's begin or end at position q of its track's nesting
    order gets key 4q + 2 (positions count from twice the track's first slice); an
    invocation slice over records [first, stop) begins at 8 first and ends at 8 stop - 1:
    around its records, between the neighbouring ones'.
    """

    def __init__(self, uuid: np.ndarray, ts: np.ndarray, end: np.ndarray, core: np.ndarray):
        count = len(uuid)
        self.begin_key = np.empty(count, dtype=np.int64)
        self.end_key = np.empty(count, dtype=np.int64)
        self.inline = np.zeros(count, dtype=bool)
        firsts, stops, parent_ends = [], [], []
        self.context_tracks = 0
        edges = np.concatenate([[0], np.flatnonzero(np.diff(uuid)) + 1, [count]]).tolist()
        for first, stop in itertools.pairwise(edges):
            track_ts, track_end = ts[first:stop], end[first:stop]
            begin, finish = _nesting_order(track_ts, track_end)
            self.begin_key[first:stop] = 4 * (2 * first + begin) + 2
            self.end_key[first:stop] = 4 * (2 * first + finish) + 2
            runs = np.concatenate(
                [[0], np.flatnonzero(np.diff(core[first:stop])) + 1, [stop - first]]
            )
            run_end = np.maximum.reduceat(track_end, runs[:-1])
            disjoint = (track_ts[runs[1:-1]] >= run_end[:-1]).all()
            once = len(np.unique(core[first:stop][runs[:-1]])) == len(runs) - 1
            if disjoint and once:
                firsts.append(runs[:-1] + first)
                stops.append(runs[1:] + first)
                parent_ends.append(run_end)
            else:
                self.inline[first:stop] = True
                self.context_tracks += 1
        self.parent_first = np.concatenate(firsts) if firsts else np.zeros(0, np.int64)
        self.parent_stop = np.concatenate(stops) if stops else np.zeros(0, np.int64)
        self.parent_end = np.concatenate(parent_ends) if parent_ends else np.zeros(0, np.int64)


def _nesting_order(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions of each slice's begin and end among the 2n events of one track whose
    slices (by start, longest first) nest or follow one another: slice i ends just before
    the begin of the first slice j > i that starts at or after its end (or last), and the
    slices that end before the same begin end innermost (latest opened) first."""
    count = len(ts)
    index = np.arange(count, dtype=np.int64)
    closer = np.maximum(index + 1, np.searchsorted(ts, end, side="left"))
    width = count + 2
    keys = np.concatenate([index * width + width - 1, closer * width + (count - index)])
    position = np.empty(2 * count, dtype=np.int64)
    position[np.argsort(keys, kind="stable")] = np.arange(2 * count)
    return position[:count], position[count:]


def _event(rows: int, kind: int, uuid: np.ndarray) -> Messages:
    """The start of ``rows`` track events: none of their fields below ``type`` (9)."""
    return Messages(rows).raw(encode_field(_TYPE, kind)).varint(_TRACK_UUID, uuid)


def _packets(timestamps: np.ndarray, events: Messages) -> Messages:
    """Track events as framed packets (``Trace.packet``) of the writer's sequence."""
    packet = (
        Messages(events.rows)
        .varint(_TIMESTAMP, timestamps)
        .raw(encode_field(_SEQUENCE, SEQUENCE_ID))
        .message(_TRACK_EVENT, events)
        .raw(encode_field(_FLAGS, _NEEDS_INCREMENTAL_STATE))
    )
    return Messages(events.rows).message(_PACKET, packet)


def _flow_lists(slices: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:
    """The flat ids and the offsets of a list column of flow ids."""
    lists = slices[column].combine_chunks()
    lengths = lists.value_lengths().to_numpy(zero_copy_only=False)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return lists.flatten().to_numpy(), offsets


def _once_each(slices: pa.Table, column: str) -> pa.Table:
    """``slices`` with each flow id of a list column on its first slice only: two rows of a
    query can share a record's identity (invocation, core, cycles, desc and task id) and
    differ in another column, and both match the flows of that record, but a flow leaves
    one slice and enters one (a second begin would make the flow a step through the
    other)."""
    flat, offsets = _flow_lists(slices, column)
    if len(np.unique(flat)) == len(flat):
        return slices
    rows = np.repeat(np.arange(slices.num_rows), np.diff(offsets))
    first = np.zeros(len(flat), dtype=bool)
    first[np.unique(flat, return_index=True)[1]] = True
    counts = np.bincount(rows[first], minlength=slices.num_rows)
    kept = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(kept), pa.array(flat[first], pa.uint64()))
    return slices.set_column(slices.schema.get_field_index(column), column, lists)


def _record_begins(
    slices: pa.Table,
    uuid: np.ndarray,
    ts: np.ndarray,
    core: np.ndarray,
    inline: np.ndarray,
    layout: _Layout,
) -> Messages:
    """Each record slice's SLICE_BEGIN: its name and category, its annotations (its
    context first where its track has no invocation slices), its outgoing flows."""
    rows = slices.num_rows
    desc = numpy_column(slices, "desc_id")
    index = numpy_column(slices, "stage_task_index")
    owner = numpy_column(slices, "owner_id")
    shown, task_type = task_types(slices)
    values: list[tuple[str, np.ndarray | int, np.ndarray | None]] = [
        ("task_id", numpy_column(slices, "task_id"), None),
        ("desc_id", desc, None),
        ("task_type", task_type, shown),
        ("stage_task_index", index, None),
        ("task_number", index.astype(np.uint64) + 1, None),
        ("owner_id", owner, owner != NO_OWNER),
        ("start_cycle", numpy_column(slices, "start_cycle"), None),
        ("end_cycle", numpy_column(slices, "end_cycle"), None),
    ]
    if "critical" in slices.column_names:
        values.append(("critical", 1, numpy_column(slices, "critical").astype(bool)))
    events = (
        Messages(rows)
        .raw(encode_field(_CATEGORY_IIDS, _RECORD_CATEGORY_IID))
        .lookup(layout.context, core, present=inline)
    )
    for name, column, present in values:
        events.message(_ANNOTATION, _annotation(rows, name).varint(_UINT, column), present)
    events.raw(encode_field(_TYPE, _SLICE_BEGIN))
    events.varint(_NAME_IID, numpy_column(slices, "name").astype(np.int64) + 1)
    events.varint(_TRACK_UUID, uuid)
    events.repeated_fixed64(_FLOW_IDS, *_flow_lists(slices, "flows_out"))
    return _packets(ts, events)


def _record_ends(slices: pa.Table, uuid: np.ndarray, end: np.ndarray) -> Messages:
    """Each record slice's SLICE_END, with the flows that enter it."""
    events = _event(slices.num_rows, _SLICE_END, uuid)
    events.repeated_fixed64(_TERMINATING_FLOW_IDS, *_flow_lists(slices, "flows_in"))
    return _packets(end, events)


def _invocation_begins(
    uuid: np.ndarray, ts: np.ndarray, core: np.ndarray, layout: _Layout
) -> Messages:
    """Each invocation slice's SLICE_BEGIN: its kernel's name and the core's context."""
    events = (
        Messages(len(uuid))
        .raw(encode_field(_CATEGORY_IIDS, _INVOCATION_CATEGORY_IID))
        .lookup(layout.context, core)
        .raw(encode_field(_TYPE, _SLICE_BEGIN))
        .varint(_NAME_IID, layout.core_kernel_iid[core])
        .varint(_TRACK_UUID, uuid)
    )
    return _packets(ts, events)


def _invocation_ends(uuid: np.ndarray, end: np.ndarray) -> Messages:
    """Each invocation slice's SLICE_END."""
    return _packets(end, _event(len(uuid), _SLICE_END, uuid))


def _metadata(summary: dict[str, Any], layout: _Layout, counts: _Counts) -> dict[str, Any]:
    """The timeline's ``megaKernelCycleTrace`` object, with what the Perfetto trace adds:
    its clock and timestamp shift, its track events and invocation slices, and warnings for
    flows it cannot draw and tracks whose records carry their context."""
    metadata = dict(summary)
    warnings = list(summary["warnings"])
    if counts.undrawn_flows:
        warnings.append(
            f"{counts.undrawn_flows} flow(s) end before they begin (a wait that ended before "
            "its trigger started): the Perfetto trace cannot draw them"
        )
    if counts.context_tracks:
        warnings.append(
            f"on {counts.context_tracks} track(s) invocations overlap in time: their record "
            "slices carry the invocation's annotations themselves"
        )
    if layout.shift:
        warnings.append(
            f"a record starts before its process's anchor: every timestamp is shifted by "
            f"{layout.shift} ns to stay unsigned"
        )
    metadata.update(
        {
            "traceFormat": "perfetto",
            "clock": "BUILTIN_CLOCK_BOOTTIME",
            "timestampOffsetNs": layout.shift,
            "trackEventCount": counts.track_events,
            "invocationSliceCount": counts.invocation_slices,
            "undrawnFlowCount": counts.undrawn_flows,
            "warnings": warnings,
        }
    )
    return metadata
