"""Checks a Perfetto protobuf trace against the rules by which trace processor imports TrackEvents.

A trace that passes `read_perfetto_trace` opens in ui.perfetto.dev with every slice on the track
it was written for, every interned name resolved and every flow arrow drawn; the function returns
what the importer would make of it (tracks, slices, flows), for the tests to compare with the JSON
export. The rules, numbered as the messages of `PerfettoRuleError` name them:

1. (packets) The file parses as ``Trace``; every packet has a nonzero
   ``trusted_packet_sequence_id``.
2. (incremental state) The first packet of a sequence clears its incremental state
   (SEQ_INCREMENTAL_STATE_CLEARED or ``incremental_state_cleared``) and has
   ``first_packet_on_sequence``, which no later packet of the sequence has; the importer drops a
   packet that needs incremental state (SEQ_NEEDS_INCREMENTAL_STATE) before the first clear.
3. (interning) Every iid an event uses (its name and categories, its debug annotations' names and
   interned string values, at any depth) is defined in its sequence, in that packet or an earlier
   one, since the last clear; a clear forgets every entry (and the sequence's
   ``trace_packet_defaults``); an iid defined again within one state keeps its value.
4. (tracks) A track event's ``track_uuid`` (its own, else its sequence's default) was described by
   a TrackDescriptor in an earlier packet; a uuid described twice is described identically; a
   parent is described before its child and no track is its own ancestor.
5. (clock and time) Every track event has a timestamp on a declared builtin clock (the packet's
   ``timestamp_clock_id``, else its sequence's default), all on one clock, non-decreasing per
   track in file order (so the importer's sort by timestamp keeps each track's order).
6. (slices) Track events are SLICE_BEGIN, SLICE_END or INSTANT; a SLICE_END closes the slice on
   top of its track's stack (there must be one; a name or categories on the END must be that
   slice's, or the importer reports a misplaced end); a slice ends no earlier than its children;
   no slice is left open.
7. (flows) In the importer's order (by timestamp, ties in file order; ``flow_ids`` before
   ``terminating_flow_ids`` within an event) each terminated id was begun earlier and is still
   open; an id is begun once (again while open the importer would make it a step, and our writer
   gives each arrow its own id) and terminated once. A flow binds to the slice of its event: the
   slice a BEGIN begins, the slice an END ends, or the instant.
8. Fields no rule names are neither required nor checked.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from google.protobuf import text_format
from google.protobuf.message import DecodeError, Message
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    BuiltinClock,
    DebugAnnotation,
    InternedData,
    Trace,
    TracePacket,
    TracePacketDefaults,
    TrackDescriptor,
    TrackEvent,
)

__all__ = [
    "Flow",
    "PerfettoRuleError",
    "PerfettoTrace",
    "Slice",
    "Track",
    "check_perfetto_files",
    "read_perfetto_trace",
]

GZIP_MAGIC = b"\x1f\x8b"
CLEARED = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
NEEDS_STATE = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
BEGIN, END, INSTANT = (
    TrackEvent.TYPE_SLICE_BEGIN,
    TrackEvent.TYPE_SLICE_END,
    TrackEvent.TYPE_INSTANT,
)
BUILTIN_CLOCKS = frozenset(
    clock for clock in BuiltinClock.values() if 0 < clock < BuiltinClock.BUILTIN_CLOCK_MAX_ID
)
"""The clocks of the BuiltinClock enum (ids 1..63 are builtin; UNKNOWN and MAX_ID are none)."""

RULES = {
    1: "packets",
    2: "incremental state",
    3: "interning",
    4: "tracks",
    5: "clock and time",
    6: "slices",
    7: "flows",
}
INTERNED_TABLES = ("event_names", "event_categories", "debug_annotation_names")
STRING_VALUES = "debug_annotation_string_values"


class PerfettoRuleError(AssertionError):
    """A rule of Perfetto's TrackEvent importer that a trace breaks: the message names the
    rule, the packet index and what was found."""


@dataclass(frozen=True)
class Track:
    """One TrackDescriptor; name is its name, static or atrace name, else its process's or
    thread's name, as the UI shows it."""

    uuid: int
    name: str
    parent_uuid: int | None
    sibling_order_rank: int | None
    child_ordering: int | None
    sibling_merge_behavior: int | None
    description: str | None


@dataclass(frozen=True)
class Slice:
    """One SLICE_BEGIN..SLICE_END pair, or an INSTANT (dur 0), numbered in file order of their
    BEGIN (or INSTANT) packets; args merges the END's debug annotations into the BEGIN's."""

    index: int
    track_uuid: int
    name: str
    categories: tuple[str, ...]
    ts: int
    dur: int
    args: dict[str, Any]
    parent: int | None
    depth: int


@dataclass(frozen=True)
class Flow:
    """One flow: the slices of the events that carried its id in flow_ids and in
    terminating_flow_ids."""

    id: int
    source: int
    target: int


@dataclass(frozen=True)
class PerfettoTrace:
    """What the importer makes of a trace: tracks by uuid in order of description, slices by
    index, flows in the order the importer ends them; clock_id is the events' clock (0 when
    there are no events)."""

    packets: int
    tracks: dict[int, Track]
    slices: list[Slice]
    flows: list[Flow]
    clock_id: int

    def children(self, uuid: int) -> list[Track]:
        """The child tracks of `uuid` by sibling_order_rank (an unset rank is 0, as the proto
        default), ties in order of description."""
        if uuid not in self.tracks:
            raise KeyError(f"no track with uuid {uuid}")
        kids = [track for track in self.tracks.values() if track.parent_uuid == uuid]
        return sorted(kids, key=lambda track: track.sibling_order_rank or 0)


def read_perfetto_trace(source: str | os.PathLike[str] | bytes) -> PerfettoTrace:
    """Decode a trace file (gzip detected by its magic) or bytes with the perfetto protos, check
    every rule of the module docstring (raising PerfettoRuleError at the first broken one) and
    return its contents."""
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    if data.startswith(GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise PerfettoRuleError(f"rule 1 (packets): broken gzip stream: {exc}") from exc
    try:
        trace = Trace.FromString(data)
    except DecodeError as exc:
        raise PerfettoRuleError(f"rule 1 (packets): does not parse as Trace: {exc}") from exc
    reader = _Reader()
    for idx, packet in enumerate(trace.packet):
        reader.read_packet(idx, packet)
    return reader.finish(len(trace.packet))


def check_perfetto_files(root: str | os.PathLike[str]) -> list[Path]:
    """Check every ``*.pftrace`` and ``*.pftrace.gz`` under `root` (recursively), raising
    PerfettoRuleError with the file's path for a broken one; return the paths checked."""
    paths = sorted(
        path
        for path in Path(root).rglob("*.pftrace*")
        if path.name.endswith((".pftrace", ".pftrace.gz")) and path.is_file()
    )
    for path in paths:
        try:
            read_perfetto_trace(path)
        except PerfettoRuleError as exc:
            raise PerfettoRuleError(f"{path}: {exc}") from exc
    return paths


def _fail(rule: int, idx: int, problem: str) -> NoReturn:
    raise PerfettoRuleError(f"rule {rule} ({RULES[rule]}), packet #{idx}: {problem}")


def _text(message: Message) -> str:
    return "{" + text_format.MessageToString(message, as_one_line=True) + "}"


@dataclass
class _Sequence:
    """A trusted packet sequence's incremental state: its interned entries and defaults."""

    first_packet: int
    cleared_at: int
    interned: dict[str, dict[int, str]] = field(default_factory=dict)
    defaults: TracePacketDefaults | None = None

    def clear(self, idx: int) -> None:
        self.cleared_at = idx
        self.interned = {}
        self.defaults = None


@dataclass
class _OpenSlice:
    """A slice while its track's stack holds it (or an instant): dur is set by its END."""

    index: int
    track_uuid: int
    name: str
    categories: tuple[str, ...]
    ts: int
    args: dict[str, Any]
    parent: int | None
    depth: int
    packet: int
    dur: int = 0


@dataclass
class _TrackState:
    """A track's slice stack and its latest event (for the time and nesting rules)."""

    stack: list[int] = field(default_factory=list)
    last_ts: int = 0
    last_slice: int | None = None
    last_packet: int = -1


@dataclass(frozen=True)
class _FlowEvent:
    """A track event that begins or terminates flows, as the flow pass needs it."""

    ts: int
    packet: int
    slice: int
    begins: tuple[int, ...]
    terminates: tuple[int, ...]


class _Reader:
    """Reads packets in file order, checking rules 1-6 as it goes; `finish` checks 6 and 7."""

    def __init__(self) -> None:
        self.sequences: dict[int, _Sequence] = {}
        self.descriptors: dict[int, tuple[int, TrackDescriptor]] = {}
        self.track_states: dict[int, _TrackState] = {}
        self.slices: list[_OpenSlice] = []
        self.flow_events: list[_FlowEvent] = []
        self.clock: tuple[int, int] | None = None  # (clock id, packet that first used it)

    # -- rules 1 and 2: sequences and their incremental state ---------------------------------

    def read_packet(self, idx: int, packet: TracePacket) -> None:
        if packet.trusted_packet_sequence_id == 0:
            _fail(1, idx, "no trusted_packet_sequence_id (or 0); the importer needs one")
        seq_id = packet.trusted_packet_sequence_id
        clears = bool(packet.sequence_flags & CLEARED) or packet.incremental_state_cleared
        seq = self.sequences.get(seq_id)
        if seq is None:
            if not clears and packet.sequence_flags & NEEDS_STATE:
                _fail(
                    2,
                    idx,
                    f"SEQ_NEEDS_INCREMENTAL_STATE before any clear of sequence {seq_id}; the"
                    " importer drops such packets",
                )
            if not clears:
                _fail(2, idx, f"the first packet of sequence {seq_id} does not clear its state")
            if not packet.first_packet_on_sequence:
                _fail(
                    2, idx, f"the first packet of sequence {seq_id} lacks first_packet_on_sequence"
                )
            seq = self.sequences[seq_id] = _Sequence(first_packet=idx, cleared_at=idx)
        elif packet.first_packet_on_sequence:
            _fail(
                2,
                idx,
                f"first_packet_on_sequence, but sequence {seq_id} began at packet"
                f" #{seq.first_packet}",
            )
        if clears:
            seq.clear(idx)
        if packet.HasField("interned_data"):
            self.intern(idx, seq_id, seq, packet.interned_data)
        if packet.HasField("trace_packet_defaults"):
            seq.defaults = packet.trace_packet_defaults
        data = packet.WhichOneof("data")
        if data == "track_descriptor":
            self.describe(idx, packet.track_descriptor)
        elif data == "track_event":
            self.track_event(idx, packet, seq_id, seq)

    # -- rule 3: interning --------------------------------------------------------------------

    def intern(self, idx: int, seq_id: int, seq: _Sequence, data: InternedData) -> None:
        for table in (*INTERNED_TABLES, STRING_VALUES):
            entries = seq.interned.setdefault(table, {})
            for entry in getattr(data, table):
                value = entry.str if table == STRING_VALUES else entry.name
                if isinstance(value, bytes):
                    try:
                        value = value.decode("utf-8")
                    except UnicodeDecodeError:
                        _fail(3, idx, f"{table} iid {entry.iid} is not UTF-8: {value!r}")
                old = entries.get(entry.iid)
                if old is not None and old != value:
                    _fail(
                        3,
                        idx,
                        f"{table} iid {entry.iid} redefined as {value!r} in sequence {seq_id},"
                        f" which holds {old!r} since its clear at packet #{seq.cleared_at}",
                    )
                entries[entry.iid] = value

    def interned(self, idx: int, seq_id: int, seq: _Sequence, table: str, iid: int) -> str:
        value = seq.interned.get(table, {}).get(iid)
        if value is None:
            _fail(
                3,
                idx,
                f"{table} iid {iid} is not defined in sequence {seq_id} since its clear at packet"
                f" #{seq.cleared_at} (in this packet or an earlier one)",
            )
        return value

    def args(
        self, idx: int, seq_id: int, seq: _Sequence, annotations: Any, named: bool = True
    ) -> Any:
        """Debug annotations as a dict (named) or a list (array values), resolved."""
        values = [self.annotation_value(idx, seq_id, seq, a) for a in annotations]
        if not named:
            return values
        names = [self.annotation_name(idx, seq_id, seq, a) for a in annotations]
        return dict(zip(names, values, strict=True))

    def annotation_name(self, idx: int, seq_id: int, seq: _Sequence, ann: DebugAnnotation) -> str:
        if ann.HasField("name_iid"):
            return self.interned(idx, seq_id, seq, "debug_annotation_names", ann.name_iid)
        return ann.name

    def annotation_value(self, idx: int, seq_id: int, seq: _Sequence, ann: DebugAnnotation) -> Any:
        kind = ann.WhichOneof("value")
        if kind == "string_value_iid":
            return self.interned(idx, seq_id, seq, STRING_VALUES, ann.string_value_iid)
        if kind == "nested_value":
            return _nested(ann.nested_value)
        if kind is not None:
            return getattr(ann, kind)
        if ann.dict_entries:
            return self.args(idx, seq_id, seq, ann.dict_entries)
        if ann.array_values:
            return self.args(idx, seq_id, seq, ann.array_values, named=False)
        if ann.HasField("proto_value"):
            return ann.proto_value
        return None

    # -- rule 4: tracks -----------------------------------------------------------------------

    def describe(self, idx: int, desc: TrackDescriptor) -> None:
        if not desc.HasField("uuid"):
            _fail(
                4, idx, f"a TrackDescriptor without uuid, which the importer drops: {_text(desc)}"
            )
        first = self.descriptors.get(desc.uuid)
        if first is not None:
            if first[1] != desc:
                _fail(
                    4,
                    idx,
                    f"track {desc.uuid} described again differently: {_text(desc)}, first at"
                    f" packet #{first[0]}: {_text(first[1])}",
                )
            return
        if desc.HasField("parent_uuid"):
            # A parent must be described before its child and a track is described once, so
            # the only cycle left to find is a track that is its own parent.
            if desc.parent_uuid == desc.uuid:
                _fail(4, idx, f"track {desc.uuid} is its own parent (a cycle)")
            if desc.parent_uuid not in self.descriptors:
                _fail(
                    4,
                    idx,
                    f"track {desc.uuid}'s parent_uuid {desc.parent_uuid} is not described"
                    " before it",
                )
        self.descriptors[desc.uuid] = (idx, desc)

    def track_uuid(self, idx: int, event: TrackEvent, seq_id: int, seq: _Sequence) -> int:
        if event.HasField("track_uuid"):
            uuid = event.track_uuid
        elif seq.defaults is not None and seq.defaults.track_event_defaults.HasField("track_uuid"):
            uuid = seq.defaults.track_event_defaults.track_uuid
        else:
            _fail(
                4,
                idx,
                f"a track event without track_uuid, and sequence {seq_id} has no default"
                " track_uuid since its clear",
            )
        if uuid not in self.descriptors:
            _fail(4, idx, f"track_uuid {uuid} was not described by a TrackDescriptor before")
        return uuid

    # -- rule 5: clock and time ---------------------------------------------------------------

    def check_clock(self, idx: int, packet: TracePacket, seq_id: int, seq: _Sequence) -> None:
        if not packet.HasField("timestamp"):
            _fail(5, idx, "a track event without timestamp")
        if packet.HasField("timestamp_clock_id"):
            clock = packet.timestamp_clock_id
        elif seq.defaults is not None and seq.defaults.HasField("timestamp_clock_id"):
            clock = seq.defaults.timestamp_clock_id
        else:
            _fail(
                5,
                idx,
                f"a track event without a declared clock: no timestamp_clock_id on the packet or"
                f" in sequence {seq_id}'s trace_packet_defaults since its clear",
            )
        if clock not in BUILTIN_CLOCKS:
            _fail(5, idx, f"timestamp_clock_id {clock} is not a builtin clock of BuiltinClock")
        if self.clock is None:
            self.clock = (clock, idx)
        elif clock != self.clock[0]:
            _fail(
                5,
                idx,
                f"timestamp_clock_id {clock}, but packet #{self.clock[1]}'s events are on clock"
                f" {self.clock[0]}",
            )

    def check_order(self, idx: int, ts: int, uuid: int, state: _TrackState) -> None:
        if ts < state.last_ts:
            _fail(
                5,
                idx,
                f"timestamp {ts} on track {uuid} is before {state.last_ts} of packet"
                f" #{state.last_packet} on that track",
            )

    # -- rule 6: slices -----------------------------------------------------------------------

    def track_event(self, idx: int, packet: TracePacket, seq_id: int, seq: _Sequence) -> None:
        event = packet.track_event
        if event.type not in (BEGIN, END, INSTANT):
            type_name = TrackEvent.Type.Name(event.type)
            _fail(6, idx, f"track event of {type_name}; only SLICE_BEGIN, SLICE_END, INSTANT")
        uuid = self.track_uuid(idx, event, seq_id, seq)
        self.check_clock(idx, packet, seq_id, seq)
        name = (
            self.interned(idx, seq_id, seq, "event_names", event.name_iid)
            if event.HasField("name_iid")
            else event.name
        )
        categories = tuple(
            self.interned(idx, seq_id, seq, "event_categories", iid) for iid in event.category_iids
        ) or tuple(event.categories)
        args = self.args(idx, seq_id, seq, event.debug_annotations)
        ts = packet.timestamp
        state = self.track_states.setdefault(uuid, _TrackState())
        if event.type == END:
            index = self.end_slice(idx, ts, uuid, state, name, categories)
            self.slices[index].args.update(args)
        else:
            self.check_order(idx, ts, uuid, state)
            index = len(self.slices)
            parent = state.stack[-1] if state.stack else None
            self.slices.append(
                _OpenSlice(index, uuid, name, categories, ts, args, parent, len(state.stack), idx)
            )
            if event.type == BEGIN:
                state.stack.append(index)
        state.last_ts, state.last_slice, state.last_packet = ts, index, idx
        if event.flow_ids or event.terminating_flow_ids:
            self.flow_events.append(
                _FlowEvent(ts, idx, index, tuple(event.flow_ids), tuple(event.terminating_flow_ids))
            )

    def end_slice(
        self,
        idx: int,
        ts: int,
        uuid: int,
        state: _TrackState,
        name: str,
        categories: tuple[str, ...],
    ) -> int:
        """Close the top of the track's stack at `ts`; return its index."""
        if not state.stack:
            _fail(6, idx, f"SLICE_END on track {uuid}, which has no open slice")
        top = self.slices[state.stack[-1]]
        if (name and name != top.name) or (categories and categories != top.categories):
            _fail(
                6,
                idx,
                f"SLICE_END named {name!r} {list(categories)} on track {uuid} would close slice"
                f" #{top.index} {top.name!r} {list(top.categories)} (a misplaced end)",
            )
        if ts < state.last_ts and state.last_slice != top.index:
            child = self.slices[state.last_slice]
            _fail(
                6,
                idx,
                f"slice #{top.index} {top.name!r} ends at {ts}, before its child slice"
                f" #{child.index} {child.name!r} ends at {state.last_ts} (packet"
                f" #{state.last_packet})",
            )
        self.check_order(idx, ts, uuid, state)
        state.stack.pop()
        top.dur = ts - top.ts
        return top.index

    # -- rules 6 (what is left open) and 7, then the result ------------------------------------

    def finish(self, packets: int) -> PerfettoTrace:
        left_open = sorted(index for state in self.track_states.values() for index in state.stack)
        if left_open:
            first = self.slices[left_open[0]]
            _fail(
                6,
                first.packet,
                f"slice #{first.index} {first.name!r} on track {first.track_uuid} is never ended",
            )
        flows = self.match_flows()
        tracks = {uuid: _track(desc) for uuid, (_, desc) in self.descriptors.items()}
        slices = [
            Slice(
                s.index, s.track_uuid, s.name, s.categories, s.ts, s.dur, s.args, s.parent, s.depth
            )
            for s in self.slices
        ]
        clock = 0 if self.clock is None else self.clock[0]
        return PerfettoTrace(packets, tracks, slices, flows, clock)

    def match_flows(self) -> list[Flow]:
        begun: dict[int, _FlowEvent] = {}  # open flows by id
        ended: dict[int, tuple[_FlowEvent, _FlowEvent]] = {}
        flows: list[Flow] = []
        for event in sorted(self.flow_events, key=lambda e: (e.ts, e.packet)):
            for flow_id in event.begins:
                if flow_id in begun:
                    _fail(
                        7,
                        event.packet,
                        f"flow id {flow_id} begun again while the flow begun at packet"
                        f" #{begun[flow_id].packet} is open (the importer would make it a step)",
                    )
                if flow_id in ended:
                    source, target = ended[flow_id]
                    _fail(
                        7,
                        event.packet,
                        f"flow id {flow_id} begun again after its flow from packet"
                        f" #{source.packet} to #{target.packet} ended",
                    )
                begun[flow_id] = event
            for flow_id in event.terminates:
                if flow_id in ended:
                    _fail(
                        7,
                        event.packet,
                        f"flow id {flow_id} terminated twice (first at packet"
                        f" #{ended[flow_id][1].packet})",
                    )
                source = begun.pop(flow_id, None)
                if source is None:
                    _fail(
                        7,
                        event.packet,
                        f"terminating flow id {flow_id}, which no earlier event (by timestamp,"
                        " ties in file order) began",
                    )
                ended[flow_id] = (source, event)
                flows.append(Flow(flow_id, source.slice, event.slice))
        for flow_id, source in begun.items():
            _fail(7, source.packet, f"flow id {flow_id} is begun but never terminated")
        return flows


def _nested(value: DebugAnnotation.NestedValue) -> Any:
    """A legacy NestedValue as a dict, list or scalar."""
    if value.nested_type == DebugAnnotation.NestedValue.DICT:
        return {
            key: _nested(item)
            for key, item in zip(value.dict_keys, value.dict_values, strict=False)
        }
    if value.nested_type == DebugAnnotation.NestedValue.ARRAY:
        return [_nested(item) for item in value.array_values]
    for kind in ("int_value", "double_value", "bool_value", "string_value"):
        if value.HasField(kind):
            return getattr(value, kind)
    return None


def _track(desc: TrackDescriptor) -> Track:
    name_field = desc.WhichOneof("static_or_dynamic_name")
    if name_field is not None:
        name = getattr(desc, name_field)
    elif desc.process.HasField("process_name"):
        name = desc.process.process_name
    else:
        name = desc.thread.thread_name
    return Track(
        uuid=desc.uuid,
        name=name,
        parent_uuid=desc.parent_uuid if desc.HasField("parent_uuid") else None,
        sibling_order_rank=desc.sibling_order_rank if desc.HasField("sibling_order_rank") else None,
        child_ordering=desc.child_ordering if desc.HasField("child_ordering") else None,
        sibling_merge_behavior=(
            desc.sibling_merge_behavior if desc.HasField("sibling_merge_behavior") else None
        ),
        description=desc.description if desc.HasField("description") else None,
    )
