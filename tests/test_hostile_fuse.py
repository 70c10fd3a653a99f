"""Hostile inputs to offline fusion: misaligned runs stay valid traces (overlapping invocations
go to lanes), pids and arguments out of range are refused before anything is written, and a
refused fusion leaves no output and the store as it was."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from exact_json import events_of, load
from golden import AIC, AIV, GMM1, TRIGGER, WAIT, Slot, pack
from hostile import refused, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuse import (
    EPOCH_US,
    KERNEL,
    LAYOUT,
    graph,
    launch,
    mega_kernel,
    name_processes,
    write_kineto,
)
from trace_checker import check_trace, load_trace

from multicore_profiler.errors import ArgumentError, FuseError, TraceFormatError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.fuse.align import invocation_lanes
from multicore_profiler.fuse.merge import merge_chrome_traces
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

SCALES = (3, 1, 1, 1, 1)
"""Invocations 10 to 14 span 18, 6, 6, 6 and 6 us (300 x scale cycles at 50 MHz)."""
STARTS_US = ("10.000", "12.000", "20.000", "22.000", "30.000")
"""Their outer kernels start here (1 us long each): aligned, invocation 10 runs from 10 to 28,
11 inside it (12 to 18), 12 from 20 to 26 over 10, 13 from 22 to 28 over 10 and 12, and 14
from 30, after all of them."""


def misaligned_run(store: Store) -> None:
    """Run ``mk``: invocations 10 to 14 of ``KERNEL`` on rank 0 with the spans of SCALES, and
    their task graph (an arrow from AIC/0's trigger to AIV/1's wait in each)."""
    run = RunInfo.begin(run_id="mk")
    store.write_run(run)
    ingest_buffers(
        store,
        [launch(100_000 * i, scale) for i, scale in enumerate(SCALES)],
        LAYOUT,
        frequency_hz=50e6,
        run_id="mk",
        kernel=KernelInfo(kernel_name=KERNEL, stage_names={GMM1: "GMM1"}, config_id="graph"),
        launches=Launches(rank=0, device=0, step=0, first_invocation_id=10),
    )
    store.write_tasks("mk", graph(0, KERNEL))
    store.write_run(run.finish())


def short_kernels(path: Path, pid: int = 0, starts: tuple[str, ...] = STARTS_US) -> None:
    """A kineto trace whose 1 us ``KERNEL`` kernels (on ``pid``, stream 7) start at
    ``starts``, its processes named (as Perfetto wants them)."""
    write_kineto(path, [(KERNEL, start, "1.000") for start in starts], base=EPOCH_US)
    name_processes(path)
    path.write_text(path.read_text().replace('"pid": 0,', f'"pid": {pid},'))


def test_overlapping_invocations_go_to_lanes_and_the_trace_stays_valid(
    store: Store, tmp_path: Path
) -> None:
    misaligned_run(store)
    short_kernels(tmp_path / "k.json")
    merged = merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk")
    check_trace(load_trace(tmp_path / "f.json"))  # the whole fused trace, outer events too

    report = merged.report
    names = {
        8: "HyperMegaMoe/AIC/0",
        9: "HyperMegaMoe/AIC/0 lane 1",
        10: "HyperMegaMoe/AIC/0 lane 2",
        11: "HyperMegaMoe/AIV/1",
        12: "HyperMegaMoe/AIV/1 lane 1",
        13: "HyperMegaMoe/AIV/1 lane 2",
    }
    assert report["threads"] == [{"pid": 0, "tid": t, "name": n} for t, n in names.items()]
    added = events_of(load(tmp_path / "f.json"))[len(events_of(load(tmp_path / "k.json"))) :]
    threads = {e["tid"]: e["args"]["name"] for e in added if e.get("name") == "thread_name"}
    assert threads == names
    on = {}
    for event in added:
        if event["ph"] == "X":
            on.setdefault(event["args"]["invocation_id"], set()).add(event["tid"])
    assert on == {10: {8, 11}, 11: {9, 12}, 12: {9, 12}, 13: {10, 13}, 14: {8, 11}}
    first: dict[int, Decimal] = {}
    for event in added:
        if event["ph"] == "X":
            invocation = event["args"]["invocation_id"]
            first[invocation] = min(first.get(invocation, event["ts"]), event["ts"])
    assert first == {10 + i: Decimal(EPOCH_US) + Decimal(s) for i, s in enumerate(STARTS_US)}
    # The arrows stay on their invocation's lane, from AIC's trigger to AIV's wait; by time:
    # invocations 11 (17.8 us), 12 (25.8), 10 (27.4), 13 (27.8) and 14 (35.8).
    arrows = sorted((e["ts"], e["ph"], e["tid"]) for e in added if e["ph"] in "sf")
    assert [(ph, tid) for _, ph, tid in arrows] == [
        (ph, tid)
        for aic, aiv in ((9, 12), (9, 12), (8, 11), (10, 13), (8, 11))
        for ph, tid in (("f", aiv), ("s", aic))
    ]

    assert report["overlaps"] == [
        {"invocationId": 11, "kernelName": KERNEL, "overlapsInvocations": [10], "lane": 1,
         "pid": 0, "tids": [9, 12]},
        {"invocationId": 12, "kernelName": KERNEL, "overlapsInvocations": [10], "lane": 1,
         "pid": 0, "tids": [9, 12]},
        {"invocationId": 13, "kernelName": KERNEL, "overlapsInvocations": [10, 12], "lane": 2,
         "pid": 0, "tids": [10, 13]},
    ]  # fmt: skip
    assert report["counts"]["addedThreads"] == 6
    assert report["warnings"] == [
        "5 invocation(s) last longer than their outer kernel (first: invocation 10, by 17.0 us): "
        "the kernel may not be the one that ran them, or the cycle frequency is off",
        "3 invocation(s) overlap an earlier invocation of their kernel once aligned (first: "
        "invocation 11, over invocation(s) 10): they are on 4 lane thread(s) of their own "
        "('... lane <n>'), listed under overlaps",
    ]
    assert json.loads((tmp_path / "f.json").read_text())["megaKernelTraceMerge"] == report


def test_invocations_that_follow_one_another_stay_on_their_threads(
    store: Store, tmp_path: Path
) -> None:
    mega_kernel(store)  # three 6 us invocations, into kernels 6 us apart
    short_kernels(tmp_path / "k.json", starts=("10.000", "16.000", "22.000"))
    merged = merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk")
    check_trace(load_trace(tmp_path / "f.json"))
    assert merged.report["overlaps"] == []
    assert [t["name"] for t in merged.report["threads"]] == [
        "HyperMegaMoe/AIC/0",
        "HyperMegaMoe/AIV/1",
    ]


def test_invocation_lanes_never_nest_and_reuse_the_lowest_free_lane() -> None:
    group = np.array([0, 0, 0, 0, 0, 0, 1, 1])
    start = np.array([10, 12, 18, 20, 22, 30, 0, 5])
    end = np.array([28, 18, 18, 26, 28, 36, 10, 6])
    # The second nests in the first yet gets a lane of its own; the third (zero length, at 18)
    # and the fourth reuse lane 1 once the second has ended; the fifth needs lane 2; the sixth
    # starts after all of them. Group 1 numbers its lanes from 0 again.
    assert invocation_lanes(group, start, end).tolist() == [0, 1, 1, 1, 2, 0, 0, 1]
    touching = np.array([0, 5, 9])
    lanes = invocation_lanes(np.zeros(3, int), touching, touching + np.array([5, 4, 1]))
    assert lanes.tolist() == [0, 0, 0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), min_size=1, max_size=30))
def test_invocation_lanes_are_valid_and_as_few_as_the_deepest_overlap(
    spans: list[tuple[int, int]],
) -> None:
    spans.sort()
    start = np.array([s for s, _ in spans])
    end = start + np.array([d for _, d in spans])
    lanes = invocation_lanes(np.zeros(len(spans), int), start, end)
    for i in range(len(spans)):
        for j in range(i):
            if lanes[i] == lanes[j]:
                assert end[j] <= start[i]
    # Sorted by start, an invocation overlaps each earlier one that ends after its start.
    depth = max(1 + int((end[:i] > start[i]).sum()) for i in range(len(spans)))
    assert lanes.max() + 1 == depth


def test_an_outer_pid_beyond_int64_is_refused_naming_the_field(
    store: Store, tmp_path: Path
) -> None:
    misaligned_run(store)
    short_kernels(tmp_path / "k.json", pid=2**63)
    before = snapshot(store.root)
    with pytest.raises(TraceFormatError, match=r"pid") as caught:
        merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk")
    assert "k.json" in str(caught.value)
    assert snapshot(store.root) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json", "store"]


def test_cli_refuses_an_outer_pid_beyond_int64(capsys, store: Store, tmp_path: Path) -> None:
    misaligned_run(store)
    short_kernels(tmp_path / "k.json", pid=2**63)
    out = tmp_path / "f.json"
    message = refused(
        capsys, "fuse", str(tmp_path / "k.json"), "--store", str(store.root), "--run", "mk",
        "-o", str(out), store=store.root,
    )  # fmt: skip
    assert "k.json" in message
    assert "pid" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json", "store"]


def test_an_outer_kernel_without_pid_is_refused_not_fused_into_nothing(
    capsys, store: Store, tmp_path: Path
) -> None:
    misaligned_run(store)
    short_kernels(tmp_path / "k.json")
    text = (tmp_path / "k.json").read_text()
    kernel = '"name": "HyperMegaMoe", '
    (tmp_path / "k.json").write_text(text.replace(kernel + '"pid": 0, ', kernel, 1))
    first = next(e for e in events_of(load(tmp_path / "k.json")) if e.get("cat") == "kernel")
    assert "pid" not in first
    ingest_trace(store, tmp_path / "k.json")  # loaded once: the refusal below changes nothing
    (tmp_path / "f.json").write_text("older")
    with pytest.raises(FuseError, match=r"outer kernel 'HyperMegaMoe' \(event 5 of the outer "
                       r"trace\), which invocation 10 aligns to, has no pid"):  # fmt: skip
        merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk")
    assert (tmp_path / "f.json").read_text() == "older"
    message = refused(
        capsys, "fuse", str(tmp_path / "k.json"), "--store", str(store.root), "--run", "mk",
        "-o", str(tmp_path / "g.json"), store=store.root,
    )  # fmt: skip
    assert message.startswith("outer kernel 'HyperMegaMoe' (event 5 of the outer trace)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json", "k.json", "store"]


@pytest.mark.parametrize(
    ("argument", "value", "words"),
    [
        ("rank", 2**31, "rank 2147483648 is out of range [0 .. 2147483647]"),
        ("rank", -1, "rank -1 is out of range [0 .. 2147483647]"),
        ("kernel_index", -1, "kernel_index -1 is out of range [0 .. 9223372036854775807]"),
        ("kernel_index", True, "kernel_index must be an integer"),
        ("outer_pid", 2**63, "outer_pid 9223372036854775808 is out of range"),
        ("outer_pid", "800", "outer_pid must be an integer"),
        ("step", 2**63, "step 9223372036854775808 is out of range"),
        ("window", -2, "window -2 is out of range"),
    ],
)
def test_arguments_out_of_range_are_refused_before_any_work(
    store: Store, tmp_path: Path, argument: str, value: Any, words: str
) -> None:
    misaligned_run(store)
    short_kernels(tmp_path / "k.json")
    before = snapshot(store.root)
    with pytest.raises(ArgumentError) as caught:
        merge_chrome_traces(
            tmp_path / "k.json", store, tmp_path / "f.json", run="mk", **{argument: value}
        )
    assert words in str(caught.value)
    assert snapshot(store.root) == before  # the outer trace was not even loaded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json", "store"]


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("rank", 2**40, "megaKernelCycleTrace.invocations[1].rank 1099511627776 is out of range"),
        ("invocationId", -5, "megaKernelCycleTrace.invocations[1].invocationId -5 is out of"),
        ("invocationId", 1.5, "megaKernelCycleTrace.invocations[1].invocationId must be an"),
        ("kernelName", 7, "megaKernelCycleTrace.invocations[1].kernelName must be a string, got 7"),
        ("kernelName", None, "megaKernelCycleTrace has no 'kernelName' (invocations[1])"),
        ("cycleFrequencyMHz", 1e-320, "cycleFrequencyMHz 1e-320 MHz is out of range"),
    ],
)
def test_a_hand_edited_mega_kernel_summary_is_refused_naming_entry_and_field(
    capsys, store: Store, tmp_path: Path, field: str, value: Any, words: str
) -> None:
    misaligned_run(store)
    short_kernels(tmp_path / "k.json")
    export_chrome_trace(store, tmp_path / "mk.json", run="mk")
    trace = json.loads((tmp_path / "mk.json").read_text())
    trace["megaKernelCycleTrace"]["invocations"][1][field] = value
    (tmp_path / "mk.json").write_text(json.dumps(trace))
    before = snapshot(store.root)
    with pytest.raises(FuseError) as caught:
        merge_chrome_traces(tmp_path / "k.json", tmp_path / "mk.json", tmp_path / "f.json",
                            store=store)  # fmt: skip
    assert str(caught.value).startswith(f"{tmp_path / 'mk.json'}: ")
    assert words in str(caught.value)
    assert snapshot(store.root) == before  # refused before the outer trace is loaded
    message = refused(
        capsys, "fuse", str(tmp_path / "k.json"), "--trace", str(tmp_path / "mk.json"),
        "--store", str(store.root), "-o", str(tmp_path / "f.json"), store=store.root,
    )  # fmt: skip
    assert words in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json", "mk.json", "store"]


def test_a_summary_whose_invocations_are_not_objects_is_refused(
    store: Store, tmp_path: Path
) -> None:
    misaligned_run(store)
    short_kernels(tmp_path / "k.json")
    export_chrome_trace(store, tmp_path / "mk.json", run="mk")
    trace = json.loads((tmp_path / "mk.json").read_text())
    trace["megaKernelCycleTrace"]["invocations"] = [1, 2]
    (tmp_path / "mk.json").write_text(json.dumps(trace))
    with pytest.raises(FuseError, match=r"megaKernelCycleTrace.invocations is not a list of obj"):
        merge_chrome_traces(tmp_path / "k.json", tmp_path / "mk.json", tmp_path / "f.json")
    assert not (tmp_path / "f.json").exists()


@pytest.mark.parametrize(
    ("key", "value"), [("rank", 2**40), ("invocation_id", "ten"), ("core_type", "AIX")]
)
def test_a_hand_edited_slice_is_refused_naming_the_event(
    store: Store, tmp_path: Path, key: str, value: Any
) -> None:
    misaligned_run(store)
    short_kernels(tmp_path / "k.json")
    export_chrome_trace(store, tmp_path / "mk.json", run="mk")
    trace = json.loads((tmp_path / "mk.json").read_text())
    index, event = next(
        (i, e) for i, e in enumerate(trace["traceEvents"]) if e["ph"] == "X" and i > 20
    )
    event["args"][key] = value
    (tmp_path / "mk.json").write_text(json.dumps(trace))
    with pytest.raises(FuseError) as caught:
        merge_chrome_traces(tmp_path / "k.json", tmp_path / "mk.json", tmp_path / "f.json")
    assert str(caught.value) == (
        f"{tmp_path / 'mk.json'}: event {index}, a MegaKernelInternal slice, lacks an integer "
        "tid, ts, dur or args.rank, invocation_id, core_type (or its name, AIC or AIV) or "
        "block_id in range; export the trace again (mcprof export)"
    )
    assert not (tmp_path / "f.json").exists()


def test_an_arrow_into_a_lower_thread_is_written_after_its_start(
    store: Store, tmp_path: Path
) -> None:
    # AIV/1's task 8 triggers the event AIC/0's task 7 waits for: the arrow runs from the
    # higher tid to the lower one, and both its ends are at the trigger's start (cycle 150).
    buffer = pack(1, 2, 16, 16, [
        Slot(AIC, 0, 100, [(110, 300, WAIT, 7, 2, 5), (300, 400, GMM1, 7, 2, 5)]),
        Slot(AIV, 1, 100, [(100, 150, 0x20002, 8, 0, 5), (150, 300, TRIGGER, 8, 0, 5)]),
    ])  # fmt: skip
    run = RunInfo.begin(run_id="mk")
    store.write_run(run)
    ingest_buffers(
        store,
        [buffer],
        LAYOUT,
        frequency_hz=50e6,
        run_id="mk",
        kernel=KernelInfo(kernel_name=KERNEL, stage_names={GMM1: "GMM1"}, config_id="graph"),
        launches=Launches(rank=0, device=0, step=0),
    )
    tasks = graph(0, KERNEL)
    for name, values in (("wait_event", [0, -1]), ("wait_count", [1, 0]),
                         ("trigger_event", [-1, 0])):  # fmt: skip
        column = tasks.schema.get_field_index(name)
        tasks = tasks.set_column(column, name, pa.array(values, tasks.schema.field(name).type))
    store.write_tasks("mk", tasks)
    store.write_run(run.finish())
    short_kernels(tmp_path / "k.json", starts=("10.000",))
    merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk")
    check_trace(load_trace(tmp_path / "f.json"))
    fused = events_of(load(tmp_path / "f.json"))
    arrows = [(e["ph"], e["tid"], e["ts"]) for e in fused if e["ph"] in "sf"]
    assert arrows == [("s", 9, Decimal(EPOCH_US) + Decimal("11.000")),
                      ("f", 8, Decimal(EPOCH_US) + Decimal("11.000"))]  # fmt: skip
