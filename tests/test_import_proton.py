"""Proton imports: the host buffer and the chrome trace, real samples and packed edge cases."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from multicore_profiler.errors import (
    ArgumentError,
    ClockAnchorWarning,
    DroppedRecordsWarning,
    ImportFormatError,
)
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.ingest.import_proton import read
from multicore_profiler.ingest.imported import CoreClock, ImportedInvocation
from multicore_profiler.ingest.imports import ImportOptions, import_profile
from multicore_profiler.storage.store import open_store
from tests.proton_packer import (
    Cta,
    Layout,
    chrome_trace,
    numpy_decode,
    pack_buffer,
    scopes,
    write_synthetic,
    write_synthetic_chrome,
)
from tests.shared_fixtures import shared_fixture

SM = 3


def launches(path: Path, **options: object) -> list[ImportedInvocation]:
    return list(read(path, ImportOptions(format="proton", **options)))  # type: ignore[arg-type]


_ROWS: dict[int, tuple[ImportedInvocation, list[dict]]] = {}
"""Each launch's records by its id, with the launch itself (kept alive, so the id is its)."""


def rows(launch: ImportedInvocation) -> list[dict]:
    """The launch's records (read once: its chunks come from a generator)."""
    if id(launch) not in _ROWS:
        table = pa.concat_tables(list(launch.records))
        _ROWS[id(launch)] = (launch, table.drop(["phase"]).to_pylist())
    return _ROWS[id(launch)][1]


def written(tmp_path: Path, data: bytes | str, name: str = "p.bin") -> Path:
    path = tmp_path / name
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    return path


def seq() -> list[ImportedInvocation]:
    with pytest.warns(ClockAnchorWarning, match=r"counter runs at 1656 MHz or more"):
        return launches(shared_fixture("import/proton_seq_hip.bin"))


# --- the real samples --------------------------------------------------------------------


def test_seq_decodes_its_crossing_scopes_per_warp() -> None:
    (launch,) = seq()
    assert (launch.kernel_name, launch.soc, launch.frequency_hz) == ("proton", "hip", 1e9)
    assert (launch.producer, launch.producer_format, launch.owner_label) == (
        "proton", "host-buffer/1", "warp",
    )  # fmt: skip
    assert launch.stage_names == {0: "scope_0", 1: "scope_1", 2: "scope_2"}
    assert launch.dropped == {}
    records = rows(launch)
    assert len(records) == 24
    # CTA 0 (hw 0x5e) warp 0 wrote S0 S1 S2 E1 E0 E2: three instances, crossing.
    warp0 = sorted(
        (r["desc_id"], r["start_cycle"], r["end_cycle"] - r["start_cycle"])
        for r in records
        if r["owner_id"] == 0
    )
    assert warp0 == [(0, 1136998837487, 324), (1, 1136998837559, 168), (2, 1136998837643, 252)]
    first = records[0]
    assert first == {
        "core_type": SM, "block_id": 0x5E, "record_index": 0, "start_cycle": 1136998837487,
        "end_cycle": 1136998837811, "desc_id": 0, "task_id": 0, "stage_task_index": 0,
        "owner_id": 0,
    }  # fmt: skip
    # CTA 1 runs on hw 0x82: its warps are owners 4..7 (CTA x 4 warps + warp).
    cta1 = [r for r in records if r["block_id"] == 0x82]
    assert {r["owner_id"] for r in cta1} == {4, 5, 6, 7}
    assert {r["task_id"] for r in cta1} == {1}
    assert cta1[0]["start_cycle"] == 95280551537
    assert [r["record_index"] for r in cta1] == list(range(12))
    starts = [r["start_cycle"] for r in cta1]
    assert starts == sorted(starts)


def test_seq_clocks_anchor_each_sm_at_its_init_and_report_the_empty_interval() -> None:
    (launch,) = seq()
    assert launch.clock_domain == "anchored"
    # CTA 0: init is the earliest; its records span 530 cycles but pre-final is 320 ns on.
    # CTA 1: init 170 ns later, records 95280551537 .. 95280551982, pre-final at 490 ns.
    assert launch.clocks == {
        (SM, 0x5E): CoreClock(-1136998837487, -1136998837487, 320 - 1136998838017),
        (SM, 0x82): CoreClock(170 - 95280551537, 170 - 95280551537, 490 - 95280551982),
    }


def test_seq_at_the_sm_clock_fits_its_anchors() -> None:
    (launch,) = launches(shared_fixture("import/proton_seq_hip.bin"), frequency_hz=2e9)
    assert launch.frequency_hz == 2e9
    assert launch.clocks == {
        (SM, 0x5E): CoreClock(-1136998837487, -1136998837487, 640 - 1136998838017),
        (SM, 0x82): CoreClock(340 - 95280551537, 340 - 95280551537, 980 - 95280551982),
    }


def test_loop_counts_what_the_circular_buffer_overwrote() -> None:
    with pytest.warns(DroppedRecordsWarning, match=r"128 entries were overwritten in 4 warps"):
        (launch,) = launches(shared_fixture("import/proton_loop_hip.bin"), kernel_name="loop")
    # Each warp wrote 80 words (40 entries, 20 iterations) into 8 slots: the last 4
    # iterations are kept, 16 instances per warp (32 entries) lost, 64 on the SM.
    assert launch.dropped == {(SM, 0xD8): 64}
    assert launch.kernel_name == "loop"
    records = rows(launch)
    assert len(records) == 16
    warp2 = [r for r in records if r["owner_id"] == 2]
    assert [(r["start_cycle"], r["end_cycle"], r["stage_task_index"]) for r in warp2] == [
        (971519890082, 971519890166, 0),
        (971519890254, 971519890338, 1),
        (971519890426, 971519890510, 2),
        (971519890598, 971519890682, 3),
    ]
    assert launch.clocks == {
        (SM, 0xD8): CoreClock(-971519890007, -971519890007, 1720 - 971519890688)
    }


# --- packed edge cases -------------------------------------------------------------------


def cta(program: int, hw: int, *warps: list, init: int = 1000, span: int = 10**6) -> Cta:
    return Cta(program, hw, init, init + span, init + span + 300, warps)


def test_a_wrapped_segment_is_read_from_its_write_position_and_orphans_are_counted(
    tmp_path: Path,
) -> None:
    entries = scopes(("S0", 100), ("E0", 110), ("S1", 120), ("S2", 130),  # overwritten
                     ("E1", 140), ("E2", 150), ("S0", 160), ("E0", 170),
                     ("S0", 180), ("E0", 190), ("S1", 200), ("E1", 210))  # fmt: skip
    path = written(tmp_path, pack_buffer([cta(0, 7, entries)], Layout(uids=(0,), total_unit=1)))
    with pytest.warns(DroppedRecordsWarning, match=r"2 of them ends whose begin was overwritten"):
        (launch,) = launches(path)
    # Lost: S0/E0, S1 (its E1 orphaned), S2 (its E2 orphaned): 3 instances.
    assert launch.dropped == {(SM, 7): 3}
    kept = [
        (r["desc_id"], r["start_cycle"], r["end_cycle"], r["stage_task_index"])
        for r in rows(launch)
    ]
    assert kept == [(0, 160, 170, 0), (0, 180, 190, 1), (1, 200, 210, 0)]


def test_unpaired_entries_without_a_wrap_are_each_a_lost_instance(tmp_path: Path) -> None:
    entries = scopes(("E1", 90), ("S0", 100), ("S0", 110), ("E0", 120), ("S2", 130))
    path = written(tmp_path, pack_buffer([cta(0, 7, entries)], Layout(uids=(0,), total_unit=1)))
    with pytest.warns(DroppedRecordsWarning, match=r"no segment wrapped; 3 kept entries"):
        (launch,) = launches(path)
    assert launch.dropped == {(SM, 7): 3}
    # The later begin of scope 0 is the one its end closes.
    assert [(r["start_cycle"], r["end_cycle"]) for r in rows(launch)] == [(110, 120)]


def test_ctas_sharing_an_sm_intersect_their_anchors_and_unprofiled_ones_are_skipped(
    tmp_path: Path,
) -> None:
    one = cta(4, 9, scopes(("S0", 5000), ("E0", 5100)), init=1000, span=400)
    skipped = Cta(5, 0, 0, 0, 0, preamble=0)
    # CTA 6 on the same SM starts 2000 ns later and its first record 1950 cycles later.
    two = cta(6, 9, scopes(("S3", 6950), ("E3", 7000)), init=3000, span=100)
    other = cta(7, 2, scopes(("S0", 50), ("E0", 60)), init=1500)
    path = written(tmp_path, pack_buffer([one, skipped, two, other]))
    (launch,) = launches(path)
    # CTA 4 allows -5000 .. 400 - 5100, CTA 6 allows 2000 - 6950 .. 2100 - 7000 (ns from
    # CTA 4's init, at 1 GHz): the SM's interval is their intersection, its offset its low end.
    assert launch.clocks == {
        (SM, 9): CoreClock(-4950, -4950, -4900),
        (SM, 2): CoreClock(500 - 50, 500 - 50, 1500 + 10**6 - 1000 - 60),
    }
    assert {r["task_id"] for r in rows(launch)} == {4, 6, 7}


def test_sampled_warps_keep_their_own_ids(tmp_path: Path) -> None:
    warp1 = scopes(("S0", 10), ("E0", 20))
    warp3 = scopes(("S0", 15), ("E0", 40))
    data = pack_buffer([cta(2, 1, warp1, warp3)], Layout(uids=(1, 3), segment_bytes=128))
    (launch,) = launches(written(tmp_path, data))
    # The counts of warps 1 and 3 are read at their warp ids; owners are 2 x 4 + warp.
    assert [(r["owner_id"], r["end_cycle"] - r["start_cycle"]) for r in rows(launch)] == [
        (9, 10),
        (11, 25),
    ]


def test_an_sm_whose_43_bit_counter_wrapped_is_unwrapped(tmp_path: Path) -> None:
    top = (1 << 43) - 20
    entries = scopes(("S0", top), ("E0", 5), ("S1", 10), ("E1", 30))
    path = written(tmp_path, pack_buffer([cta(0, 3, entries)], Layout(uids=(0,), total_unit=1)))
    (launch,) = launches(path)
    assert [(r["start_cycle"], r["end_cycle"]) for r in rows(launch)] == [
        (top, (1 << 43) + 5),
        ((1 << 43) + 10, (1 << 43) + 30),
    ]


@pytest.mark.parametrize("frequency", [0.0, -1e9, float("nan"), float("inf")])
def test_a_frequency_that_is_not_one_is_refused(tmp_path: Path, frequency: float) -> None:
    path = written(tmp_path, pack_buffer([cta(0, 3, scopes(("S5", 1), ("E5", 2)))]))
    with pytest.raises(ArgumentError, match=r"positive number of Hz"):
        launches(path, frequency_hz=frequency)


def test_scope_names_from_the_options(tmp_path: Path) -> None:
    path = written(tmp_path, pack_buffer([cta(0, 3, scopes(("S5", 1), ("E5", 2)))]))
    (launch,) = launches(path, names={5: "load", 6: "unused"})
    assert launch.stage_names == {5: "load"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01\x00\x00\x00" + bytes(10), r"truncated: 14 bytes hold no Proton host header"),
        (b"\x07" * 64, r"neither a Proton host buffer"),
        (b"", r"neither a Proton host buffer"),
        (pack_buffer([cta(0, 1, [])]) + b"\0", r"too long: 441 bytes, but its header says 440"),
        (
            pack_buffer([], Layout(overrides={"version": 1, "block_num": 1})),
            r"payload_size 0 does not hold block_num 1",
        ),
        (
            pack_buffer([cta(0, 1, [])], Layout(overrides={"header_size": 52})),
            r"header_size 52, but 4 uids make it 56",
        ),
        (
            pack_buffer([cta(0, 1, [])], Layout(overrides={"uid_num": 5})),
            r"5 profiled warps of 4",
        ),
        (
            pack_buffer([cta(0, 1, [])], Layout(extra_payload=384)),
            r"payload_size 768 does not hold block_num 1",
        ),
        (pack_buffer([cta(0, 1, [])], Layout(device_type=3)), r"device_type 3"),
        (pack_buffer([cta(0, 1, [])], Layout(uids=(0, 2, 1, 3))), r"not increasing warp ids"),
        (
            pack_buffer([Cta(0, 1, 0, 0, 0, preamble=0x12345678)]),
            r"CTA block 0 \(at byte 56\) starts with 0x12345678",
        ),
        (
            pack_buffer([Cta(3, 1, 10, 20, 30, counts=(2, 3, 0, 0))]),
            r"CTA block 0 \(program id 3\), warp 1: wrote 3 words, an odd number .*byte 100\)",
        ),
        (pack_buffer([Cta(3, 1, 30, 20, 40)]), r"init, pre-final and post-final times"),
        (pack_buffer([cta(3, 1, []), cta(3, 2, [])]), r"CTA block 1 \(program id 3\): another"),
        (pack_buffer([Cta(0, 1, 0, 0, 0, preamble=0)]), r"no scope instance: 0 of 1 CTA blocks"),
        (pack_buffer([cta(0, 1, scopes(("S0", 1)))]), r"no scope instance: 1 of 1 CTA blocks"),
        (
            pack_buffer([cta(0, 1, [], scopes(("S2", 50), ("E2", 40)))]),
            r"warp 1: the end of scope 2 at byte 184 has cycle 40, before its begin's 50",
        ),
    ],
)
def test_refused_buffers_name_where(tmp_path: Path, data: bytes, message: str) -> None:
    path = written(tmp_path, data)
    with pytest.raises(ImportFormatError, match=message):
        launches(path)


@pytest.mark.parametrize("cut", [1, 100, 383])
def test_a_truncated_buffer_is_refused(tmp_path: Path, cut: int) -> None:
    data = Path(shared_fixture("import/proton_loop_hip.bin")).read_bytes()
    path = written(tmp_path, data[:-cut])
    with pytest.raises(
        ImportFormatError, match=rf"truncated: {568 - cut} bytes, but its header says 568"
    ):
        launches(path)


def test_a_segment_that_is_not_whole_entries_is_refused(tmp_path: Path) -> None:
    path = written(tmp_path, pack_buffer([cta(0, 1, [])], Layout(segment_bytes=60)))
    with pytest.raises(ImportFormatError, match=r"240 data bytes are not 4 whole segments"):
        launches(path)


# --- the chrome trace --------------------------------------------------------------------


def aligned(launch: ImportedInvocation) -> list[tuple]:
    """Records on the launch's common clock, from its earliest record, in a fixed order."""
    records = rows(launch)
    shifted = [
        (r["start_cycle"] + launch.clocks[(SM, r["block_id"])].offset_cycles, r) for r in records
    ]
    zero = min(s for s, _ in shifted)
    return sorted(
        (s - zero, r["end_cycle"] - r["start_cycle"], r["block_id"], r["owner_id"], r["desc_id"],
         r["task_id"], r["stage_task_index"], r["record_index"])
        for s, r in shifted
    )  # fmt: skip


@pytest.mark.parametrize("sample", ["proton_seq_hip.bin", "proton_loop_hip.bin"])
def test_the_chrome_trace_of_a_sample_gives_its_buffer_records(tmp_path: Path, sample: str) -> None:
    buffer = Path(shared_fixture(f"import/{sample}"))
    trace = written(tmp_path, chrome_trace([(buffer.read_bytes(), "kern")]), "t.chrome_trace")
    warned = ClockAnchorWarning if "seq" in sample else DroppedRecordsWarning
    with pytest.warns(warned):  # the sample's anchors, or its loop's overwrite
        (from_buffer,) = launches(buffer, kernel_name="kern")
    if "seq" in sample:
        with pytest.warns(ClockAnchorWarning, match=r"CTA 0 spans 530 cycles"):
            (from_trace,) = launches(trace)
    else:
        (from_trace,) = launches(trace)  # the trace does not know what was overwritten
    assert (from_trace.kernel_name, from_trace.producer_format) == ("kern", "chrome-trace")
    assert aligned(from_trace) == aligned(from_buffer)
    assert from_trace.dropped == {}
    assert from_trace.stage_names == from_buffer.stage_names
    # What the trace lost: the raw cycles (only those since the CTA's first record remain).
    first = rows(from_trace)[0]
    assert first["start_cycle"] == 0
    assert {
        k: (c.offset_cycles, c.high_cycles - c.low_cycles) for k, c in from_trace.clocks.items()
    } == {
        k: (c.offset_cycles + min_start(from_buffer, k[1]), c.high_cycles - c.low_cycles)
        for k, c in from_buffer.clocks.items()
    }


def min_start(launch: ImportedInvocation, hw: int) -> int:
    return min(r["start_cycle"] for r in rows(launch) if r["block_id"] == hw)


@pytest.mark.parametrize(("second_first", "moved"), [(7000, 0), (7050, 50), (6950, -50)])
def test_a_trace_places_each_cta_of_an_sm_by_its_own_init(
    tmp_path: Path, second_first: int, moved: int
) -> None:
    one = cta(4, 9, scopes(("S0", 5000), ("E0", 5100)), init=1000)
    two = cta(6, 9, scopes(("S0", second_first), ("E0", second_first + 50)), init=3000)
    buffer = pack_buffer([one, two])
    trace = written(tmp_path, chrome_trace([(buffer, "k")]), "t.json")
    (from_buffer,) = launches(written(tmp_path, buffer))
    (from_trace,) = launches(trace)
    placed = {
        name: {r[5]: r[0] for r in aligned(launch)}
        for name, launch in (("buffer", from_buffer), ("trace", from_trace))
    }
    # The buffer knows the SM's one counter: the CTA whose anchor binds lands at its init,
    # the other where the shared cycles put it (CTA 6 at 2050 with CTA 4 at 0; or CTA 4 at
    # 50, CTA 6 at 2000). The trace lost the shared counter and puts each CTA at its own
    # init, as Proton's viewer does; both agree where the anchors do.
    assert placed["trace"] == {4: 0, 6: 2000}
    assert placed["buffer"] == {4: 0, 6: 2000 + moved}


def test_a_gzipped_trace_reads_as_the_trace(tmp_path: Path) -> None:
    buffer = pack_buffer([cta(0, 3, scopes(("S0", 100), ("E0", 200)))])
    text = chrome_trace([(buffer, "k")])
    path = written(tmp_path, gzip.compress(text.encode()), "t.chrome_trace.gz")
    (launch,) = launches(path)
    assert [(r["start_cycle"], r["end_cycle"]) for r in rows(launch)] == [(0, 100)]


def test_named_scopes_and_several_launches_of_a_trace(tmp_path: Path) -> None:
    one = pack_buffer([cta(0, 3, scopes(("S0", 100), ("S1", 110), ("E1", 150), ("E0", 200))),
                       cta(1, 4, scopes(("S1", 900), ("E1", 960)), init=1040)])  # fmt: skip
    two = pack_buffer([cta(0, 5, scopes(("S1", 70), ("E1", 75)), init=90000)])
    text = chrome_trace([(one, "mm"), (two, "mm")], names={0: "outer", 1: "inner"})
    path = written(tmp_path, text, "t.chrome_trace")
    first, second = launches(path)
    # Named scopes take ids from 256 on, in the file's order (Proton writes an instance at
    # its end: "inner" ends first); the same name keeps its id in every launch.
    assert first.stage_names == {256: "inner", 257: "outer"}
    assert second.stage_names == {256: "inner"}
    got = [(r["block_id"], r["desc_id"], r["start_cycle"], r["end_cycle"], r["owner_id"])
           for r in rows(first)]  # fmt: skip
    assert got == [(3, 257, 0, 100, 0), (3, 256, 10, 50, 0), (4, 256, 0, 60, 1)]
    assert first.clocks == {
        (SM, 3): CoreClock(0, 0, 10**6 - 100),
        (SM, 4): CoreClock(40, 40, 10**6 - 20),
    }
    assert [(r["block_id"], r["start_cycle"], r["end_cycle"]) for r in rows(second)] == [(5, 0, 5)]
    assert second.clocks == {(SM, 5): CoreClock(0, 0, 10**6 - 5)}
    partly_named = written(tmp_path, chrome_trace([(one, "mm")], names={0: "outer"}), "n.json")
    (named,) = launches(partly_named, names={0: "outer", 1: "inner"})
    assert named.stage_names == {0: "outer", 1: "inner"}
    assert {r["desc_id"] for r in rows(named)} == {0, 1}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda e: e.update(pid=3), r"has pid 3, which is not '<kernel> Core<hw> CTA<cta>'"),
        (lambda e: e.update(tid="thread 0"), r"has tid \"thread 0\", which is not 'warp <w>"),
        (lambda e: e.update(ph="B"), r"has ph \"B\", which is not X"),
        (lambda e: e["args"].update({"Frequency (MHz)": 1400.0}), r"is not the 1000.0 Proton"),
        (lambda e: e["args"].pop("Init Time (ns)"), r"event 1 has no args.Init Time \(ns\)"),
        (
            lambda e: e["args"].update({"Init Time (ns)": "soon"}),
            r"event 1 has args.Init Time \(ns\) \"soon\", which is not a number",
        ),
        (lambda e: e.update(ts=e["ts"] + 0.5), r"not the timestamps Proton writes"),
        (lambda e: e.update(cat="other"), r"has cat \"other\", which is not the kernel"),
        (lambda e: e.update(dur=-0.001), r"has dur -0.001, which is not a number >= 0"),
        (lambda e: e.pop("ph"), r"event 1 has no ph, which every event"),
        (lambda e: e.update(pid="k Core1234567890 CTA1"), r"which is not '<kernel> Core<hw>"),
    ],
)
def test_refused_chrome_traces_name_the_event(tmp_path: Path, edit, message: str) -> None:
    buffer = pack_buffer([cta(0, 3, scopes(("S0", 100), ("E0", 200))),
                          cta(1, 4, scopes(("S0", 10), ("E0", 20)), init=1200)])  # fmt: skip
    document = json.loads(chrome_trace([(buffer, "k")]))
    edit(document["traceEvents"][1])
    path = written(tmp_path, json.dumps(document), "t.json")
    with pytest.raises(ImportFormatError, match=message):
        launches(path)


def test_a_json_that_is_not_a_trace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError, match=r"not a Proton chrome trace"):
        launches(written(tmp_path, '{"traceEvents": 3}', "t.json"))
    with pytest.raises(ImportFormatError, match=r"without any scope event"):
        launches(written(tmp_path, '{"traceEvents": []}', "e.json"))


# --- the store, end to end ---------------------------------------------------------------


def test_import_into_a_store_then_views_and_export(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    buffer = shared_fixture("import/proton_seq_hip.bin")
    trace = written(tmp_path, chrome_trace([(Path(buffer).read_bytes(), "seq")]), "t.chrome_trace")
    raw = import_profile(store, [buffer], format="proton", kernel_name="seq", run_id="raw",
                         frequency_hz=2e9)  # fmt: skip
    json_run = import_profile(store, [trace], format="proton", run_id="json", frequency_hz=2e9)
    assert (raw.records, json_run.records) == (24, 24)
    times = {
        run: store.sql(
            "SELECT block_id, owner_id, desc_id, ts_ns, dur_ns FROM records_ns WHERE run_id = $1 "
            "ORDER BY ALL",
            [run],
        ).to_pylist()
        for run in ("raw", "json")
    }
    assert times["raw"] == times["json"]
    # At 2 GHz, CTA 1's first record lands at its init, 170 ns after CTA 0's.
    firsts = {r["block_id"]: r["ts_ns"] for r in reversed(times["raw"])}
    assert firsts == {0x5E: 0.0, 0x82: 170.0}
    assert times["raw"][0] == {"block_id": 0x5E, "owner_id": 0, "desc_id": 0, "ts_ns": 0.0,
                               "dur_ns": 162.0}  # fmt: skip
    stats = store.sql(
        "SELECT stage, records, compute_total_us FROM stage_stats WHERE run_id = 'raw' "
        "ORDER BY stage"
    ).to_pylist()
    # scope_1: warps' durations 168, 176, 172, 172 (CTA 0) and 168, 168, 176, 172 (CTA 1).
    assert [(s["stage"], s["records"]) for s in stats] == [
        ("scope_0", 8),
        ("scope_1", 8),
        ("scope_2", 8),
    ]
    assert stats[1]["compute_total_us"] == pytest.approx(
        (168 + 176 + 172 + 172 + 168 + 168 + 176 + 172) / 2e3
    )
    cores = store.sql(
        "SELECT DISTINCT core, block_id FROM core_breakdown WHERE run_id = 'raw' ORDER BY block_id"
    ).to_pylist()
    assert cores == [{"core": "SM", "block_id": 0x5E}, {"core": "SM", "block_id": 0x82}]
    invocation = store.sql(
        "SELECT producer, producer_format, clock_domain, owner_label, dropped_count FROM "
        "invocations WHERE run_id = 'raw'"
    ).to_pylist()
    assert invocation == [
        {"producer": "proton", "producer_format": "host-buffer/1", "clock_domain": "anchored",
         "owner_label": "warp", "dropped_count": 0}
    ]  # fmt: skip
    exported = tmp_path / "out.json"
    export_chrome_trace(store, exported, run="raw")
    events = [e for e in json.loads(exported.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 24
    assert sorted({e["name"] for e in events}) == ["scope_0", "scope_1", "scope_2"]


def test_the_loop_sample_stores_its_dropped_count(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    with pytest.warns(DroppedRecordsWarning):
        import_profile(store, [shared_fixture("import/proton_loop_hip.bin")], format="proton")
    assert store.sql("SELECT block_id, record_count, dropped_count FROM cores").to_pylist() == [
        {"block_id": 0xD8, "record_count": 16, "dropped_count": 64}
    ]


# --- the benchmark's file ----------------------------------------------------------------


def test_the_synthetic_buffer_decodes_as_the_numpy_baseline(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    count = write_synthetic(path, 40_000)
    baseline = numpy_decode(path)
    assert baseline["cycle"].size == 2 * count
    (launch,) = launches(path)
    table = pa.concat_tables(list(launch.records))
    assert table.num_rows == count == 40_960
    assert launch.dropped == {}
    begins = np.sort(baseline["cycle"][~baseline["end"]])
    assert np.array_equal(np.sort(table["start_cycle"].to_numpy()), begins)


def test_a_chrome_trace_read_a_few_sms_at_a_time_gives_the_same_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 CTAs x 4 warps x 256 scope events on SMs 0, 1, 2; whole SMs per chunk.
    from multicore_profiler.ingest import import_proton

    path = tmp_path / "big.chrome_trace"
    assert write_synthetic_chrome(path, 3000) == 3072
    (whole,) = launches(path)
    expected = pa.concat_tables(list(whole.records))
    monkeypatch.setattr(import_proton, "CHUNK_ENTRIES", 2)
    (launch,) = launches(path)
    chunks = list(launch.records)
    assert [(c["block_id"][0].as_py(), c.num_rows) for c in chunks] == [(0, 1024), (1, 1024),
                                                                       (2, 1024)]  # fmt: skip
    assert pa.concat_tables(chunks).equals(expected)
    assert launch.clocks == whole.clocks
    # Each SM's records are numbered 0.. in time order; each warp's scope_0 events 0..85.
    assert expected["record_index"].to_pylist() == list(range(1024)) * 3
    first = expected.filter(pa.compute.equal(expected["owner_id"], 0))
    assert first.filter(pa.compute.equal(first["desc_id"], 0))["stage_task_index"].to_pylist() == (
        list(range(86))
    )
