"""Offline fusion into real kineto traces and torch_npu-shaped ones: exact outer events,
new device threads, the report, and every refusal.

Expected values are computed here from the JSON with ``Decimal`` (never floats), and the
fused kineto trace is checked against Holistic Trace Analysis' kernel breakdown.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from exact_json import events_of, load
from golden import AIC, AIV, GMM1, TRIGGER, WAIT, Slot, pack
from hta_breakdown import gpu_kernel_breakdown, trace_analysis_breakdown
from npu_trace import write_npu_trace
from shared_fixtures import shared_fixture
from trace_checker import check_trace

from multicore_profiler import cli
from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import FuseError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.fuse.align import frequency_check, kernel_pattern_for
from multicore_profiler.fuse.merge import merge_chrome_traces
from multicore_profiler.ingest import trace_reader
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

LAYOUT = BufferLayout(aic_slots=1, aiv_slots=2, aic_capacity=16, aiv_capacity=16)
KERNEL = "HyperMegaMoe"
CYCLE_NS = 20
"""The runs below are written at 50 MHz."""


def launch(offset: int, scale: int = 1, wait_end: int = 300) -> bytearray:
    """One invocation: AIC/0 waits then runs GMM1 then triggers; AIV/1 waits. Its first
    record starts at cycle 110 + offset; its last ends at 110 + offset + 300 x scale. AIV/1's
    wait ends at 110 + offset + ``wait_end`` x scale (after the trigger ends, at 295)."""
    base = 110 + offset
    return pack(
        1,
        2,
        16,
        16,
        [
            Slot(
                AIC,
                0,
                100 + offset,
                [
                    (base, base + 50 * scale, WAIT, 7, 2, 5),
                    (base + 50 * scale, base + 290 * scale, GMM1, 7, 2, 5),
                    (base + 290 * scale, base + 295 * scale, TRIGGER, 7, 2, 5),
                ],
            ),
            Slot(AIV, 1, 120 + offset, [(base + 20, base + wait_end * scale, WAIT, 8, 0, 5)]),
        ],
    )


# (name, start from the invocation's first record in ns, dur ns, tid key) per launch.
INTERNAL = [
    ("GMM1_WaitDependency", 0, 1000, "AIC/0"),
    ("GMM1", 1000, 4800, "AIC/0"),
    ("GMM1_TriggerEvent", 5800, 100, "AIC/0"),
    ("WaitDependency", 400, 5600, "AIV/1"),
]


def graph(rank: int, kernel: str) -> pa.Table:
    """Task 7 (AIC/0) triggers event 0, which task 8 (AIV/1) waits for once."""
    return pa.table(
        {
            "rank": pa.array([rank, rank], pa.int32()),
            "config_id": ["graph"] * 2,
            "kernel_name": [kernel] * 2,
            "task_id": pa.array([7, 8], pa.uint32()),
            "task_type": pa.array([1, 2], pa.uint32()),
            "desc_id": pa.array([GMM1, 0x20002], pa.uint32()),
            "stage_task_index": pa.array([2, 0], pa.uint32()),
            "owner_id": pa.array([5, 5], pa.uint32()),
            "core_type": pa.array([AIC, AIV], pa.uint8()),
            "worker": pa.array([0, 1], pa.uint32()),
            "wait_event": pa.array([-1, 0], pa.int32()),
            "wait_count": pa.array([0, 1], pa.uint32()),
            "trigger_event": pa.array([0, -1], pa.int32()),
            "tiling_position": pa.array([0, 0], pa.uint32()),
            "input_position": pa.array([0, 0], pa.uint32()),
        }
    )


def mega_kernel(
    store: Store, *, kernel: str = KERNEL, launches: int = 3, rank: int = 0, wait_end: int = 300
) -> str:
    """A run of ``launches`` invocations (ids from 10) with their task graph (``launch``)."""
    run = RunInfo.begin(run_id="mk", label="fuse")
    store.write_run(run)
    info = KernelInfo(
        kernel_name=kernel, stage_names={GMM1: "GMM1"}, soc="Ascend910B4", config_id="graph"
    )
    ingest_buffers(
        store,
        [launch(100_000 * i, wait_end=wait_end) for i in range(launches)],
        LAYOUT,
        frequency_hz=50e6,
        run_id="mk",
        kernel=info,
        launches=Launches(rank=rank, device=2, step=1, first_invocation_id=10),
    )
    store.write_tasks("mk", graph(rank, kernel))
    store.write_run(run.finish())
    return "mk"


def us(value: Any) -> Decimal:
    return Decimal(str(value))


def split(fused: Any, outer: Any) -> tuple[list, list]:
    """The fused trace's outer events (its first ones) and the added ones."""
    events = events_of(fused)
    count = len(events_of(outer))
    return events[:count], events[count:]


def added_slices(added: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in added if e["ph"] == "X"]


def test_kernel_pattern_from_camel_case() -> None:
    pattern = kernel_pattern_for("HyperMegaMoe")
    assert pattern == "(?i)hyper_?mega_?moe"
    for name in (
        "aclnnHyperMegaMoe_HyperMegaMoeAiCore_HyperMegaMoe",
        "hyper_mega_moe",
        "HYPERMEGAMOE",
    ):
        assert re.search(pattern, name)
    assert kernel_pattern_for("GMMKernel2") == "(?i)gmm_?kernel_?2"
    with pytest.raises(FuseError, match="no word"):
        kernel_pattern_for("__")


def test_npu_trace_gets_the_kernel_tracks_on_its_device_process(
    store: Store, tmp_path: Path
) -> None:
    written = write_npu_trace(tmp_path / "trace_view.json")
    run = mega_kernel(store)
    merged = merge_chrome_traces(
        tmp_path / "trace_view.json", store, tmp_path / "fused.json", run=run
    )
    outer = load(tmp_path / "trace_view.json")
    fused = load(tmp_path / "fused.json")
    assert isinstance(fused, list)  # a bare array stays a bare array
    kept, added = split(fused, outer)
    assert kept == outer  # every outer event, every field, exactly (ts strings included)

    threads = {e["tid"]: e["args"] for e in added if e["ph"] == "M" and e["name"] == "thread_name"}
    fresh = written["max_device_tid"] + 1
    assert threads == {
        fresh: {"name": "HyperMegaMoe/AIC/0"},
        fresh + 1: {"name": "HyperMegaMoe/AIV/1"},
    }
    sort = {e["tid"]: e["args"]["sort_index"] for e in added if e["name"] == "thread_sort_index"}
    existing = [
        e["args"]["sort_index"]
        for e in outer
        if e.get("name") == "thread_sort_index" and e["pid"] == written["device_pid"]
    ]
    lowest = min([*existing, *(e["tid"] for e in outer if e.get("pid") == written["device_pid"])])
    assert sort == {fresh: lowest - 2, fresh + 1: lowest - 1}
    tids = {"AIC/0": fresh, "AIV/1": fresh + 1}

    slices = added_slices(added)
    expected = []
    for kernel in written["device_kernels"]:
        start = kernel["ts_ns"]
        for name, offset, dur, core in INTERNAL:
            expected.append(
                (name, written["device_pid"], tids[core], Decimal(start + offset) / 1000,
                 Decimal(dur) / 1000, kernel["name"], us(kernel["ts"]), us(kernel["dur"]))
            )  # fmt: skip
    got = [
        (e["name"], e["pid"], e["tid"], e["ts"], e["dur"], e["args"]["parent_kernel"],
         e["args"]["parent_kernel_ts"], e["args"]["parent_kernel_dur"])
        for e in slices
    ]  # fmt: skip
    assert sorted(got, key=lambda r: (r[2], r[3])) == sorted(expected, key=lambda r: (r[2], r[3]))
    assert all(e["cat"] == "MegaKernelInternal" for e in slices)
    assert {e["args"]["invocation_id"] for e in slices} == {10, 11, 12}
    # The added threads and slices open in Perfetto on their own (the outer events are the
    # outer tool's; the report is a metadata event Perfetto skips, which the checker refuses).
    plain = json.loads((tmp_path / "fused.json").read_text())
    named = [e for e in plain if e["ph"] == "M" and e["name"] == "process_name" and e["pid"] == 800]
    check_trace({"traceEvents": named + plain[len(outer) : -1]})

    assert [e["name"] for e in added if e["ph"] == "M"][-1] == "megaKernelTraceMerge"
    report = json.loads((tmp_path / "fused.json").read_text())[-1]["args"]
    assert report == json.loads(json.dumps(merged.report))
    assert report["kernelPattern"] == "(?i)hyper_?mega_?moe"
    assert (report["kernelPatternInferred"], report["durationFallbackUsed"]) == (True, False)
    assert report["counts"] == {
        "invocations": 3,
        "deviceCandidates": 3,
        "hostCandidates": 9,
        "internalEvents": 12,
        "dependencyArrows": 3,
        "addedThreads": 2,
    }
    # Each launch's arrow from the trigger (AIC/0) into the wait it released (AIV/1).
    arrows = [(e["ph"], e["pid"], e["tid"], e["ts"], e.get("bp")) for e in added if e["ph"] in "sf"]
    assert sorted(arrows, key=lambda a: (a[3], a[0] == "f")) == [
        (ph, 800, tids[core], Decimal(kernel["ts_ns"] + 5800) / 1000, bp)
        for kernel in written["device_kernels"]
        for ph, core, bp in (("s", "AIC/0", None), ("f", "AIV/1", "e"))
    ]
    assert len({e["id"] for e in added if e["ph"] in "sf"}) == 3
    first = report["invocations"][0]
    kernel = written["device_kernels"][0]
    assert first == {
        "invocationId": 10,
        "direction": "forward",
        "kernelName": KERNEL,
        "rank": 0,
        "deviceId": 2,
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
        "internalEventCount": 4,
        "spanUs": 6.0,
        "exceedsOuterKernelUs": 0.0,
    }
    assert report["warnings"] == []


def device_kernels(document: Any, pattern: str) -> list[dict[str, Any]]:
    kernels = [
        e
        for e in events_of(document)
        if e.get("ph") == "X" and e.get("cat") == "kernel" and re.search(pattern, e["name"])
    ]
    return sorted(kernels, key=lambda e: us(e["ts"]))


def test_kineto_trace_fusion_by_pattern_and_index_keeps_hta_breakdown(
    store: Store, tmp_path: Path
) -> None:
    rank0 = shared_fixture("kineto/a100_training_rank0.json.gz")
    run = mega_kernel(store, kernel="SimulatedMegaMoe", launches=4)
    out = tmp_path / "fused.json.gz"
    merged = merge_chrome_traces(
        rank0, store, out, run=run, kernel_pattern="ncclKernel_SendRecv", kernel_index=2
    )
    outer = load(rank0)
    fused = load(out)
    kept, added = split(fused, outer)
    assert kept == events_of(outer)
    assert {k: v for k, v in fused.items() if k != "traceEvents"} == {
        k: v for k, v in outer.items() if k != "traceEvents"
    } | {"megaKernelTraceMerge": fused["megaKernelTraceMerge"],
         "metadata": {"megaKernelTraceMerge": fused["megaKernelTraceMerge"]}}  # fmt: skip

    targets = device_kernels(outer, "ncclKernel_SendRecv")[2:6]
    report = merged.report
    assert [i["outerKernel"]["tsNs"] for i in report["invocations"]] == [
        int(us(k["ts"]) * 1000) for k in targets
    ]
    assert {i["outerKernel"]["deviceEvidence"] for i in report["invocations"]} == {"cat=kernel"}
    assert report["counts"]["deviceCandidates"] == 80
    highest = max(e["tid"] for e in events_of(outer) if e.get("pid") == 0)
    assert sorted({e["tid"] for e in added}) == [highest + 1, highest + 2]
    slices = added_slices(added)
    assert {e["pid"] for e in slices} == {0}
    starts = sorted(e["ts"] for e in slices if e["name"] == "GMM1_WaitDependency")
    assert starts == [us(k["ts"]) for k in targets]
    assert gpu_kernel_breakdown(out) == gpu_kernel_breakdown(rank0)
    # And HTA's own breakdown (per kernel type, per kernel) is the original's.
    for fused_frame, outer_frame in zip(
        trace_analysis_breakdown(out), trace_analysis_breakdown(rank0), strict=True
    ):
        assert len(outer_frame) > 0
        assert fused_frame.to_dict("records") == outer_frame.to_dict("records")


def write_kineto(path: Path, kernels: list[tuple[str, str, str]], *, base: int) -> None:
    """A small kineto-shaped trace: one cpu op, and device kernels (name, ts, dur) on
    stream 7 of pid 0, with absolute epoch ts of 3 decimals."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 11, "tid": 11,
         "ts": Decimal(base) + Decimal("0.125"), "dur": Decimal("3.5")},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
    ]  # fmt: skip
    for name, ts, dur in kernels:
        events.append(
            {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7,
             "ts": Decimal(base) + Decimal(ts), "dur": Decimal(dur),
             "args": {"stream": 7, "device": 0, "correlation": len(events)}}
        )  # fmt: skip
    document = {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 0},
        "traceEvents": events,
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
    }
    # Decimals are written as strings by default=str: make them numbers again.
    text = json.dumps(document, default=str)
    path.write_text(re.sub(r'"(ts|dur)": "(-?[0-9.]+)"', r'"\1": \2', text))


def name_processes(path: Path) -> None:
    """Name the processes (GPU 0, host) and the host thread (main) of ``write_kineto``'s
    trace, as Perfetto wants them: metadata events first in its events."""
    named = "".join(
        f'{{"name": "{kind}_name", "ph": "M", "pid": {pid}, "tid": {tid}, '
        f'"args": {{"name": "{name}"}}}}, '
        for kind, pid, tid, name in (
            ("process", 0, 0, "GPU 0"),
            ("process", 11, 0, "host"),
            ("thread", 11, 11, "main"),
        )
    )
    text = path.read_text().replace('"traceEvents": [', '"traceEvents": [' + named, 1)
    path.write_text(text)


EPOCH_US = 1_683_564_901_540_885


def test_an_inferred_pattern_without_match_falls_back_to_durations(
    store: Store, tmp_path: Path
) -> None:
    # Invocations span 6, 12 and 18 us (scale 1, 2, 3 of 300 cycles at 20 ns).
    run = RunInfo.begin(run_id="mk")
    store.write_run(run)
    ingest_buffers(
        store,
        [launch(0, 1), launch(100_000, 2), launch(200_000, 3)],
        LAYOUT,
        frequency_hz=50e6,
        run_id="mk",
        kernel=KernelInfo(kernel_name=KERNEL),
        launches=Launches(rank=0, device=0, step=0),
    )
    kernels = [
        ("gemm_a", "10.000", "40.000"),
        ("gemm_b", "60.000", "6.100"),
        ("gemm_c", "70.000", "12.200"),
        ("gemm_d", "90.000", "18.300"),
        ("gemm_e", "120.000", "6.000"),
    ]
    write_kineto(tmp_path / "k.json", kernels, base=EPOCH_US)
    merged = merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk")
    report = merged.report
    assert report["durationFallbackUsed"] is True
    assert [i["outerKernel"]["name"] for i in report["invocations"]] == [
        "gemm_b",
        "gemm_c",
        "gemm_d",
    ]
    assert report["warnings"] == [
        "no outer event matches '(?i)hyper_?mega_?moe' (inferred from 'HyperMegaMoe'): aligned "
        "to the run of 3 device kernel(s) whose durations best match the invocations' spans "
        "instead"
    ]
    with pytest.raises(FuseError, match=r"'\(\?=gemm\)' is not a regular expression DuckDB"):
        merge_chrome_traces(
            tmp_path / "k.json", store, tmp_path / "g.json", run="mk", kernel_pattern="(?=gemm)"
        )
    with pytest.raises(FuseError, match="no outer event matches the kernel pattern 'Nope'"):
        merge_chrome_traces(
            tmp_path / "k.json", store, tmp_path / "g.json", run="mk", kernel_pattern="Nope"
        )
    assert not (tmp_path / "g.json").exists()


def test_host_only_candidates_are_refused_unless_allowed(store: Store, tmp_path: Path) -> None:
    written = write_npu_trace(tmp_path / "t.json")
    mega_kernel(store)
    host_only = "^aclnnHyperMegaMoe$"
    with pytest.raises(FuseError, match=r"matches 3 host event\(s\) but no device kernel"):
        merge_chrome_traces(
            tmp_path / "t.json", store, tmp_path / "f.json", kernel_pattern=host_only
        )
    assert not (tmp_path / "f.json").exists()
    merged = merge_chrome_traces(
        tmp_path / "t.json",
        store,
        tmp_path / "f.json",
        kernel_pattern=host_only,
        allow_host_alignment=True,
    )
    report = merged.report
    assert (report["hostAlignmentAllowed"], report["hostAligned"]) == (True, True)
    assert [i["outerKernel"]["deviceEvidence"] for i in report["invocations"]] == [None] * 3
    assert [i["outerKernel"]["tsNs"] for i in report["invocations"]] == [
        op["ts_ns"] for op in written["host_ops"] if op["name"] == "aclnnHyperMegaMoe"
    ]
    assert report["warnings"][0].startswith("aligned to 3 host-side event(s)")


def test_too_few_candidates_and_longer_invocations(store: Store, tmp_path: Path) -> None:
    write_npu_trace(tmp_path / "t.json", kernel_us=("0.100", "0.100", "9.000"))
    mega_kernel(store)
    with pytest.raises(
        FuseError,
        match=r"too few candidates: 3 invocation\(s\) of rank 0 to align, but 3 outer kernel\(s\) "
        r"match '\(\?i\)hyper_\?mega_\?moe' and 1 are skipped \(kernel_index\)",
    ):
        merge_chrome_traces(tmp_path / "t.json", store, tmp_path / "f.json", kernel_index=1)
    merged = merge_chrome_traces(tmp_path / "t.json", store, tmp_path / "f.json")
    excess = [i["exceedsOuterKernelUs"] for i in merged.report["invocations"]]
    assert excess == [5.9, 5.9, 0.0]
    assert merged.report["warnings"] == [
        "2 invocation(s) last longer than their outer kernel (first: invocation 10, by 5.9 us): "
        "the kernel may not be the one that ran them, or the cycle frequency is off"
    ]


def test_rebase_shifts_every_event_exactly(store: Store, tmp_path: Path) -> None:
    mega_kernel(store, launches=2)
    kernels = [("HyperMegaMoe_kernel", "10.125", "40.000"), ("hyper_mega_moe", "60.001", "9.999")]
    write_kineto(tmp_path / "k.json", kernels, base=EPOCH_US)
    merged = merge_chrome_traces(
        tmp_path / "k.json", store, tmp_path / "f.json", rebase_timestamps=True
    )
    outer, fused = load(tmp_path / "k.json"), load(tmp_path / "f.json")
    rebase = merged.report["rebase"]
    shift = Decimal(EPOCH_US)
    assert rebase == {
        "applied": True,
        "shiftNs": EPOCH_US * 1000,
        "shiftUs": f"{EPOCH_US}.000",
        "baseTimeNanoseconds": {
            "before": 1_700_000_000_000_000_000,
            "after": 1_700_000_000_000_000_000 + EPOCH_US * 1000,
        },
    }
    assert fused["baseTimeNanoseconds"] == rebase["baseTimeNanoseconds"]["after"]
    kept, added = split(fused, outer)
    for before, after in zip(events_of(outer), kept, strict=True):
        if "ts" in before:
            assert after["ts"] + shift == before["ts"]
        assert {k: v for k, v in after.items() if k != "ts"} == {
            k: v for k, v in before.items() if k != "ts"
        }
    starts = sorted(e["ts"] for e in added_slices(added) if e["name"] == "GMM1_WaitDependency")
    assert starts == [Decimal("10.125"), Decimal("60.001")]


class _Events(msgspec.Struct):
    traceEvents: list[msgspec.Raw]


class _Time(msgspec.Struct):
    ts: msgspec.Raw = msgspec.Raw()


@pytest.mark.parametrize("rebase", [False, True])
def test_outer_events_are_copied_byte_for_byte(
    store: Store, tmp_path: Path, monkeypatch, rebase: bool
) -> None:
    """Each outer event's text is in the fused trace as written (read in many chunks),
    with a rebase but for its ``ts`` value."""
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 256)
    mega_kernel(store, launches=2)
    kernels = [("HyperMegaMoe_kernel", "10.125", "40.000"), ("hyper_mega_moe", "60.001", "9.999")]
    write_kineto(tmp_path / "k.json", kernels, base=EPOCH_US)
    merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", rebase_timestamps=rebase)
    before = msgspec.json.decode((tmp_path / "k.json").read_bytes(), type=_Events).traceEvents
    after = msgspec.json.decode((tmp_path / "f.json").read_bytes(), type=_Events).traceEvents
    kept = [bytes(event) for event in after[: len(before)]]
    written = [bytes(event) for event in before]
    if rebase:

        def without_ts(event: bytes) -> bytes:
            ts = bytes(msgspec.json.decode(event, type=_Time).ts)
            return event.replace(ts, b"@") if ts else event

        assert [without_ts(e) for e in kept] == [without_ts(e) for e in written]
        assert kept != written
    else:
        assert kept == written


def test_rebase_keeps_string_timestamps_strings(store: Store, tmp_path: Path) -> None:
    write_npu_trace(tmp_path / "t.json")
    mega_kernel(store)
    merge_chrome_traces(tmp_path / "t.json", store, tmp_path / "f.json", rebase_timestamps=True)
    outer, fused = load(tmp_path / "t.json"), load(tmp_path / "f.json")
    kept, _ = split(fused, outer)
    first = min(Decimal(e["ts"]) for e in outer if "ts" in e)
    shift = first.to_integral_value(rounding="ROUND_FLOOR")
    for before, after in zip(outer, kept, strict=True):
        if "ts" in before:
            assert isinstance(after["ts"], str)
            assert Decimal(after["ts"]) + shift == Decimal(before["ts"])


def test_an_arrow_that_would_end_before_it_begins_is_left_out_of_the_fused_trace(
    store: Store, tmp_path: Path
) -> None:
    """AIV/1's wait ends at cycle 280, before the trigger that releases it starts (400 ns
    later, at 290): its f would come before its s, which both viewers drop. The fused trace
    leaves each such arrow out, as the standalone export does, and its report warns; the
    added events open in Perfetto (the checker passes them)."""
    write_npu_trace(tmp_path / "t.json")
    mega_kernel(store, wait_end=280)
    merged = merge_chrome_traces(tmp_path / "t.json", store, tmp_path / "f.json", run="mk")
    warning = (
        "3 flow(s) end before they begin (a wait that ended before its trigger started): "
        "the fused trace cannot draw them"
    )
    assert merged.report["warnings"] == [warning]
    assert merged.report["counts"]["dependencyArrows"] == 0
    outer = load(tmp_path / "t.json")
    _, added = split(load(tmp_path / "f.json"), outer)
    assert [e for e in added if e["ph"] in "sf"] == []
    plain = json.loads((tmp_path / "f.json").read_text())
    named = [e for e in plain if e["ph"] == "M" and e["name"] == "process_name" and e["pid"] == 800]
    check_trace({"traceEvents": named + plain[len(outer) : -1]})


def test_a_standalone_trace_fuses_like_the_store_selection(store: Store, tmp_path: Path) -> None:
    write_npu_trace(tmp_path / "t.json")
    mega_kernel(store)
    export_chrome_trace(store, tmp_path / "mk.json.gz", run="mk")
    from_file = merge_chrome_traces(
        tmp_path / "t.json", tmp_path / "mk.json.gz", tmp_path / "a.json"
    )
    from_store = merge_chrome_traces(tmp_path / "t.json", store, tmp_path / "b.json", run="mk")
    assert load(tmp_path / "a.json")[:-1] == load(tmp_path / "b.json")[:-1]
    assert from_file.report["invocations"] == from_store.report["invocations"]
    assert from_file.report["megaKernelTrace"]["path"] == str(tmp_path / "mk.json.gz")


def test_a_mega_kernel_trace_must_be_schema_v1(store: Store, tmp_path: Path) -> None:
    write_npu_trace(tmp_path / "t.json")
    mega_kernel(store)
    with pytest.raises(FuseError, match=r"is not a MegaKernel trace of schema v1"):
        merge_chrome_traces(tmp_path / "t.json", tmp_path / "t.json", tmp_path / "f.json")
    export_chrome_trace(store, tmp_path / "mk.json", run="mk")
    trace = json.loads((tmp_path / "mk.json").read_text())
    del trace["megaKernelCycleTrace"]["invocations"][1]["rank"]
    (tmp_path / "mk.json").write_text(json.dumps(trace))
    with pytest.raises(FuseError, match=r"an invocation of its megaKernelCycleTrace has no 'rank'"):
        merge_chrome_traces(tmp_path / "t.json", tmp_path / "mk.json", tmp_path / "f.json")
    assert not (tmp_path / "f.json").exists()


def test_a_failed_fusion_leaves_an_older_output_alone(store: Store, tmp_path: Path) -> None:
    write_npu_trace(tmp_path / "t.json", launches=2)
    mega_kernel(store)
    (tmp_path / "f.json").write_text("older")
    with pytest.raises(FuseError, match="too few candidates"):
        merge_chrome_traces(tmp_path / "t.json", store, tmp_path / "f.json")
    assert (tmp_path / "f.json").read_text() == "older"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json", "store", "t.json"]


def test_cli_fuse(capsys, store: Store, tmp_path: Path) -> None:
    write_npu_trace(tmp_path / "t.json")
    mega_kernel(store)
    base = ["fuse", str(tmp_path / "t.json"), "--store", str(store.root), "--run", "mk"]
    host = ["--kernel-pattern", "^aclnnHyperMegaMoe$"]
    assert cli.main([*base, *host, "-o", str(tmp_path / "f.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mcprof: error: kernel pattern '^aclnnHyperMegaMoe$' matches 3 host")
    code = cli.main([*base, *host, "--allow-host-alignment", "-o", str(tmp_path / "f.json")])
    out, err = capsys.readouterr()
    assert code == 0
    assert err.startswith("mcprof: warning: aligned to 3 host-side event(s)")
    assert out.startswith(
        f"{tmp_path / 'f.json'}: 12 records of 3 invocation(s) (22 events with threads and "
        "arrows) on 2 new thread(s) of pid 21356, aligned to 'aclnnHyperMegaMoe' (pattern "
        "'^aclnnHyperMegaMoe$'); outer trace 1e00d0113dae1291: 68 events kept"
    )
    assert cli.main([*base, "-o", str(tmp_path / "g.json")]) == 0
    assert (
        "aligned to 'aclnnHyperMegaMoe_HyperMegaMoeAiCore_HyperMegaMoe'" in capsys.readouterr().out
    )


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in {keys}"
    return dict(pairs)


@pytest.mark.parametrize("piece", [1 << 20, 61])
def test_a_fused_trace_fused_again_keeps_one_report(
    store: Store, tmp_path: Path, monkeypatch, piece: int
) -> None:
    # Read in pieces of 61 bytes, the replaced report spans many of them.
    monkeypatch.setattr("multicore_profiler.fuse.merge.CHUNK_BYTES", piece)
    kernels = [("HyperMegaMoe_kernel", "10.125", "40.000"), ("hyper_mega_moe", "60.001", "9.999")]
    write_kineto(tmp_path / "k.json", kernels, base=EPOCH_US)
    mega_kernel(store, launches=2)
    merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "once.json")
    again = merge_chrome_traces(tmp_path / "once.json", store, tmp_path / "twice.json")
    text = (tmp_path / "twice.json").read_text()
    fused = json.loads(text, object_pairs_hook=no_duplicate_keys)
    assert fused["megaKernelTraceMerge"] == fused["metadata"]["megaKernelTraceMerge"]
    assert fused["megaKernelTraceMerge"]["outerTrace"]["path"] == str(tmp_path / "once.json")
    assert again.report["counts"]["addedThreads"] == 2
    threads = [e["tid"] for e in fused["traceEvents"] if e.get("name") == "thread_name"]
    # The second fusion's threads come above the first one's: 7 (stream), 8, 9, then 10, 11.
    assert threads == [7, 8, 9, 10, 11]
    # Its arrows' ids follow the first one's, so no arrow joins the other fusion's.
    starts = [e["id"] for e in fused["traceEvents"] if e.get("ph") == "s"]
    assert starts == [1, 2, 3, 4]


def test_ranks_pair_with_the_outer_trace(store: Store, tmp_path: Path) -> None:
    write_npu_trace(tmp_path / "t.json")
    run = RunInfo.begin(run_id="mk")
    store.write_run(run)
    for rank in (0, 1):
        ingest_buffers(
            store,
            [launch(100_000 * i, scale=rank + 1) for i in range(3)],
            LAYOUT,
            frequency_hz=50e6,
            run_id="mk",
            kernel=KernelInfo(kernel_name=KERNEL),
            launches=Launches(rank=rank, device=rank, step=0),
        )
    with pytest.raises(FuseError, match=r"names no rank .* has ranks \[0, 1\]; give rank"):
        merge_chrome_traces(tmp_path / "t.json", store, tmp_path / "f.json")
    with pytest.raises(FuseError, match=r"the outer trace is rank 5 but the MegaKernel trace"):
        merge_chrome_traces(tmp_path / "t.json", store, tmp_path / "f.json", rank=5)
    merged = merge_chrome_traces(tmp_path / "t.json", store, tmp_path / "f.json", rank=1)
    assert [(i["rank"], i["deviceId"], i["spanUs"]) for i in merged.report["invocations"]] == [
        (1, 1, 12.0)
    ] * 3


def fused_at(store: Store, tmp_path: Path, frequency_hz: float, kernel_us: str) -> dict[str, Any]:
    """The report of three 300-cycle invocations stored at ``frequency_hz`` fused into
    kernels of ``kernel_us`` each."""
    run = RunInfo.begin(run_id="mk")
    store.write_run(run)
    ingest_buffers(
        store,
        [launch(100_000 * i) for i in range(3)],
        LAYOUT,
        frequency_hz=frequency_hz,
        run_id="mk",
        kernel=KernelInfo(kernel_name=KERNEL, frequency_source="device"),
        launches=Launches(rank=0, device=0, step=0),
    )
    kernels = [(KERNEL, f"{10 + 20 * i}.000", kernel_us) for i in range(3)]
    write_kineto(tmp_path / "k.json", kernels, base=EPOCH_US)
    return merge_chrome_traces(tmp_path / "k.json", store, tmp_path / "f.json", run="mk").report


def test_spans_off_by_one_factor_suggest_the_frequency_that_fits(
    store: Store, tmp_path: Path
) -> None:
    # The counter runs at 50 MHz (6 us spans in 6.2 us kernels); the device said 100.
    report = fused_at(store, tmp_path, 100e6, "6.200")
    assert report["frequencyCheck"] == {
        "cycleFrequencyMHz": 100.0,
        "source": "device",
        "invocations": 3,
        "spanToKernel": {"min": 0.4839, "median": 0.4839, "max": 0.4839},
        "consistent": True,
        "fits": False,
        "estimatedMHz": 48.387,
        "suggestedMHz": 50.0,
    }
    assert report["warnings"] == [
        "every invocation's span is 0.48x its outer kernel's duration at 100 MHz (from "
        "device): the cycle counter would fit 50 MHz; capture with that frequency_hz"
    ]


def test_spans_that_fit_their_kernels_raise_nothing(store: Store, tmp_path: Path) -> None:
    report = fused_at(store, tmp_path, 50e6, "6.200")
    check = report["frequencyCheck"]
    assert (check["fits"], check["consistent"], check["suggestedMHz"]) == (True, True, None)
    assert check["spanToKernel"]["median"] == 0.9677
    assert report["warnings"] == []


@pytest.mark.parametrize(
    ("spans_and_durations", "consistent", "estimated"),
    [
        # Ratios 0.5 and 0.3: no single factor, so no suggestion.
        ([(5000, 10_000), (3000, 10_000)], False, None),
        # A hundredth of each kernel: no counter runs at 0.5 MHz; the kernel is the suspect.
        ([(100, 10_000), (100, 10_000)], True, 0.5),
        # Twice as long as their kernels: a 100 MHz counter read as 50 MHz.
        ([(20_000, 10_000), (19_800, 9_950)], True, 99.749),
    ],
)
def test_frequency_check_suggests_only_a_common_frequency(
    spans_and_durations: list[tuple[int, int]], consistent: bool, estimated: float | None
) -> None:
    pairs = [
        {
            "span_ns": span,
            "outer_dur_ns": dur,
            "frequency_mhz": 50.0,
            "frequency_source": "soc_table",
        }
        for span, dur in spans_and_durations
    ]
    check = frequency_check(pairs)
    assert (check["consistent"], check["fits"], check["estimatedMHz"]) == (
        consistent,
        False,
        estimated,
    )
    assert check["suggestedMHz"] == (100.0 if estimated == 99.749 else None)
    single = frequency_check(pairs[:1])
    assert (single["invocations"], single["spanToKernel"], single["suggestedMHz"]) == (
        1,
        None,
        None,
    )
