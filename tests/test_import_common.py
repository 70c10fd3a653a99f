"""The writer every importer shares (``ingest/imported.py``): imported launches as runs,
anchored per-core clocks on the invocation's common clock, and what analyze says of
producers that recorded no waits, no graph, or a clock per core with no anchor."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from shared_fixtures import shared_fixture

from multicore_profiler import export_chrome_trace, merge_chrome_traces
from multicore_profiler.abi import CoreType
from multicore_profiler.analysis.analyze import analyze
from multicore_profiler.cli import main
from multicore_profiler.errors import AnalysisError, ArgumentError, ImportFormatError
from multicore_profiler.export.analysis_text import check_lines
from multicore_profiler.ingest.imported import CoreClock, ImportedInvocation, write_imported
from multicore_profiler.ingest.imports import import_profile
from multicore_profiler.storage.store import Store

SM = int(CoreType.SM)


def records(rows: list[tuple[int, int, int, int, str]]) -> pa.Table:
    """Record rows (block, start, end, desc id, phase) of SMs, numbered per block."""
    index: dict[int, int] = {}
    numbered = []
    for block, start, end, desc, phase in rows:
        numbered.append((block, index.setdefault(block, 0), start, end, desc, phase))
        index[block] += 1
    block, position, start, end, desc, phase = zip(*numbered, strict=True)
    count = len(rows)
    return pa.table(
        {
            "core_type": [SM] * count,
            "block_id": block,
            "record_index": position,
            "start_cycle": start,
            "end_cycle": end,
            "desc_id": desc,
            "task_id": [7] * count,
            "stage_task_index": [0] * count,
            "owner_id": block,
            "phase": phase,
        }
    )


# Two SMs whose counters are a million cycles apart; their anchors put SM 2's first record
# 170 ns after SM 1's (1 GHz: a cycle is a ns), each anchor allowing 130 ns more.
TWO_CLOCKS = records(
    [
        (1, 1000, 1050, 0, "compute"),
        (1, 1100, 1200, 1, "compute"),
        (2, 5_000_000, 5_000_040, 0, "compute"),
        (2, 5_000_050, 5_000_100, 1, "compute"),
    ]
)
ANCHORS = {
    (SM, 1): CoreClock(-1000, -1000, -870),
    (SM, 2): CoreClock(-5_000_000 + 170, -5_000_000 + 170, -5_000_000 + 300),
}


def launch(**changes: object) -> ImportedInvocation:
    fields: dict[str, object] = {
        "kernel_name": "attn",
        "frequency_hz": 1e9,
        "producer": "proton",
        "producer_format": "host-buffer/1",
        "records": [TWO_CLOCKS],
        "source": "seq.bin",
        "clock_domain": "anchored",
        "stage_names": {0: "load", 1: "mma"},
        "owner_label": "warp",
        "clocks": ANCHORS,
    }
    fields.update(changes)
    return ImportedInvocation(**fields)  # type: ignore[arg-type]


def test_anchored_cores_land_on_the_common_clock(store: Store) -> None:
    written = write_imported(store, [launch()], label="imported")
    assert (written.invocation_ids, written.records) == (range(1), 4)
    ns = store.sql(
        "SELECT block_id, stage, start_cycle, ts_ns, dur_ns FROM records_ns ORDER BY ts_ns"
    ).to_pylist()
    assert [tuple(r.values()) for r in ns] == [
        (1, "load", 0, 0.0, 50.0),
        (1, "mma", 100, 100.0, 100.0),
        (2, "load", 170, 170.0, 40.0),
        (2, "mma", 220, 220.0, 50.0),
    ]
    # The store keeps the cycles as counted; only the views shift them.
    raw = store.sql("SELECT start_cycle FROM records ORDER BY block_id, record_index")
    assert raw.column(0).to_pylist() == [1000, 1100, 5_000_000, 5_000_050]
    breakdown = store.sql(
        "SELECT core, block_id, makespan_ns, compute_ns, front_gap_ns, gap_ns, tail_gap_ns "
        "FROM core_breakdown ORDER BY block_id"
    ).to_pylist()
    assert [tuple(r.values()) for r in breakdown] == [
        ("SM", 1, 270, 150, 0, 50, 70),
        ("SM", 2, 270, 90, 170, 10, 0),
    ]
    cores = store.sql(
        "SELECT block_id, entry_cycle, record_count, clock_offset_cycles, clock_low_cycles, "
        "clock_high_cycles FROM cores ORDER BY block_id"
    ).to_pylist()
    assert [tuple(r.values()) for r in cores] == [
        (1, 1000, 2, -1000, -1000, -870),
        (2, 5_000_000, 2, -4_999_830, -4_999_830, -4_999_700),
    ]
    (invocation,) = store.sql(
        "SELECT kernel_name, anchor_cycle, producer, producer_format, clock_domain, owner_label, "
        "frequency_source, abi_generation FROM invocations"
    ).to_pylist()
    assert invocation == {
        "kernel_name": "attn",
        "anchor_cycle": 0,
        "producer": "proton",
        "producer_format": "host-buffer/1",
        "clock_domain": "anchored",
        "owner_label": "warp",
        "frequency_source": "producer",
        "abi_generation": None,
    }
    (run,) = store.sql("SELECT label, status, tags FROM runs").to_pylist()
    assert run == {
        "label": "imported",
        "status": "complete",
        "tags": [("producer", "proton"), ("producer_format", "proton:host-buffer/1")],
    }


def test_an_anchored_launch_exports_on_the_common_clock(store: Store, tmp_path: Path) -> None:
    write_imported(store, [launch()])
    export_chrome_trace(store, tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    slices = sorted((e["tid"], e["name"], e["ts"], e["dur"]) for e in events if e.get("ph") == "X")
    threads = sorted(e["args"]["name"] for e in events if e.get("name") == "thread_name")
    assert slices == [
        (3001, "load", 0.0, 0.05),
        (3001, "mma", 0.1, 0.1),
        (3002, "load", 0.17, 0.04),
        (3002, "mma", 0.22, 0.05),
    ]
    assert threads == ["SM/1", "SM/2"]


def test_analyze_says_what_the_producer_did_not_record(store: Store) -> None:
    write_imported(store, [launch()], run_id="anchored")
    analysis = analyze(store)
    limits = analysis.limits.select(["reason", "invocations", "clock_spread_ns"]).to_pylist()
    assert [tuple(r.values()) for r in limits] == [
        ("anchored", 1, 130.0),
        ("no_task_graph", 1, None),
        ("no_waits", 1, None),
    ]
    assert check_lines(analysis)[2:] == [
        "NOTE: run anchored, attn (proton, 1 invocation(s)): each core counted on a clock of its "
        "own, placed on a common clock by the producer's anchors: a core's place may be off by "
        "up to 130 ns",
        "NOTE: run anchored, attn (proton, 1 invocation(s)): the producer recorded no task "
        "graph: no release edges, so the critical path follows each core's own records",
        "NOTE: run anchored, attn (proton, 1 invocation(s)): the producer recorded no waits: no "
        "wait is attributed to what released it (blockers) and the critical path crosses no "
        "wait",
    ]
    # The anchors make the cores comparable: the critical path tiles the 270 ns.
    assert analysis.invocations.column("critical_path_ns").to_pylist() == [270]


def test_cores_without_an_anchor_get_no_critical_path(store: Store) -> None:
    write_imported(store, [launch(clock_domain="per_core", clocks={})], run_id="unanchored")
    analysis = analyze(store)
    assert analysis.critical_path.num_rows == 0
    (invocation,) = analysis.invocations.to_pylist()
    assert (invocation["critical_path_ns"], invocation["faithful"]) == (None, None)
    assert analysis.limits.column("reason").to_pylist() == ["no_task_graph", "no_waits", "per_core"]
    assert (
        check_lines(analysis)[0] == "critical path: tiles the makespan of every invocation (0 of 0)"
    )
    assert check_lines(analysis)[-1].startswith(
        "NOTE: run unanchored, attn (proton, 1 invocation(s)): each core counted on a clock of "
        "its own and the producer recorded no anchor: times of different cores cannot be "
        "compared"
    )


def test_a_launch_that_fails_leaves_nothing(store: Store) -> None:
    backwards = records([(1, 100, 90, 0, "compute")])
    with pytest.raises(ImportFormatError) as raised:
        write_imported(
            store,
            [
                launch(),
                launch(records=[backwards], source="bad.bin", clock_domain="shared", clocks={}),
            ],
        )
    assert str(raised.value) == (
        "bad.bin: a record ends before it starts (core SM/1, record 0: 100 .. 90)"
    )
    for table in ("runs", "invocations", "records", "cores"):
        assert store.sql(f"SELECT count(*) FROM {table}").column(0)[0].as_py() == 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"clocks": {(SM, 1): ANCHORS[(SM, 1)], (SM, 2): CoreClock(-6_000_000)}},
            "seq.bin: core SM/2's clock offset -6000000 places its first record before cycle 0",
        ),
        (
            {"clocks": {(SM, 1): ANCHORS[(SM, 1)]}},
            "seq.bin: core SM/2 of an anchored launch has no clock offset",
        ),
        (
            {"clocks": {}},
            "seq.bin: an anchored clock domain needs each core's clock offset, and only it has "
            "them",
        ),
        (
            {"records": [records([(1, 0, 1, 0, "stall")])]},
            "seq.bin: records of unknown phases ['stall']",
        ),
        ({"records": [TWO_CLOCKS.slice(0, 0)]}, "seq.bin: the launch holds no record"),
        (
            {"frequency_hz": 0.0},
            "seq.bin: the cycle frequency must be a positive number of Hz, got 0.0",
        ),
        (
            {"clock_domain": "global"},
            "seq.bin: clock domain 'global' is none of ('shared', 'anchored', 'per_core')",
        ),
    ],
)
def test_a_launch_that_cannot_be_placed_is_refused(
    store: Store, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ImportFormatError) as raised:
        write_imported(store, [launch(**changes)])
    assert str(raised.value) == message
    assert store.sql("SELECT count(*) FROM invocations").column(0)[0].as_py() == 0


def test_import_refuses_an_unknown_format_and_a_missing_file(store: Store, tmp_path: Path) -> None:
    with pytest.raises(ArgumentError) as unknown:
        import_profile(store, [tmp_path / "x.bin"], format="nsys")
    assert str(unknown.value) == (
        "unknown import format 'nsys'; known: proton, flashinfer, mpk, triton-distributed, "
        "hazy, simpler"
    )
    with pytest.raises(ImportFormatError) as missing:
        import_profile(store, [tmp_path / "x.bin"], format="proton")
    assert str(missing.value) == f"{tmp_path / 'x.bin'}: no such file"


def test_the_command_names_a_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    status = main(
        ["import", "--format", "hazy", str(tmp_path / "t.mkprof"), "--store", str(tmp_path / "s")]
    )
    assert (status, capsys.readouterr().err) == (
        1,
        f"mcprof: error: {tmp_path / 't.mkprof'}: no such file\n",
    )


def test_spans_that_overlap_on_a_core_get_no_replay(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two warps of SM 1 at once: the replay, chaining a core's records, cannot hold them.
    warps = records([(1, 0, 100, 0, "compute"), (1, 50, 120, 1, "compute")])
    write_imported(store, [launch(records=[warps], clock_domain="shared", clocks={})], run_id="w")
    analysis = analyze(store)
    (invocation,) = analysis.invocations.to_pylist()
    assert (invocation["makespan_ns"], invocation["static_bound_ns"]) == (120, None)
    assert analysis.limits.column("reason").to_pylist() == [
        "no_task_graph",
        "no_waits",
        "overlapping_records",
    ]
    with pytest.raises(AnalysisError, match="no selected invocation can be replayed"):
        analysis.speedup_curves()
    assert main(["analyze", "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "replay: no invocation could be replayed (the notes say why)\n" in out
    assert "speed-up curves" not in out


def test_an_imported_launch_fuses_into_the_torch_trace_of_its_kernel(
    store: Store, tmp_path: Path
) -> None:
    # Proton's seq capture, named as the one Triton kernel of a real A100 kineto trace.
    kernel = "triton_poi_fused_add_cos_sin_0"
    import_profile(
        store,
        [shared_fixture("import/proton_seq_hip.bin")],
        format="proton",
        kernel_name=kernel,
        frequency_hz=2e9,
        run_id="seq",
    )
    outer = shared_fixture("kineto/a100_triton_example.json.gz")
    merged = merge_chrome_traces(outer, store, tmp_path / "fused.json", run="seq")
    (invocation,) = merged.report["invocations"]
    assert (merged.records, invocation["internalEventCount"], invocation["spanUs"]) == (
        24,
        24,
        0.393,
    )
    assert (invocation["outerKernel"]["tsNs"], invocation["outerKernel"]["durNs"]) == (
        2413669097444592,
        1760,
    )
    events = json.loads((tmp_path / "fused.json").read_text())["traceEvents"]
    records = [e for e in events if e.get("cat") == "MegaKernelInternal"]
    assert min(e["ts"] for e in records) == 2413669097444.592  # the kernel's start
    threads = {
        e["args"]["name"].split(" overlap")[0]
        for e in events
        if e.get("name") == "thread_name" and e["args"]["name"].startswith(kernel)
    }
    assert threads == {f"{kernel}/SM/94", f"{kernel}/SM/130"}
