"""Outer-kernel views of torch_npu captures: the step of a one-step capture (the last-step
rule), HCCL communication as collectives, and per-kernel parity with msprof.

The real capture (``torchnpu_imagenet_2025_L0_rank0_*``, one recorded step) is checked
against ``kineto_reference`` (plain Python over the JSON) and against msprof's own
``kernel_details.csv``; small torch_npu-shaped traces, written here with round numbers,
check each rule by hand.
"""

from __future__ import annotations

import csv
import json
import re
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import kineto_reference as ref
import pytest
from shared_fixtures import shared_fixture

from multicore_profiler.analysis.outer_kernel_rules import OuterKernelRules
from multicore_profiler.errors import RulesError
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.storage.store import Store

IMAGENET = "ascend/torchnpu_imagenet_2025_L0_rank0_trace_view.json.gz"
KERNEL_DETAILS = "ascend/torchnpu_imagenet_2025_L0_rank0_kernel_details.csv"


def rows(store: Store, query: str, params: Any = None) -> list[dict[str, Any]]:
    return store.sql(query, params).to_pylist()


def us_to_ns(text: str, rounding: str = ROUND_HALF_UP) -> int:
    return int((Decimal(text.strip()) * 1000).quantize(Decimal(1), rounding=rounding))


@pytest.fixture(scope="module")
def imagenet_events() -> list[dict[str, Any]]:
    return ref.load_events(shared_fixture(IMAGENET))


@pytest.fixture
def imagenet(store: Store) -> str:
    return ingest_trace(store, shared_fixture(IMAGENET)).source_id


# The real capture ---------------------------------------------------------------------------


def test_a_one_step_capture_has_its_step(store: Store, imagenet: str, imagenet_events) -> None:
    own = ref.own_ops(imagenet_events)
    ((annotation, ops),) = own.items()
    got = rows(
        store,
        "SELECT step_index, step_name, step_number, annotation_index, start_ns, end_ns, "
        "period_ns, own_launches, closed_by FROM steps WHERE source_id = $1",
        [imagenet],
    )
    start, end = min(o.start_ns for o in ops), max(o.end_ns for o in ops)
    assert got == [
        {
            "step_index": 0,
            "step_name": "ProfilerStep#50",
            "step_number": 50,
            "annotation_index": annotation,
            "start_ns": start,
            "end_ns": end,
            "period_ns": end - start,
            "own_launches": len(ops),
            "closed_by": "own_end",
        }
    ]
    # From the first own task (a MEMCPY_ASYNC) to the end of the last one.
    assert (start, end) == (1736405443876953510, 1736405443997661503)


def test_hcom_ops_are_collectives_and_their_tasks_their_parts(store: Store, imagenet: str) -> None:
    got = rows(
        store,
        "SELECT collective_index, op, name, ts_ns, dur_ns FROM collectives "
        "WHERE source_id = $1 ORDER BY collective_index",
        [imagenet],
    )
    assert got == [
        {"collective_index": 0, "op": "all_reduce", "name": "hcom_allReduce__868_0_1",
         "ts_ns": 1736405443909176934, "dur_ns": 72994438},
        {"collective_index": 1, "op": "all_reduce", "name": "hcom_allReduce__868_1_1",
         "ts_ns": 1736405443982175673, "dur_ns": 2193584},
        {"collective_index": 2, "op": "all_reduce", "name": "hcom_allReduce__868_2_1",
         "ts_ns": 1736405443984372977, "dur_ns": 2489530},
        {"collective_index": 3, "op": "all_reduce", "name": "hcom_allReduce__868_3_1",
         "ts_ns": 1736405443986866246, "dur_ns": 7839337},
    ]  # fmt: skip
    kinds = rows(
        store,
        "SELECT kind, family, task_type, tid, count(*) AS n FROM kernels WHERE source_id = $1 "
        "AND (family = 'collective' OR task_type LIKE 'SDMA%') GROUP BY ALL ORDER BY ALL",
        [imagenet],
    )
    # The tasks of the communication stream (4) are parts; the compute stream's SDMA
    # memcpys (stream 2, no notify) stay copies.
    assert kinds == [
        {"kind": "communication", "family": "collective", "task_type": None, "tid": 0, "n": 4},
        {"kind": "communication_task", "family": "collective", "task_type": "Notify Wait",
         "tid": 4, "n": 112},
        {"kind": "communication_task", "family": "collective", "task_type": "SDMA",
         "tid": 4, "n": 72},
        {"kind": "communication_task", "family": "collective", "task_type": "Write Value",
         "tid": 4, "n": 112},
        {"kind": "kernel", "family": "copy", "task_type": "SDMA_SQE", "tid": 2, "n": 10},
    ]  # fmt: skip
    # The communication islands: the union of the ops and their parts, as msprof's
    # Communication (85,516.889 us) within the 1 ns its rounding of part ends gives.
    union = rows(
        store,
        "SELECT sum(end_ns - start_ns) AS ns FROM step_islands "
        "WHERE source_id = $1 AND grp = 'collective'",
        [imagenet],
    )
    assert union == [{"ns": 85_516_890}]
    segments = rows(
        store,
        "SELECT segment_index, start_ns, end_ns FROM segments WHERE source_id = $1 ORDER BY 1",
        [imagenet],
    )
    assert [(s["start_ns"], s["end_ns"]) for s in segments] == [
        (1736405443876953510, 1736405443909176934),
        (1736405443982171373, 1736405443982175673),
        (1736405443984369257, 1736405443984372977),
        (1736405443986862507, 1736405443986866246),
        (1736405443994705583, 1736405443997661503),
    ]


def msprof_duration_ns(dur_text: str, communication: bool) -> int:
    """msprof's ``Duration(us)`` of a task or an hcom op, from the trace's ``dur`` text: a
    task's is the binary double of the text rounded to 3 decimals (so a half-ns tie goes
    down or up as the double lies), an hcom op's is truncated to the ns."""
    if communication:
        return us_to_ns(dur_text, ROUND_FLOOR)
    return us_to_ns(repr(round(float(dur_text), 3)))


def test_kernels_hold_every_kernel_details_row(store: Store, imagenet: str) -> None:
    with shared_fixture(KERNEL_DETAILS).open(newline="", encoding="utf-8") as f:
        details = list(csv.DictReader(f))
    assert len(details) == 191
    ours = rows(
        store,
        "SELECT name, kind, ts_ns, dur_ns FROM kernels WHERE source_id = $1 AND step_index = 0",
        [imagenet],
    )
    texts = {
        (e["name"], ref.ns(e["ts"])): str(e["dur"])
        for e in ref.load_events(shared_fixture(IMAGENET))
        if e.get("ph") == "X" and "dur" in e
    }
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in ours:
        by_name.setdefault(row["name"], []).append(row)
    exact, explained = 0, []
    for row in details:
        start = us_to_ns(row["Start Time(us)"])
        duration = us_to_ns(row["Duration(us)"])
        # Each row is one of ours: the same name, start and duration within 1 ns.
        (match,) = [
            k for k in by_name[row["Name"]]
            if abs(k["ts_ns"] - start) <= 1 and abs(k["dur_ns"] - duration) <= 1
        ]  # fmt: skip
        assert match["kind"] == ("communication" if row["Accelerator Core"] == "HCCL" else "kernel")
        if (match["ts_ns"], match["dur_ns"]) == (start, duration):
            exact += 1
            continue
        # Ours is the trace's text, exact to the ns (half up); msprof rounds otherwise.
        text = texts[(row["Name"], match["ts_ns"])]
        assert match["dur_ns"] == us_to_ns(text)
        assert duration == msprof_duration_ns(text, match["kind"] == "communication")
        explained.append((row["Name"], match["ts_ns"] - start, match["dur_ns"] - duration))
    assert exact == 183
    assert sorted(explained) == [
        # Half-ns ties in the text (24.8005 us): the double lies below, msprof rounds down.
        ("aclnnAdaptiveAvgPool2dBackward_TransposeAiCore_Transpose", 0, 1),
        ("aclnnAdaptiveAvgPool2d_TransposeAiCore_Transpose", 0, 1),
        ("aclnnAdaptiveAvgPool2d_TransposeAiCore_Transpose", 0, 1),
        ("aclnnMaxPool2dWithMaskBackward_TransDataSpecial_TransData", 0, 1),
        ("aclnnMm_MatMulCommon_MemSet", 0, 1),
        # The hcom ops: msprof truncates their duration, and their start too, which the
        # trace's text (the start rounded to the ns) does not hold.
        ("hcom_allReduce__868_1_1", 1, 1),
        ("hcom_allReduce__868_2_1", 1, 1),
        ("hcom_allReduce__868_3_1", 0, 1),
    ]


# Hand-built torch_npu traces: round numbers ---------------------------------------------------

PYTHON, HARDWARE, HCCL = 100, 200, 300
MAIN, COMPUTE_STREAM, COMM_STREAM = 1, 2, 4


class NpuTrace:
    """A torch_npu-shaped trace (a bare array, ``ts`` strings of µs): step annotations and
    launches on the Python main thread, device tasks with a Task Type on Ascend Hardware
    streams, hcom ops on the HCCL process; launches link to what they start by async_npu
    flows, as torch_npu writes them."""

    def __init__(self, shift_us: int = 0) -> None:
        self.shift = shift_us
        self.flows = 0
        self.events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
            for pid, name in ((PYTHON, "Python"), (HARDWARE, "Ascend Hardware"), (HCCL, "HCCL"))
        ]

    def _x(self, pid: int, tid: int, name: str, ts: int, dur: int, **more: Any) -> None:
        self.events.append(
            {"ph": "X", "name": name, "pid": pid, "tid": tid,
             "ts": f"{ts + self.shift}.000", "dur": dur, **more}
        )  # fmt: skip

    def _launch(self, launch_us: int, pid: int, tid: int, ts: int) -> None:
        self.flows += 1
        self._x(PYTHON, MAIN, "aclnnLaunch", launch_us, 1, cat="cpu_op")
        for ph, where, at in (("s", (PYTHON, MAIN), launch_us), ("f", (pid, tid), ts)):
            self.events.append(
                {"ph": ph, "bp": "e", "name": "torch_to_npu", "id": self.flows,
                 "pid": where[0], "tid": where[1], "ts": f"{at + self.shift}.000",
                 "cat": "async_npu"}
            )  # fmt: skip

    def step(self, name: str, ts: int, dur: int) -> NpuTrace:
        self._x(PYTHON, MAIN, name, ts, dur, cat="cpu_op")
        return self

    def task(
        self, name: str, task_type: str, ts: int, dur: int, *,
        stream: int = COMPUTE_STREAM, launch: int | None = None,
    ) -> NpuTrace:  # fmt: skip
        self._x(HARDWARE, stream, name, ts, dur, args={"Task Type": task_type})
        if launch is not None:
            self._launch(launch, HARDWARE, stream, ts)
        return self

    def hcom(self, name: str, ts: int, dur: int, *, launch: int) -> NpuTrace:
        """An hcom op and the tasks it issues on the communication stream."""
        self._x(HCCL, 0, name, ts, dur, args={"alg_type": "MESH-RING"})
        self._launch(launch, HCCL, 0, ts)
        third = dur // 4
        for i, kind in enumerate(("Notify Wait", "SDMA", "Write Value")):
            self.task(kind, kind, ts + i * third, third, stream=COMM_STREAM)
        return self

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.events), encoding="utf-8")
        return path


def one_step(shift_us: int = 0) -> NpuTrace:
    """ProfilerStep#1 (1000-1500 us on the host): a matmul, a compute-stream SDMA memcpy, an
    all-reduce of 100 us (1200-1300) overlapped by an add, and a mul ending at 1425 us."""
    return (
        NpuTrace(shift_us)
        .step("ProfilerStep#1", 1000, 500)
        .task("aclnnMm_MatMulCommon_MatMulV2", "AI_CORE", 1100, 50, launch=1010)
        .task("MEMCPY_ASYNC", "SDMA_SQE", 1160, 10, launch=1020)
        .hcom("hcom_allReduce__1_0_1", 1200, 100, launch=1030)
        .task("aclnnAdd_AddAiCore_Add", "AI_CORE", 1250, 30, launch=1040)
        .task("aclnnMuls_MulAiCore_Mul", "AI_CORE", 1400, 25, launch=1050)
    )


STEP_COLUMNS = (
    "step_index, step_name, start_ns, end_ns, period_ns, own_launches, launches, busy_ns, "
    "idle_ns, closed_by"
)


def test_one_step_ends_at_its_own_last_op(store: Store, tmp_path: Path) -> None:
    ingest_trace(store, one_step().write(tmp_path / "one.json"))
    assert rows(store, f"SELECT {STEP_COLUMNS} FROM steps") == [
        {
            "step_index": 0,
            "step_name": "ProfilerStep#1",
            "start_ns": 1_100_000,
            "end_ns": 1_425_000,
            "period_ns": 325_000,
            "own_launches": 5,  # four tasks and the hcom op; its parts have no launch
            "launches": 8,
            "busy_ns": 50_000 + 10_000 + 100_000 + 25_000,
            "idle_ns": 325_000 - 185_000,
            "closed_by": "own_end",
        }
    ]
    kinds = rows(store, "SELECT name, kind, family FROM kernels ORDER BY ts_ns, tid")
    assert kinds == [
        {"name": "aclnnMm_MatMulCommon_MatMulV2", "kind": "kernel", "family": "gemm"},
        {"name": "MEMCPY_ASYNC", "kind": "kernel", "family": "copy"},
        {"name": "hcom_allReduce__1_0_1", "kind": "communication", "family": "collective"},
        {"name": "Notify Wait", "kind": "communication_task", "family": "collective"},
        {"name": "SDMA", "kind": "communication_task", "family": "collective"},
        {"name": "aclnnAdd_AddAiCore_Add", "kind": "kernel", "family": "elementwise"},
        {"name": "Write Value", "kind": "communication_task", "family": "collective"},
        {"name": "aclnnMuls_MulAiCore_Mul", "kind": "kernel", "family": "elementwise"},
    ]
    collectives = rows(store, "SELECT collective_index, op, name, ts_ns, dur_ns FROM collectives")
    assert collectives == [
        {"collective_index": 0, "op": "all_reduce", "name": "hcom_allReduce__1_0_1",
         "ts_ns": 1_200_000, "dur_ns": 100_000},
    ]  # fmt: skip
    segments = rows(
        store, "SELECT start_ns, end_ns, launches, busy_ns, families FROM segments ORDER BY 1"
    )
    # The add overlaps the all-reduce: it starts in no segment.
    assert segments == [
        {"start_ns": 1_100_000, "end_ns": 1_200_000, "launches": 2, "busy_ns": 60_000,
         "families": ["copy", "gemm"]},
        {"start_ns": 1_300_000, "end_ns": 1_425_000, "launches": 1, "busy_ns": 25_000,
         "families": ["elementwise"]},
    ]  # fmt: skip


def test_a_step_of_only_communication(store: Store, tmp_path: Path) -> None:
    trace = (
        NpuTrace()
        .step("ProfilerStep#3", 1000, 500)
        .hcom("hcom_allGather__2_0_1", 1200, 100, launch=1010)
    )
    ingest_trace(store, trace.write(tmp_path / "comm.json"))
    assert rows(store, f"SELECT {STEP_COLUMNS} FROM steps") == [
        {
            "step_index": 0,
            "step_name": "ProfilerStep#3",
            "start_ns": 1_200_000,
            "end_ns": 1_300_000,
            "period_ns": 100_000,
            "own_launches": 1,
            "launches": 4,
            "busy_ns": 100_000,
            "idle_ns": 0,
            "closed_by": "own_end",
        }
    ]
    assert rows(store, "SELECT op, dur_ns FROM collectives") == [
        {"op": "all_gather", "dur_ns": 100_000}
    ]
    # No part of the period is outside the collective: no compute segment.
    assert rows(store, "SELECT count(*) AS n FROM segments") == [{"n": 0}]
    assert rows(store, "SELECT family, union_ns, period_share FROM step_family_totals") == [
        {"family": "collective", "union_ns": 100_000, "period_share": 1.0}
    ]


def two_steps() -> NpuTrace:
    """ProfilerStep#1 and #2, each launching a matmul and an all-reduce."""
    trace = NpuTrace()
    for i, base in enumerate((1000, 2000)):
        trace.step(f"ProfilerStep#{i + 1}", base, 500)
        trace.task("aclnnMm_MatMulCommon_MatMulV2", "AI_CORE", base + 100, 50, launch=base + 10)
        trace.hcom(f"hcom_allReduce__1_{i}_1", base + 200, 100, launch=base + 20)
    return trace


def test_the_last_step_rules(store: Store, tmp_path: Path) -> None:
    ingest_trace(store, one_step().write(tmp_path / "one.json"))
    two = ingest_trace(store, two_steps().write(tmp_path / "two.json")).source_id
    query = "SELECT source_id = $1 AS two, step_name, end_ns, closed_by FROM steps ORDER BY ALL"
    # auto (the default): the one-step capture keeps its step, the two-step trace drops
    # its last one (the rule of multi-step traces).
    assert rows(store, query, [two]) == [
        {"two": False, "step_name": "ProfilerStep#1", "end_ns": 1_425_000, "closed_by": "own_end"},
        {"two": True, "step_name": "ProfilerStep#1", "end_ns": 2_100_000,
         "closed_by": "next_step"},
    ]  # fmt: skip
    # drop, when asked for: no step of a one-step capture, and its ops in none.
    store.use_kernel_rules(OuterKernelRules(last_step="drop"))
    assert rows(store, query, [two]) == [
        {"two": True, "step_name": "ProfilerStep#1", "end_ns": 2_100_000,
         "closed_by": "next_step"},
    ]  # fmt: skip
    assert rows(
        store, "SELECT count(step_index) AS n FROM kernels WHERE source_id <> $1", [two]
    ) == [{"n": 0}]
    # own_end, from a rules file: every last step ends at its own last op.
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text('last_step = "own_end"\n')
    store.use_kernel_rules(OuterKernelRules.load(rules_file))
    assert rows(store, query, [two]) == [
        {"two": False, "step_name": "ProfilerStep#1", "end_ns": 1_425_000, "closed_by": "own_end"},
        {"two": True, "step_name": "ProfilerStep#1", "end_ns": 2_100_000,
         "closed_by": "next_step"},
        {"two": True, "step_name": "ProfilerStep#2", "end_ns": 2_300_000, "closed_by": "own_end"},
    ]  # fmt: skip
    assert OuterKernelRules().last_step == "auto"
    assert OuterKernelRules().with_families([("x", "y")]).last_step == "auto"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'last_step = "next"\n',
            "last_step must be one of ['auto', 'drop', 'own_end'], got 'next'",
        ),
        ("last_step = 1\n", "last_step must be a string"),
    ],
)
def test_a_bad_last_step_rule_is_refused(tmp_path: Path, text: str, message: str) -> None:
    rules_file = tmp_path / "bad.toml"
    rules_file.write_text(text)
    with pytest.raises(RulesError, match=f"^{re.escape(f'{rules_file}: {message}')}$"):
        OuterKernelRules.load(rules_file)


def test_rank_pairs_of_torch_npu_ranks(store: Store, tmp_path: Path) -> None:
    a = ingest_trace(store, one_step().write(tmp_path / "a.json"), rank=0, label="job")
    b = ingest_trace(store, one_step(3).write(tmp_path / "b.json"), rank=1, label="job")
    got = rows(store, "SELECT * FROM rank_pairs")
    keys = ("a_source_id", "b_source_id", "start_skew_ns", "a_collectives", "b_collectives",
            "paired_collectives", "a_wait_ns", "b_wait_ns")  # fmt: skip
    assert [{k: r[k] for k in keys} for r in got] == [
        {"a_source_id": a.source_id, "b_source_id": b.source_id, "start_skew_ns": 3_000,
         "a_collectives": 1, "b_collectives": 1, "paired_collectives": 1,
         "a_wait_ns": 3_000, "b_wait_ns": 0},
    ]  # fmt: skip


def test_collective_op_of_hcom_names(store: Store) -> None:
    cases = {
        "hcom_allReduce__868_0_1": "all_reduce",
        "hcom_allGather__1_0_1": "all_gather",
        "hcom_reduceScatter__1_0_1": "reduce_scatter",
        "hcom_alltoallv__1_0_1": "all_to_all",
        "hcom_broadcast__1_0_1": "broadcast",
        "hcom_batchSendRecv__1_0_1": "send_recv",
        "hcom_send__1_0_1": "send",
        "hcom_receive__1_0_1": "recv",
        "hcom_reduce__1_0_1": "reduce",
    }
    got = rows(store, "SELECT n, collective_op(n) AS op FROM unnest($1) AS t(n)", [list(cases)])
    assert {r["n"]: r["op"] for r in got} == cases
