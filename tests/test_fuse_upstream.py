"""Fusion of what hyper-parallel's users have: a training window holding forward and backward
invocations (two kernels, each aligned to the outer kernels of its own name), hyper-parallel's
own standalone traces (a single capture: no invocation list, core types named ``AIC`` /
``AIV``), ``kernel_index`` in the duration fallback, and kernel patterns that would match every
outer event.

The standalone traces here are written out by hand in the shape hyper-parallel's
``profiling._parse_cycle_buffer`` gives them: pid the rank, tid ``core_type x 1000 + block_id``,
``ts`` / ``dur`` float microseconds from the anchor cycle, and its ``megaKernelCycleTrace``.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from exact_json import events_of, load
from golden import GMM1, TRIGGER, WAIT
from npu_trace import write_npu_trace
from test_fuse import LAYOUT, graph, launch, name_processes, write_kineto
from trace_checker import check_trace, load_trace

from multicore_profiler import cli
from multicore_profiler.errors import ArgumentError, FuseError
from multicore_profiler.fuse.merge import merge_chrome_traces
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

FORWARD, BACKWARD = "HyperMegaMoe", "HyperMegaMoeGrad"
FORWARD_OUTER = "aclnnHyperMegaMoe_HyperMegaMoeAiCore_HyperMegaMoe"
BACKWARD_OUTER = "aclnnHyperMegaMoeGrad_HyperMegaMoeGradAiCore_HyperMegaMoeGrad"
"""The forward kernel's inferred pattern, ``(?i)hyper_?mega_?moe``, matches both outer names;
the backward one's only the second."""


def internal(scale: int) -> list[tuple[str, int, int, str]]:
    """A ``launch`` of ``scale``'s slices at 50 MHz: name, start from its first record (ns),
    duration (ns), core."""
    cycle = 20
    return [
        ("GMM1_WaitDependency", 0, 50 * scale * cycle, "AIC/0"),
        ("GMM1", 50 * scale * cycle, 240 * scale * cycle, "AIC/0"),
        ("GMM1_TriggerEvent", 290 * scale * cycle, 5 * scale * cycle, "AIC/0"),
        ("WaitDependency", 20 * cycle, (300 * scale - 20) * cycle, "AIV/1"),
    ]


def training_window(store: Store, plan: list[tuple[int, str, str, int]]) -> None:
    """Run ``mk`` on rank 0: one invocation per (invocation id, kernel, direction, scale) of
    ``plan``, each with its kernel's task graph, 100,000 cycles apart."""
    run = RunInfo.begin(run_id="mk", label="training")
    store.write_run(run)
    for number, (invocation, kernel, direction, scale) in enumerate(plan):
        ingest_buffers(
            store,
            [launch(100_000 * number, scale)],
            LAYOUT,
            frequency_hz=50e6,
            run_id="mk",
            kernel=KernelInfo(
                kernel_name=kernel, stage_names={GMM1: "GMM1"}, config_id=f"graph-{kernel}"
            ),
            launches=Launches(
                rank=0, device=2, step=1, first_invocation_id=invocation, direction=direction
            ),
        )
    for kernel in sorted({kernel for _, kernel, _, _ in plan}):
        tasks = graph(0, kernel)
        store.write_tasks("mk", tasks.set_column(1, "config_id", pa.array([f"graph-{kernel}"] * 2)))
    store.write_run(run.finish())


ONE_F_ONE_B = [
    (10, FORWARD, "forward", 1),
    (11, BACKWARD, "backward", 2),
    (12, FORWARD, "forward", 1),
    (13, BACKWARD, "backward", 2),
]
"""Forward invocations span 6 us, backward ones 12 us."""
BASE_US = 1_000_000


def named_kineto(path: Path, kernels: list[tuple[str, str, str]]) -> None:
    """``write_kineto``'s trace with its processes and host thread named, and times near
    ``BASE_US`` (which a double holds to the ns), so that the whole fused trace passes the
    trace checker."""
    write_kineto(path, kernels, base=BASE_US)
    name_processes(path)


def at(us: str) -> Decimal:
    return Decimal(BASE_US) + Decimal(us)


def test_forward_and_backward_fuse_by_default_each_to_its_own_outer_kernels(
    store: Store, tmp_path: Path
) -> None:
    training_window(store, ONE_F_ONE_B)
    starts = ("10.000", "20.000", "40.000", "60.000")
    named_kineto(
        tmp_path / "k.json",
        [
            (FORWARD_OUTER, starts[0], "6.200"),
            (BACKWARD_OUTER, starts[1], "12.400"),
            (FORWARD_OUTER, starts[2], "6.200"),
            (BACKWARD_OUTER, starts[3], "12.400"),
        ],
    )
    merged = merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk")
    check_trace(load_trace(tmp_path / "f.json"))
    report = merged.report
    assert (report["kernelPattern"], report["kernelPatternInferred"]) == (None, True)
    assert report["kernels"] == [
        {"kernelName": FORWARD, "pattern": "(?i)hyper_?mega_?moe", "invocations": 2,
         "deviceCandidates": 2, "hostCandidates": 0, "alignment": "device"},
        {"kernelName": BACKWARD, "pattern": "(?i)hyper_?mega_?moe_?grad", "invocations": 2,
         "deviceCandidates": 2, "hostCandidates": 0, "alignment": "device"},
    ]  # fmt: skip
    # Each invocation on the outer kernel of its own name, in order; the forward pattern
    # matches the backward kernels too, which belong to the longer match.
    placed = [
        (i["invocationId"], i["direction"], i["kernelName"], i["outerKernel"]["name"],
         i["outerKernel"]["ts"], i["exceedsOuterKernelUs"])
        for i in report["invocations"]
    ]  # fmt: skip
    assert placed == [
        (10, "forward", FORWARD, FORWARD_OUTER, str(at("10.000")), 0.0),
        (11, "backward", BACKWARD, BACKWARD_OUTER, str(at("20.000")), 0.0),
        (12, "forward", FORWARD, FORWARD_OUTER, str(at("40.000")), 0.0),
        (13, "backward", BACKWARD, BACKWARD_OUTER, str(at("60.000")), 0.0),
    ]
    assert report["counts"] == {
        "invocations": 4,
        "deviceCandidates": 4,
        "hostCandidates": 0,
        "internalEvents": 16,
        "dependencyArrows": 4,
        "addedThreads": 4,
    }
    assert report["threads"] == [
        {"pid": 0, "tid": 8, "name": "HyperMegaMoe/AIC/0"},
        {"pid": 0, "tid": 9, "name": "HyperMegaMoe/AIV/1"},
        {"pid": 0, "tid": 10, "name": "HyperMegaMoeGrad/AIC/0"},
        {"pid": 0, "tid": 11, "name": "HyperMegaMoeGrad/AIV/1"},
    ]
    assert report["warnings"] == []
    # Every slice, shifted so that its invocation's first record starts with its kernel.
    outer = load(tmp_path / "k.json")
    added = events_of(load(tmp_path / "f.json"))[len(events_of(outer)) :]
    tids = {(FORWARD, "AIC/0"): 8, (FORWARD, "AIV/1"): 9, (BACKWARD, "AIC/0"): 10,
            (BACKWARD, "AIV/1"): 11}  # fmt: skip
    durations = {FORWARD: "6.200", BACKWARD: "12.400"}
    expected = sorted(
        (tids[kernel, core], at(start) + Decimal(offset) / 1000, name, Decimal(dur) / 1000,
         invocation, direction, outer_name, at(start), Decimal(durations[kernel]))
        for (invocation, kernel, direction, scale), start, outer_name in zip(
            ONE_F_ONE_B, starts, (FORWARD_OUTER, BACKWARD_OUTER) * 2, strict=True
        )
        for name, offset, dur, core in internal(scale)
    )  # fmt: skip
    got = [
        (e["tid"], e["ts"], e["name"], e["dur"], e["args"]["invocation_id"],
         e["args"]["direction"], e["args"]["parent_kernel"], e["args"]["parent_kernel_ts"],
         e["args"]["parent_kernel_dur"])
        for e in added
        if e["ph"] == "X"
    ]  # fmt: skip
    assert got == expected
    assert {e["pid"] for e in added if e["ph"] == "X"} == {0}


ONE_F_ONE_B_OUTER = [
    (FORWARD_OUTER, "10.000", "6.200"),
    (BACKWARD_OUTER, "20.000", "12.400"),
    (FORWARD_OUTER, "40.000", "6.200"),
    (BACKWARD_OUTER, "60.000", "12.400"),
]


def test_an_explicit_pattern_aligns_every_invocation_in_order(store: Store, tmp_path: Path) -> None:
    """``kernel_pattern`` keeps its meaning: the i-th invocation, whatever its kernel, goes to
    the i-th outer kernel the pattern matches."""
    training_window(store, ONE_F_ONE_B)
    named_kineto(tmp_path / "k.json", ONE_F_ONE_B_OUTER)
    merged = merge_chrome_traces(
        tmp_path / "k.json", store, tmp_path / "f.json", kernel_pattern="HyperMegaMoe"
    )
    report = merged.report
    assert (report["kernelPattern"], report["kernelPatternInferred"]) == ("HyperMegaMoe", False)
    assert report["kernels"] == [
        {"kernelName": None, "pattern": "HyperMegaMoe", "invocations": 4, "deviceCandidates": 4,
         "hostCandidates": 0, "alignment": "device"}
    ]  # fmt: skip
    assert [(i["invocationId"], i["outerKernel"]["ts"]) for i in report["invocations"]] == [
        (10, "1000010.000"),
        (11, "1000020.000"),
        (12, "1000040.000"),
        (13, "1000060.000"),
    ]
    # Only the two backward kernels match 'Grad': too few for all four invocations.
    with pytest.raises(FuseError) as caught:
        merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "g.json", kernel_pattern="Grad")
    assert str(caught.value) == (
        "too few candidates: 4 invocation(s) of rank 0 to align, but 2 outer kernel(s) match "
        "'Grad'; fuse fewer invocations (a capture window or step of the run) or check the pattern"
    )


def test_kernel_index_skips_the_first_outer_kernels_of_each_kernel(
    store: Store, tmp_path: Path
) -> None:
    """A warm-up step before the window: each kernel skips its first outer kernel."""
    training_window(store, ONE_F_ONE_B)
    warm_up = [(FORWARD_OUTER, "1.000", "6.200"), (BACKWARD_OUTER, "8.000", "1.000")]
    named_kineto(tmp_path / "k.json", warm_up + ONE_F_ONE_B_OUTER)
    merged = merge_chrome_traces(
        tmp_path / "k.json", store, tmp_path / "f.json", run="mk", kernel_index=1
    )
    assert merged.report["kernelIndex"] == 1
    assert [(i["invocationId"], i["outerKernel"]["ts"]) for i in merged.report["invocations"]] == [
        (10, "1000010.000"),
        (11, "1000020.000"),
        (12, "1000040.000"),
        (13, "1000060.000"),
    ]
    with pytest.raises(FuseError) as caught:
        merge_chrome_traces(
            tmp_path / "k.json", store, tmp_path / "g.json", run="mk", kernel_index=2
        )
    assert str(caught.value) == (
        "too few candidates: 2 invocation(s) of 'HyperMegaMoe' of rank 0 to align, but 3 outer "
        "kernel(s) match '(?i)hyper_?mega_?moe' and 2 are skipped (kernel_index); fuse fewer "
        "invocations (a capture window or step of the run) or check the pattern"
    )


def test_an_outer_kernel_two_kernels_claim_alike_is_refused(store: Store, tmp_path: Path) -> None:
    """``(?i)gate_?moe`` and ``(?i)moe_?gate`` both match 7 characters of ``GateMoeGate``."""
    training_window(store, [(10, "GateMoe", "forward", 1), (11, "MoeGate", "backward", 1)])
    named_kineto(tmp_path / "k.json", [("GateMoeGate", "10.000", "6.200")])
    with pytest.raises(FuseError) as caught:
        merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk")
    index = next(
        i for i, e in enumerate(events_of(load(tmp_path / "k.json"))) if e["name"] == "GateMoeGate"
    )
    assert str(caught.value) == (
        f"outer event {index} ('GateMoeGate') matches the patterns of kernels 'GateMoe' "
        "('(?i)gate_?moe') and 'MoeGate' ('(?i)moe_?gate') alike: which kernel ran in it is "
        "unknown; give kernel_pattern (--kernel-pattern)"
    )
    assert not (tmp_path / "f.json").exists()


def test_a_kernel_without_outer_kernels_of_its_name_is_refused(
    store: Store, tmp_path: Path
) -> None:
    training_window(store, ONE_F_ONE_B)
    named_kineto(tmp_path / "k.json", [(FORWARD_OUTER, "10.000", "6.200")] * 2)
    with pytest.raises(FuseError) as caught:
        merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk")
    assert str(caught.value) == (
        "no outer event matches the kernel pattern '(?i)hyper_?mega_?moe_?grad' inferred from "
        "'HyperMegaMoeGrad', though 'HyperMegaMoe''s pattern '(?i)hyper_?mega_?moe' matches 2: "
        "its 2 invocation(s) have nothing to align to; give kernel_pattern (--kernel-pattern)"
    )


def test_without_any_outer_kernel_of_their_names_both_kernels_fall_back_to_one_run(
    store: Store, tmp_path: Path
) -> None:
    """The duration fallback takes every invocation, in order, as one run of device kernels."""
    training_window(store, ONE_F_ONE_B)
    kernels = [
        ("gemm_a", "10.000", "12.100"),
        ("fwd", "30.000", "6.100"),
        ("bwd", "40.000", "12.100"),
        ("fwd", "60.000", "6.100"),
        ("bwd", "70.000", "12.100"),
    ]
    named_kineto(tmp_path / "k.json", kernels)
    merged = merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk")
    report = merged.report
    assert report["durationFallbackUsed"] is True
    assert [k["alignment"] for k in report["kernels"]] == ["duration", "duration"]
    assert [(i["invocationId"], i["outerKernel"]["name"], i["outerKernel"]["ts"])
            for i in report["invocations"]] == [
        (10, "fwd", "1000030.000"),
        (11, "bwd", "1000040.000"),
        (12, "fwd", "1000060.000"),
        (13, "bwd", "1000070.000"),
    ]  # fmt: skip
    assert report["warnings"] == [
        "no outer event matches '(?i)hyper_?mega_?moe' (inferred from 'HyperMegaMoe') or "
        "'(?i)hyper_?mega_?moe_?grad' (inferred from 'HyperMegaMoeGrad'): aligned to the run of "
        "4 device kernel(s) whose durations best match the invocations' spans instead"
    ]


DURATIONS = [
    ("gemm_a", "10.000", "6.000"),
    ("gemm_b", "20.000", "12.000"),
    ("gemm_c", "40.000", "18.000"),
    ("gemm_d", "60.000", "40.000"),
    ("gemm_e", "110.000", "6.100"),
    ("gemm_f", "120.000", "12.200"),
    ("gemm_g", "140.000", "18.300"),
]
"""Two runs that fit invocations of 6, 12 and 18 us: a to c exactly, e to g nearly."""


def scaled_run(store: Store) -> None:
    """Run ``mk``: three invocations of ``HyperMegaMoe`` spanning 6, 12 and 18 us."""
    training_window(store, [(10 + n, FORWARD, "forward", n + 1) for n in range(3)])


def test_kernel_index_is_honoured_in_the_duration_fallback(store: Store, tmp_path: Path) -> None:
    scaled_run(store)
    named_kineto(tmp_path / "k.json", DURATIONS)
    best = merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk")
    assert [i["outerKernel"]["name"] for i in best.report["invocations"]] == [
        "gemm_a",
        "gemm_b",
        "gemm_c",
    ]
    # Skipping the first device kernel (gemm_a) leaves e to g as the best run.
    skipped = merge_chrome_traces(
        tmp_path / "k.json", store, tmp_path / "g.json", run="mk", kernel_index=1
    )
    report = skipped.report
    assert (report["durationFallbackUsed"], report["kernelIndex"]) == (True, 1)
    assert [(i["invocationId"], i["outerKernel"]["name"], i["outerKernel"]["ts"])
            for i in report["invocations"]] == [
        (10, "gemm_e", "1000110.000"),
        (11, "gemm_f", "1000120.000"),
        (12, "gemm_g", "1000140.000"),
    ]  # fmt: skip
    assert report["warnings"] == [
        "no outer event matches '(?i)hyper_?mega_?moe' (inferred from 'HyperMegaMoe'): aligned "
        "to the run of 3 device kernel(s) after the first 1 (kernel_index) whose durations best "
        "match the invocations' spans instead"
    ]
    with pytest.raises(FuseError) as caught:
        merge_chrome_traces(
            tmp_path / "k.json", store, tmp_path / "h.json", run="mk", kernel_index=5
        )
    assert str(caught.value) == (
        "no outer event matches the kernel pattern '(?i)hyper_?mega_?moe' (inferred from "
        "'HyperMegaMoe'), and no run of 3 device kernel(s) after the first 5 (kernel_index) is "
        "there to fall back to; give kernel_pattern (--kernel-pattern)"
    )
    assert not (tmp_path / "h.json").exists()


@pytest.mark.parametrize("pattern", ["", ".*", "(?i)", "x?"])
def test_a_pattern_that_matches_every_outer_event_is_refused_before_any_work(
    store: Store, tmp_path: Path, pattern: str
) -> None:
    scaled_run(store)
    named_kineto(tmp_path / "k.json", DURATIONS)
    with pytest.raises(ArgumentError) as caught:
        merge_chrome_traces(
            tmp_path / "k.json", store, tmp_path / "f.json", run="mk", kernel_pattern=pattern
        )
    assert str(caught.value) == (
        f"kernel_pattern {pattern!r} matches an empty name, so it matches every outer event: "
        "give a pattern of the outer kernel's name, or none to infer one from the kernel's"
    )
    assert not (tmp_path / "f.json").exists()
    with store.reading() as con:  # the outer trace was not loaded
        assert con.execute("SELECT count(*) FROM trace_sources").fetchall() == [(0,)]


def test_cli_fuses_forward_and_backward_and_refuses_an_empty_pattern(
    capsys, store: Store, tmp_path: Path
) -> None:
    training_window(store, ONE_F_ONE_B)
    named_kineto(tmp_path / "k.json", ONE_F_ONE_B_OUTER)
    base = ["fuse", str(tmp_path / "k.json"), "--store", str(store.root), "--run", "mk"]
    assert cli.main([*base, "-o", str(tmp_path / "f.json")]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    source = json.loads((tmp_path / "f.json").read_text())["megaKernelTraceMerge"]["outerTrace"]
    assert out == (
        f"{tmp_path / 'f.json'}: 16 records of 4 invocation(s) (32 events with threads and "
        f"arrows) on 4 new thread(s) of pid 0, aligned to '{FORWARD_OUTER}' (pattern "
        "'(?i)hyper_?mega_?moe') and 'aclnnHyperMegaMoeGrad_HyperMegaMoeGradAiCore_"
        "HyperMegaMoe...' "
        f"(pattern '(?i)hyper_?mega_?moe_?grad'); outer trace {source['sourceId']}: "
        f"{source['events']} events kept\n"
    )
    with pytest.raises(SystemExit) as exited:
        cli.main([*base, "--kernel-pattern", "", "-o", str(tmp_path / "g.json")])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "mcprof: error: argument --kernel-pattern: kernel_pattern '' matches an empty name, so it "
        "matches every outer event: give a pattern of the outer kernel's name, or none to infer "
        "one from the kernel's\n"
    )
    assert not (tmp_path / "g.json").exists()


SHMEM_GET = 0x20000 + 107
"""hyper-parallel's task-type fallback desc of ShmemGetMem: its slices carry args.task_type."""
RECORDS = [
    # core type, block, entry cycle, start, end, desc id, task, stage task index, owner
    ("AIC", 0, 100, 110, 160, WAIT, 7, 2, 5),
    ("AIV", 1, 120, 130, 410, WAIT, 8, 0, 5),
    ("AIC", 0, 100, 160, 400, GMM1, 7, 2, 5),
    ("AIC", 0, 100, 400, 405, TRIGGER, 7, 2, 5),
    ("AIV", 1, 120, 410, 450, SHMEM_GET, 8, 0, 0xFFFFFFFF),
]
"""One buffer's records at 50 MHz, anchor cycle 100, in the order hyper-parallel writes them
(start cycle, core type, block); task 7 belongs to graph stage GMM1, task 8 to none."""
NAMES = {
    False: ["GMM1_WaitDependency", "WaitDependency", "GMM1", "GMM1_TriggerEvent",
            "TaskType_ShmemGetMem"],
    True: ["Expert5_GMM1_WaitDependency_task3", "Expert5_WaitDependency_task1",
           "Expert5_GMM1_task3", "Expert5_GMM1_TriggerEvent_task3",
           "TaskType_ShmemGetMem_task1"],
}  # fmt: skip
"""Their names as hyper-parallel writes them, stage only and detailed."""
TS_DUR = [(0.2, 1.0), (0.6, 5.6), (1.2, 4.8), (6.0, 0.1), (6.2, 0.8)]
"""Their ``ts`` and ``dur``, (cycle - 100) / 50.0 and (end - start) / 50.0 as Python writes them."""


def upstream_slices(detailed: bool, *, rank: int | None = 3) -> list[dict[str, Any]]:
    """The records' slices as hyper-parallel's ``_duration_trace_event`` writes them (with
    ``args.rank`` unless ``rank`` is None)."""
    slices = []
    for record, name, (ts, dur) in zip(RECORDS, NAMES[detailed], TS_DUR, strict=True):
        core, block, entry, start, end, desc, task, index, owner = record
        args: dict[str, Any] = {} if rank is None else {"rank": rank}
        args |= {"device_id": 5, "core_type": core, "block_id": block, "task_id": task,
                 "desc_id": desc, "stage_task_index": index, "task_number": index + 1,
                 "start_cycle": start, "end_cycle": end, "core_entry_cycle": entry}  # fmt: skip
        if task == 7:
            args["task_stage"] = "GMM1"
        if desc >= 0x20000:
            args["task_type"] = desc - 0x20000
        if owner != 0xFFFFFFFF:
            args["owner_id"] = owner
        tid = (1 if core == "AIC" else 2) * 1000 + block
        slices.append({"name": name, "cat": "MegaKernelInternal", "ph": "X", "pid": 3,
                       "tid": tid, "ts": ts, "dur": dur, "args": args})  # fmt: skip
    return slices


def upstream_capture(path: Path, detailed: bool, *, rank: int | None = 3) -> dict[str, Any]:
    """Write hyper-parallel's standalone trace of one buffer (``_parse_cycle_buffer``) on pid
    3; ``rank`` None leaves the rank out of its summary and of its slices' args."""
    metadata = [
        {"name": "process_name", "ph": "M", "pid": 3, "tid": 0,
         "args": {"name": "HyperMegaMoe rank 3 device 5"}},
        {"name": "thread_name", "ph": "M", "pid": 3, "tid": 1000, "args": {"name": "AIC/0"}},
        {"name": "thread_sort_index", "ph": "M", "pid": 3, "tid": 1000,
         "args": {"sort_index": 0}},
        {"name": "thread_name", "ph": "M", "pid": 3, "tid": 2001, "args": {"name": "AIV/1"}},
        {"name": "thread_sort_index", "ph": "M", "pid": 3, "tid": 2001,
         "args": {"sort_index": 1}},
    ]  # fmt: skip
    summary: dict[str, Any] = {"schemaVersion": 1}
    if rank is not None:
        summary["rank"] = rank
    summary |= {
        "deviceId": 5,
        "socName": "Ascend910B4",
        "cycleFrequencyMHz": 50.0,
        "anchorCycle": 100,
        "recordCapacityPerCore": {"AIC": 16, "AIV": 16},
        "maxRecordCapacityPerCore": 134217712,
        "recordCount": 5,
        "droppedRecordCount": 0,
        "profileBufferBytes": 41472,
        "detailedTaskNames": detailed,
        "kernelName": "HyperMegaMoe",
        "ownerLabel": "Expert",
        "warnings": [],
    }
    trace = {"traceEvents": metadata + upstream_slices(detailed, rank=rank)}
    trace["megaKernelCycleTrace"] = summary
    path.write_text(json.dumps(trace, ensure_ascii=False))
    return trace


@pytest.mark.parametrize(
    ("detailed", "rank", "rank_from"),
    [
        (False, 3, "megaKernelCycleTrace.rank"),
        (True, 3, "megaKernelCycleTrace.rank"),
        (False, None, "the slices' pid"),
    ],
)
def test_a_hyper_parallel_single_capture_fuses_as_written(
    tmp_path: Path, detailed: bool, rank: int | None, rank_from: str
) -> None:
    # Times a double holds to the ns, so that the trace checker reads the slices exactly.
    written = write_npu_trace(tmp_path / "t.json", base_ts="1000000.000")
    upstream = upstream_capture(tmp_path / "mk.json", detailed, rank=rank)
    merged = merge_chrome_traces(tmp_path / "t.json", tmp_path / "mk.json", tmp_path / "f.json")
    kernel = written["device_kernels"][0]  # one invocation: the first outer kernel
    start, dur = Decimal(kernel["ts"]), Decimal(kernel["dur"])
    fresh = written["max_device_tid"] + 1
    # The device process's lowest tid is 0 (its process metadata), below its streams' sort
    # indexes (3 and 7): the two added threads go before it.
    expected = [
        {"name": "thread_name", "ph": "M", "pid": 800, "tid": fresh,
         "args": {"name": "HyperMegaMoe/AIC/0"}},
        {"name": "thread_name", "ph": "M", "pid": 800, "tid": fresh + 1,
         "args": {"name": "HyperMegaMoe/AIV/1"}},
        {"name": "thread_sort_index", "ph": "M", "pid": 800, "tid": fresh,
         "args": {"sort_index": -2}},
        {"name": "thread_sort_index", "ph": "M", "pid": 800, "tid": fresh + 1,
         "args": {"sort_index": -1}},
    ]  # fmt: skip
    slices = upstream["traceEvents"][5:]
    by_thread = sorted(slices, key=lambda e: (e["tid"], e["ts"]))
    for event in by_thread:
        # Shifted so the first record (ts 0.2) starts with the kernel; args as written, plus
        # the parent kernel's.
        expected.append(
            {"name": event["name"], "ph": "X", "cat": "MegaKernelInternal", "pid": 800,
             "tid": fresh if event["tid"] == 1000 else fresh + 1,
             "ts": start + Decimal(str(event["ts"])) - Decimal("0.2"),
             "dur": Decimal(str(event["dur"])),
             "args": event["args"] | {"parent_kernel": kernel["name"], "parent_kernel_ts": start,
                                      "parent_kernel_dur": dur}}
        )  # fmt: skip
    outer = load(tmp_path / "t.json")
    fused = load(tmp_path / "f.json")
    assert fused[: len(outer)] == outer
    added = fused[len(outer) :]
    assert added[:-1] == expected
    plain = json.loads((tmp_path / "f.json").read_text())
    named = [e for e in plain if e["ph"] == "M" and e["name"] == "process_name" and e["pid"] == 800]
    check_trace({"traceEvents": named + plain[len(outer) : -1]})

    report = merged.report
    assert added[-1]["args"] == json.loads(json.dumps(report), parse_float=Decimal)
    assert report["invocations"] == [
        {
            "invocationId": 0,
            "direction": None,
            "kernelName": "HyperMegaMoe",
            "rank": 3,
            "deviceId": 5,
            "outerKernel": {
                "name": kernel["name"],
                "pid": 800,
                "tid": kernel["tid"],
                "ts": kernel["ts"],
                "tsNs": kernel["ts_ns"],
                "dur": kernel["dur"],
                "durNs": kernel["dur_ns"],
                "deviceEvidence": "Task Type=MIX_AIC",
            },
            "internalEventCount": 5,
            "spanUs": 6.8,
            "exceedsOuterKernelUs": 0.0,
        }
    ]
    assert report["megaKernelTrace"] == {
        "path": str(tmp_path / "mk.json"),
        "selection": None,
        "cycleFrequencyMHz": 50.0,
        "singleCapture": True,
        "inferred": [
            {
                "field": "invocationId",
                "value": 0,
                "from": "a single capture (no megaKernelCycleTrace.invocations)",
            },
            {"field": "rank", "value": 3, "from": rank_from},
            {"field": "coreType", "value": {"AIC": 1, "AIV": 2}, "from": "args.core_type names"},
        ],
    }
    assert report["rank"] == 3
    assert report["counts"]["dependencyArrows"] == 0
    assert report["warnings"] == []


def edited_capture(path: Path, edit: Any) -> None:
    """A single capture (stage names, rank 3) that ``edit`` changed in place."""
    trace = upstream_capture(path, False)
    edit(trace)
    path.write_text(json.dumps(trace))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t["megaKernelCycleTrace"].pop("kernelName"),
            "{mk}: its megaKernelCycleTrace has neither invocations (as mcprof export writes) "
            "nor a kernelName (as hyper-parallel writes for a single capture): which kernel ran "
            "is unknown",
        ),
        (
            lambda t: t["traceEvents"][6]["args"].update(rank=4),
            "{mk}: a slice has args.rank 4, but the single capture is rank 3 (from "
            "megaKernelCycleTrace.rank)",
        ),
        (
            lambda t: t["traceEvents"][7]["args"].update(invocation_id=1),
            "{mk}: event 7 carries args.invocation_id, but its megaKernelCycleTrace lists no "
            "invocations: which invocation it belongs to is unknown",
        ),
        (
            lambda t: (t["megaKernelCycleTrace"].pop("rank"), t["traceEvents"][9].update(pid=4)),
            "{mk}: its megaKernelCycleTrace has no rank, and its slices are on 2 integer pid(s) "
            "[3, 4]: which rank ran them is unknown",
        ),
        (
            lambda t: t["megaKernelCycleTrace"].update(rank=2**31),
            "{mk}: megaKernelCycleTrace.rank 2147483648 is out of range [0 .. 2147483647]",
        ),
        (
            lambda t: t["megaKernelCycleTrace"].update(cycleFrequencyMHz=0),
            "{mk}: megaKernelCycleTrace.cycleFrequencyMHz 0 MHz is out of range "
            "[0.001 .. 100000 MHz]",
        ),
    ],
    ids=["no-kernel-name", "slice-rank", "invocation-id", "two-pids", "rank", "frequency"],
)
def test_a_trace_that_is_neither_ours_nor_a_single_capture_is_refused_naming_what_is_missing(
    store: Store, tmp_path: Path, edit: Any, message: str
) -> None:
    write_npu_trace(tmp_path / "t.json")
    edited_capture(tmp_path / "mk.json", edit)
    with pytest.raises(FuseError) as caught:
        merge_chrome_traces(
            tmp_path / "t.json", tmp_path / "mk.json", tmp_path / "f.json", store=store
        )
    assert str(caught.value) == message.format(mk=tmp_path / "mk.json")
    assert not (tmp_path / "f.json").exists()
    with store.reading() as con:  # refused before the outer trace was loaded
        assert con.execute("SELECT count(*) FROM trace_sources").fetchall() == [(0,)]


def test_a_hyper_parallel_capture_window_of_both_directions_fuses_as_written(
    tmp_path: Path,
) -> None:
    """hyper-parallel's capture window lists its invocations (with ids, directions and kernels
    but no frequency) and adds ``invocation_id``, ``step`` and ``direction`` to each slice's
    args, its core types named: a forward and a backward invocation here, 10 us apart."""
    forward, backward = upstream_slices(False), upstream_slices(False)
    for invocation, (slices, direction) in enumerate(
        ((forward, "forward"), (backward, "backward"))
    ):
        for event in slices:
            event["ts"] += 10.0 * invocation
            event["args"] |= {"invocation_id": invocation, "step": 4, "direction": direction}
    trace = {
        "traceEvents": sorted(forward + backward, key=lambda e: (e["ts"], e["pid"], e["tid"])),
        "megaKernelCycleTrace": {
            "schemaVersion": 1,
            "windowIndex": 0,
            "anchorCycle": 100,
            "invocationCount": 2,
            "recordCount": 10,
            "droppedRecordCount": 0,
            "detailedTaskNames": False,
            "invocations": [
                {"invocationId": number, "step": 4, "direction": direction, "kernelName": kernel,
                 "rank": 3, "deviceId": 5, "anchorCycle": 100 + 500 * number, "recordCount": 5,
                 "droppedRecordCount": 0}
                for number, (direction, kernel) in enumerate(
                    (("forward", FORWARD), ("backward", BACKWARD))
                )
            ],
            "warnings": [],
        },
    }  # fmt: skip
    (tmp_path / "mk.json").write_text(json.dumps(trace))
    named_kineto(
        tmp_path / "k.json",
        [(BACKWARD_OUTER, "5.000", "7.000"), (FORWARD_OUTER, "20.000", "7.000")],
    )
    merged = merge_chrome_traces(
        tmp_path / "k.json", tmp_path / "mk.json", tmp_path / "f.json", rank=3
    )
    check_trace(load_trace(tmp_path / "f.json"))
    report = merged.report
    assert [
        (i["invocationId"], i["direction"], i["kernelName"], i["outerKernel"]["name"],
         i["outerKernel"]["ts"], i["spanUs"])
        for i in report["invocations"]
    ] == [
        (0, "forward", FORWARD, FORWARD_OUTER, "1000020.000", 6.8),
        (1, "backward", BACKWARD, BACKWARD_OUTER, "1000005.000", 6.8),
    ]  # fmt: skip
    assert report["megaKernelTrace"]["singleCapture"] is False
    assert report["megaKernelTrace"]["inferred"] == [
        {"field": "coreType", "value": {"AIC": 1, "AIV": 2}, "from": "args.core_type names"}
    ]
    assert report["frequencyCheck"]["cycleFrequencyMHz"] is None
    added = events_of(load(tmp_path / "f.json"))[len(events_of(load(tmp_path / "k.json"))) :]
    firsts = {}
    for event in added:
        if event["ph"] == "X":
            key = (event["args"]["invocation_id"], event["tid"])
            firsts.setdefault(key, (event["name"], event["ts"]))
    assert firsts == {
        (0, 8): ("GMM1_WaitDependency", Decimal("1000020.000")),
        (0, 9): ("WaitDependency", Decimal("1000020.400")),
        (1, 10): ("GMM1_WaitDependency", Decimal("1000005.000")),
        (1, 11): ("WaitDependency", Decimal("1000005.400")),
    }


def test_cli_fuses_a_single_capture_and_refuses_a_pattern_that_is_no_expression(
    capsys, tmp_path: Path
) -> None:
    written = write_npu_trace(tmp_path / "t.json")
    upstream_capture(tmp_path / "mk.json", True)
    base = ["fuse", str(tmp_path / "t.json"), "--trace", str(tmp_path / "mk.json")]
    assert cli.main([*base, "-o", str(tmp_path / "f.json")]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    source = json.loads((tmp_path / "f.json").read_text())[-1]["args"]["outerTrace"]
    assert out == (
        f"{tmp_path / 'f.json'}: 5 records of 1 invocation(s) (9 events with threads and "
        f"arrows) on 2 new thread(s) of pid 800, aligned to "
        f"'{written['device_kernels'][0]['name']}' (pattern '(?i)hyper_?mega_?moe'); outer "
        f"trace {source['sourceId']}: {written['events']} events kept\n"
    )
    with pytest.raises(SystemExit) as exited:
        cli.main([*base, "--kernel-pattern", "(?=x)", "-o", str(tmp_path / "g.json")])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(
        "mcprof: error: argument --kernel-pattern: kernel pattern '(?=x)' is not a regular "
        "expression DuckDB (RE2 syntax) accepts: "
    )
    assert not (tmp_path / "g.json").exists()
