"""Perfetto protobuf export: every trace decoded with the ``perfetto`` package's protos
(``perfetto_checker`` applies the TrackEvent import rules too) and compared with the Chrome
JSON export of the same selection: the same slices (track, name, ts, dur, every arg), the
same flows, the same process and thread names in the same order; golden bytes for the
two-core golden store.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
import test_abi_generations as generations
from golden import AIC, AIV, GMM1, TRIGGER, WAIT, Slot, pack
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace
from perfetto_checker import PerfettoTrace, Slice, read_perfetto_trace
from test_export import LAYOUT, NAMED, RUN, fill, golden_buffer, golden_tasks
from test_export_critical_path import two_runs
from trace_checker import check_trace, load_trace

from multicore_profiler import cli
from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import DroppedRecordsWarning, ExportError, ProfileError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.export.files import ExportedTrace
from multicore_profiler.export.perfetto_trace import (
    CONTEXT_ARGS,
    INVOCATION_CATEGORY,
    export_perfetto_trace,
    sidecar_path,
)
from multicore_profiler.export.timeline import RecordSelection
from multicore_profiler.export.trace_formats import export_trace, trace_format
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

DATA = Path(__file__).parent / "data"
PERFETTO_KEYS = {
    "traceFormat",
    "clock",
    "timestampOffsetNs",
    "trackEventCount",
    "invocationSliceCount",
    "undrawnFlowCount",
}
"""What the Perfetto trace's metadata adds to the JSON's ``megaKernelCycleTrace``."""
UNDRAWN = "the JSON trace cannot draw them"
"""How the JSON's warning of the flows it leaves out ends."""


@pytest.fixture
def golden(store: Store) -> Store:
    """Six records on AIC/0 and AIV/1, one arrow (test_export's golden store)."""
    fill(store, NAMED, [golden_buffer()])
    store.write_tasks(RUN, golden_tasks())
    return store


@pytest.fixture
def paths(store: Store) -> Store:
    """Run A (two invocations, with the graph) and run B (one, without), as in
    test_export_critical_path."""
    return two_runs(store)


def ns(us: float) -> int:
    """JSON's microseconds (three decimals, exact) as integer ns."""
    return int(Decimal(repr(us)) * 1000)


def json_view(trace: dict[str, Any]) -> dict[str, Any]:
    """The JSON trace as what the comparison looks at: slices, flows, and the processes
    with their threads, each in sort-index order."""
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    order = {
        (e["pid"], e.get("tid")): e["args"]["sort_index"]
        for e in events
        if e["name"] in ("process_sort_index", "thread_sort_index")
    }
    slices = sorted(
        (
            processes[e["pid"]],
            threads[e["pid"], e["tid"]],
            e["name"],
            ns(e["ts"]),
            ns(e["dur"]),
            tuple(e["args"].items()),
        )
        for e in events
        if e["ph"] == "X"
    )
    ends: dict[tuple[str, int], dict[str, Any]] = {}
    for e in events:
        if e["ph"] in ("s", "f"):
            ends.setdefault((e["cat"], e["id"]), {})[e["ph"]] = e
    flows = sorted(
        (
            cat,
            processes[s["pid"]],
            threads[s["pid"], s["tid"]],
            ns(s["ts"]),
            threads[f["pid"], f["tid"]],
            ns(f["ts"]),
        )
        for (cat, _), pair in ends.items()
        for s, f in [(pair["s"], pair["f"])]
    )
    tree = [
        (
            processes[pid],
            [
                threads[pid, tid]
                for (p, tid) in sorted(threads, key=lambda key: order[key])
                if p == pid
            ],
        )
        for pid in sorted(processes, key=lambda pid: order[pid, 0])
    ]
    return {"slices": slices, "flows": flows, "tree": tree}


def perfetto_view(trace: PerfettoTrace, offset: int) -> dict[str, Any]:
    """The Perfetto trace as ``json_view`` sees the JSON: each record slice with its
    invocation slice's annotations before its own, timestamps less ``offset``."""
    tracks = trace.tracks

    def where(piece: Slice) -> tuple[str, str]:
        track = tracks[piece.track_uuid]
        assert track.parent_uuid is not None
        return tracks[track.parent_uuid].name, track.name

    def args(piece: Slice) -> tuple[tuple[str, Any], ...]:
        inherited: dict[str, Any] = {}
        above = piece.parent
        while above is not None:
            if INVOCATION_CATEGORY in trace.slices[above].categories:
                inherited = trace.slices[above].args
            above = trace.slices[above].parent
        return tuple({**inherited, **piece.args}.items())

    slices = sorted(
        (*where(s), s.name, s.ts - offset, s.dur, args(s))
        for s in trace.slices
        if INVOCATION_CATEGORY not in s.categories
    )
    flows = []
    for flow in trace.flows:
        source, target = trace.slices[flow.source], trace.slices[flow.target]
        end = min(max(target.ts, source.ts), target.ts + target.dur)
        kind = "critical_path" if flow.id >> 63 else "MegaKernelInternal"
        flows.append((kind, *where(source), source.ts - offset, where(target)[1], end - offset))
    roots = sorted(
        (t for t in tracks.values() if t.parent_uuid is None),
        key=lambda t: t.sibling_order_rank or 0,
    )
    tree = [(root.name, [t.name for t in trace.children(root.uuid)]) for root in roots]
    return {"slices": slices, "flows": sorted(flows), "tree": tree}


def both(store: Store, tmp_path: Path, **options: Any) -> tuple[ExportedTrace, PerfettoTrace]:
    """Export the selection as JSON and as Perfetto; assert the two show the same slices,
    flows, processes and threads, and that the metadata is the JSON's plus what Perfetto
    adds (each format warns of the flows it cannot draw in its own words); return the
    Perfetto export and its decoded trace."""
    json_result = export_chrome_trace(store, tmp_path / "t.json", **options)
    trace = load_trace(tmp_path / "t.json")
    check_trace(trace)
    result = export_perfetto_trace(store, tmp_path / "t.pftrace", **options)
    decoded = read_perfetto_trace(tmp_path / "t.pftrace")
    metadata = result.metadata
    assert orjson.loads((tmp_path / "t.pftrace.meta.json").read_bytes()) == metadata
    assert {k: v for k, v in metadata.items() if k not in PERFETTO_KEYS | {"warnings"}} == {
        k: v for k, v in json_result.metadata.items() if k != "warnings"
    }
    shared = [w for w in json_result.metadata["warnings"] if not w.endswith(UNDRAWN)]
    assert metadata["warnings"][: len(shared)] == shared
    view = perfetto_view(decoded, metadata["timestampOffsetNs"])
    expected = json_view(trace)
    assert view["tree"] == expected["tree"]
    assert view["slices"] == expected["slices"]
    assert Counter(view["flows"]) - Counter(expected["flows"]) == Counter()
    flows = metadata["flowCount"] + metadata.get("criticalFlowCount", 0)
    assert flows - len(view["flows"]) == metadata["undrawnFlowCount"]
    assert result.events == metadata["trackEventCount"] == 2 * len(decoded.slices)
    assert result.records == json_result.records
    assert result.flows == json_result.flows
    assert result.critical_flows == json_result.critical_flows
    return result, decoded


def test_golden_store_matches_json_and_names_its_invocation(golden: Store, tmp_path: Path) -> None:
    result, trace = both(golden, tmp_path)
    assert trace.clock_id == 6
    rows = [(trace.tracks[s.track_uuid].name, s.name, s.ts, s.dur, s.depth) for s in trace.slices]
    assert rows == [
        ("AIC/0", "GoldenMoe", 200, 5900, 0),
        ("AIC/0", "GMM1_WaitDependency", 200, 1000, 1),
        ("AIC/0", "GMM1", 1200, 4800, 1),
        ("AIC/0", "GMM1_TriggerEvent", 6000, 100, 1),
        ("AIV/1", "GoldenMoe", 600, 7800, 0),
        ("AIV/1", "WaitDependency", 600, 5600, 1),
        ("AIV/1", "TaskType_SwiGLU", 6200, 1800, 1),
        ("AIV/1", "TaskType_65541", 8000, 400, 1),
    ]
    invocation = trace.slices[0]
    assert invocation.categories == (INVOCATION_CATEGORY,)
    assert list(invocation.args) == list(CONTEXT_ARGS)
    assert invocation.args == {
        "rank": 3,
        "device_id": 5,
        "core_type": 1,
        "block_id": 0,
        "core_entry_cycle": 100,
        "invocation_id": 0,
        "step": 4,
        "direction": "forward",
    }
    assert trace.slices[2].args == {
        "task_id": 7,
        "desc_id": GMM1,
        "stage_task_index": 2,
        "task_number": 3,
        "task_type": GMM1 - 0x20000,
        "owner_id": 5,
        "start_cycle": 160,
        "end_cycle": 400,
    }
    assert [(f.source, f.target) for f in trace.flows] == [(3, 5)]
    assert result.metadata["invocationSliceCount"] == 2
    assert result.metadata["undrawnFlowCount"] == 0
    assert result.metadata["traceFormat"] == "perfetto"
    (process,) = (t for t in trace.tracks.values() if t.parent_uuid is None)
    assert process.description == (
        "MegaKernel records of run golden-run rank 3: 1 invocation(s), 6 records, cycles at "
        f"50 MHz from anchor cycle 100. Selection: run {RUN}. Metadata: t.pftrace.meta.json."
    )
    assert [t.sibling_merge_behavior for t in trace.children(process.uuid)] == [2, 2]


def test_golden_bytes(golden: Store, tmp_path: Path) -> None:
    """The two-core golden selection, byte for byte (regenerate by copying this test's
    output to tests/data/golden.pftrace after checking the change is meant)."""
    export_perfetto_trace(golden, tmp_path / "golden.pftrace")
    data = (tmp_path / "golden.pftrace").read_bytes()
    assert data == (DATA / "golden.pftrace").read_bytes()


def test_the_official_serializer_writes_the_same_bytes(paths: Store, tmp_path: Path) -> None:
    """Decoded and serialized again by the protobuf runtime, a trace with every kind of
    field (two runs, interned names, annotations, flows, the critical path) comes out
    byte for byte as written: fields in number order, canonical varints."""
    export_perfetto_trace(
        paths, tmp_path / "t.pftrace", run=["critical-a", "critical-b"], critical_path=True
    )
    data = (tmp_path / "t.pftrace").read_bytes()
    assert Trace.FromString(data).SerializeToString() == data


def test_detailed_names_selections_and_gzip(golden: Store, tmp_path: Path) -> None:
    both(golden, tmp_path, detailed_task_names=True)
    both(golden, tmp_path, where="task_id <> 8")
    partial, trace = both(golden, tmp_path, where="task_id <> 9")  # both ends of the arrow
    assert partial.flows == len(trace.flows) == 1
    both(golden, tmp_path, query="SELECT * FROM records_ns WHERE core_type = 2")
    plain = export_perfetto_trace(golden, tmp_path / "t.pftrace")
    packed = export_perfetto_trace(golden, tmp_path / "t.pftrace.gz")
    assert sidecar_path(packed.path) == tmp_path / "t.pftrace.meta.json"
    assert packed.metadata == plain.metadata
    assert (
        gzip.decompress((tmp_path / "t.pftrace.gz").read_bytes())
        == (tmp_path / "t.pftrace").read_bytes()
    )
    loud = export_perfetto_trace(golden, tmp_path / "T.PFTRACE.GZ")
    assert sidecar_path(loud.path) == tmp_path / "T.PFTRACE.meta.json"
    assert (tmp_path / "T.PFTRACE.GZ").read_bytes()[:2] == b"\x1f\x8b"


def test_runs_invocations_and_the_critical_path(paths: Store, tmp_path: Path) -> None:
    """Two runs are two processes; with the critical path every critical record carries its
    mark and the chain's flows (their ids' top bit set) join the arrows."""
    result, trace = both(paths, tmp_path, run=["critical-a", "critical-b"], critical_path=True)
    roots = [t.name for t in trace.tracks.values() if t.parent_uuid is None]
    assert roots == [
        "CriticalMoe rank 0 device 0 (critical-a)",
        "CriticalMoe rank 0 device 0 (critical-b)",
    ]
    chain = [f for f in trace.flows if f.id >> 63]
    assert len(chain) == result.critical_flows > 0
    assert (
        sum(1 for s in trace.slices if s.args.get("critical") == 1)
        == (result.metadata["criticalRecordCount"])
    )
    assert result.metadata["invocationSliceCount"] == 3 * 3


def test_records_on_sub_tracks(store: Store, tmp_path: Path) -> None:
    """A record that starts before the previous one ends (clock granularity) goes to the
    core's sub-track, with its own invocation slice; the chain follows it there."""
    layout = BufferLayout(aic_slots=3, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
    records = [(100, 200, GMM1, 1, 0, 0), (150, 250, GMM1, 2, 1, 0), (250, 300, GMM1, 3, 2, 0)]
    store.write_run(RunInfo.begin(run_id=RUN))
    buffer = pack(3, 1, 16, 16, [Slot(AIC, 2, 100, records)])
    ingest_buffers(store, [buffer], layout, frequency_hz=50e6, run_id=RUN)
    result, trace = both(store, tmp_path, critical_path=True)
    tracks = [(trace.tracks[s.track_uuid].name, s.name, s.depth) for s in trace.slices]
    assert tracks == [
        ("AIC/2", "MegaKernel", 0),
        ("AIC/2", "TaskType_65537", 1),
        ("AIC/2", "TaskType_65537", 1),
        ("AIC/2 overlap 1", "MegaKernel", 0),
        ("AIC/2 overlap 1", "TaskType_65537", 1),
    ]
    assert len(trace.flows) == result.critical_flows == 2


def test_nested_and_zero_length_records(store: Store, tmp_path: Path) -> None:
    """Zero-length records at a record's start nest in it (the longest first); a record
    that starts where the previous one ends follows it: the nesting JSON's viewers build,
    as begin/end pairs in nesting order."""
    layout = BufferLayout(aic_slots=1, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
    records = [
        (100, 100, WAIT, 1, 0, 0),
        (100, 200, GMM1, 1, 0, 0),
        (200, 200, TRIGGER, 1, 0, 0),
        (200, 200, WAIT, 2, 1, 0),
        (200, 300, GMM1, 2, 1, 0),
    ]
    store.write_run(RunInfo.begin(run_id=RUN))
    buffer = pack(1, 1, 16, 16, [Slot(AIC, 0, 100, records)])
    ingest_buffers(store, [buffer], layout, frequency_hz=50e6, run_id=RUN)
    _, trace = both(store, tmp_path)
    shape = [(s.name, s.ts, s.dur, s.depth) for s in trace.slices]
    assert shape == [
        ("MegaKernel", 0, 4000, 0),
        ("TaskType_65537", 0, 2000, 1),
        ("WaitDependency", 0, 0, 2),
        ("TaskType_65537", 2000, 2000, 1),
        ("WaitDependency", 2000, 0, 2),
        ("TriggerEvent", 2000, 0, 2),
    ]


def test_a_record_selected_twice_is_shown_once(golden: Store, tmp_path: Path) -> None:
    """A query that selects every record twice: each slice once, the arrow once, 6 records
    of the invocation (12 before), and a warning that says so."""
    query = "SELECT * FROM records UNION ALL SELECT * FROM records"
    result, trace = both(golden, tmp_path, query=query)
    assert result.records == result.metadata["invocations"][0]["recordCount"] == 6
    assert len(trace.slices) == 2 + 6  # an invocation slice per core, and the records
    assert len(trace.flows) == result.flows == 1
    assert result.metadata["warnings"] == [
        f"6 row(s) of query {query!r} repeat a record it selects already: each record is shown once"
    ]


def test_overlapping_invocations_carry_their_context(golden: Store, tmp_path: Path) -> None:
    """Two invocations of one rank at the same cycles: no invocation slices on their
    tracks, every record slice carries all its annotations, and a warning says so."""
    ingest_buffers(
        golden,
        [golden_buffer()],
        LAYOUT,
        frequency_hz=50e6,
        run_id=RUN,
        kernel=NAMED,
        launches=Launches(rank=3, device=5, step=5, first_invocation_id=1),
    )
    result, trace = both(golden, tmp_path)
    assert result.metadata["invocationSliceCount"] == 0
    assert {tuple(s.args)[: len(CONTEXT_ARGS)] for s in trace.slices} == {CONTEXT_ARGS}
    assert result.metadata["warnings"][-1] == (
        "on 2 track(s) invocations overlap in time: their record slices carry the "
        "invocation's annotations themselves"
    )


def test_a_flow_that_ends_before_it_begins_is_counted(store: Store, tmp_path: Path) -> None:
    """Task 8's wait ends (cycle 395) before task 7's trigger starts (400): neither format
    can bind the arrow to the two slices (test_export: the JSON leaves it out too)."""
    buffer = pack(1, 2, 16, 16, [
        Slot(AIC, 0, 100, [(110, 160, WAIT, 7, 2, 5), (160, 400, GMM1, 7, 2, 5),
                           (400, 405, TRIGGER, 7, 2, 5)]),
        Slot(AIV, 1, 120, [(130, 395, WAIT, 8, 0, 5)]),
    ])  # fmt: skip
    fill(store, NAMED, [buffer])
    store.write_tasks(RUN, golden_tasks())
    result, trace = both(store, tmp_path)
    assert result.flows == 1
    assert trace.flows == []
    assert result.metadata["undrawnFlowCount"] == 1
    assert result.metadata["warnings"] == [
        "1 flow(s) end before they begin (a wait that ended before its trigger started): "
        "the Perfetto trace cannot draw them"
    ]


def test_records_before_their_anchor_shift_every_timestamp(golden: Store, tmp_path: Path) -> None:
    query = "SELECT * REPLACE (start_cycle - 20 AS start_cycle) FROM records"
    result, trace = both(golden, tmp_path, query=query)
    assert result.metadata["timestampOffsetNs"] == 200
    assert min(s.ts for s in trace.slices) == 0
    assert result.metadata["warnings"][-1] == (
        "a record starts before its process's anchor: every timestamp is shifted by 200 ns "
        "to stay unsigned"
    )


def test_a_record_that_ends_before_it_starts_is_refused(golden: Store, tmp_path: Path) -> None:
    later = "CASE WHEN task_id = 9 THEN start_cycle + 100 ELSE start_cycle END"
    query = f"SELECT * REPLACE ({later} AS start_cycle) FROM records"
    out = tmp_path / "out"
    out.mkdir()
    refused = (
        r"invocation 0 rank 3 on core 2/1 ends before it starts \(start_cycle 600, end_cycle 520\)"
    )
    with pytest.raises(ExportError, match=refused):
        export_perfetto_trace(golden, out / "t.pftrace", query=query)
    assert list(out.iterdir()) == []


def test_export_trace_chooses_the_writer(
    golden: Store, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    names = ("a.pftrace", "a.PFTRACE.gz", "a.perfetto-trace", "a.json", "a")
    assert [trace_format(n) for n in names] == ["perfetto", "perfetto", "perfetto", "json", "json"]
    assert trace_format("a.pftrace", "json") == "json"
    with pytest.raises(ExportError, match="no trace format 'pb': choose one of json, perfetto"):
        trace_format("a.pftrace", "pb")
    selection = RecordSelection(run=RUN)
    export_trace(golden, tmp_path / "a.pftrace", selection)
    read_perfetto_trace(tmp_path / "a.pftrace")
    export_trace(golden, tmp_path / "a.bin", selection, format="perfetto")
    read_perfetto_trace(tmp_path / "a.bin")
    as_json = tmp_path_factory.mktemp("json") / "b.pftrace"  # not a .pftrace to check
    export_trace(golden, as_json, selection, format="json")
    check_trace(load_trace(as_json))


def test_cli_export_perfetto(
    golden: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.pftrace"
    assert cli.main(["export", "--store", str(golden.root), "-o", str(out)]) == 0
    assert capsys.readouterr().out == (
        f"{out}: 16 track events (6 records of 1 invocation(s), 1 dependency arrows) from run "
        f"{RUN}\n{tmp_path / 'cli.pftrace.meta.json'}: the trace's megaKernelCycleTrace metadata\n"
    )
    assert len(read_perfetto_trace(out).slices) == 8
    as_json = tmp_path / "cli.trace"
    command = ["export", "--store", str(golden.root), "-o", str(as_json), "--format", "json"]
    assert cli.main(command) == 0
    assert json.loads(as_json.read_text())["megaKernelCycleTrace"]["recordCount"] == 6


def test_failures_leave_neither_file(golden: Store, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ProfileError, match="no records match"):
        export_perfetto_trace(golden, out / "t.pftrace", where="desc_id = 12345")
    with pytest.raises(ProfileError, match=f"^run {RUN} has no step 9$"):
        export_perfetto_trace(golden, out / "t.pftrace", step=9)
    assert list(out.iterdir()) == []
    with pytest.raises(ExportError, match="cannot write the trace to"):
        export_perfetto_trace(golden, out / "missing" / "t.pftrace")


def test_generation_b_matches_json(store: Store, tmp_path: Path) -> None:
    """hyper-parallel's newer generation: a slot of 260 records, graph stages with their
    task_type (65536 + k), a ShmemGetMem fallback, drops from a full slot and from a slot that
    was not full, each said in its own words."""
    with pytest.warns(DroppedRecordsWarning):
        generations.fill(store, [generations.buffer_b()], generations.LAYOUT_B)
    store.write_tasks(generations.RUN, generations.graph())
    result, trace = both(store, tmp_path, detailed_task_names=True)
    types = Counter(
        (s.args["desc_id"], s.args.get("task_type")) for s in trace.slices if "desc_id" in s.args
    )
    assert types == Counter(
        {(0x30000, 65536): 260, (0x30001, 65537): 17, (0x30002, 65538): 1, (0x2006B, 107): 1,
         (WAIT, None): 2, (TRIGGER, None): 1}
    )  # fmt: skip
    assert result.metadata["maxRecordCapacityPerCore"] == 134217712
    (process,) = (t for t in trace.tracks.values() if t.parent_uuid is None)
    assert process.description == (
        f"MegaKernel records of run {generations.RUN} rank 1: 1 invocation(s), 282 records, "
        "cycles at 50 MHz from anchor cycle 1000; the device dropped 3 records (full slots); "
        "the device dropped 3 records on slots that were not full. Selection: run "
        f"{generations.RUN}. Metadata: t.pftrace.meta.json."
    )
