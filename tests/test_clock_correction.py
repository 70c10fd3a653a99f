"""``--clock-correction`` and analyze's refusal of contradicted clocks, end to end.

The run (``skewed_clocks``): invocation 0's AIV/0 counter lags AIC/0's by 30 cycles, so
its wait is recorded ending 20 cycles (400 ns) before the trigger that released it ended;
invocation 1 is on one clock. The correction moves AIV/0 of invocation 0 by +20 cycles
(400 ns), within [400, 800] ns of AIC/0, worked out by hand in ``skewed_clocks``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace
from skewed_clocks import KERNEL, RUN, write_skewed_run
from test_fuse import write_kineto

from multicore_profiler import (
    RecordSelection,
    analyze,
    export_chrome_trace,
    export_perfetto_trace,
    merge_chrome_traces,
    open_store,
)
from multicore_profiler.cli import main
from multicore_profiler.errors import ClockError, FuseError
from multicore_profiler.export.analysis_text import (
    AnalysisReport,
    analysis_csv,
    analysis_json,
    analysis_markdown,
    analysis_table,
)
from multicore_profiler.storage.store import Store

CONTRADICTION_NOTE = (
    "1 causal edge(s) of their records contradict causality beyond the clock tolerance of {} "
    "ns (a wait recorded as ending before the trigger that released it ended, or a task "
    "starting before a predecessor ended), by up to 20 cycles (400.0 ns): the cores' clocks "
    "disagree, so these invocations get no critical path and no replay (no static bound, no "
    "what-if prediction); run mcprof check --clocks to see which cores, or analyze with "
    "--clock-correction to correct the clocks from the records' causality first"
)
MOVED = {
    "run_id": RUN,
    "rank": 0,
    "invocation_id": 0,
    "core": "AIV",
    "block_id": 0,
    "offset_cycles": 20,
    "offset_ns": 400.0,
    "low_ns": 400.0,
    "high_ns": 800.0,
}
"""The one core the correction moves (``clock_correction.APPLIED_COLUMNS``)."""
CLOCK_CORRECTION = {
    "applied": True,
    "cores": [
        {
            "runId": RUN,
            "rank": 0,
            "invocationId": 0,
            "core": "AIV",
            "blockId": 0,
            "offsetCycles": 20,
            "offsetNs": 400.0,
            "lowNs": 400.0,
            "highNs": 800.0,
        }
    ],
}
"""``megaKernelCycleTrace.clockCorrection`` and the fused report's."""
CORRECTED_PATH = [
    ("front_gap", "AIC", 200),
    ("compute", "AIC", 1000),
    ("trigger", "AIC", 200),
    ("data_wait", "AIV", 0),
    ("compute", "AIV", 1000),
    ("trigger", "AIV", 200),
    ("data_wait", "AIC", 400),
    ("compute", "AIC", 1200),
]
"""Invocation 0's critical path once corrected, by hand (20 ns a cycle): AIC/0 starts 10
cycles after AIV/0's corrected wait (90); GMM1 100..150, trigger ..160; AIV/0's wait ends
at 160 (corrected 140 + 20), SwiGLU 160..210, trigger ..220; AIC/0 waits to 240, GMM1
240..300. 4200 ns, the makespan 90..300."""
CLEAN_PATH = [
    ("compute", "AIC", 1000),
    ("trigger", "AIC", 200),
    ("data_wait", "AIV", 200),
    ("compute", "AIV", 1000),
    ("trigger", "AIV", 200),
    ("data_wait", "AIC", 200),
    ("compute", "AIC", 1200),
]
"""Invocation 1's critical path (one clock): 4000 ns, its makespan 100..300."""


@pytest.fixture
def skewed(store: Store) -> Store:
    return write_skewed_run(store)


def path_of(table: Any, invocation: int) -> list[tuple[str, str, int]]:
    return [
        (row["kind"], row["core"], row["dur_ns"])
        for row in table.to_pylist()
        if row["invocation_id"] == invocation
    ]


def invocation_rows(analysis: Any) -> list[tuple]:
    return [
        (r["invocation_id"], r["makespan_ns"], r["critical_path_ns"], r["path_tiles"])
        for r in analysis.invocations.to_pylist()
    ]


def test_contradicted_clocks_get_no_critical_path_and_say_why(skewed: Store) -> None:
    analysis = analyze(skewed)
    assert invocation_rows(analysis) == [(0, 4600, None, None), (1, 4000, 4000, True)]
    assert [r["static_bound_ns"] for r in analysis.invocations.to_pylist()] == [None, 3600]
    assert analysis.limits.to_pylist() == [
        {
            "run_id": RUN,
            "kernel_name": KERNEL,
            "producer": None,
            "reason": "clock_contradiction",
            "invocations": 1,
            "clock_spread_ns": None,
            "note": CONTRADICTION_NOTE.format(0),
        }
    ]
    assert path_of(analysis.critical_path, 0) == []
    assert path_of(analysis.critical_path, 1) == CLEAN_PATH
    assert analysis.clock_correction is None
    assert "clock_correction" not in analysis.tables()
    assert analysis.what_if(["TaskType_SwiGLU*0.5"])["invocation_id"].to_pylist() == [1]


def test_a_tolerance_as_large_as_the_violation_lets_it_through(skewed: Store) -> None:
    skewed.configure("clock_tolerance", 399)
    assert analyze(skewed).limits["note"].to_pylist() == [CONTRADICTION_NOTE.format(399)]
    skewed.configure("clock_tolerance", 400)
    analysis = analyze(skewed)
    assert analysis.limits.num_rows == 0
    # The records as recorded: the walk cannot cross AIV/0's wait to a trigger that ended
    # after it, so the path (tiling the skewed makespan, 70..300) begins with the wait.
    assert invocation_rows(analysis) == [(0, 4600, 4600, True), (1, 4000, 4000, True)]
    assert path_of(analysis.critical_path, 0) == [
        ("wait", "AIV", 1400),
        ("compute", "AIV", 1000),
        ("trigger", "AIV", 200),
        ("data_wait", "AIC", 800),
        ("compute", "AIC", 1200),
    ]


def test_the_correction_gives_the_critical_path_that_tiles_the_makespan(skewed: Store) -> None:
    analysis = analyze(skewed, clock_correction=True)
    assert invocation_rows(analysis) == [(0, 4200, 4200, True), (1, 4000, 4000, True)]
    assert [r["static_bound_ns"] for r in analysis.invocations.to_pylist()] == [3600, 3600]
    assert analysis.limits.num_rows == 0
    assert path_of(analysis.critical_path, 0) == CORRECTED_PATH
    assert path_of(analysis.critical_path, 1) == CLEAN_PATH
    assert analysis.clock_correction is not None
    assert analysis.clock_correction.to_pylist() == [MOVED]
    assert analysis.tables()["clock_correction"].to_pylist() == [MOVED]
    # Only the command read corrected records: the store's are as recorded again.
    assert skewed.setting("clock_correction").num_rows == 0
    assert analyze(skewed).limits["reason"].to_pylist() == ["clock_contradiction"]


def test_the_correction_keeps_to_the_selected_invocations(skewed: Store) -> None:
    clean = analyze(skewed, RecordSelection(invocation=1), clock_correction=True)
    assert clean.clock_correction is not None
    assert clean.clock_correction.num_rows == 0
    text = analysis_table(AnalysisReport(clean, (), None))
    assert (
        "NOTE: clock correction applied: no causal edge was contradicted, so no core's clock "
        "was moved\n"
    ) in text


def test_the_analysis_text_and_json_say_the_correction(skewed: Store) -> None:
    corrected = AnalysisReport(analyze(skewed, clock_correction=True), (), None)
    text = analysis_table(corrected)
    assert text.splitlines()[:4] == [
        f"mcprof analyze: run {RUN}: 2 invocation(s) of {KERNEL}",
        "critical path: tiles the makespan of every invocation (2 of 2)",
        "replay fidelity: max error 0.00% over 2 invocation(s) (limit 5%)",
        "NOTE: clock correction applied: 1 core(s) of 1 invocation(s) moved by the offsets the "
        "records' causality asks for (see the clock correction table); every time above reads "
        "the corrected cycles",
    ]
    assert text.endswith(
        "clock correction (offset added to each moved core's cycles; low/high: the interval "
        "causality allows):\n"
        "run_id      rank  invocation_id  core  block_id  offset_cycles  offset_us  low_us  "
        "high_us\n"
        "----------  ----  -------------  ----  --------  -------------  ---------  ------  "
        "-------\n"
        "skewed-run     0              0  AIV          0             20      0.400   0.400    "
        "0.800\n"
    )
    assert analysis_csv(corrected).endswith(
        "# clock_correction\n"
        "run_id,rank,invocation_id,core,block_id,offset_cycles,offset_ns,low_ns,high_ns\n"
        "skewed-run,0,0,AIV,0,20,400.0,400.0,800.0\n"
    )
    markdown = analysis_markdown(corrected)
    assert "- NOTE: clock correction applied: 1 core(s) of 1 invocation(s) moved" in markdown
    assert markdown.endswith("| skewed-run | 0 | 0 | AIV | 0 | 20 | 0.400 | 0.400 | 0.800 |\n")
    document = orjson.loads(analysis_json(corrected))
    assert document["tables"]["clock_correction"] == [MOVED]
    assert document["summary"]["clock_correction"] == [MOVED]
    assert document["tables"]["limits"] == []

    plain = AnalysisReport(analyze(skewed), (), None)
    text = analysis_table(plain)
    assert "clock correction" not in text
    assert text.splitlines()[3] == (
        f"NOTE: run {RUN}, {KERNEL} (1 invocation(s)): {CONTRADICTION_NOTE.format(0)}"
    )
    document = orjson.loads(analysis_json(plain))
    assert "clock_correction" not in document["tables"]
    assert "clock_correction" not in document["summary"]
    assert "clock_correction" not in analysis_csv(plain)
    assert "clock correction" not in analysis_markdown(plain)


def aiv_slices(trace: dict[str, Any]) -> list[tuple[float, float, str]]:
    """The AIV/0 slices of a Chrome trace: ts, dur (us) and name."""
    return [
        (e["ts"], e["dur"], e["name"])
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e["tid"] == 2000
    ]


def test_the_chrome_trace_carries_the_offsets(skewed: Store, tmp_path: Path) -> None:
    corrected = export_chrome_trace(skewed, tmp_path / "c.json", clock_correction=True)
    assert corrected.metadata["clockCorrection"] == CLOCK_CORRECTION
    trace = json.loads((tmp_path / "c.json").read_text())
    assert trace["metadata"]["megaKernelCycleTrace"]["clockCorrection"] == CLOCK_CORRECTION
    # The anchor is AIV/0's corrected entry (60 + 20); its wait starts 10 cycles after it.
    assert aiv_slices(trace)[:3] == [
        (0.2, 1.4, "WaitDependency"),
        (1.6, 1.0, "TaskType_SwiGLU"),
        (2.6, 0.2, "TriggerEvent"),
    ]
    plain = export_chrome_trace(skewed, tmp_path / "p.json")
    assert "clockCorrection" not in plain.metadata
    trace = json.loads((tmp_path / "p.json").read_text())
    assert "clockCorrection" not in trace["metadata"]["megaKernelCycleTrace"]
    assert aiv_slices(trace)[:3] == [
        (0.2, 1.4, "WaitDependency"),
        (1.6, 1.0, "TaskType_SwiGLU"),
        (2.6, 0.2, "TriggerEvent"),
    ]
    assert skewed.setting("clock_correction").num_rows == 0


def process_description(path: Path) -> str:
    """The description of the Perfetto trace's one process track, decoded with Perfetto's
    own protos."""
    trace = Trace.FromString(path.read_bytes())
    (description,) = [
        p.track_descriptor.description
        for p in trace.packet
        if p.HasField("track_descriptor") and p.track_descriptor.HasField("description")
    ]
    return description


def test_the_perfetto_trace_says_the_offsets(skewed: Store, tmp_path: Path) -> None:
    corrected = export_perfetto_trace(skewed, tmp_path / "c.pftrace", clock_correction=True)
    assert corrected.metadata["clockCorrection"] == CLOCK_CORRECTION
    sidecar = json.loads((tmp_path / "c.pftrace.meta.json").read_text())
    assert sidecar["clockCorrection"] == CLOCK_CORRECTION
    assert process_description(tmp_path / "c.pftrace") == (
        f"MegaKernel records of run {RUN} rank 0: 2 invocation(s), 14 records, cycles at 50 MHz "
        f"from anchor cycle 80. Selection: run {RUN}. Clock correction applied (offsets added "
        "to the recorded cycles): invocation 0 AIV/0 +20 cycles (+400 ns). "
        "Metadata: c.pftrace.meta.json."
    )
    export_perfetto_trace(skewed, tmp_path / "p.pftrace")
    assert "clockCorrection" not in json.loads((tmp_path / "p.pftrace.meta.json").read_text())
    assert process_description(tmp_path / "p.pftrace") == (
        f"MegaKernel records of run {RUN} rank 0: 2 invocation(s), 14 records, cycles at 50 MHz "
        f"from anchor cycle 60. Selection: run {RUN}. Metadata: p.pftrace.meta.json."
    )


def outer_trace(path: Path) -> Path:
    """A kineto trace with two device kernels of the skewed kernel, long enough for each
    invocation."""
    kernels = [("SkewedMoe_kernel", "10.000", "6.000"), ("SkewedMoe_kernel", "40.000", "6.000")]
    write_kineto(path, kernels, base=1_683_564_901_540_885)
    return path


def test_the_fused_report_says_the_offsets(skewed: Store, tmp_path: Path) -> None:
    outer = outer_trace(tmp_path / "k.json")
    merged = merge_chrome_traces(outer, skewed, tmp_path / "c.json", clock_correction=True)
    assert merged.report["clockCorrection"] == CLOCK_CORRECTION
    fused = json.loads((tmp_path / "c.json").read_text())
    assert fused["megaKernelTraceMerge"]["clockCorrection"] == CLOCK_CORRECTION
    plain = merge_chrome_traces(outer, skewed, tmp_path / "p.json")
    assert "clockCorrection" not in plain.report
    assert (
        "clockCorrection"
        not in json.loads((tmp_path / "p.json").read_text())["megaKernelTraceMerge"]
    )
    # A trace file exported with the correction carries it into the fusion.
    export_chrome_trace(skewed, tmp_path / "mk.json", clock_correction=True)
    from_file = merge_chrome_traces(outer, tmp_path / "mk.json", tmp_path / "f.json")
    assert from_file.report["clockCorrection"] == CLOCK_CORRECTION
    with pytest.raises(FuseError, match="the clock correction reads a store's records"):
        merge_chrome_traces(outer, tmp_path / "mk.json", tmp_path / "g.json", clock_correction=True)
    assert not (tmp_path / "g.json").exists()


def test_contradictions_around_a_cycle_cannot_be_corrected(store: Store, tmp_path: Path) -> None:
    # AIC/0's wait ends at 190 on its clock, 10 cycles before AIV/0's trigger (200 on
    # AIV/0's lagging clock): AIC -> AIV needs AIV moved 20 on, AIV -> AIC forbids more than
    # -10, around a cycle.
    write_skewed_run(store, aic_wait_end=190)
    with pytest.raises(ClockError, match=r"contradict causality around a cycle"):
        analyze(store, clock_correction=True)
    with pytest.raises(ClockError, match=r"contradict causality around a cycle"):
        export_chrome_trace(store, tmp_path / "c.json", clock_correction=True)
    assert not (tmp_path / "c.json").exists()
    assert store.setting("clock_correction").num_rows == 0


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_commands_take_the_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with open_store(tmp_path / "store") as store:
        write_skewed_run(store)
    given = ("--store", str(tmp_path / "store"))
    code, out, err = cli(capsys, "analyze", *given, "--format", "json")
    assert (code, err) == (0, "")
    assert [r["reason"] for r in json.loads(out)["tables"]["limits"]] == ["clock_contradiction"]
    assert "clock_correction" not in json.loads(out)["tables"]

    code, out, err = cli(capsys, "analyze", *given, "--format", "json", "--clock-correction")
    assert (code, err) == (0, "")
    document = json.loads(out)
    assert document["tables"]["clock_correction"] == [MOVED]
    assert document["tables"]["limits"] == []
    assert [r["critical_path_ns"] for r in document["tables"]["invocations"]] == [4200, 4000]

    code, out, err = cli(capsys, "analyze", *given, "--format", "json", "--clock-tolerance", "400")
    assert (code, err) == (0, "")
    assert json.loads(out)["tables"]["limits"] == []
    with pytest.raises(SystemExit) as exited:
        main(["analyze", *given, "--clock-tolerance", "-1"])
    assert exited.value.code == 2
    assert "argument --clock-tolerance: a clock tolerance in ns -1 is out of range" in (
        capsys.readouterr().err
    )

    code, out, err = cli(
        capsys, "export", *given, "-o", str(tmp_path / "c.json"), "--clock-correction"
    )
    assert (code, err) == (0, "")
    assert out.splitlines()[1] == (
        "clock correction applied: 1 core(s) of 1 invocation(s) moved; the offsets are in "
        "megaKernelCycleTrace.clockCorrection"
    )
    trace = json.loads((tmp_path / "c.json").read_text())
    assert trace["metadata"]["megaKernelCycleTrace"]["clockCorrection"] == CLOCK_CORRECTION

    outer = outer_trace(tmp_path / "k.json")
    code, out, err = cli(
        capsys, "fuse", str(outer), "--run", RUN, *given, "-o", str(tmp_path / "f.json"),
        "--clock-correction",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert out.splitlines()[1] == (
        "clock correction applied: 1 core(s) of 1 invocation(s) moved; the offsets are in "
        "megaKernelTraceMerge.clockCorrection"
    )
    fused = json.loads((tmp_path / "f.json").read_text())
    assert fused["megaKernelTraceMerge"]["clockCorrection"] == CLOCK_CORRECTION


def test_the_cli_says_why_clocks_cannot_be_corrected(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with open_store(tmp_path / "store") as store:
        write_skewed_run(store, aic_wait_end=190)
    code, out, err = cli(
        capsys, "analyze", "--store", str(tmp_path / "store"), "--clock-correction"
    )
    assert (code, out) == (1, "")
    assert err == (
        "mcprof: error: the records of 1 invocation(s) contradict causality around a cycle of "
        "edges that no per-core clock offset can satisfy (so no offsets are given): run "
        f"{RUN} rank 0 invocation 0: AIC/0 -> AIV/0 (release: task 2's wait recorded 20 "
        "cycles before task 1's end), AIV/0 -> AIC/0 (release: task 3's wait recorded 10 "
        "cycles before task 2's end)\n"
    )
