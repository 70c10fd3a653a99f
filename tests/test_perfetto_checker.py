"""The Perfetto checker decodes a well-formed TrackEvent trace exactly and names the rule and packet
a broken one breaks."""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    DebugAnnotation,
    Trace,
    TracePacket,
    TrackDescriptor,
    TrackEvent,
)
from perfetto_checker import (
    BEGIN,
    CLEARED,
    END,
    INSTANT,
    Flow,
    PerfettoRuleError,
    PerfettoTrace,
    Slice,
    Track,
    check_perfetto_files,
    read_perfetto_trace,
)
from perfetto_checker import NEEDS_STATE as NEEDS

pytest_plugins = ["pytester"]

BOOTTIME = 6
EXPLICIT = TrackDescriptor.EXPLICIT
NO_MERGE = TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE
NestedValue = DebugAnnotation.NestedValue


def packet(seq: int, **fields: Any) -> TracePacket:
    """A packet of sequence `seq` with the given fields (messages as dicts)."""
    return TracePacket(trusted_packet_sequence_id=seq, **fields)


def event(
    seq: int,
    ts: int,
    kind: int,
    *,
    flags: int = NEEDS,
    packet_fields: dict[str, Any] | None = None,
    **fields: Any,
) -> TracePacket:
    """A track event packet of `kind` at `ts` with `fields`, needing its sequence's incremental
    state, with `packet_fields` on the packet."""
    return packet(
        seq,
        timestamp=ts,
        sequence_flags=flags,
        track_event={"type": kind, **fields},
        **(packet_fields or {}),
    )


def every_kind_of_annotation() -> list[DebugAnnotation]:
    """One debug annotation of every value kind, names interned and plain, nested at depth 2."""
    return [
        DebugAnnotation(name_iid=1, uint_value=7),
        DebugAnnotation(name_iid=2, uint_value=2**64 - 1),
        DebugAnnotation(name="offset", int_value=-3),
        DebugAnnotation(name="ratio", double_value=0.5),
        DebugAnnotation(name="ok", bool_value=True),
        DebugAnnotation(name="addr", pointer_value=0xDEAD),
        DebugAnnotation(name="stage", string_value="gmm1"),
        DebugAnnotation(name="owner", string_value_iid=1),
        DebugAnnotation(name="legacy", legacy_json_value='{"a": 1}'),
        DebugAnnotation(
            name="ids",
            array_values=[DebugAnnotation(int_value=1), DebugAnnotation(string_value_iid=1)],
        ),
        DebugAnnotation(
            name="meta",
            dict_entries=[
                DebugAnnotation(name_iid=1, uint_value=3),
                DebugAnnotation(
                    name="inner",
                    array_values=[
                        DebugAnnotation(bool_value=True),
                        DebugAnnotation(double_value=2.5),
                    ],
                ),
            ],
        ),
        DebugAnnotation(
            name="nested",
            nested_value=NestedValue(
                nested_type=NestedValue.DICT,
                dict_keys=["k", "l"],
                dict_values=[
                    NestedValue(int_value=1),
                    NestedValue(
                        nested_type=NestedValue.ARRAY,
                        array_values=[NestedValue(int_value=2), NestedValue(string_value="x")],
                    ),
                ],
            ),
        ),
        DebugAnnotation(
            name="blob", proto_type_name="perfetto.protos.Foo", proto_value=b"\x08\x01"
        ),
    ]


EVERY_KIND_ARGS = {
    "task_id": 7,
    "start_cycle": 2**64 - 1,
    "offset": -3,
    "ratio": 0.5,
    "ok": True,
    "addr": 0xDEAD,
    "stage": "gmm1",
    "owner": "expert",
    "legacy": '{"a": 1}',
    "ids": [1, "expert"],
    "meta": {"task_id": 3, "inner": [True, 2.5]},
    "nested": {"k": 1, "l": [2, "x"]},
    "blob": b"\x08\x01",
}


def good() -> list[TracePacket]:
    """Two process tracks (1 on sequence 1, 2 on sequence 2) with child tracks described out of
    rank order; nested slices, interned names, a clear in mid-sequence and two flows, one of them
    ended earlier in the file than it begins (the importer orders flows by timestamp)."""
    return [
        # 0
        packet(
            1,
            sequence_flags=CLEARED,
            first_packet_on_sequence=True,
            trace_packet_defaults={"timestamp_clock_id": BOOTTIME},
            track_descriptor={
                "uuid": 1,
                "name": "rank 0",
                "child_ordering": EXPLICIT,
                "description": '{"run": "r0"}',
            },
        ),
        # 1, 2
        packet(
            1,
            track_descriptor={
                "uuid": 12,
                "name": "AIV/7",
                "parent_uuid": 1,
                "sibling_order_rank": 1,
            },
        ),
        packet(
            1,
            track_descriptor={
                "uuid": 11,
                "name": "AIC/3",
                "parent_uuid": 1,
                "sibling_order_rank": 0,
                "sibling_merge_behavior": NO_MERGE,
            },
        ),
        # 3: sequence 2 clears with the bool, names its process track by its ProcessDescriptor and
        # gives its events a default track and no default clock
        packet(
            2,
            incremental_state_cleared=True,
            first_packet_on_sequence=True,
            trace_packet_defaults={"track_event_defaults": {"track_uuid": 21}},
            track_descriptor={
                "uuid": 2,
                "process": {"pid": 2, "process_name": "rank 1"},
                "child_ordering": EXPLICIT,
            },
        ),
        # 4
        packet(2, track_descriptor={"uuid": 21, "static_name": "AIC/0", "parent_uuid": 2}),
        # 5: slice 0
        event(
            1,
            100,
            BEGIN,
            packet_fields={
                "interned_data": {
                    "event_names": [{"iid": 1, "name": "kernel"}, {"iid": 2, "name": "load"}],
                    "event_categories": [{"iid": 1, "name": "MegaKernelInternal"}],
                    "debug_annotation_names": [
                        {"iid": 1, "name": "task_id"},
                        {"iid": 2, "name": "start_cycle"},
                    ],
                    "debug_annotation_string_values": [{"iid": 1, "str": b"expert"}],
                }
            },
            track_uuid=11,
            name_iid=1,
            category_iids=[1],
            debug_annotations=every_kind_of_annotation(),
        ),
        # 6: slice 1, begins flow 5
        event(1, 110, BEGIN, track_uuid=11, name_iid=2, category_iids=[1], flow_ids=[5]),
        # 7: slice 2
        event(1, 120, BEGIN, track_uuid=12, name="store", categories=["io"]),
        # 8: ends slice 2 and flow 9
        event(1, 160, END, track_uuid=12, terminating_flow_ids=[9]),
        # 9: slice 3 on sequence 2's default track, where iid 1 is another name
        event(
            2,
            105,
            BEGIN,
            packet_fields={
                "timestamp_clock_id": BOOTTIME,
                "interned_data": {"event_names": [{"iid": 1, "name": "wait"}]},
            },
            name_iid=1,
            categories=["dep"],
        ),
        # 10: ends slice 1
        event(1, 130, END, track_uuid=11),
        # 11: slice 4, an instant in slice 0, begins flow 9
        event(1, 140, INSTANT, track_uuid=11, name="mark", flow_ids=[9]),
        # 12: ends slice 3 and flow 5
        event(
            2,
            150,
            END,
            packet_fields={"timestamp_clock_id": BOOTTIME},
            terminating_flow_ids=[5],
        ),
        # 13: ends slice 0 with one more arg
        event(
            1,
            200,
            END,
            track_uuid=11,
            debug_annotations=[DebugAnnotation(name="end_cycle", uint_value=9)],
        ),
        # 14: clears sequence 1 again; iid 1 is now another name; slice 5
        event(
            1,
            300,
            INSTANT,
            flags=CLEARED | NEEDS,
            packet_fields={
                "trace_packet_defaults": {"timestamp_clock_id": BOOTTIME},
                "interned_data": {"event_names": [{"iid": 1, "name": "tail"}]},
            },
            track_uuid=12,
            name_iid=1,
        ),
    ]


def encode(packets: list[TracePacket]) -> bytes:
    """The Trace of `packets`, serialized."""
    return Trace(packet=packets).SerializeToString()


TRACKS = {
    1: Track(1, "rank 0", None, None, EXPLICIT, None, '{"run": "r0"}'),
    12: Track(12, "AIV/7", 1, 1, None, None, None),
    11: Track(11, "AIC/3", 1, 0, None, NO_MERGE, None),
    2: Track(2, "rank 1", None, None, EXPLICIT, None, None),
    21: Track(21, "AIC/0", 2, None, None, None, None),
}
KERNEL_CATEGORIES = ("MegaKernelInternal",)
SLICES = [
    Slice(
        0, 11, "kernel", KERNEL_CATEGORIES, 100, 100, {**EVERY_KIND_ARGS, "end_cycle": 9}, None, 0
    ),
    Slice(1, 11, "load", KERNEL_CATEGORIES, 110, 20, {}, 0, 1),
    Slice(2, 12, "store", ("io",), 120, 40, {}, None, 0),
    Slice(3, 21, "wait", ("dep",), 105, 45, {}, None, 0),
    Slice(4, 11, "mark", (), 140, 0, {}, 0, 1),
    Slice(5, 12, "tail", (), 300, 0, {}, None, 0),
]
FLOWS = [Flow(5, source=1, target=3), Flow(9, source=4, target=2)]
GOOD = PerfettoTrace(packets=15, tracks=TRACKS, slices=SLICES, flows=FLOWS, clock_id=BOOTTIME)


def fails(packets: list[TracePacket] | bytes, fragment: str) -> None:
    """read_perfetto_trace raises PerfettoRuleError containing `fragment` (plain text)."""
    data = packets if isinstance(packets, bytes) else encode(packets)
    with pytest.raises(PerfettoRuleError, match=re.escape(fragment)):
        read_perfetto_trace(data)


def broken(change: Callable[[list[TracePacket]], Any]) -> list[TracePacket]:
    """The good trace with `change` applied to its packets."""
    packets = good()
    change(packets)
    return packets


# -- the good trace ---------------------------------------------------------------------------


def test_good_trace_is_decoded_exactly() -> None:
    trace = read_perfetto_trace(encode(good()))
    assert trace == GOOD
    assert list(trace.tracks) == [1, 12, 11, 2, 21]


def test_children_follow_sibling_order_rank() -> None:
    trace = read_perfetto_trace(encode(good()))
    assert trace.children(1) == [TRACKS[11], TRACKS[12]]
    assert trace.children(2) == [TRACKS[21]]
    assert trace.children(11) == []
    with pytest.raises(KeyError, match="no track with uuid 3"):
        trace.children(3)


def test_gzipped_file_path_and_bytes(tmp_path: Path) -> None:
    data = encode(good())
    (tmp_path / "run.pftrace.gz").write_bytes(gzip.compress(data))
    (tmp_path / "run.pftrace").write_bytes(data)
    assert read_perfetto_trace(tmp_path / "run.pftrace.gz") == GOOD
    assert read_perfetto_trace(str(tmp_path / "run.pftrace")) == GOOD
    assert read_perfetto_trace(gzip.compress(data)) == GOOD


def test_empty_trace() -> None:
    assert read_perfetto_trace(b"") == PerfettoTrace(0, {}, [], [], 0)


def test_unknown_and_unused_fields_are_fine() -> None:
    """Rule 8: an unknown field, fields no rule reads and a packet of another kind change
    nothing."""
    packets = good()
    unknown_field_9999 = b"\xf8\xf0\x04\x01"
    packets[6].MergeFromString(unknown_field_9999)
    packets[6].track_event.MergeFromString(unknown_field_9999)
    packets[6].trusted_pid = 5
    packets[6].track_event.thread_time_absolute_us = 3
    packets.insert(
        1, packet(1, clock_snapshot={"clocks": [{"clock_id": BOOTTIME, "timestamp": 1}]})
    )
    assert read_perfetto_trace(encode(packets)) == PerfettoTrace(
        16, TRACKS, SLICES, FLOWS, BOOTTIME
    )


def test_same_interned_value_and_same_track_again_are_fine() -> None:
    packets = good()
    packets[10].interned_data.event_names.add(iid=2, name="load")
    packets.insert(5, packet(1, track_descriptor=packets[2].track_descriptor))
    assert read_perfetto_trace(encode(packets)).slices == SLICES


def test_timestamps_may_go_back_across_tracks() -> None:
    """Packet 9 (track 21, ts 105) already follows packet 8 (track 12, ts 160) in the good
    trace; an event on a fresh track earlier than all of them is fine too."""
    packets = good()
    packets.insert(14, packet(1, track_descriptor={"uuid": 13, "name": "AIV/8", "parent_uuid": 1}))
    packets.insert(15, event(1, 1, INSTANT, track_uuid=13, name="early"))
    trace = read_perfetto_trace(encode(packets))
    assert trace.slices[5] == Slice(5, 13, "early", (), 1, 0, {}, None, 0)


# -- rule 1: packets ----------------------------------------------------------------------------


def test_rule_1_not_a_trace() -> None:
    fails(b"\xff\xff\xff", "rule 1 (packets): does not parse as Trace")


def test_rule_1_broken_gzip() -> None:
    fails(gzip.compress(encode(good()))[:-8], "rule 1 (packets): broken gzip stream")


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p.ClearField("trusted_packet_sequence_id"),
        lambda p: setattr(p, "trusted_packet_sequence_id", 0),
    ],
)
def test_rule_1_sequence_id(change: Callable[[TracePacket], None]) -> None:
    fails(
        broken(lambda packets: change(packets[7])),
        "rule 1 (packets), packet #7: no trusted_packet_sequence_id (or 0)",
    )


# -- rule 2: incremental state -------------------------------------------------------------------


def test_rule_2_first_packet_does_not_clear() -> None:
    fails(
        broken(lambda packets: packets[3].ClearField("incremental_state_cleared")),
        "rule 2 (incremental state), packet #3: the first packet of sequence 2 does not clear"
        " its state",
    )


def test_rule_2_first_packet_on_sequence_missing() -> None:
    fails(
        broken(lambda packets: packets[0].ClearField("first_packet_on_sequence")),
        "rule 2 (incremental state), packet #0: the first packet of sequence 1 lacks"
        " first_packet_on_sequence",
    )


def test_rule_2_needs_state_before_any_clear() -> None:
    fails(
        broken(lambda packets: setattr(packets[0], "sequence_flags", NEEDS)),
        "rule 2 (incremental state), packet #0: SEQ_NEEDS_INCREMENTAL_STATE before any clear of"
        " sequence 1",
    )


def test_rule_2_first_packet_on_sequence_twice() -> None:
    fails(
        broken(lambda packets: setattr(packets[14], "first_packet_on_sequence", True)),
        "rule 2 (incremental state), packet #14: first_packet_on_sequence, but sequence 1 began"
        " at packet #0",
    )


# -- rule 3: interning ---------------------------------------------------------------------------


def test_rule_3_undefined_event_name() -> None:
    fails(
        broken(lambda packets: setattr(packets[6].track_event, "name_iid", 3)),
        "rule 3 (interning), packet #6: event_names iid 3 is not defined in sequence 1 since its"
        " clear at packet #0",
    )


def test_rule_3_undefined_category() -> None:
    fails(
        broken(lambda packets: packets[6].track_event.category_iids.append(2)),
        "rule 3 (interning), packet #6: event_categories iid 2 is not defined",
    )


def test_rule_3_undefined_nested_annotation_name() -> None:
    def change(packets: list[TracePacket]) -> None:
        packets[5].track_event.debug_annotations[10].dict_entries[0].name_iid = 9

    fails(broken(change), "rule 3 (interning), packet #5: debug_annotation_names iid 9 is not")


def test_rule_3_undefined_string_value_in_an_array() -> None:
    def change(packets: list[TracePacket]) -> None:
        packets[5].track_event.debug_annotations[9].array_values[1].string_value_iid = 2

    fails(broken(change), "rule 3 (interning), packet #5: debug_annotation_string_values iid 2")


def test_rule_3_iid_of_another_sequence() -> None:
    fails(
        broken(lambda packets: setattr(packets[9].track_event, "name_iid", 2)),
        "rule 3 (interning), packet #9: event_names iid 2 is not defined in sequence 2",
    )


def test_rule_3_iid_from_before_the_clear() -> None:
    fails(
        broken(lambda packets: setattr(packets[14].track_event, "name_iid", 2)),
        "rule 3 (interning), packet #14: event_names iid 2 is not defined in sequence 1 since"
        " its clear at packet #14",
    )


def test_rule_3_iid_defined_after_its_use() -> None:
    def change(packets: list[TracePacket]) -> None:
        del packets[5].interned_data.event_names[1]
        packets[10].interned_data.event_names.add(iid=2, name="load")

    fails(broken(change), "rule 3 (interning), packet #6: event_names iid 2 is not defined")


def test_rule_3_iid_redefined() -> None:
    fails(
        broken(lambda packets: packets[10].interned_data.event_names.add(iid=2, name="other")),
        "rule 3 (interning), packet #10: event_names iid 2 redefined as 'other' in sequence 1,"
        " which holds 'load' since its clear at packet #0",
    )


def test_rule_3_string_value_not_utf8() -> None:
    fails(
        broken(
            lambda packets: setattr(
                packets[5].interned_data.debug_annotation_string_values[0], "str", b"\xff"
            )
        ),
        "rule 3 (interning), packet #5: debug_annotation_string_values iid 1 is not UTF-8",
    )


# -- rule 4: tracks ------------------------------------------------------------------------------


def test_rule_4_undescribed_track() -> None:
    fails(
        broken(lambda packets: setattr(packets[6].track_event, "track_uuid", 99)),
        "rule 4 (tracks), packet #6: track_uuid 99 was not described by a TrackDescriptor",
    )


def test_rule_4_track_described_after_use() -> None:
    def change(packets: list[TracePacket]) -> None:
        packets.insert(6, packets.pop(2))

    fails(broken(change), "rule 4 (tracks), packet #4: track_uuid 11 was not described")


def test_rule_4_no_track_and_no_default() -> None:
    fails(
        broken(lambda packets: packets[3].trace_packet_defaults.ClearField("track_event_defaults")),
        "rule 4 (tracks), packet #9: a track event without track_uuid, and sequence 2 has no"
        " default track_uuid",
    )


def test_rule_4_described_again_differently() -> None:
    fails(
        broken(
            lambda packets: packets.insert(
                5, packet(1, track_descriptor={"uuid": 11, "name": "AIC/4"})
            )
        ),
        "rule 4 (tracks), packet #5: track 11 described again differently: {uuid: 11 name:"
        ' "AIC/4"}, first at packet #2',
    )


def test_rule_4_parent_described_after_child() -> None:
    fails(
        broken(lambda packets: setattr(packets[1].track_descriptor, "parent_uuid", 2)),
        "rule 4 (tracks), packet #1: track 12's parent_uuid 2 is not described before it",
    )


def test_rule_4_own_parent() -> None:
    fails(
        broken(lambda packets: setattr(packets[1].track_descriptor, "parent_uuid", 12)),
        "rule 4 (tracks), packet #1: track 12 is its own parent (a cycle)",
    )


def test_rule_4_descriptor_without_uuid() -> None:
    fails(
        broken(lambda packets: packets[1].track_descriptor.ClearField("uuid")),
        "rule 4 (tracks), packet #1: a TrackDescriptor without uuid",
    )


# -- rule 5: clock and time ----------------------------------------------------------------------


def test_rule_5_no_timestamp() -> None:
    fails(
        broken(lambda packets: packets[6].ClearField("timestamp")),
        "rule 5 (clock and time), packet #6: a track event without timestamp",
    )


def test_rule_5_no_clock() -> None:
    fails(
        broken(lambda packets: packets[9].ClearField("timestamp_clock_id")),
        "rule 5 (clock and time), packet #9: a track event without a declared clock",
    )


def test_rule_5_clock_not_in_defaults_after_a_clear() -> None:
    fails(
        broken(lambda packets: packets[14].ClearField("trace_packet_defaults")),
        "rule 5 (clock and time), packet #14: a track event without a declared clock",
    )


@pytest.mark.parametrize("clock", [0, 7, 63, 64])
def test_rule_5_not_a_builtin_clock(clock: int) -> None:
    fails(
        broken(
            lambda packets: setattr(packets[0].trace_packet_defaults, "timestamp_clock_id", clock)
        ),
        f"rule 5 (clock and time), packet #5: timestamp_clock_id {clock} is not a builtin clock",
    )


def test_rule_5_two_clocks() -> None:
    fails(
        broken(lambda packets: setattr(packets[9], "timestamp_clock_id", 3)),
        "rule 5 (clock and time), packet #9: timestamp_clock_id 3, but packet #5's events are on"
        " clock 6",
    )


def test_rule_5_timestamp_goes_back_on_a_track() -> None:
    fails(
        broken(lambda packets: setattr(packets[6], "timestamp", 99)),
        "rule 5 (clock and time), packet #6: timestamp 99 on track 11 is before 100 of packet #5",
    )


def test_rule_5_end_before_its_begin() -> None:
    fails(
        broken(lambda packets: setattr(packets[8], "timestamp", 119)),
        "rule 5 (clock and time), packet #8: timestamp 119 on track 12 is before 120 of packet #7",
    )


# -- rule 6: slices ------------------------------------------------------------------------------


def test_rule_6_end_without_open_slice() -> None:
    fails(
        broken(lambda packets: setattr(packets[7].track_event, "type", INSTANT)),
        "rule 6 (slices), packet #8: SLICE_END on track 12, which has no open slice",
    )


def test_rule_6_slice_left_open() -> None:
    fails(
        broken(lambda packets: packets.pop(13)),
        "rule 6 (slices), packet #5: slice #0 'kernel' on track 11 is never ended",
    )


def test_rule_6_child_ends_after_its_parent() -> None:
    fails(
        broken(lambda packets: setattr(packets[13], "timestamp", 135)),
        "rule 6 (slices), packet #13: slice #0 'kernel' ends at 135, before its child slice #4"
        " 'mark' ends at 140 (packet #11)",
    )


def test_rule_6_end_names_another_slice() -> None:
    fails(
        broken(lambda packets: setattr(packets[10].track_event, "name", "kernel")),
        "rule 6 (slices), packet #10: SLICE_END named 'kernel' [] on track 11 would close slice #1"
        " 'load' ['MegaKernelInternal'] (a misplaced end)",
    )


def test_rule_6_other_event_types() -> None:
    fails(
        broken(lambda packets: setattr(packets[11].track_event, "type", TrackEvent.TYPE_COUNTER)),
        "rule 6 (slices), packet #11: track event of TYPE_COUNTER; only SLICE_BEGIN",
    )


# -- rule 7: flows -------------------------------------------------------------------------------


def test_rule_7_terminated_but_never_begun() -> None:
    fails(
        broken(lambda packets: packets[12].track_event.terminating_flow_ids.append(6)),
        "rule 7 (flows), packet #12: terminating flow id 6, which no earlier event (by timestamp,"
        " ties in file order) began",
    )


def test_rule_7_terminated_before_begun_by_timestamp() -> None:
    """Flow 9 begins at ts 200 (packet 13) and ends at ts 160 (packet 8)."""

    def change(packets: list[TracePacket]) -> None:
        packets[11].track_event.ClearField("flow_ids")
        packets[13].track_event.flow_ids.append(9)

    fails(broken(change), "rule 7 (flows), packet #8: terminating flow id 9, which no earlier")


def test_rule_7_terminated_twice() -> None:
    fails(
        broken(lambda packets: packets[13].track_event.terminating_flow_ids.append(5)),
        "rule 7 (flows), packet #13: flow id 5 terminated twice (first at packet #12)",
    )


def test_rule_7_never_terminated() -> None:
    fails(
        broken(lambda packets: packets[11].track_event.flow_ids.append(11)),
        "rule 7 (flows), packet #11: flow id 11 is begun but never terminated",
    )


def test_rule_7_begun_again_while_open() -> None:
    fails(
        broken(lambda packets: packets[10].track_event.flow_ids.append(5)),
        "rule 7 (flows), packet #10: flow id 5 begun again while the flow begun at packet #6 is"
        " open",
    )


def test_rule_7_begun_again_after_it_ended() -> None:
    fails(
        broken(lambda packets: packets[13].track_event.flow_ids.append(5)),
        "rule 7 (flows), packet #13: flow id 5 begun again after its flow from packet #6 to #12"
        " ended",
    )


# -- every trace the tests write -----------------------------------------------------------------


def test_check_perfetto_files_finds_traces_recursively(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("traces")
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "run.pftrace.gz").write_bytes(gzip.compress(encode(good())))
    (root / "run.pftrace").write_bytes(encode(good()))
    (root / "run.json").write_bytes(b"not a Perfetto trace")
    (root / "run.pftrace.txt").write_bytes(b"not one either")
    assert check_perfetto_files(root) == [root / "a" / "b" / "run.pftrace.gz", root / "run.pftrace"]
    (root / "a" / "bad.pftrace").write_bytes(encode(broken(lambda packets: packets.pop(13))))
    with pytest.raises(PerfettoRuleError, match=re.escape(f"{root / 'a' / 'bad.pftrace'}: rule 6")):
        check_perfetto_files(root)


def test_conftest_checks_the_traces_each_test_writes(pytester: pytest.Pytester) -> None:
    """The autouse fixture of tests/conftest.py fails a test that writes a broken trace under its
    tmp_path, after the test, and leaves tests without tmp_path alone."""
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    bad = encode(broken(lambda packets: packets.pop(13)))
    pytester.makepyfile(
        f"""
        def test_writes_a_good_trace(tmp_path):
            (tmp_path / "good.pftrace").write_bytes({encode(good())!r})

        def test_writes_a_broken_trace(tmp_path):
            (tmp_path / "deep").mkdir()
            (tmp_path / "deep" / "bad.pftrace").write_bytes({bad!r})

        def test_without_tmp_path():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_writes_a_broken_trace*",
            "*deep/bad.pftrace: rule 6 (slices), packet #5: slice #0 'kernel' * is never ended",
        ]
    )
