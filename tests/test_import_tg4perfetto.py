"""FlashInfer, Mirage MPK and Triton-distributed ``.perfetto-trace`` files (tg4perfetto's
layout) imported into the store: each producer's tracks and names, slices ended by their
track's last open one, instants, the 32-bit ns wrap, and each refusal with the byte it
names. Traces are written from the same raw buffers as tests/test_import_tagged.py, so the
raw importer is the reference."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb2
from tagged_packer import (
    BEGIN,
    END,
    INSTANT,
    fi,
    launch_rows,
    mpk_tag,
    pack,
    triton_tag,
)
from tg4perfetto_packer import (
    TraceWriter,
    flashinfer_trace,
    mpk_trace,
    numpy_decode,
    triton_trace,
    write_synthetic,
)

from multicore_profiler import open_store
from multicore_profiler.abi import DESC_TRIGGER_EVENT, DESC_WAIT_DEPENDENCY, CoreType
from multicore_profiler.errors import DroppedRecordsWarning, ImportFormatError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.ingest import import_tagged
from multicore_profiler.ingest.import_tagged import MPK_TASK_NAMES
from multicore_profiler.ingest.import_tg4perfetto import is_perfetto_trace, read_trace
from multicore_profiler.ingest.imports import ImportOptions, import_profile

SM, CTA = int(CoreType.SM), int(CoreType.CTA)
EVENTS = ["prefill", "decode", "merge", "rope", "sync"]
TOP = 2**32


def from_trace(path: Path, format: str, **options: object) -> tuple[list[tuple], object]:
    (launch,) = read_trace(path, ImportOptions(format=format, **options))  # type: ignore[arg-type]
    return launch_rows(launch), launch


def from_raw(buffer: np.ndarray, tmp_path: Path, format: str, **options: object) -> list[tuple]:
    np.save(tmp_path / "raw.npy", buffer)
    (launch,) = import_tagged.read(tmp_path / "raw.npy", ImportOptions(format=format, **options))  # type: ignore[arg-type]
    return launch_rows(launch)


def packets(path: Path) -> list[pb2.TracePacket]:
    return list(pb2.Trace.FromString(path.read_bytes()).packet)


def byte_of(path: Path, index: int) -> int:
    """The file offset of packet ``index`` (each packet: 0x0A, a varint length, its body)."""
    offset = 0
    for packet in packets(path)[:index]:
        size = packet.ByteSize()
        offset += 1 + (1 if size < 0x80 else 2) + size
    return offset


def fi_buffer() -> np.ndarray:
    """One group per block: block 0 on SM 5 nests decode in prefill, then an instant (sync);
    block 1 on SM 7 runs rope; block 2 on SM 5 runs prefill."""
    return pack(
        3,
        1,
        {
            (0, 0): [
                fi(BEGIN, 0, 0, 5, 1100), fi(BEGIN, 1, 0, 5, 1200), fi(END, 1, 0, 5, 1300),
                fi(END, 0, 0, 5, 1400), fi(INSTANT, 4, 0, 5, 1450),
            ],
            (1, 0): [fi(BEGIN, 3, 1, 7, 1050), fi(END, 3, 1, 7, 1250)],
            (2, 0): [fi(BEGIN, 0, 2, 5, 1120), fi(END, 0, 2, 5, 1500)],
        },
    )  # fmt: skip


def test_flashinfer_trace_layout_from_the_packer(tmp_path: Path) -> None:
    """What tg4perfetto writes: the ClockSnapshot, the config, the sequence defaults, then an
    SM_%03d process (pid 1, uuid 1234567) and its blk tracks, interned begin names."""
    flashinfer_trace(tmp_path / "t.perfetto-trace", fi_buffer(), EVENTS)
    head, config, defaults, sm5, track = packets(tmp_path / "t.perfetto-trace")[:5]
    assert [c.clock_id for c in head.clock_snapshot.clocks] == [1, 2, 3, 4, 5, 6]
    assert head.clock_snapshot.primary_trace_clock == pb2.BUILTIN_CLOCK_BOOTTIME
    assert config.trace_config.data_sources[0].config.name == "track_event"
    assert defaults.trace_packet_defaults.timestamp_clock_id == 1
    assert (sm5.track_descriptor.uuid, sm5.track_descriptor.process.pid) == (1234567, 1)
    assert sm5.track_descriptor.process.process_name == "SM_005"
    assert (track.track_descriptor.name, track.track_descriptor.parent_uuid) == ("blk0_g0", 1234567)
    begin = packets(tmp_path / "t.perfetto-trace")[5]
    assert begin.track_event.type == pb2.TrackEvent.TYPE_SLICE_BEGIN
    assert (begin.timestamp, begin.track_event.name_iid) == (1100, 1)
    assert begin.interned_data.event_names[0].name == "prefill"
    assert is_perfetto_trace(tmp_path / "t.perfetto-trace")


def test_flashinfer_trace_gives_the_raw_buffers_records(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    flashinfer_trace(path, fi_buffer(), EVENTS)
    names = dict(enumerate(EVENTS))
    records, launch = from_trace(path, "flashinfer", names=names)
    assert records == [
        (SM, 5, 0, 1100, 1400, 0, 0, 0, 0, "compute"),
        (SM, 5, 1, 1120, 1500, 0, 4, 1, 2, "compute"),
        (SM, 5, 2, 1200, 1300, 1, 1, 0, 0, "compute"),
        (SM, 5, 3, 1450, 1450, 4, 2, 0, 0, "compute"),
        (SM, 7, 0, 1050, 1250, 3, 3, 0, 1, "compute"),
    ]
    assert records == from_raw(fi_buffer(), tmp_path, "flashinfer", names=names)
    assert launch.stage_names == names  # type: ignore[attr-defined]
    assert (launch.producer, launch.producer_format) == ("flashinfer", "perfetto-trace")  # type: ignore[attr-defined]
    assert (launch.clock_domain, launch.frequency_hz, launch.anchor_cycle) == ("shared", 1e9, 1050)  # type: ignore[attr-defined]
    assert launch.owner_label == "Block"  # type: ignore[attr-defined]


def test_flashinfer_names_without_an_index_number_in_first_use(tmp_path: Path) -> None:
    """Slot order: prefill (block 0), rope (block 1), prefill, decode, then sync (an inline
    instant name): ids 0 1 2 3, unless a name's index is given."""
    path = tmp_path / "t.perfetto-trace"
    flashinfer_trace(path, fi_buffer(), EVENTS)
    records, launch = from_trace(path, "flashinfer")
    assert launch.stage_names == {0: "prefill", 1: "rope", 2: "decode", 3: "sync"}  # type: ignore[attr-defined]
    assert [r[5] for r in records] == [0, 0, 2, 3, 1]
    _, given = from_trace(path, "flashinfer", names={1: "prefill"})
    assert given.stage_names == {1: "prefill", 0: "rope", 2: "decode", 3: "sync"}  # type: ignore[attr-defined]


def test_nested_slices_end_with_their_tracks_last_open_one(tmp_path: Path) -> None:
    """decode (1200..1300) inside prefill (1100..1400) on track blk0_g0; three deep."""
    buffer = pack(1, 1, {(0, 0): [
        fi(BEGIN, 0, 0, 1, 10), fi(BEGIN, 1, 0, 1, 20), fi(BEGIN, 2, 0, 1, 30),
        fi(END, 2, 0, 1, 40), fi(END, 1, 0, 1, 50), fi(BEGIN, 3, 0, 1, 55), fi(END, 3, 0, 1, 60),
        fi(END, 0, 0, 1, 70),
    ]})  # fmt: skip
    flashinfer_trace(tmp_path / "t.perfetto-trace", buffer, EVENTS)
    records, _ = from_trace(
        tmp_path / "t.perfetto-trace", "flashinfer", names=dict(enumerate(EVENTS))
    )
    assert [(r[5], r[3], r[4]) for r in records] == [
        (0, 10, 70),
        (1, 20, 50),
        (2, 30, 40),
        (3, 55, 60),
    ]
    assert records == from_raw(buffer, tmp_path, "flashinfer", names=dict(enumerate(EVENTS)))


def test_wrap_of_the_32_bit_counter_is_unwrapped_per_track(tmp_path: Path) -> None:
    """Block 0 begins 100 ns before the wrap and ends 200 ns after; block 1 starts after it.
    The earliest record keeps its raw value, as from the raw buffer."""
    buffer = pack(2, 1, {
        (0, 0): [fi(BEGIN, 0, 0, 1, TOP - 100), fi(END, 0, 0, 1, 200), fi(INSTANT, 4, 0, 1, 300)],
        (1, 0): [fi(BEGIN, 0, 1, 2, 50), fi(END, 0, 1, 2, 2_000_000_000)],
    })  # fmt: skip
    flashinfer_trace(tmp_path / "t.perfetto-trace", buffer, EVENTS)
    records, launch = from_trace(
        tmp_path / "t.perfetto-trace", "flashinfer", names={0: "prefill", 4: "sync"}
    )
    assert [r[1:5] for r in records] == [
        (1, 0, TOP - 100, TOP + 200),
        (1, 1, TOP + 300, TOP + 300),
        (2, 0, TOP + 50, TOP + 2_000_000_000),
    ]
    assert launch.anchor_cycle == TOP - 100  # type: ignore[attr-defined]
    assert records == from_raw(buffer, tmp_path, "flashinfer", names={0: "prefill", 4: "sync"})


def test_a_step_the_wrap_makes_ambiguous_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    flashinfer_trace(
        path, pack(1, 1, {(0, 0): [fi(BEGIN, 0, 0, 1, 10), fi(END, 0, 0, 1, 10 + 2**31)]}), EVENTS
    )
    at = byte_of(path, 6)
    message = rf"t\.perfetto-trace: the track event at byte {at} follows the previous one of "
    with pytest.raises(ImportFormatError, match=message + r"its track by 2147483648 ns .* cannot"):
        from_trace(path, "flashinfer")
    apart = pack(3, 1, {
        (b, 0): [fi(BEGIN, 0, b, 1, t), fi(END, 0, b, 1, t + 5)]
        for b, t in enumerate((0, 1_500_000_000, 3_000_000_000))
    })  # fmt: skip
    flashinfer_trace(path, apart, EVENTS)
    with pytest.raises(ImportFormatError, match=r"tracks' first events lie .* cannot be decided"):
        from_trace(path, "flashinfer")


def hand_trace(path: Path, events: list[tuple[str, int, str]]) -> None:
    """A FlashInfer-shaped trace of one track (blk0_g0 in SM_001) from (kind, ts, name)."""
    with open(path, "wb") as out:
        writer = TraceWriter(out)
        track = writer.create_track(writer.create_group("SM_001"), "blk0_g0")
        for kind, ts, name in events:
            if kind == "open":
                writer.open(track, ts, name)
            elif kind == "close":
                writer.close(track, ts)
            else:
                writer.instant(track, ts, name)


def test_an_end_closing_nothing_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    hand_trace(path, [("open", 10, "a"), ("close", 20, ""), ("close", 30, "")])
    at = byte_of(path, 7)
    with pytest.raises(ImportFormatError, match=rf"the slice end at byte {at} on track 'blk0_g0' "
                       r"\(uuid 1234568\) closes no open slice"):  # fmt: skip
        from_trace(path, "flashinfer")


def test_a_begin_never_ended_is_a_dropped_record(tmp_path: Path) -> None:
    """What FlashInfer's exporter writes when a writer filled its column: the begin stays
    open. It is counted, the closed slices are kept."""
    path = tmp_path / "t.perfetto-trace"
    hand_trace(
        path,
        [
            ("open", 10, "a"),
            ("close", 20, ""),
            ("open", 30, "b"),
            ("open", 35, "c"),
            ("close", 40, ""),
        ],
    )
    with pytest.warns(DroppedRecordsWarning, match="1 slices begin and never end"):
        records, launch = from_trace(path, "flashinfer")
    assert [r[3:6] for r in records] == [(10, 20, 0), (35, 40, 2)]
    assert launch.dropped == {(SM, 1): 1}  # type: ignore[attr-defined]


def test_a_truncated_file_names_the_cut_packet(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    flashinfer_trace(path, fi_buffer(), EVENTS)
    data = path.read_bytes()
    cut = byte_of(path, 9)
    (tmp_path / "cut.perfetto-trace").write_bytes(data[: cut + 3])
    message = rf"cut\.perfetto-trace: the file is truncated: the packet at byte {cut} does "
    with pytest.raises(ImportFormatError, match=message + rf"not end .* file at byte {cut + 3}"):
        from_trace(tmp_path / "cut.perfetto-trace", "flashinfer")
    (tmp_path / "one.perfetto-trace").write_bytes(data[: cut + 1])
    with pytest.raises(ImportFormatError, match=rf"packet at byte {cut} does not end"):
        from_trace(tmp_path / "one.perfetto-trace", "flashinfer")


def test_a_corrupt_field_inside_a_packet_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    hand_trace(path, [("open", 10, "a"), ("close", 20, "")])
    data = bytearray(path.read_bytes())
    at = byte_of(path, 5)
    data[at + 2] = 0x0F  # the body's first key: field 1, wire type 7 (none)
    path.write_bytes(bytes(data))
    with pytest.raises(
        ImportFormatError, match=rf"byte {at + 2}: a field \(number 1, wire type 7\)"
    ):
        from_trace(path, "flashinfer")


def test_not_a_perfetto_trace(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"traceEvents": []}')
    assert not is_perfetto_trace(tmp_path / "x.json")
    with pytest.raises(ImportFormatError, match=r"x\.json: byte 0 holds 0x7b, not a TracePacket"):
        from_trace(tmp_path / "x.json", "flashinfer")
    np.save(tmp_path / "raw.npy", fi_buffer())
    assert not is_perfetto_trace(tmp_path / "raw.npy")
    (tmp_path / "empty.perfetto-trace").write_bytes(b"")
    assert not is_perfetto_trace(tmp_path / "empty.perfetto-trace")
    with pytest.raises(ImportFormatError, match="the file is empty"):
        from_trace(tmp_path / "empty.perfetto-trace", "flashinfer")
    other = pb2.Trace(packet=[pb2.TracePacket(timestamp=5, trusted_packet_sequence_id=1)])
    (tmp_path / "other.perfetto-trace").write_bytes(other.SerializeToString())
    assert is_perfetto_trace(tmp_path / "other.perfetto-trace")
    with pytest.raises(
        ImportFormatError,
        match="first packet holds no ClockSnapshot: not a trace tg4perfetto wrote",
    ):
        from_trace(tmp_path / "other.perfetto-trace", "flashinfer")


def test_another_producers_trace_is_refused(tmp_path: Path) -> None:
    mpk_trace(tmp_path / "m.perfetto-trace", mpk_buffer(), MPK_TASK_NAMES)
    message = r"track 'group_0' \(descriptor at byte \d+\) is not FlashInfer's layout"
    with pytest.raises(ImportFormatError, match=message):
        from_trace(tmp_path / "m.perfetto-trace", "flashinfer")
    flashinfer_trace(tmp_path / "f.perfetto-trace", fi_buffer(), EVENTS)
    with pytest.raises(ImportFormatError, match=r"track 'blk0_g0' .* is not MPK's layout"):
        from_trace(tmp_path / "f.perfetto-trace", "mpk")


def test_zero_slices_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    hand_trace(path, [])
    with pytest.raises(
        ImportFormatError, match=r"t\.perfetto-trace: the trace holds no slice or instant"
    ):
        from_trace(path, "flashinfer")
    hand_trace(path, [("open", 10, "a")])
    with pytest.raises(ImportFormatError, match="no slice of the trace ends, and it holds no"):
        from_trace(path, "flashinfer")
    hand_trace(path, [("open", 10, "a"), ("close", 20, "")])
    with pytest.raises(ImportFormatError, match="read as flashinfer, mpk, triton-distributed, not"):
        from_trace(path, "hazy")


def test_several_groups_per_block_are_refused(tmp_path: Path) -> None:
    """With two groups FlashInfer's exporter files block 1's both groups under blk0_g1,
    interleaved on one track: which slice is whose cannot be known."""
    buffer = pack(2, 2, {
        (1, 0): [fi(BEGIN, 0, 1, 3, 100), fi(END, 0, 1, 3, 200)],
        (1, 1): [fi(BEGIN, 1, 1, 3, 105), fi(END, 1, 1, 3, 210)],
    })  # fmt: skip
    flashinfer_trace(tmp_path / "t.perfetto-trace", buffer, EVENTS)
    assert [
        p.track_descriptor.name
        for p in packets(tmp_path / "t.perfetto-trace")
        if p.HasField("track_descriptor")
    ] == ["SM_003", "blk0_g1"]
    with pytest.raises(
        ImportFormatError, match=r"track 'blk0_g1' .* names group 1: .* Import the raw buffer"
    ):
        from_trace(tmp_path / "t.perfetto-trace", "flashinfer")


def mpk_buffer() -> np.ndarray:
    """As tests/test_import_tagged.py's, with an instant: worker 0 embedding, its trigger,
    TASK_BEGIN_TASK_GRAPH as an instant; worker 1 two RMS_NORM tasks."""
    w0 = [
        (mpk_tag(BEGIN, 101, 0, 0), 500), (mpk_tag(END, 101, 0, 0), 900),
        (mpk_tag(BEGIN, 201, 0, 0), 910), (mpk_tag(END, 201, 0, 0), 950),
        (mpk_tag(INSTANT, 10, 0, 1), 960),
    ]  # fmt: skip
    w1 = [
        (mpk_tag(BEGIN, 119, 1, 0), 600), (mpk_tag(END, 119, 1, 0), 700),
        (mpk_tag(BEGIN, 119, 1, 1), 800), (mpk_tag(END, 119, 1, 1), 990),
    ]  # fmt: skip
    return pack(2, 1, {(0, 0): w0, (1, 0): w1})


def test_mpk_trace_gives_the_raw_buffers_records(tmp_path: Path) -> None:
    mpk_trace(tmp_path / "m.perfetto-trace", mpk_buffer(), MPK_TASK_NAMES)
    records, launch = from_trace(tmp_path / "m.perfetto-trace", "mpk")
    assert records == [
        (CTA, 0, 0, 500, 900, 101, 0, 0, 0, "compute"),
        (CTA, 0, 1, 910, 950, DESC_TRIGGER_EVENT, 0, 0, 0, "trigger"),
        (CTA, 0, 2, 960, 960, 10, 1, 0, 0, "compute"),
        (CTA, 1, 0, 600, 700, 119, 8192, 0, 1, "compute"),
        (CTA, 1, 1, 800, 990, 119, 8193, 1, 1, "compute"),
    ]
    assert records == from_raw(mpk_buffer(), tmp_path, "mpk")
    assert launch.stage_names == {  # type: ignore[attr-defined]
        10: "TASK_BEGIN_TASK_GRAPH",
        101: "TASK_EMBEDDING",
        119: "TASK_RMS_NORM",
        201: "TASK_SCHD_EVENTS",
    }
    assert (launch.kernel_name, launch.owner_label) == ("mpk", "Block")  # type: ignore[attr-defined]


def test_mpk_names_missing_from_its_table(tmp_path: Path) -> None:
    """A task type newer than the table keeps its name and takes a local id from 512."""
    buffer = pack(1, 1, {(0, 0): [(mpk_tag(BEGIN, 330, 0, 7), 5), (mpk_tag(END, 330, 0, 7), 9)]})
    mpk_trace(tmp_path / "m.perfetto-trace", buffer, {**MPK_TASK_NAMES, 330: "TASK_NEW_SM100"})
    records, launch = from_trace(tmp_path / "m.perfetto-trace", "mpk")
    assert records == [(CTA, 0, 0, 5, 9, 512, 7, 0, 0, "compute")]
    assert launch.stage_names == {512: "TASK_NEW_SM100"}  # type: ignore[attr-defined]
    _, named = from_trace(tmp_path / "m.perfetto-trace", "mpk", names={330: "TASK_NEW_SM100"})
    assert named.stage_names == {330: "TASK_NEW_SM100"}  # type: ignore[attr-defined]


def test_mpk_past_256_blocks_is_refused(tmp_path: Path) -> None:
    """Block 256's records land on block_0's tracks (8-bit worker field)."""
    buffer = pack(
        257, 1, {(256, 0): [(mpk_tag(BEGIN, 120, 256, 3), 1), (mpk_tag(END, 120, 256, 3), 2)]}
    )
    mpk_trace(tmp_path / "m.perfetto-trace", buffer, MPK_TASK_NAMES)
    with pytest.raises(ImportFormatError, match=r"257 block groups: .* import the raw buffer"):
        from_trace(tmp_path / "m.perfetto-trace", "mpk")


def triton_buffer() -> np.ndarray:
    """As tests/test_import_tagged.py's: program 0 (SM 9) waits, runs qkv, waits, runs attn;
    program 1 (SM 4) runs qkv, then a wait with no task after it."""
    t = triton_tag
    p0 = [
        (t(True, 3, 0), 100), (t(False, 3, 0), 150), (t(True, 1, 0), 150), (t(False, 1, 0), 400),
        (t(True, 3, 0), 400), (t(False, 3, 0), 420), (t(True, 2, 0), 425), (t(False, 2, 0), 600),
    ]  # fmt: skip
    p1 = [(t(True, 1, 1), 120), (t(False, 1, 1), 300), (t(True, 3, 1), 300), (t(False, 3, 1), 700)]
    return pack(2, 1, {(0, 0): p0, (1, 0): p1}, block_sms={0: 9, 1: 4})


TASKS = ["idle", "qkv", "attn", "scoreboard_wait_deps"]


def test_triton_distributed_trace_gives_the_raw_buffers_records(tmp_path: Path) -> None:
    triton_trace(tmp_path / "t.perfetto-trace", triton_buffer(), TASKS)
    names = {1: "qkv", 2: "attn"}
    records, launch = from_trace(tmp_path / "t.perfetto-trace", "triton-distributed", names=names)
    wait = DESC_WAIT_DEPENDENCY
    assert records == [
        (SM, 4, 0, 120, 300, 1, 2, 0, 1, "compute"),
        (SM, 4, 1, 300, 700, wait, 0xFFFF_FFFF, 1, 1, "wait"),
        (SM, 9, 0, 100, 150, wait, 0, 0, 0, "wait"),
        (SM, 9, 1, 150, 400, 1, 0, 1, 0, "compute"),
        (SM, 9, 2, 400, 420, wait, 1, 2, 0, "wait"),
        (SM, 9, 3, 425, 600, 2, 1, 0, 0, "compute"),
    ]
    assert records == from_raw(triton_buffer(), tmp_path, "triton-distributed", names=names)
    assert launch.stage_names == names  # type: ignore[attr-defined]


def test_triton_distributed_overlaps_take_sub_tracks(tmp_path: Path) -> None:
    """Two programs on SM 4 overlap: the exporter lays them on two sub-tracks of group '4';
    both are SM 4's records, owned by their block from the slice name."""
    t = triton_tag
    buffer = pack(2, 1, {
        (0, 0): [(t(True, 1, 0), 100), (t(False, 1, 0), 300)],
        (1, 0): [(t(True, 2, 1), 150), (t(False, 2, 1), 200)],
    }, block_sms={0: 4, 1: 4})  # fmt: skip
    triton_trace(tmp_path / "t.perfetto-trace", buffer, TASKS)
    lanes = [
        p.track_descriptor.name
        for p in packets(tmp_path / "t.perfetto-trace")
        if p.HasField("track_descriptor")
    ]
    assert lanes == ["tracks of all SMs", "4", "4", "4"]
    records, launch = from_trace(tmp_path / "t.perfetto-trace", "triton-distributed")
    assert records == [
        (SM, 4, 0, 100, 300, 0, 0, 0, 0, "compute"),
        (SM, 4, 1, 150, 200, 1, 1, 0, 1, "compute"),
    ]
    assert launch.stage_names == {0: "qkv", 1: "attn"}  # type: ignore[attr-defined]


def test_import_profile_of_trace_and_raw_buffer_agree(tmp_path: Path) -> None:
    """One capture, saved both ways, through the store: records_ns, stage_stats,
    core_breakdown and the Chrome export agree."""
    flashinfer_trace(tmp_path / "cap.perfetto-trace", fi_buffer(), EVENTS)
    np.save(tmp_path / "cap.npy", fi_buffer())
    names = dict(enumerate(EVENTS))
    views = []
    for file in ("cap.npy", "cap.perfetto-trace"):
        store = open_store(tmp_path / file.replace(".", "_"))
        imported = import_profile(store, [tmp_path / file], format="flashinfer", names=names)
        assert imported.records == 5
        ns = store.sql(
            "SELECT block_id, record_index, stage, phase, ts_ns, dur_ns FROM records_ns "
            "ORDER BY block_id, record_index"
        ).to_pylist()
        stats = store.sql(
            "SELECT stage, tasks, compute_total_us FROM stage_stats ORDER BY stage"
        ).to_pylist()
        breakdown = store.sql(
            "SELECT block_id, compute_ns, makespan_ns FROM core_breakdown ORDER BY block_id"
        ).to_pylist()
        export_chrome_trace(store, tmp_path / f"{file}.json")
        events = json.loads((tmp_path / f"{file}.json").read_text())["traceEvents"]
        slices = sorted(
            (e["tid"], e["name"], e["ts"], e["dur"]) for e in events if e.get("ph") == "X"
        )
        views.append((ns, stats, breakdown, slices))
    assert views[0] == views[1]
    ns, stats, breakdown, slices = views[1]
    assert [tuple(r.values()) for r in ns] == [
        (5, 0, "prefill", "compute", 50, 300),
        (5, 1, "prefill", "compute", 70, 380),
        (5, 2, "decode", "compute", 150, 100),
        (5, 3, "sync", "compute", 400, 0),
        (7, 0, "rope", "compute", 0, 200),
    ]
    assert stats == [
        {"stage": "decode", "tasks": 1, "compute_total_us": 0.1},
        {"stage": "prefill", "tasks": 2, "compute_total_us": 0.68},
        {"stage": "rope", "tasks": 1, "compute_total_us": 0.2},
        {"stage": "sync", "tasks": 1, "compute_total_us": 0.0},
    ]
    assert breakdown == [
        {"block_id": 5, "compute_ns": 400, "makespan_ns": 450},
        {"block_id": 7, "compute_ns": 200, "makespan_ns": 450},
    ]
    assert slices[0] == (3005, "decode", 0.15, 0.1)


def test_synthetic_trace_and_decode_baseline(tmp_path: Path) -> None:
    count = write_synthetic(tmp_path / "s.perfetto-trace", 2_000)
    assert count == 15 * 132
    assert numpy_decode(tmp_path / "s.perfetto-trace") == 2 * count
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        records, launch = from_trace(tmp_path / "s.perfetto-trace", "flashinfer")
    assert len(records) == count
    assert {r[1] for r in records} == set(range(132))
    assert launch.stage_names == {i: f"event_{i}" for i in range(9)}  # type: ignore[attr-defined]


def test_blocks_of_the_file_read_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read 7 bytes at a time (every packet straddles a block): the same records."""
    from multicore_profiler.ingest import import_tg4perfetto

    path = tmp_path / "t.perfetto-trace"
    flashinfer_trace(path, fi_buffer(), EVENTS)
    whole, _ = from_trace(path, "flashinfer")
    monkeypatch.setattr(import_tg4perfetto, "BLOCK_BYTES", 7)
    assert from_trace(path, "flashinfer")[0] == whole


def test_crossing_spans_of_one_writer_pair_as_perfetto_shows_them(tmp_path: Path) -> None:
    """prefill 10..30 and decode 20..40 cross on one writer: the raw buffer pairs them by
    event; the trace's ends carry no event, so each closes the last open slice."""
    buffer = pack(1, 1, {(0, 0): [
        fi(BEGIN, 0, 0, 1, 10), fi(BEGIN, 1, 0, 1, 20), fi(END, 0, 0, 1, 30), fi(END, 1, 0, 1, 40),
    ]})  # fmt: skip
    flashinfer_trace(tmp_path / "t.perfetto-trace", buffer, EVENTS)
    names = dict(enumerate(EVENTS))
    records, _ = from_trace(tmp_path / "t.perfetto-trace", "flashinfer", names=names)
    assert [(r[5], r[3], r[4]) for r in records] == [(0, 10, 40), (1, 20, 30)]
    raw = from_raw(buffer, tmp_path, "flashinfer", names=names)
    assert [(r[5], r[3], r[4]) for r in raw] == [(0, 10, 30), (1, 20, 40)]


def test_triton_distributed_spans_across_a_wrap_are_refused(tmp_path: Path) -> None:
    """Its exporter sorts by the raw start: the span after the wrap (raw 50..100) comes first
    on the sub-track, the one before it (raw 2^32 - 500) next, 2^32 - 600 ns later."""
    t = triton_tag
    buffer = pack(1, 1, {(0, 0): [
        (t(True, 1, 0), TOP - 500), (t(False, 1, 0), TOP - 400),
        (t(True, 2, 0), 50), (t(False, 2, 0), 100),
    ]}, block_sms={0: 3})  # fmt: skip
    triton_trace(tmp_path / "t.perfetto-trace", buffer, TASKS)
    at = byte_of(tmp_path / "t.perfetto-trace", 8)
    with pytest.raises(ImportFormatError, match=rf"event at byte {at} follows .* by 4294966696 ns"):
        from_trace(tmp_path / "t.perfetto-trace", "triton-distributed")
