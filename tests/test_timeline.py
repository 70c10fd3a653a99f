"""``RecordSelection`` and ``Timeline``: exact tables of the golden store's timeline.

The golden store (``test_export``): one invocation at 50 MHz (20 ns a cycle), anchor
cycle 100; AIC/0 (entry 100) runs task 7's wait, GMM1 and trigger; AIV/1 (entry 120)
runs task 8's wait (released by task 7's trigger) and SwiGLU, then task 9.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import test_export
from golden import AIC, GMM1, Slot, pack
from simulated_runs import write_run
from test_export import RUN, golden_summary

from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import ArgumentError, ExportError, StatementError, StoreError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.export.timeline import (
    US_TEXT_MACRO,
    LayoutChanged,
    RecordSelection,
    Spans,
    Timeline,
    _GroupFiles,
    numpy_column,
    open_timeline,
    track_name,
    track_tid,
    us_text,
)
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

golden = test_export.golden
"""The golden store (a fixture)."""

WAIT, TRIGGER, SWIGLU, UNNAMED = 0x10000, 0x10007, 0x20000 + 102, 0x30005
NO_OWNER = 0xFFFFFFFF


def passed(timeline: Timeline) -> list[Any]:
    """One whole pass over the groups: each group's slices and flows as Python values."""
    return [
        (group.slices.to_pylist(), None if group.flows is None else group.flows.to_pylist())
        for group in timeline.groups()
    ]


def slice_row(tid: int, core: int, ts: int, end: int, name: int, task: int, desc: int,
              index: int, owner: int, start: int, stop: int) -> dict[str, Any]:  # fmt: skip
    return {
        "pid": 3, "tid": tid, "core": core, "ts_ns": ts, "end_ns": end, "name": name,
        "task_id": task, "desc_id": desc, "stage_task_index": index, "owner_id": owner,
        "start_cycle": start, "end_cycle": stop,
    }  # fmt: skip


def test_golden_timeline_tables(golden: Store) -> None:
    with open_timeline(golden, RecordSelection(run=RUN)) as timeline:
        assert timeline.records == 6
        assert timeline.described == f"run {RUN}"
        assert timeline.processes.select(["pid", "name", "sort_index", "anchor"]).to_pylist() == [
            {"pid": 3, "name": "GoldenMoe rank 3 device 5", "sort_index": 3, "anchor": 100}
        ]
        assert timeline.tracks.to_pylist() == [
            {"pid": 3, "tid": 1000, "parent_tid": 1000, "lane": 0, "name": "AIC/0",
             "sort_index": 0},
            {"pid": 3, "tid": 2001, "parent_tid": 2001, "lane": 0, "name": "AIV/1",
             "sort_index": 1},
        ]  # fmt: skip
        core = {"lane": 0, "inv_index": 0, "rank": 3, "device": 5, "invocation_id": 0,
                "step": 4, "direction": "forward"}  # fmt: skip
        assert timeline.cores.to_pylist() == [
            {"pid": 3, "tid": 1000, "core_type": 1, "block_id": 0, "entry_cycle": 100} | core,
            {"pid": 3, "tid": 2001, "core_type": 2, "block_id": 1, "entry_cycle": 120} | core,
        ]
        assert timeline.names == [
            "GMM1",
            "GMM1_TriggerEvent",
            "GMM1_WaitDependency",
            "TaskType_65541",
            "TaskType_SwiGLU",
            "WaitDependency",
        ]
        assert timeline.spans == Spans(
            ts=(200, 8000),
            dur=(100, 5600),
            task=(7, 9),
            index=(0, 2),
            owner=(5, NO_OWNER),
            start=(110, 500),
            end=(160, 520),
            desc=(WAIT, UNNAMED),
            task_type=(0, 65541),
        )
        assert timeline.metadata is None  # complete once a pass has run
        assert passed(timeline) == [
            (
                [
                    slice_row(1000, 0, 200, 1200, 2, 7, WAIT, 2, 5, 110, 160),
                    slice_row(1000, 0, 1200, 6000, 0, 7, GMM1, 2, 5, 160, 400),
                    slice_row(1000, 0, 6000, 6100, 1, 7, TRIGGER, 2, 5, 400, 405),
                    slice_row(2001, 1, 600, 6200, 5, 8, WAIT, 0, 5, 130, 410),
                    slice_row(2001, 1, 6200, 8000, 4, 8, SWIGLU, 0, 5, 410, 500),
                    slice_row(2001, 1, 8000, 8400, 3, 9, UNNAMED, 0, NO_OWNER, 500, 520),
                ],
                [
                    {"inv_index": 0, "source_pid": 3, "source_tid": 1000, "source_ts": 6000,
                     "target_pid": 3, "target_tid": 2001, "target_ts": 600, "target_end": 6200}
                ],
            )
        ]  # fmt: skip
        assert timeline.metadata == golden_summary(detailed=False)


def test_an_overlap_changes_the_layout_once(store: Store) -> None:
    """Clock granularity: task 2 starts before task 1 ends on AIC/2; the first pass finds
    it, and the second yields it on AIC/2's first sub-track."""
    layout = BufferLayout(aic_slots=3, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
    records = [(100, 200, GMM1, 1, 0, 0), (150, 250, GMM1, 2, 1, 0), (250, 300, GMM1, 3, 2, 0)]
    store.write_run(RunInfo.begin(run_id=RUN))
    ingest_buffers(
        store, [pack(3, 1, 16, 16, [Slot(AIC, 2, 100, records)])], layout, frequency_hz=50e6,
        run_id=RUN,
    )  # fmt: skip
    with open_timeline(store, RecordSelection(run=RUN), group_rows=1) as timeline:
        assert [t["tid"] for t in timeline.tracks.to_pylist()] == [1002]
        with pytest.raises(LayoutChanged):
            passed(timeline)
        assert timeline.tracks.select(["tid", "name", "sort_index"]).to_pylist() == [
            {"tid": 1002, "name": "AIC/2", "sort_index": 0},
            {"tid": 11002, "name": "AIC/2 overlap 1", "sort_index": 1},
        ]
        assert timeline.cores.select(["tid", "lane"]).to_pylist() == [
            {"tid": 1002, "lane": 0},
            {"tid": 11002, "lane": 1},
        ]
        ((slices, flows),) = passed(timeline)
        assert [(s["tid"], s["core"], s["task_id"]) for s in slices] == [
            (1002, 0, 1),
            (11002, 1, 2),
            (1002, 0, 3),
        ]
        assert flows is None
        assert timeline.metadata is not None
        assert timeline.metadata["subTracks"] == [
            {"pid": 0, "tid": 11002, "parentTid": 1002, "records": 1}
        ]


def test_selection_sql_and_description(golden: Store) -> None:
    ingest_buffers(
        golden,
        [test_export.golden_buffer()],
        test_export.LAYOUT,
        frequency_hz=50e6,
        run_id=RUN,
        kernel=test_export.NAMED,
        launches=Launches(rank=3, device=5, step=4, first_invocation_id=1, window_id=0),
    )
    selected = RecordSelection(run=RUN, step=4, rank=3, window=0).resolve(golden)
    assert selected.described == f"run {RUN}, step 4, rank 3, window 0"
    assert selected.runs == [RUN]
    assert selected.sql == (
        f"SELECT * FROM aligned_records r WHERE run_id IN ('{RUN}') AND step = 4 AND rank = 3 AND "
        "EXISTS (SELECT 1 FROM invocations i WHERE i.run_id = r.run_id AND i.rank = r.rank "
        "AND i.invocation_id = r.invocation_id AND i.window_id = 0)"
    )
    latest = RecordSelection(where="stage = 'GMM1'").resolve(golden)
    assert (latest.described, latest.runs) == (f"run {RUN}, where stage = 'GMM1'", [RUN])
    assert latest.sql.startswith("SELECT * FROM records_ns r WHERE")
    query = RecordSelection(query="SELECT * FROM records;  ").resolve(golden)
    assert (query.sql, query.runs) == ("SELECT * FROM records", None)
    assert RecordSelection(run=["a", "b"]).run == ("a", "b")


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"step": -1}, ArgumentError, r"--step -1 is out of range"),
        ({"rank": 2**31}, ArgumentError, r"--rank 2147483648 is out of range"),
        ({"where": "1; DROP TABLE runs"}, StatementError, r"the --where condition holds a ';'"),
        ({"query": "DELETE FROM runs"}, StatementError, r"the --sql query"),
        ({"query": "SELECT 1", "step": 1}, ExportError, r"give either a query or run"),
        ({"run": "../up"}, StoreError, r"run id '../up' is not valid"),
    ],
)
def test_a_selection_checks_itself(
    arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        RecordSelection(**arguments)


def test_an_empty_store_has_no_latest_run(store: Store) -> None:
    with pytest.raises(ExportError, match="holds no run"):
        RecordSelection().resolve(store)


def test_track_rules_and_microseconds() -> None:
    assert (track_tid(1, 3), track_tid(2, 7, 2)) == (1003, 22007)
    assert (track_name(1, 3), track_name(2, 7, 2), track_name(9, 1)) == (
        "AIC/3",
        "AIV/7 overlap 2",
        "9/1",
    )
    values = [0, 1500, -20, 123456789]
    texts = us_text(pa.array(values).to_numpy()).to_pylist()
    assert texts == ["0.000", "1.500", "-0.020", "123456.789"]
    con = duckdb.connect()
    con.execute(US_TEXT_MACRO)
    assert [con.execute("SELECT us_text(?::BIGINT)", [v]).fetchone()[0] for v in values] == texts
    quoted = us_text(np.array([1500, 2]), np.array([True, False])).to_pylist()
    assert quoted == ['"1.500"', "0.002"]


def test_the_scratch_directory_lives_as_long_as_the_timeline(golden: Store, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with open_timeline(golden, RecordSelection(run=RUN), scratch_dir=scratch) as timeline:
        passed(timeline)
        assert [p.name.startswith(".mcprof-export-") for p in scratch.iterdir()] == [True]
    assert list(scratch.iterdir()) == []


def test_export_takes_a_selection_or_its_arguments(golden: Store, tmp_path: Path) -> None:
    trace = export_chrome_trace(golden, tmp_path / "t.json", selection=RecordSelection(run=RUN))
    assert trace.metadata == golden_summary(detailed=False)
    with pytest.raises(ExportError, match="give either a selection or run/step"):
        export_chrome_trace(golden, tmp_path / "t.json", selection=RecordSelection(), step=4)


def test_flow_ids_name_each_flow_at_both_of_its_slices(golden: Store) -> None:
    """With ``flow_ids``, the trigger's slice lists the arrow it starts and the wait's slice
    the arrow it ends, under one id: the wait's slot code above its record index."""
    with open_timeline(golden, RecordSelection(run=RUN), flow_ids=True) as timeline:
        (group,) = list(timeline.groups())
    slices = group.slices.select(["task_id", "desc_id", "flows_out", "flows_in"]).to_pylist()
    flow = 1 << 8  # AIV/1 is the invocation's second slot; the wait is its record 0
    assert slices == [
        {"task_id": 7, "desc_id": WAIT, "flows_out": [], "flows_in": []},
        {"task_id": 7, "desc_id": GMM1, "flows_out": [], "flows_in": []},
        {"task_id": 7, "desc_id": TRIGGER, "flows_out": [flow], "flows_in": []},
        {"task_id": 8, "desc_id": WAIT, "flows_out": [], "flows_in": [flow]},
        {"task_id": 8, "desc_id": SWIGLU, "flows_out": [], "flows_in": []},
        {"task_id": 9, "desc_id": UNNAMED, "flows_out": [], "flows_in": []},
    ]


def open_in(directory: Path) -> int:
    """How many of this process's file descriptors are open on files under ``directory``."""
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        try:
            targets.append(fd.readlink())
        except FileNotFoundError:  # the descriptor listdir itself used, closed since
            continue
    return sum(target.is_relative_to(directory) for target in targets)


def test_filing_by_group_keeps_a_bounded_number_of_files_open(tmp_path: Path) -> None:
    """300,000 rows of 200 groups, every batch of DuckDB's stream holding all 200: with a
    limit of 4, at most 4 files are open while the rows are filed (200 before), and each
    group reads back its rows, in the order they came."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    con = duckdb.connect()
    sql = "SELECT (i % 200)::INTEGER AS grp, i FROM range(300000) t(i) ORDER BY i"
    files = _GroupFiles(scratch, "rows", open_limit=4)
    try:
        files.add(con, sql)
        assert open_in(scratch) == 4
    finally:
        files.close()
    assert open_in(scratch) == 0
    for group in (0, 7, 199):
        table = files.read(group)
        assert table is not None
        assert table.column_names == ["i"]
        assert table["i"].to_pylist() == list(range(group, 300000, 200))
    assert files.read(200) is None


def flow_rows(timeline: Timeline) -> list[Any]:
    """One whole pass: each group's flows, and each slice's identity with its flow ids."""
    rows = []
    for group in timeline.groups():
        flows = [] if group.flows is None else group.flows.to_pylist()
        slices = group.slices.select(
            ["pid", "tid", "ts_ns", "end_ns", "task_id", "desc_id", "flows_in", "flows_out"]
        )
        rows.append((flows, slices.to_pylist()))
    return rows


def test_whole_invocations_take_their_arrows_from_their_records(store: Store) -> None:
    """A run selected whole ranks its triggers from its own selected records; the same
    records as a query's rows take their edges from ``task_edges``: the arrows, their ids
    and the slices' flow lists are the same, group by group, over several parts."""
    run = write_run(store, SimulatedMoeKernel(), seed=1, commit="arrows01", config_id="moe")
    whole = RecordSelection(run=run)
    rows = RecordSelection(query=f"SELECT * FROM aligned_records WHERE run_id = '{run}'")
    with open_timeline(store, whole, flow_ids=True, group_rows=200) as timeline:
        assert numpy_column(timeline.invocations, "whole").all()
        selected = flow_rows(timeline)
    with open_timeline(store, rows, flow_ids=True, group_rows=200) as timeline:
        assert not numpy_column(timeline.invocations, "whole").any()
        stored = flow_rows(timeline)
    assert len(selected) > 4
    arrows = sum(len(flows) for flows, _ in selected)
    assert arrows == timeline.metadata["flowCount"] > 0
    assert selected == stored
