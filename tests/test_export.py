"""Chrome Trace export: exact JSON of small golden stores, names, arrows, tracks, failures.

Every trace a test writes is read back and run through ``trace_checker.check_trace``,
the rules Perfetto's and chrome://tracing's importers apply.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from golden import AIC, AIV, GMM1, NO_OWNER, TRIGGER, WAIT, Slot, pack
from task_graphs import tasks_table
from trace_checker import check_trace, load_trace

from multicore_profiler import cli
from multicore_profiler.abi import BufferLayout
from multicore_profiler.analysis.analyze import analyze
from multicore_profiler.analysis.selection import RecordSelection
from multicore_profiler.errors import (
    DroppedRecordsWarning,
    ExportError,
    ProfileError,
    QueryError,
    SelectorError,
    SessionError,
)
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.schedule import schedule
from multicore_profiler.ingest.session import mega_kernel_profile
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

RUN = "golden-run"
LAYOUT = BufferLayout(aic_slots=1, aiv_slots=2, aic_capacity=16, aiv_capacity=16, generation="a")
SWIGLU_TYPE = 102
UNNAMED = 0x30005
CONFIG = "golden-config"
NAMED = KernelInfo(
    kernel_name="GoldenMoe",
    owner_label="Expert",
    stage_names={GMM1: "GMM1", 0x20000 + SWIGLU_TYPE: "SwiGLU"},
    soc="Ascend910B4",
    config_id=CONFIG,
)


def golden_buffer() -> bytearray:
    """Task 7 (Expert 5, GMM1 #3) on AIC/0 triggers event 0; task 8 (Expert 5, a SwiGLU
    task of no stage) on AIV/1 waits on it; task 9 (no owner, an unnamed stage) follows."""
    return pack(
        1,
        2,
        16,
        16,
        [
            Slot(
                AIC,
                0,
                100,
                [
                    (110, 160, WAIT, 7, 2, 5),
                    (160, 400, GMM1, 7, 2, 5),
                    (400, 405, TRIGGER, 7, 2, 5),
                ],
            ),
            Slot(
                AIV,
                1,
                120,
                [
                    (130, 410, WAIT, 8, 0, 5),
                    (410, 500, 0x20000 + SWIGLU_TYPE, 8, 0, 5),
                    (500, 520, UNNAMED, 9, 0, NO_OWNER),
                ],
            ),
        ],
    )


def golden_tasks() -> pa.Table:
    """The graph of the golden kernel: task 7 waits on event 1 (never triggered here) and
    triggers event 0, which task 8 waits for once."""
    return tasks_table(
        CONFIG,
        "GoldenMoe",
        task_id=[7, 8, 9],
        desc_id=[GMM1, 0x20000 + SWIGLU_TYPE, UNNAMED],
        core_type=[AIC, AIV, AIV],
        worker=[0, 1, 1],
        wait_event=[1, 0, -1],
        wait_count=[1, 1, 0],
        trigger_event=[0, -1, -1],
        task_type=[103, SWIGLU_TYPE, 104],
        stage_task_index=[2, 0, 0],
        owner_id=[5, 5, NO_OWNER],
        rank=3,
    )


def fill(store: Store, kernel: KernelInfo, buffers: list[bytearray], *, run_id: str = RUN) -> None:
    run = RunInfo.begin(run_id=run_id, label="golden")
    store.write_run(run)
    ingest_buffers(
        store,
        buffers,
        LAYOUT,
        frequency_hz=50e6,
        run_id=run_id,
        kernel=kernel,
        launches=Launches(rank=3, device=5, step=4, first_invocation_id=0),
    )
    store.write_run(run.finish())


@pytest.fixture
def golden(store: Store) -> Store:
    fill(store, NAMED, [golden_buffer()])
    store.write_tasks(RUN, golden_tasks())
    return store


def exported(store: Store, path: Path, **options: Any) -> dict[str, Any]:
    """Export, read the file back, check it as Perfetto would; return the trace."""
    result = export_chrome_trace(store, path, **options)
    trace = load_trace(path)
    check_trace(trace)
    assert result.events == len(trace["traceEvents"])
    assert result.metadata == trace["megaKernelCycleTrace"]
    return trace


def x(name: str, ts: float, dur: float, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "ph": "X",
        "cat": "MegaKernelInternal",
        "pid": 3,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"rank": 3, "device_id": 5, "invocation_id": 0, "step": 4} | args,
    }


def record(core: int, block: int, entry: int, task: int, desc: int, index: int, **more: Any):
    args = {
        "core_type": core,
        "block_id": block,
        "core_entry_cycle": entry,
        "direction": "forward",
        "task_id": task,
        "desc_id": desc,
        "stage_task_index": index,
        "task_number": index + 1,
    }
    return args | more


FLOW = {"id": 1, "cat": "MegaKernelInternal", "name": "dependency", "pid": 3, "ts": 6.0}
GOLDEN_EVENTS = [
    {"name": "process_name", "ph": "M", "pid": 3, "tid": 0,
     "args": {"name": "GoldenMoe rank 3 device 5"}},
    {"name": "process_sort_index", "ph": "M", "pid": 3, "tid": 0, "args": {"sort_index": 3}},
    {"name": "thread_name", "ph": "M", "pid": 3, "tid": 1000, "args": {"name": "AIC/0"}},
    {"name": "thread_sort_index", "ph": "M", "pid": 3, "tid": 1000, "args": {"sort_index": 0}},
    {"name": "thread_name", "ph": "M", "pid": 3, "tid": 2001, "args": {"name": "AIV/1"}},
    {"name": "thread_sort_index", "ph": "M", "pid": 3, "tid": 2001, "args": {"sort_index": 1}},
    x("GMM1_WaitDependency", 0.2, 1.0, 1000,
      record(AIC, 0, 100, 7, WAIT, 2, owner_id=5, start_cycle=110, end_cycle=160)),
    x("GMM1", 1.2, 4.8, 1000,
      record(AIC, 0, 100, 7, GMM1, 2, task_type=GMM1 - 0x20000, owner_id=5, start_cycle=160,
             end_cycle=400)),
    x("GMM1_TriggerEvent", 6.0, 0.1, 1000,
      record(AIC, 0, 100, 7, TRIGGER, 2, owner_id=5, start_cycle=400, end_cycle=405)),
    x("WaitDependency", 0.6, 5.6, 2001,
      record(AIV, 1, 120, 8, WAIT, 0, owner_id=5, start_cycle=130, end_cycle=410)),
    x("TaskType_SwiGLU", 6.2, 1.8, 2001,
      record(AIV, 1, 120, 8, 0x20000 + SWIGLU_TYPE, 0, task_type=SWIGLU_TYPE, owner_id=5,
             start_cycle=410, end_cycle=500)),
    x("TaskType_65541", 8.0, 0.4, 2001,
      record(AIV, 1, 120, 9, UNNAMED, 0, task_type=UNNAMED - 0x20000, start_cycle=500,
             end_cycle=520)),
    FLOW | {"ph": "s", "tid": 1000},
    FLOW | {"ph": "f", "bp": "e", "tid": 2001},
]  # fmt: skip

DETAILED_NAMES = [
    "Expert5_GMM1_WaitDependency_task3",
    "Expert5_GMM1_task3",
    "Expert5_GMM1_TriggerEvent_task3",
    "Expert5_WaitDependency_task1",
    "Expert5_TaskType_SwiGLU_task1",
    "TaskType_65541_task1",
]


def golden_summary(detailed: bool) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "selection": f"run {RUN}",
        "detailedTaskNames": detailed,
        "rank": 3,
        "deviceId": 5,
        "socName": "Ascend910B4",
        "windowIndex": None,
        "cycleFrequencyMHz": 50.0,
        "cycleFrequencySource": "given",
        "anchorCycle": 100,
        "recordCapacityPerCore": {"AIC": 16, "AIV": 16},
        "maxRecordCapacityPerCore": 256,
        "abiGeneration": "a",
        "profileBufferBytes": 1728,
        "invocationCount": 1,
        "recordCount": 6,
        "droppedRecordCount": 0,
        "flowCount": 1,
        "invocationsWithoutTaskGraph": 0,
        "processes": [{"pid": 3, "runId": RUN, "rank": 3, "anchorCycle": 100}],
        "invocations": [
            {
                "runId": RUN,
                "invocationId": 0,
                "step": 4,
                "windowIndex": None,
                "direction": "forward",
                "kernelName": "GoldenMoe",
                "rank": 3,
                "deviceId": 5,
                "pid": 3,
                "socName": "Ascend910B4",
                "cycleFrequencyMHz": 50.0,
                "cycleFrequencySource": "given",
                "anchorCycle": 100,
                "offsetUs": 0.0,
                "recordCapacityPerCore": {"AIC": 16, "AIV": 16},
                "recordCount": 6,
                "storedRecordCount": 6,
                "droppedRecordCount": 0,
                "taskGraph": True,
                "abiGeneration": "a",
                "profileBufferBytes": 1728,
            }
        ],
        "subTracks": [],
        "warnings": [],
    }


def test_golden_trace_is_exact(golden: Store, tmp_path: Path) -> None:
    trace = exported(golden, tmp_path / "t.json", run=RUN)
    assert trace["traceEvents"] == GOLDEN_EVENTS
    assert trace["megaKernelCycleTrace"] == golden_summary(detailed=False)
    assert trace["metadata"] == {"megaKernelCycleTrace": golden_summary(detailed=False)}
    assert trace["schemaVersion"] == 1
    assert trace["displayTimeUnit"] == "ns"


def test_golden_detailed_names(golden: Store, tmp_path: Path) -> None:
    trace = exported(golden, tmp_path / "t.json", detailed_task_names=True)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in complete] == DETAILED_NAMES
    assert [e["args"] for e in complete] == [e["args"] for e in GOLDEN_EVENTS if e["ph"] == "X"]
    assert trace["megaKernelCycleTrace"] == golden_summary(detailed=True)


def test_fallback_names_without_spec_or_graph(store: Store, tmp_path: Path) -> None:
    """The issue's worked example: nothing bound, no task graph, 50 MHz, anchor 100."""
    buffer = pack(
        1,
        1,
        16,
        16,
        [
            Slot(
                AIC,
                0,
                100,
                [
                    (110, 160, WAIT, 7, 0, 5),
                    (160, 400, 0x30001, 7, 0, 5),
                    (400, 405, TRIGGER, 7, 0, 5),
                    (405, 410, 0x20003, 8, 0, NO_OWNER),
                ],
            )
        ],
    )
    layout = BufferLayout(aic_slots=1, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
    run = RunInfo.begin(run_id=RUN)
    store.write_run(run)
    ingest_buffers(
        store, [buffer], layout, frequency_hz=50e6, run_id=RUN, launches=Launches(rank=3)
    )
    for detailed, names in (
        (False, ["WaitDependency", "TaskType_65537", "TriggerEvent", "TaskType_3"]),
        (
            True,
            [
                "Owner5_WaitDependency_task1",
                "Owner5_TaskType_65537_task1",
                "Owner5_TriggerEvent_task1",
                "TaskType_3_task1",
            ],
        ),
    ):
        trace = exported(store, tmp_path / "t.json", detailed_task_names=detailed)
        events = trace["traceEvents"]
        assert events[0]["args"] == {"name": "MegaKernel rank 3 device 0"}
        complete = [e for e in events if e["ph"] == "X"]
        assert [e["name"] for e in complete] == names
        first = complete[0]
        assert (first["pid"], first["tid"], first["ts"], first["dur"]) == (3, 1000, 0.2, 1.0)
        assert "owner_id" not in complete[3]["args"]
        assert complete[3]["args"]["task_type"] == 3
        assert not [e for e in events if e["ph"] in "sf"]
        summary = trace["megaKernelCycleTrace"]
        assert (summary["flowCount"], summary["invocationsWithoutTaskGraph"]) == (0, 1)
        assert summary["warnings"] == []


def test_dropped_records_are_a_warning(store: Store, tmp_path: Path) -> None:
    full = [(100 + 10 * i, 105 + 10 * i, GMM1, i, i, 0) for i in range(16)]
    with pytest.warns(DroppedRecordsWarning):
        fill(store, NAMED, [pack(1, 2, 16, 16, [Slot(AIC, 0, 100, full, dropped=3)])])
    trace = exported(store, tmp_path / "t.json")
    summary = trace["megaKernelCycleTrace"]
    assert (summary["recordCount"], summary["droppedRecordCount"]) == (16, 3)
    assert summary["invocations"][0]["droppedRecordCount"] == 3
    assert summary["warnings"] == [
        "device dropped 3 records in 1 invocation(s) (full slots; raise the capacity): "
        "the timeline misses their last tasks"
    ]
    assert cli.main(["export", "--store", str(store.root), "-o", str(tmp_path / "c.json")]) == 0


def test_gzip_holds_the_same_trace(golden: Store, tmp_path: Path) -> None:
    exported(golden, tmp_path / "t.json")
    plain = json.loads((tmp_path / "t.json").read_bytes())
    exported(golden, tmp_path / "t.json.gz")
    with gzip.open(tmp_path / "t.json.gz") as packed:
        assert json.load(packed) == plain


def test_selections(golden: Store, tmp_path: Path) -> None:
    fill(golden, NAMED, [golden_buffer()] * 2, run_id="later-run")
    trace = exported(golden, tmp_path / "t.json", run=RUN, where="stage = 'GMM1'")
    names = [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"]
    assert names == ["GMM1_WaitDependency", "GMM1", "GMM1_TriggerEvent"]
    assert trace["megaKernelCycleTrace"]["flowCount"] == 0
    latest = export_chrome_trace(golden, tmp_path / "t.json")
    assert latest.metadata["selection"] == "run later-run"
    assert latest.records == 12
    one = export_chrome_trace(golden, tmp_path / "t.json", run="later-run", invocation=1)
    assert [i["invocationId"] for i in one.metadata["invocations"]] == [1]
    by_step = export_chrome_trace(golden, tmp_path / "t.json", run="later-run", step=4, rank=3)
    assert by_step.records == 12


def test_several_runs_are_separate_processes(golden: Store, tmp_path: Path) -> None:
    fill(golden, NAMED, [golden_buffer()], run_id="later-run")
    trace = exported(golden, tmp_path / "t.json", run=[RUN, "later-run"])
    names = {
        e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {
        100003: "GoldenMoe rank 3 device 5 (golden)",
        200003: "GoldenMoe rank 3 device 5 (golden)",
    }
    summary = trace["megaKernelCycleTrace"]
    assert [p["runId"] for p in summary["processes"]] == [RUN, "later-run"]
    assert summary["anchorCycle"] == 100
    assert summary["rank"] == 3


def test_query_export(golden: Store, tmp_path: Path) -> None:
    query = "SELECT * FROM records_ns WHERE core = 'AIV' ORDER BY start_cycle"
    trace = exported(golden, tmp_path / "t.json", query=query)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in complete] == ["WaitDependency", "TaskType_SwiGLU", "TaskType_65541"]
    assert trace["megaKernelCycleTrace"]["selection"] == f"query {query!r}"
    plain = exported(golden, tmp_path / "t.json", query="SELECT * FROM records")
    assert plain["traceEvents"] == GOLDEN_EVENTS


def test_query_without_record_columns_names_them(golden: Store, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"lacks the record column\(s\) end_cycle, owner_id"):
        export_chrome_trace(
            golden,
            tmp_path / "t.json",
            query="SELECT * EXCLUDE (end_cycle, owner_id) FROM records",
        )
    with pytest.raises(QueryError, match="no_such_table"):
        export_chrome_trace(golden, tmp_path / "t.json", query="SELECT * FROM no_such_table")
    with pytest.raises(ExportError, match="either a query or"):
        export_chrome_trace(golden, tmp_path / "t.json", query="SELECT 1", step=1)
    assert list(tmp_path.iterdir()) == [golden.root]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"run": RUN, "where": "desc_id = 12345"}, "no records match .* where desc_id = 12345"),
        (
            {"run": RUN, "step": 4, "invocation": 0, "rank": 3, "where": "task_id = 1"},
            f"no records match run {RUN}, step 4, invocation 0, rank 3, where task_id = 1",
        ),
        ({"query": "SELECT * FROM records WHERE false"}, "no records match query"),
    ],
)
def test_empty_selection_fails_and_leaves_no_file(
    golden: Store, tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ExportError, match=message):
        export_chrome_trace(golden, tmp_path / "t.json", **options)
    assert list(tmp_path.iterdir()) == [golden.root]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"run": "no-such-run"}, "run no-such-run is not in the store at {uri}"),
        ({"run": [RUN, "nope"]}, "run nope is not in the store at {uri}"),
        (
            {"run": ["nope", RUN, "gone"], "step": 5},
            "runs nope, gone are not in the store at {uri}",
        ),
        ({"run": RUN, "step": 5}, f"run {RUN} has no step 5"),
        ({"step": 4, "invocation": 1}, f"run {RUN} has no invocation 1"),
        ({"run": [RUN], "rank": 0, "window": 2}, f"run {RUN} has no rank 0, window 2"),
    ],
)
def test_a_selection_naming_what_is_not_there_fails(
    golden: Store, tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    """Every run, step, invocation, rank and window a selection names is in the store (of
    the runs it names): one it does not hold is a SelectorError naming each such value,
    never a trace of the rest. Nothing is written."""
    with pytest.raises(SelectorError) as caught:
        export_chrome_trace(golden, tmp_path / "t.json", **options)
    assert str(caught.value) == message.format(uri=golden.uri)
    assert list(tmp_path.iterdir()) == [golden.root]


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        (RecordSelection(run=(RUN, "nope")), "run nope is not in the store at {uri}"),
        (RecordSelection(rank=9, step=4), f"run {RUN} has no rank 9"),
    ],
)
def test_analyze_refuses_a_selection_naming_what_is_not_there(
    golden: Store, selection: RecordSelection, message: str
) -> None:
    with pytest.raises(SelectorError) as caught:
        analyze(golden, selection)
    assert str(caught.value) == message.format(uri=golden.uri)


def test_cli_export_of_a_run_that_is_not_there(
    golden: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: ``--run r1 --run nope`` wrote r1's trace and ignored nope."""
    out = tmp_path / "t.json"
    argv = ["export", "--store", str(golden.root), "-o", str(out), "--run", RUN, "--run", "nope"]
    assert cli.main(argv) == 1
    assert (
        capsys.readouterr().err == f"mcprof: error: run nope is not in the store at {golden.uri}\n"
    )
    assert not out.exists()


def test_records_of_no_invocation_fail(golden: Store, tmp_path: Path) -> None:
    """Rows of a withdrawn write, read from the raw files, have no invocation to time them."""
    write_ids = golden.sql("SELECT write_id FROM invocations")["write_id"].to_pylist()
    golden.discard_writes(RUN, 3, write_ids)
    with pytest.raises(ExportError, match=f"6 selected record.s. belong to no invocation .*{RUN}"):
        export_chrome_trace(golden, tmp_path / "t.json", query="SELECT * FROM raw_records")
    assert list(tmp_path.iterdir()) == [golden.root]


def test_empty_store_fails(store: Store, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="holds no run"):
        export_chrome_trace(store, tmp_path / "t.json")


@pytest.mark.parametrize("frequency", [0.0, -50e6, float("nan")])
def test_bad_frequency_fails(store: Store, tmp_path: Path, frequency: float) -> None:
    fill(store, NAMED, [golden_buffer()])
    invocations = store.sql("SELECT * EXCLUDE (run_id) FROM invocations")
    invocations = invocations.set_column(
        invocations.schema.get_field_index("frequency_hz"),
        "frequency_hz",
        pa.array([frequency]),
    )
    store.discard_writes(RUN, 3, invocations["write_id"].to_pylist())
    store.write_step(
        RUN,
        4,
        invocations=invocations.drop_columns(["write_id"]),
        cores=store.sql("SELECT * EXCLUDE (run_id, step, write_id) FROM cores"),
        records=store.sql("SELECT * EXCLUDE (run_id, step, write_id) FROM raw_records"),
    )
    with pytest.raises(ExportError, match=f"invocation 0 of run {RUN} rank 3 has cycle frequency"):
        export_chrome_trace(store, tmp_path / "t.json")
    assert list(tmp_path.iterdir()) == [store.root]


def test_unwritable_path_fails_and_leaves_nothing(golden: Store, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"cannot write the trace to .*No such file"):
        export_chrome_trace(golden, tmp_path / "missing" / "t.json")
    assert list(tmp_path.iterdir()) == [golden.root]


def test_failed_write_removes_the_partial_file(
    golden: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure half-way through rendering leaves neither the trace nor its temporary file,
    and an older trace at the path stays as it was."""
    target = tmp_path / "t.json"
    target.write_text("previous")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("multicore_profiler.export.json_rows.os.pwrite", broken)
    with pytest.raises(ExportError, match="No space left on device"):
        export_chrome_trace(golden, target)
    assert target.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == [golden.root.name, "t.json"]


def test_overlapping_records_move_to_a_sub_track(store: Store, tmp_path: Path) -> None:
    """Clock granularity: the second record starts before the first ends."""
    layout = BufferLayout(aic_slots=3, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
    buffer = pack(3, 1, 16, 16, [Slot(AIC, 2, 100, [(100, 200, GMM1, 1, 0, 0),
                                                    (150, 250, GMM1, 2, 1, 0),
                                                    (250, 300, GMM1, 3, 2, 0)])])  # fmt: skip
    store.write_run(RunInfo.begin(run_id=RUN))
    ingest_buffers(store, [buffer], layout, frequency_hz=50e6, run_id=RUN)
    trace = exported(store, tmp_path / "t.json")
    tracks = [(e["tid"], e["args"]["task_id"]) for e in trace["traceEvents"] if e["ph"] == "X"]
    assert tracks == [(1002, 1), (11002, 2), (1002, 3)]
    threads = {
        e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"
    }
    assert threads == {1002: "AIC/2", 11002: "AIC/2 overlap 1"}
    summary = trace["megaKernelCycleTrace"]
    assert summary["subTracks"] == [{"pid": 0, "tid": 11002, "parentTid": 1002, "records": 1}]
    assert summary["warnings"] == [
        "1 records overlapped an earlier record of their core (clock granularity, or spans "
        "another profiler records concurrently on one core: warps, units) and were moved to 1 "
        "sub-track(s)"
    ]


def test_cli_export(golden: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.json"
    assert cli.main(["export", "--store", str(golden.root), "-o", str(out), "--detailed"]) == 0
    assert capsys.readouterr().out == (
        f"{out}: 14 events (6 records of 1 invocation(s), 1 dependency arrows) from run {RUN}\n"
    )
    trace = load_trace(out)
    check_trace(trace)
    assert [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"] == DETAILED_NAMES
    query = "SELECT * FROM records_ns WHERE task_id = 9"
    assert cli.main(["export", "--store", str(golden.root), "-o", str(out), "--sql", query]) == 0
    assert "1 records of 1 invocation(s)" in capsys.readouterr().out
    assert cli.main(["export", "--store", str(golden.root), "-o", str(out), "--step", "9"]) == 1
    assert capsys.readouterr().err == f"mcprof: error: run {RUN} has no step 9\n"


def test_a_record_selected_twice_is_shown_once(
    golden: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The golden store's 6 records, task 8's wait and SwiGLU selected twice: 6 slices,
    each once, 1 arrow, 6 records of the invocation, and a warning that says so."""
    query = "SELECT * FROM records UNION ALL SELECT * FROM records WHERE task_id = 8"
    trace = exported(golden, tmp_path / "t.json", query=query)
    assert trace["traceEvents"] == GOLDEN_EVENTS
    summary = trace["megaKernelCycleTrace"]
    assert (summary["recordCount"], summary["invocations"][0]["recordCount"]) == (6, 6)
    assert summary["flowCount"] == 1
    assert summary["warnings"] == [
        f"2 row(s) of query {query!r} repeat a record it selects already: each record is shown once"
    ]
    out = tmp_path / "cli.json"
    argv = ["export", "--store", str(golden.root), "-o", str(out), "--sql", query]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == (
        f"{out}: 14 events (6 records of 1 invocation(s), 1 dependency arrows) from query "
        f"{query!r}\n"
    )
    assert captured.err == (
        f"mcprof: warning: 2 row(s) of query {query!r} repeat a record it selects already: "
        "each record is shown once\n"
    )


def test_an_arrow_that_would_end_before_it_begins_is_left_out(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Task 8's wait ends (cycle 395, 5.9 us) before task 7's trigger starts (400, 6.0 us):
    its f would come before its s (both viewers drop it, and check_trace refuses it); the
    trace leaves the arrow out, still counts it in flowCount, and warns, as the Perfetto
    trace does. Task 9's wait, released by the same trigger after it ends, keeps its arrow."""
    buffer = pack(1, 2, 16, 16, [
        Slot(AIC, 0, 100, [(110, 160, WAIT, 7, 2, 5), (160, 400, GMM1, 7, 2, 5),
                           (400, 405, TRIGGER, 7, 2, 5)]),
        Slot(AIV, 1, 120, [(130, 395, WAIT, 8, 0, 5), (395, 410, WAIT, 9, 0, 5)]),
    ])  # fmt: skip
    fill(store, NAMED, [buffer])
    tasks = golden_tasks().to_pylist()
    tasks[2] |= {"wait_event": 0, "wait_count": 1}
    store.write_tasks(RUN, pa.Table.from_pylist(tasks, golden_tasks().schema))
    trace = exported(store, tmp_path / "t.json")
    flows = [e for e in trace["traceEvents"] if e["ph"] in "sf"]
    assert flows == [FLOW | {"ph": "s", "tid": 1000}, FLOW | {"ph": "f", "bp": "e", "tid": 2001}]
    summary = trace["megaKernelCycleTrace"]
    assert summary["flowCount"] == 2
    warning = (
        "1 flow(s) end before they begin (a wait that ended before its trigger started): "
        "the JSON trace cannot draw them"
    )
    assert summary["warnings"] == [warning]
    out = tmp_path / "cli.json"
    assert cli.main(["export", "--store", str(store.root), "-o", str(out)]) == 0
    assert capsys.readouterr().err == f"mcprof: warning: {warning}\n"


def test_session_exports_its_last_window(tmp_path: Path) -> None:
    """The reference MegaKernel under a schedule of two windows: the session's export holds
    the second window's launches only, with an arrow for every wait."""
    generator = torch.Generator().manual_seed(0)
    router, w1, w2 = make_moe_weights(4, 32, 64, generator=generator)
    x_in = torch.randn(64, 32, generator=generator)
    traces = []
    with (
        ReferenceMoeKernel(w1, w2, token_tile=16) as kernel,
        mega_kernel_profile(
            store=tmp_path / "store",
            schedule=schedule(wait=0, warmup=0, active=2, repeat=2),
            detailed_task_names=True,
            on_trace_ready=lambda p: traces.append(p.export_chrome_trace(tmp_path / "w.json")),
        ) as prof,
    ):
        with pytest.raises(SessionError, match="no capture window has ended"):
            prof.export_chrome_trace(tmp_path / "w.json")
        for _ in range(4):
            kernel(x_in, *route(x_in, router, 2))
            prof.step()
    assert [t.metadata["windowIndex"] for t in traces] == [0, 1]
    last = prof.export_chrome_trace(tmp_path / "last.json", detailed_task_names=False)
    assert [i["step"] for i in last.metadata["invocations"]] == [2, 3]
    trace = load_trace(tmp_path / "last.json")
    check_trace(trace)
    stored = prof.store.sql(
        "SELECT count(*) AS n, count(*) FILTER (WHERE phase = 'wait') AS waits "
        "FROM records_ns WHERE run_id = $1 AND window_id = 1",
        [prof.run_id],
    ).to_pylist()[0]
    assert last.records == stored["n"]
    assert last.flows == stored["waits"]
    detailed = {e["name"] for e in load_trace(tmp_path / "w.json")["traceEvents"] if e["ph"] == "X"}
    pattern = re.compile(
        r"(Expert\d+_(Dispatch|GMM1|SwiGLU|GMM2)|Combine)(_WaitDependency|_TriggerEvent)?_task\d+"
    )
    assert [n for n in detailed if not pattern.fullmatch(n)] == []
    assert {"Expert0_GMM1_task1", "Combine_WaitDependency_task1"} <= detailed
    flows = [e for e in trace["traceEvents"] if e["ph"] in "sf"]
    assert len(flows) == 2 * last.flows
    assert {e["ph"] for e in flows} == {"s", "f"}


def test_many_records_across_chunks(store: Store, tmp_path: Path) -> None:
    """More rows than one rendering chunk, on several threads: the same events as a plain
    per-event rendering in Python."""
    rng = np.random.default_rng(1)
    records = []
    cycle = 1000
    for task in range(12_000):
        length = int(rng.integers(0, 40))
        records.append((cycle, cycle + length, GMM1 if task % 3 else 0x20007, task, task, 1))
        cycle += length
    slots = [Slot(AIC, 0, 1000, records[:6000]), Slot(AIV, 0, 900, records[6000:])]
    layout = BufferLayout(aic_slots=1, aiv_slots=1, aic_capacity=256, aiv_capacity=256)
    store.write_run(RunInfo.begin(run_id=RUN))
    per_buffer = []
    for first in range(0, 6000, 256):
        part = [
            Slot(s.core_type, s.block_id, s.entry_cycle, s.records[first : first + 256])
            for s in slots
        ]
        per_buffer.append(pack(1, 1, 256, 256, part))
    ingest_buffers(store, per_buffer, layout, frequency_hz=1.5e9, run_id=RUN, kernel=NAMED)
    trace = exported(store, tmp_path / "t.json")
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 12_000
    by_task = {e["args"]["task_id"]: e for e in complete}
    anchor = 900
    for start, end, desc, task, index, owner in records[::97]:
        event = by_task[task]
        start_ns = round((start - anchor) * (1e9 / 1.5e9))
        end_ns = round((end - anchor) * (1e9 / 1.5e9))
        assert (event["ts"], event["dur"]) == (start_ns / 1000, (end_ns - start_ns) / 1000)
        assert event["name"] == ("GMM1" if desc == GMM1 else "TaskType_7")
        assert (event["args"]["desc_id"], event["args"]["owner_id"]) == (desc, owner)
        assert event["args"]["stage_task_index"] == index


def test_errors_are_profile_errors() -> None:
    assert issubclass(ExportError, ProfileError)
