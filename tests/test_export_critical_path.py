"""``export_chrome_trace(..., critical_path=True)``, ``mcprof export --critical-path`` and the
``Timeline``'s critical marks and chain, on a small hand-built store.

Run A holds two invocations of one buffer (the second 1000 cycles later) with the task
graph; run B one invocation of it without a graph. At 50 MHz a cycle is 20 ns; each
process's anchor is cycle 100. The expected critical paths are worked out by hand:

- AIC/0: task 1's GMM1 (110-200) and trigger of event 10 (200-205), task 2's GMM1
  (205-300) and trigger of event 11 (300-305);
- AIV/0: task 3 waits for event 10 (120-210) and computes (210-260); task 4 waits for
  event 11 (260-310) and computes (310-400), the invocation's last record;
- AIV/1: task 5 computes (105-150) and triggers event 12 (150-160), which nothing waits on.

With the graph, the walk back from task 4's compute crosses its wait to task 2's trigger
(ended at 305, the wait at 310), then goes back along AIC/0 to task 1's GMM1, and ends with
the front gap from 105 (AIV/1's first start): the critical records are AIC/0's four and
task 4's wait and compute. Without the graph no wait is crossed: the walk goes back along
AIV/0 alone, and its four records are the critical ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from golden import AIC, AIV, GMM1, TRIGGER, WAIT, Slot, pack
from task_graphs import tasks_table
from test_export import exported
from trace_checker import check_trace, load_trace

from multicore_profiler import cli
from multicore_profiler.abi import BufferLayout
from multicore_profiler.export.timeline import RecordSelection, open_timeline
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

RUN_A, RUN_B = "critical-a", "critical-b"
CONFIG = "critical-config"
LAYOUT = BufferLayout(aic_slots=1, aiv_slots=2, aic_capacity=16, aiv_capacity=16)
SWIGLU = 0x20000 + 102
KERNEL = KernelInfo(
    kernel_name="CriticalMoe", stage_names={GMM1: "GMM1", SWIGLU: "SwiGLU"}, config_id=CONFIG
)


def buffer(shift: int = 0) -> bytearray:
    """The records of the module docstring, ``shift`` cycles later."""

    def core(core_type: int, block: int, records: list[tuple[int, ...]]) -> Slot:
        moved = [(s + shift, e + shift, *rest) for s, e, *rest in records]
        return Slot(core_type, block, 100 + shift, moved)

    return pack(
        1,
        2,
        16,
        16,
        [
            core(
                AIC,
                0,
                [
                    (110, 200, GMM1, 1, 0, 0),
                    (200, 205, TRIGGER, 1, 0, 0),
                    (205, 300, GMM1, 2, 1, 0),
                    (300, 305, TRIGGER, 2, 1, 0),
                ],
            ),
            core(
                AIV,
                0,
                [
                    (120, 210, WAIT, 3, 0, 0),
                    (210, 260, SWIGLU, 3, 0, 0),
                    (260, 310, WAIT, 4, 1, 0),
                    (310, 400, SWIGLU, 4, 1, 0),
                ],
            ),
            core(AIV, 1, [(105, 150, SWIGLU, 5, 2, 0), (150, 160, TRIGGER, 5, 2, 0)]),
        ],
    )


def tasks() -> pa.Table:
    """Tasks 1 and 2 trigger events 10 and 11, which tasks 3 and 4 wait for once; task 5
    triggers event 12."""
    ids = [1, 2, 3, 4, 5]
    return tasks_table(
        CONFIG,
        "CriticalMoe",
        task_id=ids,
        desc_id=[GMM1, GMM1, SWIGLU, SWIGLU, SWIGLU],
        core_type=[AIC, AIC, AIV, AIV, AIV],
        worker=[0, 0, 0, 0, 1],
        wait_event=[-1, -1, 10, 11, -1],
        wait_count=[0, 0, 1, 1, 0],
        trigger_event=[10, 11, -1, -1, 12],
        task_type=[101, 101, 102, 102, 102],
        stage_task_index=[0, 1, 0, 1, 2],
    )


@pytest.fixture
def paths(store: Store) -> Store:
    """Run A (two invocations, with the graph), then run B (one, without)."""
    return two_runs(store)


def two_runs(store: Store) -> Store:
    """Write run A (two invocations, with the graph), then run B (one, without)."""
    for run_id, buffers, config in (
        (RUN_A, [buffer(), buffer(1000)], CONFIG),
        (RUN_B, [buffer()], None),
    ):
        run = RunInfo.begin(run_id=run_id, label=run_id)
        store.write_run(run)
        ingest_buffers(
            store,
            buffers,
            LAYOUT,
            frequency_hz=50e6,
            run_id=run_id,
            kernel=KERNEL if config else KernelInfo(kernel_name="CriticalMoe"),
            launches=Launches(step=0, first_invocation_id=0),
        )
        store.write_run(run.finish())
    store.write_tasks(RUN_A, tasks())
    return store


def critical_slices(trace: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """(pid, invocation, task, desc) of each slice marked critical, in file order."""
    return [
        (e["pid"], e["args"]["invocation_id"], e["args"]["task_id"], e["args"]["desc_id"])
        for e in trace["traceEvents"]
        if e["ph"] == "X" and e["args"].get("critical") == 1
    ]


def chain(trace: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Each flow of the critical path as (pid, s's tid and ts, f's tid and ts), by id; the
    ids run on from the dependency arrows' (one start and one end each, f with bp e)."""
    arrows = [e["id"] for e in trace["traceEvents"] if e.get("name") == "dependency"]
    flows: dict[int, dict[str, Any]] = {}
    for event in trace["traceEvents"]:
        if event.get("cat") == "critical_path":
            assert event["name"] == "critical_path"
            assert event.get("bp") == ("e" if event["ph"] == "f" else None)
            assert event["ph"] not in flows.setdefault(event["id"], {})
            flows[event["id"]][event["ph"]] = event
    first = max(arrows, default=0) + 1
    assert sorted(flows) == list(range(first, first + len(flows)))
    return [
        (f["s"]["pid"], f["s"]["tid"], f["s"]["ts"], f["f"]["tid"], f["f"]["ts"])
        for f in (flows[i] for i in sorted(flows))
    ]


GRAPHED = [(1, GMM1), (1, TRIGGER), (2, GMM1), (2, TRIGGER), (4, WAIT), (4, SWIGLU)]
"""(task, desc) of an invocation's critical records with the graph, in path order."""


def graphed_chain(pid: int, offset_us: float = 0.0) -> list[tuple[Any, ...]]:
    """An invocation's chain with the graph, ``offset_us`` after cycle 100: s on the earlier
    record at its start, f (bp e) inside the later one, at its start or the s's, the later."""
    hops = [
        (1000, 0.2, 1000, 2.0),  # GMM1 1 -> trigger 1
        (1000, 2.0, 1000, 2.1),  # trigger 1 -> GMM1 2
        (1000, 2.1, 1000, 4.0),  # GMM1 2 -> trigger 2
        (1000, 4.0, 2000, 4.0),  # trigger 2 -> task 4's wait (3.2-4.2), at the trigger
        (2000, 3.2, 2000, 4.2),  # task 4's wait -> its SwiGLU
    ]
    return [
        (pid, s_tid, round(s_ts + offset_us, 3), f_tid, round(f_ts + offset_us, 3))
        for s_tid, s_ts, f_tid, f_ts in hops
    ]


def test_marks_and_chain_of_several_runs_and_invocations(paths: Store, tmp_path: Path) -> None:
    trace = exported(paths, tmp_path / "t.json", run=[RUN_A, RUN_B], critical_path=True)
    a, b = 100_000, 200_000  # the runs' pids: position x 100000 + rank 0
    # Slices in file order: by process, core, then time.
    assert critical_slices(trace) == [
        (a, 0, 1, GMM1), (a, 0, 1, TRIGGER), (a, 0, 2, GMM1), (a, 0, 2, TRIGGER),
        (a, 1, 1, GMM1), (a, 1, 1, TRIGGER), (a, 1, 2, GMM1), (a, 1, 2, TRIGGER),
        (a, 0, 4, WAIT), (a, 0, 4, SWIGLU), (a, 1, 4, WAIT), (a, 1, 4, SWIGLU),
        (b, 0, 3, WAIT), (b, 0, 3, SWIGLU), (b, 0, 4, WAIT), (b, 0, 4, SWIGLU),
    ]  # fmt: skip
    # The dependency arrows keep ids 1 to 4 (two a graphed invocation); the chain follows.
    arrows = [
        e for e in trace["traceEvents"] if e.get("cat") == "MegaKernelInternal" and e["ph"] in "sf"
    ]
    assert sorted({e["id"] for e in arrows}) == [1, 2, 3, 4]
    assert sorted(chain(trace)) == sorted([
        *graphed_chain(a),
        *graphed_chain(a, 20.0),
        (b, 2000, 0.4, 2000, 2.2),  # task 3's wait -> its SwiGLU
        (b, 2000, 2.2, 2000, 3.2),  # -> task 4's wait
        (b, 2000, 3.2, 2000, 4.2),  # -> its SwiGLU
    ])  # fmt: skip
    summary = trace["megaKernelCycleTrace"]
    assert (summary["flowCount"], summary["criticalRecordCount"], summary["criticalFlowCount"]) == (
        4,
        16,
        13,
    )


def test_marks_equal_the_critical_path_view(paths: Store, tmp_path: Path) -> None:
    trace = exported(paths, tmp_path / "t.json", run=[RUN_A, RUN_B], critical_path=True)
    pids = {RUN_A: 100_000, RUN_B: 200_000}
    view = paths.sql(
        "SELECT c.run_id, c.invocation_id, r.task_id, r.desc_id FROM critical_path c "
        "JOIN records r USING (run_id, rank, invocation_id, write_id, core_type, block_id, "
        "record_index) WHERE c.record_index IS NOT NULL"
    ).to_pylist()
    expected = sorted(
        (pids[v["run_id"]], v["invocation_id"], v["task_id"], v["desc_id"]) for v in view
    )
    assert sorted(critical_slices(trace)) == expected
    assert len(expected) == 16


def test_the_chain_follows_seq_order(paths: Store, tmp_path: Path) -> None:
    """Each flow joins a critical record to the next one in the view's seq order."""
    trace = exported(paths, tmp_path / "t.json", run=RUN_A, invocation=0, critical_path=True)
    slices = {
        (e["tid"], e["ts"]): (e["args"]["task_id"], e["args"]["desc_id"])
        for e in trace["traceEvents"]
        if e["ph"] == "X"
    }
    path = paths.sql(
        "SELECT r.task_id, r.desc_id FROM critical_path c JOIN records r USING (run_id, rank, "
        "invocation_id, write_id, core_type, block_id, record_index) "
        f"WHERE c.run_id = '{RUN_A}' AND c.invocation_id = 0 AND c.record_index IS NOT NULL "
        "ORDER BY c.seq"
    ).to_pylist()
    assert [(p["task_id"], p["desc_id"]) for p in path] == GRAPHED
    starts = [e for e in trace["traceEvents"] if e.get("cat") == "critical_path" and e["ph"] == "s"]
    # Each s is at its record's start, so the record it binds to is found by (tid, ts).
    assert [slices[e["tid"], e["ts"]] for e in starts] == GRAPHED[:-1]
    assert sorted(chain(trace)) == sorted(graphed_chain(0))


def test_a_selection_chains_the_critical_records_it_shows(paths: Store, tmp_path: Path) -> None:
    """Without the triggers, the chain goes from each shown critical record to the next."""
    trace = exported(
        paths,
        tmp_path / "t.json",
        run=RUN_A,
        invocation=0,
        where=f"desc_id <> {TRIGGER}",
        critical_path=True,
    )
    assert critical_slices(trace) == [
        (0, 0, 1, GMM1),
        (0, 0, 2, GMM1),
        (0, 0, 4, WAIT),
        (0, 0, 4, SWIGLU),
    ]
    assert chain(trace) == [
        (0, 1000, 0.2, 1000, 2.1),  # GMM1 1 -> GMM1 2
        (0, 1000, 2.1, 2000, 3.2),  # GMM1 2 -> task 4's wait (3.2-4.2)
        (0, 2000, 3.2, 2000, 4.2),  # -> its SwiGLU
    ]


def test_without_the_option_nothing_changes(paths: Store, tmp_path: Path) -> None:
    """The default trace is the critical one less its marks, its chain and its two counts."""
    plain = exported(paths, tmp_path / "plain.json", run=[RUN_A, RUN_B])
    marked = exported(paths, tmp_path / "marked.json", run=[RUN_A, RUN_B], critical_path=True)
    text = (tmp_path / "plain.json").read_bytes()
    assert b'"critical"' not in text
    assert b"critical_path" not in text
    for event in marked["traceEvents"]:
        event.get("args", {}).pop("critical", None)
    marked["traceEvents"] = [e for e in marked["traceEvents"] if e.get("cat") != "critical_path"]
    for summary in (marked["megaKernelCycleTrace"], marked["metadata"]["megaKernelCycleTrace"]):
        del summary["criticalRecordCount"], summary["criticalFlowCount"]
    assert marked == plain


def test_timeline_tables(paths: Store) -> None:
    """The marks are a slice column and the chain a second kind of flow, filed with the
    group of its later record."""
    selection = RecordSelection(run=RUN_A, invocation=0)
    with open_timeline(paths, selection, critical_path=True, group_rows=1) as timeline:
        groups = list(timeline.groups())
        assert timeline.critical_path
        marks = [
            (s["tid"], s["task_id"], s["desc_id"], s["critical"])
            for g in groups
            for s in g.slices.to_pylist()
        ]
        assert marks == [
            (1000, 1, GMM1, True), (1000, 1, TRIGGER, True),
            (1000, 2, GMM1, True), (1000, 2, TRIGGER, True),
            (2000, 3, WAIT, False), (2000, 3, SWIGLU, False),
            (2000, 4, WAIT, True), (2000, 4, SWIGLU, True),
            (2001, 5, SWIGLU, False), (2001, 5, TRIGGER, False),
        ]  # fmt: skip
        columns = ["kind", "source_tid", "source_ts", "target_tid", "target_ts", "target_end"]
        flows = [None if g.flows is None else g.flows.select(columns).to_pylist() for g in groups]
        assert flows == [
            [
                {"kind": "critical_path", "source_tid": 1000, "source_ts": t, "target_tid": 1000,
                 "target_ts": u, "target_end": v}
                for t, u, v in ((200, 2000, 2100), (2000, 2100, 4000), (2100, 4000, 4100))
            ],
            [
                {"kind": "dependency", "source_tid": 1000, "source_ts": 2000, "target_tid": 2000,
                 "target_ts": 400, "target_end": 2200},
                {"kind": "dependency", "source_tid": 1000, "source_ts": 4000, "target_tid": 2000,
                 "target_ts": 3200, "target_end": 4200},
                {"kind": "critical_path", "source_tid": 1000, "source_ts": 4000, "target_tid": 2000,
                 "target_ts": 3200, "target_end": 4200},
                {"kind": "critical_path", "source_tid": 2000, "source_ts": 3200, "target_tid": 2000,
                 "target_ts": 4200, "target_end": 6000},
            ],
            None,
        ]  # fmt: skip
        assert timeline.metadata is not None
        assert timeline.metadata["criticalRecordCount"] == 6
        assert timeline.metadata["criticalFlowCount"] == 5
    with open_timeline(paths, selection) as timeline:
        groups = list(timeline.groups())
        assert "critical" not in groups[0].slices.column_names
        assert groups[0].flows is not None
        assert "kind" not in groups[0].flows.column_names
        assert timeline.metadata is not None
        assert "criticalFlowCount" not in timeline.metadata


def test_cli_export_critical_path(
    paths: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.json"
    argv = ["export", "--store", str(paths.root), "-o", str(out), "--run", RUN_A]
    assert cli.main([*argv, "--invocation", "0", "--critical-path"]) == 0
    assert capsys.readouterr().out == (
        f"{out}: 32 events (10 records of 1 invocation(s), 2 dependency arrows, 6 critical "
        f"records, 5 critical path flows) from run {RUN_A}, invocation 0\n"
    )
    trace = load_trace(out)
    check_trace(trace)
    assert sorted(chain(trace)) == sorted(graphed_chain(0))
    assert cli.main([*argv, "--invocation", "0"]) == 0
    assert capsys.readouterr().out == (
        f"{out}: 22 events (10 records of 1 invocation(s), 2 dependency arrows) from run "
        f"{RUN_A}, invocation 0\n"
    )


def test_the_chain_follows_records_onto_sub_tracks(store: Store, tmp_path: Path) -> None:
    """Task 2 starts before task 1 ends on AIC/2 (clock granularity) and moves to a
    sub-track; without a graph the path is the core's three records, and the chain goes to
    the sub-track and back."""
    layout = BufferLayout(aic_slots=3, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
    records = [(100, 200, GMM1, 1, 0, 0), (150, 250, GMM1, 2, 1, 0), (250, 300, GMM1, 3, 2, 0)]
    store.write_run(RunInfo.begin(run_id=RUN_A))
    ingest_buffers(
        store, [pack(3, 1, 16, 16, [Slot(AIC, 2, 100, records)])], layout, frequency_hz=50e6,
        run_id=RUN_A,
    )  # fmt: skip
    trace = exported(store, tmp_path / "t.json", critical_path=True)
    assert critical_slices(trace) == [(0, 0, 1, GMM1), (0, 0, 2, GMM1), (0, 0, 3, GMM1)]
    assert [e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"] == [1002, 11002, 1002]
    assert chain(trace) == [(0, 1002, 0.0, 11002, 1.0), (0, 11002, 1.0, 1002, 3.0)]
