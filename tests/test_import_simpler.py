"""simpler chip swimlane imports (``ingest/import_simpler.py``): the raw records with their
deps.json, the merged swimlane and the dist engine's swimlane, into the store; the
dependency edges as the task graph that task_edges, the critical path and wait attribution
follow; and each refusal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from shared_fixtures import shared_fixture
from simpler_packer import (
    deps_document,
    merged_document,
    numpy_decode,
    perf_swimlane_document,
    records_document,
    task_token,
    write_json,
    write_synthetic,
)

from multicore_profiler import open_store
from multicore_profiler.analysis.analyze import analyze, speedup_curves, what_if
from multicore_profiler.errors import AnalysisError, ImportFormatError
from multicore_profiler.export.analysis_text import check_lines
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.ingest.import_simpler import read
from multicore_profiler.ingest.imports import ImportOptions, import_profile

V200 = "import/simpler_v200_block_table_merged_swimlane.json"
DIST = "import/simpler_dist_bgemm_fullcore24_swimlane.json"

# block_table_dependency.md (yanghaoran29/simpler, archive/V200): Stage 2 task T2[ob] (local id
# 16 + ob) depends on Stage 1 task T1[block_table[ob]] (local id block_table[ob]).
BLOCK_TABLE = [4, 2, 9, 11, 10, 15, 3, 0, 14, 8, 12, 6, 7, 1, 5, 13]
V200_EDGES = sorted((pid, 16 + ob) for ob, pid in enumerate(BLOCK_TABLE))


def launches(path: Path, **options: object) -> list:
    return list(read(path, ImportOptions(format="simpler", **options)))  # type: ignore[arg-type]


def records_of(launch) -> list[dict]:
    return [row for chunk in launch.records for row in chunk.to_pylist()]


def rows(store, sql: str) -> list[dict]:
    return store.sql(sql).to_pylist()


# --- the real samples -------------------------------------------------------------------


def test_v200_merged_swimlane_decodes_to_its_32_tasks_on_the_50_mhz_counter() -> None:
    (launch,) = launches(shared_fixture(V200))
    assert launch.producer_format == "merged_swimlane"
    assert launch.frequency_hz == 50e6
    assert launch.clock_domain == "shared"
    assert launch.stage_names == {0: "paged_proj__windowed", 1: "paged_rmsnorm__windowed"}
    records = records_of(launch)
    assert len(records) == 32
    by_task = {r["task_id"]: r for r in records}
    assert sorted(by_task) == list(range(32))
    # r2t0: AIC_2, ts 50.72 us dur 110 us -> cycles 2536 .. 8036.
    assert by_task[0] | {} == {
        "core_type": 1, "block_id": 2, "record_index": 0, "start_cycle": 2536,
        "end_cycle": 8036, "desc_id": 0, "task_id": 0, "stage_task_index": 0,
        "owner_id": 0xFFFFFFFF, "phase": "compute",
    }  # fmt: skip
    # The last task to start, r2t19 on AIV_28 at 197.66 us for 2.06 us: its core's 4th.
    last = max(records, key=lambda r: r["start_cycle"])
    assert (last["task_id"], last["block_id"], last["record_index"]) == (19, 28, 3)
    assert (last["start_cycle"], last["end_cycle"]) == (9883, 9986)
    counts: dict[tuple[int, int], int] = {}
    for r in records:
        counts[r["core_type"], r["block_id"]] = counts.get((r["core_type"], r["block_id"]), 0) + 1
    aic = {b for (t, b), n in counts.items() if t == 1 and n == 1}
    assert aic == {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 15, 17}
    assert {b: n for (t, b), n in counts.items() if t == 2} == {
        24: 1, 25: 1, 26: 3, 27: 1, 28: 4, 29: 1, 30: 1, 31: 1, 34: 1, 36: 1, 37: 1
    }  # fmt: skip


def test_v200_dependency_flows_are_the_16_documented_edges() -> None:
    (launch,) = launches(shared_fixture(V200))
    graph = launch.tasks.to_pylist()
    assert len(graph) == 32
    assert {g["config_id"] for g in graph} == {launch.config_id}
    edges = sorted((p, g["task_id"]) for g in graph for p in g["depends_on"])
    assert edges == V200_EDGES
    assert all(g["depends_on"] == [] for g in graph if g["task_id"] < 16)
    assert {(g["wait_event"], g["trigger_event"]) for g in graph} == {(-1, -1)}


def test_dist_engine_swimlane_keeps_host_ns_and_physical_cores() -> None:
    (launch,) = launches(shared_fixture(DIST))
    assert launch.producer_format == "dist_swimlane"
    assert launch.frequency_hz == 1e9
    assert launch.tasks is None
    assert launch.config_id is None
    assert launch.stage_names == {0: "GEMM", 1: "ADD"}
    records = records_of(launch)
    assert len(records) == 480
    first = min(records, key=lambda r: r["start_cycle"])
    last = max(records, key=lambda r: r["end_cycle"])
    # GEMM#0 on block 16's AIC at 211.041 us; ADD#467 on AIV1 of block 15 (core 55).
    assert (first["task_id"], first["core_type"], first["block_id"]) == (0, 1, 16)
    assert (first["start_cycle"], first["end_cycle"]) == (211_041, 23_969_416)
    assert (last["task_id"], last["core_type"], last["block_id"], last["desc_id"]) == (
        467, 2, 55, 1
    )  # fmt: skip
    assert (last["start_cycle"], last["end_cycle"]) == (496_994_208, 497_092_958)
    aic = [r for r in records if r["core_type"] == 1]
    assert len(aic) == 240
    assert {r["desc_id"] for r in aic} == {0}
    assert sorted({r["block_id"] for r in aic}) == list(range(24))
    assert sum(r["block_id"] == 6 for r in aic) == 18
    assert sorted({r["block_id"] for r in records if r["core_type"] == 2}) == list(range(24, 72))


def test_v200_end_to_end_views_critical_path_wait_attribution_and_export(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "store")
    run = import_profile(store, [shared_fixture(V200)], format="simpler")
    assert run.records == 32
    edges = rows(
        store,
        "SELECT kind, src_task_id, dst_task_id FROM task_edges ORDER BY kind, dst_task_id, "
        "src_task_id",
    )
    assert [(e["src_task_id"], e["dst_task_id"]) for e in edges if e["kind"] == "dependency"] == (
        sorted(V200_EDGES, key=lambda e: e[1])
    )
    # AIV_28 runs t23, t25, t20, t19 and AIV_26 t29, t18, t21: 5 core-order edges.
    assert sum(e["kind"] == "core_order" for e in edges) == 5
    stages = rows(store, "SELECT stage, records, compute_total_us FROM stage_stats ORDER BY stage")
    assert stages == [
        {"stage": "paged_proj__windowed", "records": 16, "compute_total_us": 1659.62},
        {"stage": "paged_rmsnorm__windowed", "records": 16, "compute_total_us": 46.08},
    ]
    aiv28 = rows(
        store,
        "SELECT records, makespan_ns, compute_ns, front_gap_ns FROM core_breakdown "
        "WHERE core = 'AIV' AND block_id = 28",
    )
    # t23 165.42+2.44, t25 179.2+2.06, t20 189.2+1.82, t19 197.66+2.06 us; span 50.72..199.72.
    assert aiv28 == [
        {"records": 4, "makespan_ns": 149_000, "compute_ns": 8380, "front_gap_ns": 114_700}
    ]
    # The last task, t19 (AIV_28), waited for t11 (AIC_11, ends 191.38 us) after its core's
    # previous task t20 ended at 191.02 us: the walk crosses to t11, AIC_11's first task.
    path = rows(
        store,
        "SELECT kind, core, block_id, stage, task_id, start_ns, dur_ns, makespan_ns "
        "FROM critical_path ORDER BY seq",
    )
    assert path == [
        {"kind": "front_gap", "core": "AIC", "block_id": 11, "stage": None, "task_id": None,
         "start_ns": 0, "dur_ns": 33_320, "makespan_ns": 149_000},
        {"kind": "compute", "core": "AIC", "block_id": 11, "stage": "paged_proj__windowed",
         "task_id": 11, "start_ns": 33_320, "dur_ns": 107_340, "makespan_ns": 149_000},
        {"kind": "data_wait", "core": "AIV", "block_id": 28,
         "stage": "paged_rmsnorm__windowed", "task_id": 19, "start_ns": 140_660,
         "dur_ns": 6_280, "makespan_ns": 149_000},
        {"kind": "compute", "core": "AIV", "block_id": 28, "stage": "paged_rmsnorm__windowed",
         "task_id": 19, "start_ns": 146_940, "dur_ns": 2_060, "makespan_ns": 149_000},
    ]  # fmt: skip
    blamed = rows(
        store,
        "SELECT consumer_task_id, wait_ns, producer_task_id, producer_core, producer_block_id, "
        "producer_stage, waited, release_latency_ns, attributed FROM wait_attribution "
        "ORDER BY consumer_task_id",
    )
    assert [(b["producer_task_id"], b["consumer_task_id"]) for b in blamed] == sorted(
        V200_EDGES, key=lambda e: e[1]
    )
    assert blamed[19 - 16] == {
        "consumer_task_id": 19, "wait_ns": 6_640, "producer_task_id": 11,
        "producer_core": "AIC", "producer_block_id": 11, "producer_stage": "paged_proj__windowed",
        "waited": True, "release_latency_ns": 6_280, "attributed": True,
    }  # fmt: skip
    # t16 is AIV_25's first task: its gap runs from the invocation's start (50.72 us) to
    # 162.34 us, and t4 (AIC_6) ended at 154.12 us.
    assert (blamed[0]["wait_ns"], blamed[0]["release_latency_ns"]) == (111_620, 8_220)

    trace = export_chrome_trace(store, tmp_path / "t.json", critical_path=True)
    assert (trace.records, trace.flows) == (32, 16)
    events = json.loads((tmp_path / "t.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    starts = [e for e in events if e.get("ph") == "s" and e.get("name") == "dependency"]
    ends = [e for e in events if e.get("ph") == "f" and e.get("name") == "dependency"]
    assert len(starts) == len(ends) == 16
    assert {e["id"] for e in starts} == {e["id"] for e in ends}


def test_what_if_predicts_nothing_for_a_graph_of_recorded_dependencies(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    import_profile(store, [shared_fixture(V200)], format="simpler")
    for predict in (
        lambda: what_if(store, None, ["paged_proj__windowed*0.5"]),
        lambda: speedup_curves(store),
    ):
        with pytest.raises(AnalysisError, match=r"no selected invocation can be replayed"):
            predict()
    analysis = analyze(store)  # the other analyses stand; the replay's figures are NULL
    bounds = analysis.invocations.select(["critical_path_ns", "static_bound_ns", "faithful"])
    assert bounds.to_pylist() == [
        {"critical_path_ns": 149_000, "static_bound_ns": None, "faithful": None}
    ]
    # analyze says why, and flags no unfaithful replay: there was none to make.
    assert analysis.limits.column("reason").to_pylist() == ["dependency_graph"]
    assert check_lines(analysis)[1:] == [
        "replay: no invocation could be replayed (the notes say why)",
        f"NOTE: run {analysis.limits['run_id'][0]}, simpler (simpler, 1 invocation(s)): the "
        "producer recorded its task graph as dependency edges without wait or trigger records: "
        "the critical path and blockers follow the edges, but the replay releases tasks only by "
        "waits and triggers, so these invocations get no static bound and no what-if prediction",
    ]


# --- raw records and deps.json ---------------------------------------------------------

CORES = ["aic", "aic", "aiv", "aiv"]


def small_capture(tmp_path: Path, *, width: int = 6, strings: bool = False) -> tuple[Path, Path]:
    """Three tasks of ring 1: t0 on AIC 0, t1 on AIC 1, t2 on AIV 2 after both."""
    tasks = [
        (0, task_token(1, 0), 0, 1000, 1400),
        (1, task_token(1, 1), 0, 1010, 1600),
        (2, task_token(1, 2), 0, 1700, 1750),
    ]
    rows = [[*t, 5, 0][:width] for t in tasks]
    if strings:
        rows = [[str(v) for v in r] for r in rows]
    records = write_json(tmp_path / "chip_swimlane_records.json", records_document(CORES, rows))
    deps = write_json(
        tmp_path / "deps.json",
        deps_document(
            {task_token(1, 0): [3, -1, -1], task_token(1, 1): [3, -1, -1],
             task_token(1, 2): [-1, 7, -1]},
            [(task_token(1, 0), task_token(1, 2)), (task_token(1, 1), task_token(1, 2))],
        ),
    )  # fmt: skip
    return records, deps


@pytest.mark.parametrize(("width", "strings"), [(5, False), (6, True), (7, False)])
def test_raw_records_with_deps_give_func_ids_and_the_graph(
    tmp_path: Path, width: int, strings: bool
) -> None:
    records, deps = small_capture(tmp_path, width=width, strings=strings)
    (launch,) = launches(records, dependencies=deps, names={3: "mm", 7: "add"})
    assert launch.producer_format == "chip_swimlane_records"
    assert launch.frequency_hz == 50e6
    assert launch.stage_names == {3: "mm", 7: "add"}
    got = [
        (r["core_type"], r["block_id"], r["task_id"], r["desc_id"], r["start_cycle"],
         r["end_cycle"])
        for r in records_of(launch)
    ]  # fmt: skip
    assert got == [(1, 0, 0, 3, 1000, 1400), (1, 1, 1, 3, 1010, 1600), (2, 2, 2, 7, 1700, 1750)]
    assert [g["depends_on"] for g in launch.tasks.to_pylist()] == [[], [], [0, 1]]


def test_raw_records_end_to_end_critical_path_crosses_to_the_last_predecessor(
    tmp_path: Path,
) -> None:
    records, deps = small_capture(tmp_path)
    store = open_store(tmp_path / "store")
    import_profile(store, [records], format="simpler", dependencies=deps)
    # t2 (AIV 2, its core's first) starts at 1700; of t0 (ends 1400) and t1 (ends 1600) t1
    # ended last: 100 cycles of data_wait at 20 ns a cycle.
    path = rows(store, "SELECT kind, task_id, start_ns, dur_ns FROM critical_path ORDER BY seq")
    assert path == [
        {"kind": "front_gap", "task_id": None, "start_ns": 0, "dur_ns": 200},
        {"kind": "compute", "task_id": 1, "start_ns": 200, "dur_ns": 11_800},
        {"kind": "data_wait", "task_id": 2, "start_ns": 12_000, "dur_ns": 2_000},
        {"kind": "compute", "task_id": 2, "start_ns": 14_000, "dur_ns": 1_000},
    ]
    blamed = rows(store, "SELECT consumer_task_id, producer_task_id, wait_ns FROM wait_attribution")
    assert blamed == [{"consumer_task_id": 2, "producer_task_id": 1, "wait_ns": 14_000}]


def test_raw_records_without_deps_have_no_graph(tmp_path: Path) -> None:
    records, _ = small_capture(tmp_path)
    (launch,) = launches(records)
    assert launch.tasks is None
    assert launch.stage_names == {0xFFFF: "aicore_task"}
    assert {r["desc_id"] for r in records_of(launch)} == {0xFFFF}


def test_each_run_epoch_is_a_launch(tmp_path: Path) -> None:
    rows = [[0, 5, 0, 100, 200, 0, 0], [0, 5, 0, 300, 400, 0, 1], [1, 6, 0, 310, 320, 0, 1]]
    path = write_json(tmp_path / "r.json", records_document(CORES, rows))
    first, second = launches(path)
    assert [r["start_cycle"] for r in records_of(first)] == [100]
    assert [r["start_cycle"] for r in records_of(second)] == [300, 310]
    assert second.source.endswith("(run_epoch 1)")


# --- refusals --------------------------------------------------------------------------


def test_deps_naming_a_task_without_records_is_refused(tmp_path: Path) -> None:
    records, _ = small_capture(tmp_path)
    deps = write_json(
        tmp_path / "d.json",
        deps_document(
            {task_token(1, k): [3, 7, -1] for k in (0, 1, 2, 9)},
            [(task_token(1, 9), task_token(1, 2))],
        ),
    )
    with pytest.raises(ImportFormatError, match=r"name task 4294967305 \(local id 9\).*no AICore"):
        launches(records, dependencies=deps)


def test_a_cycle_in_the_edges_is_refused_naming_them(tmp_path: Path) -> None:
    records, _ = small_capture(tmp_path)
    a, b, c = (task_token(1, k) for k in range(3))
    deps = write_json(
        tmp_path / "d.json",
        deps_document({t: [3, 7, -1] for t in (a, b, c)}, [(a, b), (b, c), (c, b)]),
    )
    with pytest.raises(ImportFormatError, match=f"make a cycle, among {b} -> {c}, {c} -> {b}$"):
        launches(records, dependencies=deps)


def test_zero_tasks_are_refused(tmp_path: Path) -> None:
    empty = write_json(tmp_path / "r.json", records_document(CORES, []))
    with pytest.raises(ImportFormatError, match="aicore_tasks holds no task"):
        launches(empty)
    merged = write_json(tmp_path / "m.json", merged_document([]))
    with pytest.raises(ImportFormatError, match="the AICore View holds no task"):
        launches(merged)
    with pytest.raises(ImportFormatError, match="aicore_tasks holds no task"):
        import_profile(open_store(tmp_path / "s"), [empty], format="simpler")


def test_truncated_json_names_the_byte(tmp_path: Path) -> None:
    records, _ = small_capture(tmp_path)
    data = records.read_bytes()
    cut = write_json(tmp_path / "cut.json", None)
    cut.write_bytes(data[:100])
    with pytest.raises(ImportFormatError, match=r"not valid JSON at byte 100 of 100"):
        launches(cut)


def test_microseconds_off_the_tick_are_refused(tmp_path: Path) -> None:
    # 50.73 us is 2536.5 ticks of 50 MHz: not a whole tick.
    path = write_json(
        tmp_path / "m.json",
        merged_document([("k", 0, task_token(2, 0), 0, 50.72, 1.0),
                         ("k", 0, task_token(2, 1), 1, 50.73, 1.0)]),
    )  # fmt: skip
    with pytest.raises(
        ImportFormatError,
        match=r"event 4: ts 50.73 µs is not a whole number of ticks of the 50 MHz",
    ):
        launches(path)
    # At 100 MHz (--freq-mhz 100) every value lies on the 0.01 us tick.
    (launch,) = launches(path, frequency_hz=100e6)
    assert [r["start_cycle"] for r in records_of(launch)] == [5072, 5073]


def test_duplicate_core_and_reg_task_id_is_refused(tmp_path: Path) -> None:
    rows = [[0, 5, 7, 100, 200], [0, 6, 7, 300, 400]]
    path = write_json(tmp_path / "r.json", records_document(CORES, rows))
    with pytest.raises(ImportFormatError, match=r"2 rows of core 0, reg_task_id 7"):
        launches(path)


@pytest.mark.parametrize("value", [-1, "x", None])
def test_a_value_that_is_no_u64_is_refused(tmp_path: Path, value: object) -> None:
    path = write_json(tmp_path / "r.json", records_document(CORES, [[0, 5, 7, value, 200]]))
    with pytest.raises(ImportFormatError, match="aicore_tasks holds a non-u64 value"):
        launches(path)


def test_two_rings_sharing_a_local_id_are_refused(tmp_path: Path) -> None:
    rows = [[0, task_token(1, 4), 0, 100, 200], [1, task_token(2, 4), 0, 100, 200]]
    path = write_json(tmp_path / "r.json", records_document(CORES, rows))
    with pytest.raises(ImportFormatError, match="4294967300 and 8589934596 share the local id 4"):
        launches(path)


def test_merged_flows_and_a_deps_json_given_as_the_capture(tmp_path: Path) -> None:
    tasks = [("p", 0, task_token(0, 0), 0, 1.0, 1.0), ("c", 1, task_token(0, 1), 30, 3.0, 1.0)]
    (launch,) = launches(write_json(tmp_path / "m.json", merged_document(tasks, [(0, 1)])))
    assert [g["depends_on"] for g in launch.tasks.to_pylist()] == [[], [0]]
    _, deps = small_capture(tmp_path)
    with pytest.raises(ImportFormatError, match=r"is a deps\.json"):
        launches(deps)
    with pytest.raises(ImportFormatError, match="no simpler artefact"):
        launches(write_json(tmp_path / "x.json", {"traceEvents": []}))


def test_early_perf_swimlane_fanout_lists_are_the_graph(tmp_path: Path) -> None:
    document = perf_swimlane_document(
        [(0, 2, 0, "aic", 1.0, 3.0, [2]), (1, 2, 1, "aic", 1.0, 4.0, [2]),
         (2, 5, 30, "aiv", 4.5, 5.0, [])]
    )  # fmt: skip
    (launch,) = launches(write_json(tmp_path / "perf_swimlane_1.json", document))
    assert launch.producer_format == "perf_swimlane"
    got = [(r["core_type"], r["block_id"], r["desc_id"], r["start_cycle"], r["end_cycle"])
           for r in records_of(launch)]  # fmt: skip
    assert got == [(1, 0, 2, 50, 150), (1, 1, 2, 50, 200), (2, 30, 5, 225, 250)]
    assert [g["depends_on"] for g in launch.tasks.to_pylist()] == [[], [], [0, 1]]
    document["tasks"][0]["fanout"] = [7]
    with pytest.raises(ImportFormatError, match=r"name task 7 \(local id 7\)"):
        launches(write_json(tmp_path / "perf_swimlane_2.json", document))


# --- the benchmark's helpers -----------------------------------------------------------


def test_synthetic_file_decodes_the_same_by_the_baseline_and_the_importer(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    assert write_synthetic(path, 1000) == 1000
    plain = numpy_decode(path)
    assert len(plain["start"]) == 1000
    (launch,) = launches(path)
    records = records_of(launch)
    assert len(records) == 1000
    assert sorted(r["start_cycle"] for r in records) == sorted(plain["start"].tolist())
    # Back to back on each core: each record starts after the previous one ended.
    by_core: dict[int, list[tuple[int, int]]] = {}
    for r in records:
        by_core.setdefault(r["block_id"], []).append((r["start_cycle"], r["end_cycle"]))
    assert all(
        np.all(np.array(v)[1:, 0] > np.array(v)[:-1, 1]) for v in map(sorted, by_core.values())
    )


def test_raw_rows_read_in_small_chunks_give_the_same_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rows are decoded a chunk of text at a time; cuts after every few rows (and rows as
    # u64 strings, pretty-printed) change nothing.
    from multicore_profiler.ingest import import_simpler

    path = tmp_path / "big.json"
    write_synthetic(path, 300)
    document = json.loads(path.read_text())
    document["aicore_tasks"] = [[str(v) for v in row] for row in document["aicore_tasks"]]
    pretty = write_json(tmp_path / "pretty.json", None)
    pretty.write_text(json.dumps(document, indent=1))
    whole = [records_of(launch) for launch in launches(path)]
    monkeypatch.setattr(import_simpler, "ROWS_CHUNK_BYTES", 40)
    for file in (path, pretty):  # streamed, not read whole
        streamed = import_simpler._streamed_records(file, "f", ImportOptions(format="simpler"))
        assert streamed is not None
        assert streamed[2].shape == (300, 7)
    assert [records_of(launch) for launch in launches(path)] == whole
    assert [records_of(launch) for launch in launches(pretty)] == whole
    monkeypatch.setattr(import_simpler, "ROWS_CHUNK_BYTES", 1)  # one row's text grows it
    assert [records_of(launch) for launch in launches(pretty)] == whole


def test_raw_rows_of_another_width_in_a_later_chunk_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from multicore_profiler.ingest import import_simpler

    rows = [[0, 5, 7, 100, 200]] * 3 + [[0, 5, 8, 300, 400, 0]]
    path = write_json(tmp_path / "r.json", records_document(CORES, rows))
    monkeypatch.setattr(import_simpler, "ROWS_CHUNK_BYTES", 20)
    with pytest.raises(ImportFormatError, match=r"5, 6 or 7 columns, found \[5, 6\]"):
        launches(path)
