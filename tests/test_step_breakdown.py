"""Time breakdowns of outer traces: ``step_time_breakdown`` (msprof-analyze's step_trace_time
per step), ``overlap_analysis`` (torch_npu's own Overlap Analysis slices) and
``temporal_breakdown`` (HTA's temporal breakdown and comm/comp overlap per trace).

Checked against the anchors themselves: HTA's ``get_temporal_breakdown`` and
``get_comm_comp_overlap`` computed here on the kineto traces, msprof-analyze's
``step_trace_time.csv`` of a real torch_npu capture and the capture's Overlap Analysis slices,
and a small kineto-shaped trace written here with round numbers for each rule.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hta_breakdown import rank0_dir
from shared_fixtures import shared_fixture

from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.storage.store import Store

A100 = "kineto/a100_training_rank0.json.gz"
MI250 = "kineto/mi250_minitoy_train.json.gz"
ALEXNET = "kineto/a100_alexnet.json.gz"
IMAGENET = "ascend/torchnpu_imagenet_2025_L0_rank0_trace_view.json.gz"
IMAGENET_STEPS = "ascend/torchnpu_imagenet_2025_L0_rank0_step_trace_time.csv"

US = 1000
"""ns per µs."""


def rows(store: Store, query: str, params: Any = None) -> list[dict[str, Any]]:
    return store.sql(query, params).to_pylist()


def hta_breakdown(trace: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """HTA's temporal breakdown (in ns) and comm/comp overlap percentage of a one-rank trace, with
    HTA's rounding of fractional-µs timestamps off (``HTA_DISABLE_NS_ROUNDING``), so that
    it works on the trace's own times as the store does."""
    from hta.trace_analysis import TraceAnalysis

    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    with rank0_dir(trace) as directory:
        analysis = TraceAnalysis(trace_dir=str(directory))
        temporal = analysis.get_temporal_breakdown(visualize=False).iloc[0]
        overlap = analysis.get_comm_comp_overlap(visualize=False).iloc[0]
    return {
        "idle_ns": temporal["idle_time(us)"] * US,
        "compute_ns": temporal["compute_time(us)"] * US,
        "non_compute_ns": temporal["non_compute_time(us)"] * US,
        "kernel_ns": temporal["kernel_time(us)"] * US,
        "comm_comp_overlap_pctg": overlap["comp_comm_overlap_pctg"],
    }


def temporal(store: Store, trace: Path) -> dict[str, Any]:
    source_id = ingest_trace(store, trace).source_id
    (row,) = rows(store, "SELECT * FROM temporal_breakdown WHERE source_id = ?", [source_id])
    return row


# HTA: temporal breakdown and comm/comp overlap ------------------------------------------


def test_temporal_breakdown_is_htas_on_the_nccl_training_trace(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Integer-µs trace: HTA's µs times are exact, so every time agrees to the ns.
    hta = hta_breakdown(shared_fixture(A100), monkeypatch)
    got = temporal(store, shared_fixture(A100))
    for column in ("idle_ns", "compute_ns", "non_compute_ns", "kernel_ns"):
        assert got[column] == hta[column], column
    assert round(100 * got["comm_comp_overlap_ratio"], 2) == hta["comm_comp_overlap_pctg"] == 1.37
    assert (got["idle_ns"], got["compute_ns"], got["non_compute_ns"], got["kernel_ns"]) == (
        705_853_000, 143_836_000, 166_865_000, 1_016_554_000,
    )  # fmt: skip
    assert got["communication_ns"] == 136_490_000
    assert got["comm_comp_overlap_ns"] == 1_871_000


def test_temporal_breakdown_is_htas_on_a_fractional_us_trace(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # mi250's times have ns digits; HTA holds them as float µs, so agreement is to the ns.
    hta = hta_breakdown(shared_fixture(MI250), monkeypatch)
    got = temporal(store, shared_fixture(MI250))
    for column in ("idle_ns", "compute_ns", "non_compute_ns", "kernel_ns"):
        assert abs(got[column] - hta[column]) < 1, column
    assert (got["idle_ns"], got["compute_ns"], got["non_compute_ns"], got["kernel_ns"]) == (
        8_762_845, 110_881, 38_161, 8_911_887,
    )  # fmt: skip
    assert got["comm_comp_overlap_ratio"] is None
    assert math.isnan(hta["comm_comp_overlap_pctg"])


def test_temporal_breakdown_counts_cuda_syncs_as_gpu_time_like_hta(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # AlexNet's 41 cuda_sync events are GPU time for HTA (and here); HTA also classes the 20
    # "Stream Wait Event" ones as computation (their name holds no "Sync"), and 7 µs of them
    # lie outside the compute kernels: here they are waits (class 'other'), non-compute.
    hta = hta_breakdown(shared_fixture(ALEXNET), monkeypatch)
    got = temporal(store, shared_fixture(ALEXNET))
    assert got["idle_ns"] == hta["idle_ns"] == 12_929_684_000
    assert got["kernel_ns"] == hta["kernel_ns"] == 12_996_011_000
    assert got["compute_ns"] + got["non_compute_ns"] == hta["compute_ns"] + hta["non_compute_ns"]
    assert got["compute_ns"] == hta["compute_ns"] - 7_000 == 10_630_000


# msprof-analyze: the torch_npu capture's step_trace_time.csv ------------------------------

CSV_COLUMNS = {
    "Computing": "computing_ns",
    "Communication(Not Overlapped)": "communication_not_overlapped_ns",
    "Overlapped": "overlapped_ns",
    "Communication": "communication_ns",
    "Free": "free_ns",
    "Stage": "stage_ns",
    "Bubble": "bubble_ns",
    "Preparing": "preparing_ns",
}


@pytest.fixture
def imagenet(store: Store) -> dict[str, Any]:
    source_id = ingest_trace(store, shared_fixture(IMAGENET)).source_id
    (row,) = rows(store, "SELECT * FROM step_time_breakdown WHERE source_id = ?", [source_id])
    return row


def step_trace_time(name: str = IMAGENET_STEPS) -> dict[str, float]:
    """The one row of a capture's step_trace_time.csv, in float µs."""
    with shared_fixture(name).open(newline="") as handle:
        (row,) = csv.DictReader(handle)
    return {column: float(value) for column, value in row.items()}


def test_step_time_breakdown_is_msprof_analyzes_step_trace_time(imagenet: dict[str, Any]) -> None:
    expected = step_trace_time()
    assert imagenet["step_name"] == f"ProfilerStep#{int(expected['Step'])}"
    for column, name in CSV_COLUMNS.items():
        assert abs(imagenet[name] / US - expected[column]) <= 1, column
    # The exact ns: msprof's csv holds float µs of epoch timestamps (0.25 µs steps).
    # Communication is the hcom ops' union, as the Overlap Analysis slices' (an SDMA task
    # ends 1 ns after its op).
    assert {name: imagenet[name] for name in CSV_COLUMNS.values()} == {
        "computing_ns": 8_827_459,
        "communication_not_overlapped_ns": 81_515_617,
        "overlapped_ns": 4_001_272,
        "communication_ns": 85_516_889,
        "free_ns": 25_908_107,
        "stage_ns": 116_251_183,
        "bubble_ns": 0,
        "preparing_ns": 19_358_190,
    }
    assert imagenet["computing_share"] == pytest.approx(8_827_459 / 116_251_183)


def test_overlap_analysis_slices_agree_with_the_breakdown_and_the_csv(
    store: Store, imagenet: dict[str, Any]
) -> None:
    expected = step_trace_time()
    (slices,) = rows(store, "SELECT * FROM overlap_analysis")
    assert (slices["source_id"], slices["step_index"]) == (
        imagenet["source_id"], imagenet["step_index"],
    )  # fmt: skip
    for name in ("computing_ns", "communication_ns", "communication_not_overlapped_ns", "free_ns"):
        assert abs(slices[name] - imagenet[name]) <= US, name
    assert (
        slices["computing_ns"], slices["communication_ns"],
        slices["communication_not_overlapped_ns"], slices["free_ns"],
    ) == (8_827_473, 85_516_889, 81_515_607, 25_908_102)  # fmt: skip
    for column in ("Computing", "Communication", "Communication(Not Overlapped)", "Free"):
        assert abs(slices[CSV_COLUMNS[column]] / US - expected[column]) <= 1, column


IMAGENET_2024 = {
    # level: the exact ns of each breakdown column (CSV_COLUMNS' order).
    "L0": (9_882_831, 31_347_494, 4_215_813, 35_563_307, 3_870_986, 45_101_311, 0, 13_839_980),
    "L1": (9_847_652, 66_526_552, 4_260_795, 70_787_347, 7_268_631, 83_642_835, 0, 14_344_315),
}
"""The 2024 ImageNet captures (rank 0), whose device tasks all carry the Task Type "Other":
runtime tasks are named by their type (NOTIFY_WAIT, EVENT_RECORD, MEMCPY_ASYNC,
REDUCE_ASYNC_V2, L0) or "Other" (HCCL's helper streams, L1), kernels by their op."""


@pytest.mark.parametrize("level", sorted(IMAGENET_2024))
def test_the_2024_captures_breakdowns_are_their_step_trace_time(store: Store, level: str) -> None:
    prefix = f"ascend/torchnpu_imagenet_2024_{level}_rank0"
    trace = f"{prefix}_trace_view.json" + (".gz" if level == "L1" else "")
    ingest_trace(store, shared_fixture(trace))
    (got,) = rows(store, "SELECT * FROM step_time_breakdown")
    expected = step_trace_time(f"{prefix}_step_trace_time.csv")
    assert got["step_name"] == f"ProfilerStep#{int(expected['Step'])}" == "ProfilerStep#50"
    for column, name in CSV_COLUMNS.items():
        assert abs(got[name] / US - expected[column]) <= 1, column
    assert tuple(got[name] for name in CSV_COLUMNS.values()) == IMAGENET_2024[level]
    # The trace's own Overlap Analysis slices (summing to the csv) agree to the µs too.
    (slices,) = rows(store, "SELECT * FROM overlap_analysis")
    for name in ("computing_ns", "communication_ns", "communication_not_overlapped_ns", "free_ns"):
        assert abs(slices[name] - got[name]) <= US, name


def kernel_details(name: str) -> set[tuple[str, int]]:
    """(name, start ns) of the kernels (not the HCCL ops) a capture's kernel_details.csv lists."""
    with shared_fixture(name).open(newline="") as handle:
        return {
            # Start Time(us): µs with 3 decimals (and a trailing tab): its digits are the ns.
            (row["Name"], int(row["Start Time(us)"].strip().replace(".", "")))
            for row in csv.DictReader(handle)
            if row["Accelerator Core"] != "HCCL"
        }


@pytest.mark.parametrize(
    ("level", "others"),
    [
        # L0 names HCCL's tasks by their runtime type, on its master stream 3 and its helper
        # streams 11, 12 and 13; event records and waits synchronize streams.
        ("L0", [("communication", "communication", 4, [0]),
                ("communication_task", "communication", 1272, [3, 11, 12, 13]),
                ("kernel", "memory", 24, [1]), ("kernel", "other", 17, [1, 3])]),
        # L1 names the helper streams' tasks "Other", its Task Type: no op runs in them.
        ("L1", [("communication", "communication", 4, [0]),
                ("communication_task", "communication", 352, [3]),
                ("kernel", "memory", 24, [1]), ("kernel", "other", 941, [1, 2, 3, 11, 12, 13])]),
    ],
)  # fmt: skip
def test_the_2024_compute_ops_are_the_kernels_of_kernel_details(
    store: Store, level: str, others: list[tuple[str, str, int, list[int]]]
) -> None:
    prefix = f"ascend/torchnpu_imagenet_2024_{level}_rank0"
    trace = f"{prefix}_trace_view.json" + (".gz" if level == "L1" else "")
    ingest_trace(store, shared_fixture(trace))
    compute = rows(store, "SELECT name, ts_ns FROM breakdown_ops WHERE class = 'compute'")
    assert {(op["name"], op["ts_ns"]) for op in compute} == kernel_details(
        f"{prefix}_kernel_details.csv"
    )
    assert len(compute) == 345
    got = rows(
        store,
        "SELECT b.kind, b.class, count(*) AS ops, list_sort(list_distinct(list(d.tid))) AS tids "
        "FROM breakdown_ops b JOIN device_ops d USING (source_id, event_index) "
        "WHERE b.class <> 'compute' GROUP BY ALL ORDER BY ALL",
    )
    assert [tuple(row.values()) for row in got] == others


def test_the_older_torch_npu_trace_agrees_with_its_overlap_analysis(store: Store) -> None:
    # 2024's trace: device tasks of Task Type "Other" and "AI_CPU", its copies MEMCPY_ASYNC.
    ingest_trace(store, shared_fixture("ascend/torchnpu_advisor_trace_view.json.gz"))
    (got,) = rows(store, "SELECT * FROM step_time_breakdown")
    (slices,) = rows(store, "SELECT * FROM overlap_analysis")
    assert (got["computing_ns"], got["free_ns"], got["communication_ns"]) == (
        slices["computing_ns"], 9_481_650, slices["communication_ns"],
    ) == (1_788_267, 9_481_650, 0)  # fmt: skip
    assert abs(got["free_ns"] - slices["free_ns"]) <= US


def test_a_kineto_trace_has_no_overlap_analysis(store: Store) -> None:
    ingest_trace(store, shared_fixture(MI250))
    assert rows(store, "SELECT * FROM overlap_analysis") == []


# Hand-built: each rule with round numbers ------------------------------------------------

ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, ncclWork*)"
GEMM = "ampere_sgemm_128x64_nn"
COPY = "Memcpy DtoD (Device -> Device)"

STEPS: list[tuple[str, int, list[tuple[str, str, int, int, int]]]] = [
    # (annotation, its start in µs, [(cat, name, start, duration, stream)])
    (
        "ProfilerStep#1", 0,
        [("kernel", GEMM, 100, 300, 7), ("kernel", ALL_REDUCE, 300, 400, 20),
         ("gpu_memcpy", COPY, 700, 100, 7), ("kernel", GEMM, 900, 100, 7)],
    ),
    ("ProfilerStep#2", 2000, []),
    (
        "ProfilerStep#3", 3000,
        [("kernel", ALL_REDUCE, 3100, 400, 20), ("kernel", "hcom_receive_1", 3400, 200, 21)],
    ),
    ("ProfilerStep#4", 5000, [("gpu_memcpy", COPY, 5100, 200, 7)]),
    ("ProfilerStep#5", 7000, [("kernel", GEMM, 7100, 100, 7)]),
]  # fmt: skip
"""Step 1: compute and communication overlapping for 100 µs, a copy, a gap; step 2: no
device activity; step 3: only communication, an hcom_receive among it; step 4: only a copy;
step 5: the last (the default rule leaves it out of a trace of several steps)."""


def write_steps_trace(path: Path) -> Path:
    """A kineto-shaped trace of STEPS: each annotation launches its ops from inside it."""
    events: list[dict[str, Any]] = []
    correlation = 0
    for name, start, ops in STEPS:
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": name, "pid": 10, "tid": 10,
             "ts": start, "dur": 90}
        )  # fmt: skip
        for k, (cat, op, ts, dur, stream) in enumerate(ops):
            correlation += 1
            launch = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
            events.append(
                {"ph": "X", "cat": "cuda_runtime", "name": launch, "pid": 10, "tid": 10,
                 "ts": start + 1 + k, "dur": 1, "args": {"correlation": correlation}}
            )  # fmt: skip
            events.append(
                {"ph": "X", "cat": cat, "name": op, "pid": 0, "tid": stream, "ts": ts,
                 "dur": dur, "args": {"correlation": correlation, "stream": stream,
                                      "device": 0}}
            )  # fmt: skip
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    return path


BREAKDOWN_COLUMNS = (
    "step_name", "start_ns", "end_ns", "stage_start_ns", "stage_end_ns", "computing_ns",
    "communication_ns", "communication_not_overlapped_ns", "overlapped_ns", "free_ns",
    "stage_ns", "bubble_ns", "preparing_ns",
)  # fmt: skip


def test_hand_built_steps_have_exact_breakdowns(store: Store, tmp_path: Path) -> None:
    ingest_trace(store, write_steps_trace(tmp_path / "steps.json"))
    got = rows(
        store,
        f"SELECT {', '.join(BREAKDOWN_COLUMNS)} FROM step_time_breakdown ORDER BY step_index",
    )
    base = rows(store, "SELECT min(start_ns) AS t FROM step_time_breakdown")[0]["t"] - 100 * US

    def step(name: str, *us: int | None) -> dict[str, Any]:
        times = [None if t is None else base + t * US for t in us[:4]]
        return dict(zip(BREAKDOWN_COLUMNS, [name, *times, *(t * US for t in us[4:])], strict=True))

    assert got == [
        # Compute [100, 400) and [900, 1000); all-reduce [300, 700): overlapped 100 µs. The
        # stage is [100, 1000); free is the copy [700, 800) and the gap [800, 900). Its
        # period runs to step 3's first op: step 2 launched nothing and has no period.
        step("ProfilerStep#1", 100, 3100, 100, 1000, 400, 400, 300, 100, 200, 900, 0, 100),
        # Only communication [3100, 3600): all of it not overlapped; the hcom_receive
        # [3400, 3600) is the bubble, out of the stage.
        step("ProfilerStep#3", 3100, 5100, 3100, 3600, 0, 500, 500, 0, 0, 300, 200, 100),
        # Only a copy: no compute or communication, so no stage.
        step("ProfilerStep#4", 5100, 7100, None, None, 0, 0, 0, 0, 0, 0, 0, 0),
    ]
    shares = rows(
        store,
        "SELECT step_name, computing_share, overlapped_share, free_share, bubble_share "
        "FROM step_time_breakdown ORDER BY step_index",
    )
    assert shares == [
        {"step_name": "ProfilerStep#1", "computing_share": 4 / 9, "overlapped_share": 1 / 9,
         "free_share": 2 / 9, "bubble_share": 0.0},
        {"step_name": "ProfilerStep#3", "computing_share": 0.0, "overlapped_share": 0.0,
         "free_share": 0.0, "bubble_share": 2 / 3},
        {"step_name": "ProfilerStep#4", "computing_share": None, "overlapped_share": None,
         "free_share": None, "bubble_share": None},
    ]  # fmt: skip


def test_hand_built_temporal_breakdown(store: Store, tmp_path: Path) -> None:
    ingest_trace(store, write_steps_trace(tmp_path / "steps.json"))
    (got,) = rows(store, "SELECT * EXCLUDE (source_id, rank) FROM temporal_breakdown")
    # HTA's window: the ops launched before the last step annotation (step 5's GEMM is
    # out), from the first op's start (100) to the last one's end (the copy's, 5300).
    # Busy: [100, 800) + [900, 1000) + [3100, 3600) + [5100, 5300) = 1500 µs.
    assert got == {
        "idle_ns": 3700 * US,
        "compute_ns": 400 * US,
        "non_compute_ns": 1100 * US,
        "kernel_ns": 5200 * US,
        "communication_ns": 900 * US,
        "comm_comp_overlap_ns": 100 * US,
        "idle_share": 3700 / 5200,
        "compute_share": 400 / 5200,
        "non_compute_share": 1100 / 5200,
        "comm_comp_overlap_ratio": 100 / 900,
    }


def test_a_trace_with_one_step_annotation_keeps_every_op(store: Store, tmp_path: Path) -> None:
    # With fewer than two step annotations HTA cuts nothing; the one step here is the
    # capture's one step (closed at its own last op's end).
    path = tmp_path / "one.json"
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 10, "tid": 10,
         "ts": 0, "dur": 50},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 10,
         "ts": 1, "dur": 1, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": 10, "dur": 30,
         "args": {"correlation": 1, "stream": 7, "device": 0}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 10,
         "ts": 60, "dur": 1, "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": ALL_REDUCE, "pid": 0, "tid": 20, "ts": 70,
         "dur": 30, "args": {"correlation": 2, "stream": 20, "device": 0}},
    ]  # fmt: skip
    path.write_text(json.dumps({"traceEvents": events}))
    ingest_trace(store, path)
    (got,) = rows(store, "SELECT idle_ns, compute_ns, kernel_ns FROM temporal_breakdown")
    assert got == {"idle_ns": 30 * US, "compute_ns": 30 * US, "kernel_ns": 90 * US}
    (step,) = rows(store, "SELECT stage_ns, computing_ns, free_ns FROM step_time_breakdown")
    assert step == {"stage_ns": 30 * US, "computing_ns": 30 * US, "free_ns": 0}
