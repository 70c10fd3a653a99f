"""Kernel-level views of outer traces: families, steps, unions, collectives, segments, layers,
rank pairs, the rules and ``mcprof kernels``.

Real traces are checked against ``kineto_reference`` (plain Python over the JSON, exact ns) and
against Holistic Trace Analysis; a small synthetic MoE trace, written here with round numbers,
checks layers, segment kinds, step details and rank pairing by hand.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import kineto_reference as ref
import pytest
from hta_breakdown import gpu_kernel_breakdown
from shared_fixtures import shared_fixture

from multicore_profiler import cli
from multicore_profiler.analysis.outer_kernel_rules import (
    DEFAULT_FAMILIES,
    STEP_PATTERNS,
    KernelRules,
)
from multicore_profiler.errors import QueryError, RulesError
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.storage.store import Store

A100 = "kineto/a100_training_rank0.json.gz"
MI250 = "kineto/mi250_minitoy_train.json.gz"
NPU = "ascend/torchnpu_advisor_trace_view.json.gz"


@functools.cache
def default_family(name: str) -> str:
    """First-match classification with Python's ``re`` over the default rules (the SQL side
    compiles the same patterns with RE2). Cached: a trace's thousands of kernels have a
    few dozen names."""
    for family, pattern in DEFAULT_FAMILIES:
        if re.search(pattern, name):
            return family
    return "rest"


def rows(store: Store, query: str, params: Any = None) -> list[dict[str, Any]]:
    return store.sql(query, params).to_pylist()


@pytest.fixture(scope="module")
def a100_events() -> list[dict[str, Any]]:
    return ref.load_events(shared_fixture(A100))


@pytest.fixture
def a100(store: Store) -> str:
    return ingest_trace(store, shared_fixture(A100)).source_id


# Families ---------------------------------------------------------------------------------

FAMILY_CASES = [
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, ncclWork*)", "collective"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, ncclWork*)", "collective"),
    ("hcom_allReduce__360_0_1", "collective"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(void*)", "collective"),
    ("Memset (Device)", "memset"),
    ("aclnnMm_MatMulCommon_MemSet", "memset"),
    ("Memcpy HtoD (Pageable -> Device)", "copy"),
    ("aclnnMm_TransData_TransData", "copy"),
    ("void at::native::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>()", "copy"),
    ("aclnnMm_MatMulCommon_MatMulV2", "gemm"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>(Params)", "gemm"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("ampere_sgemm_128x64_nn", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("Conv2DBackpropFilter6", "conv"),
    ("flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>", "attention"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention"),
    ("aclnnFlashAttentionScore_FlashAttentionScore_FlashAttentionScore", "attention"),
    ("mla_decode_kernel", "attention"),
    ("fused_moe_kernel", "moe_expert"),
    ("GroupedMatmul", "moe_expert"),
    ("topkGatingSoftmax", "moe_topk"),
    ("MoeGatingTopKSoftmax", "moe_topk"),
    ("moe_router_gemm", "moe_router"),
    ("moe_align_block_size_kernel", "moe_dispatch"),
    ("triton_poi_fused_add_cos_sin_0", "triton"),
    ("triton__0d1d2d3d", "triton"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>()", "reduce"),
    ("aclnnReduceSum_ReduceSumOpAiCore_ReduceSum", "reduce"),
    ("void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>()", "elementwise"),
    ("aclnnInplaceMuls_MulAiCore_Mul", "elementwise"),
    ("aclnnAddmm_CastAiCore_Cast", "elementwise"),
    ("my_custom_kernel", "rest"),
]  # fmt: skip


def test_default_families_classify_cuda_rocm_moe_and_ascend_names(store: Store) -> None:
    names = [name for name, _ in FAMILY_CASES]
    got = rows(store, "SELECT n, kernel_family(n) AS f FROM unnest($1) AS t(n)", [names])
    assert {r["n"]: r["f"] for r in got} == dict(FAMILY_CASES)
    # The Python reading of the same rules agrees, so it can serve as the tests' oracle.
    assert {name: default_family(name) for name in names} == dict(FAMILY_CASES)


def test_collective_op_of_collective_kernel_names(store: Store) -> None:
    cases = {
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t": "send_recv",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL": "all_reduce",
        "ncclDevKernel_AllGather_RING_LL": "all_gather",
        "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL": "reduce_scatter",
        "hcom_allGather__1": "all_gather",
        "deep_ep::intranode::combine": "all_to_all",
        "ncclDevKernel_Broadcast_RING_LL": "broadcast",
        "ncclDevKernel_Reduce_Sum_f32_RING_LL": "reduce",
    }
    got = rows(store, "SELECT n, collective_op(n) AS op FROM unnest($1) AS t(n)", [list(cases)])
    assert {r["n"]: r["op"] for r in got} == cases


# Real traces against the plain-Python reference and HTA -------------------------------------


def reference_steps(events: list[dict[str, Any]], pattern: str) -> list[dict[str, Any]]:
    """The ``steps`` rows the reference computes: annotation, period, launches and times."""
    steps = ref.steps(events, pattern)
    totals = ref.step_totals(events, steps)
    return [
        {
            "step_index": s.index,
            "step_name": s.name,
            "annotation_index": s.annotation_index,
            "start_ns": s.start_ns,
            "end_ns": s.end_ns,
            "period_ns": s.end_ns - s.start_ns,
            "own_launches": s.own_launches,
            "launches": totals[(s.index, "*")][0],
            "kernel_ns": totals[(s.index, "*")][1],
            "busy_ns": totals[(s.index, "*")][2],
        }
        for s in steps
    ]


STEP_COLUMNS = (
    "step_index, step_name, annotation_index, start_ns, end_ns, period_ns, own_launches, "
    "launches, kernel_ns, busy_ns"
)


def test_a100_steps_equal_the_reference(store: Store, a100: str, a100_events) -> None:
    got = rows(
        store,
        f"SELECT {STEP_COLUMNS}, step_number FROM steps WHERE source_id = $1 ORDER BY step_index",
        [a100],
    )
    expected = reference_steps(a100_events, ref.DEFAULT_STEP_PATTERN)
    assert got == [{**r, "step_number": int(r["step_name"].split("#")[1])} for r in expected]
    # Four of the five ProfilerStep annotations: the last has no successor.
    assert [r["step_name"] for r in got] == [f"ProfilerStep#{n}" for n in range(550, 554)]
    assert got[0]["start_ns"] == 1_683_564_901_552_104_000
    assert got[0]["period_ns"] == 208_697_000
    assert got[0]["busy_ns"] == 72_437_000


def test_a100_family_totals_equal_the_reference(store: Store, a100: str, a100_events) -> None:
    steps = ref.steps(a100_events)
    expected = ref.step_totals(a100_events, steps, default_family)
    got = rows(
        store,
        "SELECT step_index, family, launches, kernel_ns, union_ns, period_share "
        "FROM step_family_totals WHERE source_id = $1",
        [a100],
    )
    assert {
        (r["step_index"], r["family"]): (r["launches"], r["kernel_ns"], r["union_ns"]) for r in got
    } == expected
    period = {s.index: s.end_ns - s.start_ns for s in steps}
    for r in got:
        assert r["period_share"] == r["union_ns"] / period[r["step_index"]]
    # One family in numbers: NCCL's 15 SendRecv kernels of step 0 overlap by 365 us.
    assert expected[(0, "collective")] == (15, 29_897_000, 29_532_000)


def test_a100_segments_between_collectives_equal_the_reference(
    store: Store, a100: str, a100_events
) -> None:
    steps = ref.steps(a100_events)
    expected = ref.segments(a100_events, steps, default_family)
    got = rows(
        store,
        "SELECT step_index, start_ns, end_ns, launches, kernel_ns, busy_ns, families, kind "
        "FROM segments WHERE source_id = $1 ORDER BY step_index, segment_index",
        [a100],
    )
    assert [
        (r["step_index"], r["start_ns"], r["end_ns"], r["launches"], r["kernel_ns"], r["busy_ns"])
        for r in got
    ] == [
        (step, s.start_ns, s.end_ns, s.launches, s.kernel_ns, s.busy_ns)
        for step, segments in sorted(expected.items())
        for s in segments
    ]
    assert [tuple(r["families"]) for r in got] == [
        s.families for _, segments in sorted(expected.items()) for s in segments
    ]
    # No MoE or attention kernel in this DLRM trace: segments are compute, or idle if empty.
    assert {r["kind"] for r in got} == {"compute", "idle"}
    assert all((r["kind"] == "idle") == (r["launches"] == 0) for r in got)
    assert len(expected[0]) == 14


def test_a100_collectives_of_each_step(store: Store, a100: str, a100_events) -> None:
    steps = ref.steps(a100_events)
    ops = [o for o in ref.device_ops(a100_events) if o.name.startswith("ncclKernel")]
    expected = [
        (s.index, k, o.start_ns, o.end_ns - o.start_ns)
        for s in steps
        for k, o in enumerate(
            sorted(
                (o for o in ops if s.start_ns <= o.start_ns < s.end_ns),
                key=lambda o: (o.start_ns, o.index),
            )
        )
    ]
    got = rows(
        store,
        "SELECT step_index, collective_index, ts_ns, dur_ns, op FROM collectives "
        "WHERE source_id = $1 ORDER BY step_index, collective_index",
        [a100],
    )
    assert [(r["step_index"], r["collective_index"], r["ts_ns"], r["dur_ns"]) for r in got] == (
        expected
    )
    assert {r["op"] for r in got} == {"send_recv"}


@pytest.mark.parametrize(
    "fixture",
    ["a100_training_rank0.json.gz", "mi250_minitoy_train.json.gz", "a100_triton_example.json.gz"],
)
def test_kernel_breakdown_equals_hta(store: Store, fixture: str) -> None:
    path = shared_fixture(f"kineto/{fixture}")
    source = ingest_trace(store, path).source_id
    hta = gpu_kernel_breakdown(path)
    # HTA rounds a fractional-us kernel to whole us inside it: ceil(ts) to floor(ts + dur).
    got = rows(
        store,
        "SELECT name, count(*) AS n, sum(dur_ns) AS ns, "
        "sum(end_ns // 1000 - (ts_ns + 999) // 1000)::BIGINT AS hta_us FROM kernels "
        "WHERE source_id = $1 AND kind = 'kernel' GROUP BY name",
        [source],
    )
    assert {r["name"]: (r["n"], r["hta_us"]) for r in got} == hta
    if fixture.startswith("a100_training"):
        # An integer-us trace: HTA's sums are ours, exactly.
        assert {r["name"]: (r["n"], r["ns"] / 1000) for r in got} == hta
        assert sum(n for n, _ in hta.values()) == 6080


def test_mi250_gpu_annotation_is_not_a_step_and_a_custom_pattern_is(store: Store) -> None:
    source = ingest_trace(store, shared_fixture(MI250)).source_id
    events = ref.load_events(shared_fixture(MI250))
    # ProfilerStep#1 has 9 own kernels; #2 none; the GPU-side copy on tid 0 is no annotation.
    assert rows(store, "SELECT count(*) AS n FROM steps WHERE source_id = $1", [source]) == [
        {"n": 0}
    ]
    annotations = rows(
        store,
        "SELECT event_index, tid FROM step_annotations WHERE source_id = $1 ORDER BY 1",
        [source],
    )
    assert [r["event_index"] for r in annotations] == [38, 80]
    # Steps by another annotation: each ``aten::`` op with kernels, the last one dropped.
    pattern = r"^aten::(add_|mul|addmm)$"
    store.use_kernel_rules(KernelRules(steps=pattern))
    got = rows(
        store,
        f"SELECT {STEP_COLUMNS} FROM steps WHERE source_id = $1 ORDER BY step_index",
        [source],
    )
    assert got == reference_steps(events, pattern)
    assert [r["step_name"] for r in got] == ["aten::addmm", "aten::add_"]


def test_torch_npu_tasks_link_by_flows_and_make_steps(store: Store) -> None:
    source = ingest_trace(store, shared_fixture(NPU)).source_id
    events = ref.load_events(shared_fixture(NPU))
    launches = rows(
        store,
        "SELECT linked_by, launch_tid, count(*) AS n FROM op_launches WHERE source_id = $1 "
        "GROUP BY ALL ORDER BY launch_tid",
        [source],
    )
    # Each task has two flows: HostToDevice from CANN's thread, async_npu from the op's.
    assert launches == [
        {"linked_by": "flow", "launch_tid": 437675, "n": 168},
        {"linked_by": "flow", "launch_tid": 439084, "n": 274},
        {"linked_by": "flow", "launch_tid": 439228, "n": 106},
    ]
    families = rows(
        store,
        "SELECT family, count(*) AS n FROM kernels WHERE source_id = $1 GROUP BY ALL",
        [source],
    )
    assert {r["family"]: r["n"] for r in families} == Counter(
        default_family(o.name) for o in ref.device_ops(events)
    )
    # The one ProfilerStep is a one-step capture: under the default last-step rule (auto)
    # it ends at its own last task (closed_by own_end); its own tasks are counted.
    assert rows(store, "SELECT count(*) AS n FROM steps") == [{"n": 1}]
    own = ref.own_ops(events)
    assert {a: len(ops) for a, ops in own.items()} == {710: 168}
    # Three aten::linear calls on the main thread make two steps of the forward pass.
    pattern = r"^aten::linear$"
    store.use_kernel_rules(KernelRules(steps=pattern))
    got = rows(store, f"SELECT {STEP_COLUMNS} FROM steps ORDER BY step_index")
    assert got == reference_steps(events, pattern)
    assert len(got) == 2


# A synthetic MoE job: two ranks, round numbers ----------------------------------------------

STEP_US = 1000
# (name, start us after the step's base, duration us, stream) of one step's kernels.
MOE_STEP = [
    ("flash_fwd_kernel", 100, 50, 7),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 160, 20, 20),
    ("moe_router_gemm", 200, 10, 7),
    ("topkGatingSoftmax", 215, 5, 7),
    ("fused_moe_kernel", 225, 30, 7),
    ("act_and_mul_kernel", 256, 4, 7),
    ("fused_moe_kernel", 262, 20, 7),
    ("moe_router_gemm", 300, 10, 7),
    ("topkGatingSoftmax", 312, 5, 7),
    ("fused_moe_kernel", 320, 25, 7),
    ("fused_moe_kernel", 350, 15, 7),
    ("ncclDevKernel_AllGather_RING_LL", 400, 30, 20),
    ("flash_fwd_kernel", 450, 40, 7),
]


def write_moe_trace(
    path: Path,
    *,
    rank: int,
    names: list[str],
    shift_us: int = 0,
    all_reduce_extra_us: int = 0,
) -> Path:
    """A kineto-shaped trace of len(names) steps of MOE_STEP; each step's annotation starts
    at 1000 x (i + 1) + shift us and launches its kernels from inside it."""
    events: list[dict[str, Any]] = []
    correlation = 0
    for i, name in enumerate(names):
        base = STEP_US * (i + 1) + shift_us
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": name, "pid": 10, "tid": 10,
             "ts": base, "dur": 90}
        )  # fmt: skip
        for k, (kernel, start, dur, stream) in enumerate(MOE_STEP):
            correlation += 1
            if kernel.startswith("ncclDevKernel_AllReduce"):
                dur += all_reduce_extra_us
            args = {"correlation": correlation, "stream": stream, "device": 0}
            events.append(
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10,
                 "tid": 10, "ts": base + 1 + k, "dur": 1, "args": {"correlation": correlation}}
            )  # fmt: skip
            events.append(
                {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream,
                 "ts": base + start, "dur": dur, "args": args}
            )  # fmt: skip
    document = {"distributedInfo": {"rank": rank}, "traceEvents": events}
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def moe_job(store: Store, tmp_path: Path) -> tuple[str, str]:
    names = [f"ProfilerStep#{n}" for n in (7, 8, 9)]
    a = write_moe_trace(tmp_path / "rank0.json", rank=0, names=names)
    b = write_moe_trace(
        tmp_path / "rank1.json", rank=1, names=names, shift_us=3, all_reduce_extra_us=7
    )
    return (
        ingest_trace(store, a, label="job").source_id,
        ingest_trace(store, b, label="job").source_id,
    )


def test_layer_spans_of_router_topk_gate_up_down(store: Store, moe_job) -> None:
    a, _ = moe_job
    got = rows(
        store,
        "SELECT step_index, layer_index, start_ns, end_ns, span_ns, launches, kernel_ns, "
        "complete, tail_ns FROM layer_spans WHERE source_id = $1 "
        "ORDER BY step_index, layer_index",
        [a],
    )
    expected = []
    for step in (0, 1):
        base = (STEP_US * (step + 1)) * 1000
        expected += [
            {"step_index": step, "layer_index": 0, "start_ns": base + 200_000,
             "end_ns": base + 282_000, "span_ns": 82_000, "launches": 4, "kernel_ns": 65_000,
             "complete": True, "tail_ns": 282_000 - 255_000},
            {"step_index": step, "layer_index": 1, "start_ns": base + 300_000,
             "end_ns": base + 365_000, "span_ns": 65_000, "launches": 4, "kernel_ns": 55_000,
             "complete": True, "tail_ns": 365_000 - 345_000},
        ]  # fmt: skip
    assert got == expected
    stages = rows(
        store,
        "SELECT position, family, launches, start_ns, end_ns FROM layer_stages "
        "WHERE source_id = $1 AND step_index = 0 AND layer_index = 0 ORDER BY position",
        [a],
    )
    base = STEP_US * 1000
    assert stages == [
        {"position": 0, "family": "moe_router", "launches": 1,
         "start_ns": base + 200_000, "end_ns": base + 210_000},
        {"position": 1, "family": "moe_topk", "launches": 1,
         "start_ns": base + 215_000, "end_ns": base + 220_000},
        {"position": 2, "family": "moe_expert", "launches": 1,
         "start_ns": base + 225_000, "end_ns": base + 255_000},
        {"position": 3, "family": "moe_expert", "launches": 1,
         "start_ns": base + 262_000, "end_ns": base + 282_000},
    ]  # fmt: skip


def test_segments_are_classified_moe_or_attn(store: Store, moe_job) -> None:
    a, _ = moe_job
    got = rows(
        store,
        "SELECT segment_index, start_ns, end_ns, kind, launches, kernel_ns, busy_ns, families, "
        "after_collective, before_collective FROM segments "
        "WHERE source_id = $1 AND step_index = 0 ORDER BY segment_index",
        [a],
    )
    base = STEP_US * 1000
    moe = ["elementwise", "moe_expert", "moe_router", "moe_topk"]
    assert got == [
        {"segment_index": 0, "start_ns": base + 100_000, "end_ns": base + 160_000,
         "kind": "attn", "launches": 1, "kernel_ns": 50_000, "busy_ns": 50_000,
         "families": ["attention"], "after_collective": False, "before_collective": True},
        {"segment_index": 1, "start_ns": base + 180_000, "end_ns": base + 400_000,
         "kind": "moe", "launches": 9, "kernel_ns": 124_000, "busy_ns": 124_000,
         "families": moe, "after_collective": True, "before_collective": True},
        {"segment_index": 2, "start_ns": base + 430_000, "end_ns": base + 1_100_000,
         "kind": "attn", "launches": 1, "kernel_ns": 40_000, "busy_ns": 40_000,
         "families": ["attention"], "after_collective": True, "before_collective": False},
    ]  # fmt: skip
    # With the rules of a model whose non-MoE segments are all attention blocks.
    store.use_kernel_rules(KernelRules(segments=[("moe", ["moe_*"]), ("attn", ["*"])]))
    kinds = rows(store, "SELECT DISTINCT kind FROM segments ORDER BY 1")
    assert kinds == [{"kind": "attn"}, {"kind": "moe"}]


def test_family_totals_and_collectives_of_the_moe_step(store: Store, moe_job) -> None:
    a, b = moe_job
    got = rows(
        store,
        "SELECT family, launches, kernel_ns, union_ns FROM step_family_totals "
        "WHERE source_id = $1 AND step_index = 1 ORDER BY family",
        [b],
    )
    assert got == [
        {"family": "attention", "launches": 2, "kernel_ns": 90_000, "union_ns": 90_000},
        {"family": "collective", "launches": 2, "kernel_ns": 57_000, "union_ns": 57_000},
        {"family": "elementwise", "launches": 1, "kernel_ns": 4_000, "union_ns": 4_000},
        {"family": "moe_expert", "launches": 4, "kernel_ns": 90_000, "union_ns": 90_000},
        {"family": "moe_router", "launches": 2, "kernel_ns": 20_000, "union_ns": 20_000},
        {"family": "moe_topk", "launches": 2, "kernel_ns": 10_000, "union_ns": 10_000},
    ]
    ops = rows(
        store,
        "SELECT collective_index, op, ts_ns, dur_ns FROM collectives "
        "WHERE source_id = $1 AND step_index = 0 ORDER BY 1",
        [a],
    )
    base = STEP_US * 1000
    assert ops == [
        {"collective_index": 0, "op": "all_reduce", "ts_ns": base + 160_000, "dur_ns": 20_000},
        {"collective_index": 1, "op": "all_gather", "ts_ns": base + 400_000, "dur_ns": 30_000},
    ]
    # The all-reduce on rank 1 ran 7 us longer, into the gap after it.
    busy = rows(store, "SELECT source_id, busy_ns, period_ns FROM steps WHERE step_index = 0")
    assert {r["source_id"]: (r["busy_ns"], r["period_ns"]) for r in busy} == {
        a: (50_000 + 20_000 + 124_000 + 30_000 + 40_000, 1_000_000),
        b: (50_000 + 27_000 + 124_000 + 30_000 + 40_000, 1_000_000),
    }


def test_rank_pairs_skews_and_collective_waits(store: Store, moe_job) -> None:
    a, b = moe_job
    got = rows(store, "SELECT * FROM rank_pairs ORDER BY step_index")
    assert [
        {k: r[k] for k in ("a_source_id", "a_rank", "b_source_id", "b_rank", "a_label")}
        for r in got
    ] == [{"a_source_id": a, "a_rank": 0, "b_source_id": b, "b_rank": 1, "a_label": "job"}] * 2
    expected = {
        "start_skew_ns": 3_000,
        "period_skew_ns": 0,
        "a_collectives": 2,
        "b_collectives": 2,
        "a_collective_ns": 50_000,
        "b_collective_ns": 57_000,
        "collective_skew_ns": 7_000,
        "paired_collectives": 2,
        "a_wait_ns": 6_000,  # rank 0 reached both collectives 3 us before rank 1
        "b_wait_ns": 0,
        "wait_skew_ns": -6_000,
    }
    for step, r in enumerate(got):
        assert r["step_index"] == step
        assert r["step_name"] == f"ProfilerStep#{7 + step}"
        assert {k: r[k] for k in expected} == expected
    # The macro pairs any two traces, either way round.
    swapped = rows(store, "SELECT * FROM rank_pair($1, $2) ORDER BY step_index", [b, a])
    assert [r["start_skew_ns"] for r in swapped] == [-3_000, -3_000]
    assert [(r["a_wait_ns"], r["b_wait_ns"]) for r in swapped] == [(0, 6_000)] * 2


def test_rank_pairs_need_the_same_label_and_annotation(store: Store, tmp_path: Path) -> None:
    names = ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    other = ["ProfilerStep#1", "ProfilerStep#5", "ProfilerStep#6"]
    ingest_trace(store, write_moe_trace(tmp_path / "a.json", rank=0, names=names), label="x")
    ingest_trace(store, write_moe_trace(tmp_path / "b.json", rank=1, names=other), label="x")
    ingest_trace(store, write_moe_trace(tmp_path / "c.json", rank=1, names=names), label="y")
    # Only step 0 pairs by annotation within job x; job y's rank has no partner.
    got = rows(store, "SELECT a_rank, b_rank, step_index, step_name FROM rank_pairs")
    assert got == [{"a_rank": 0, "b_rank": 1, "step_index": 0, "step_name": "ProfilerStep#1"}]


def test_rank_pairs_leave_out_another_run_of_the_job(store: Store, tmp_path: Path) -> None:
    names = ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    hour = 3_600_000_000
    a = write_moe_trace(tmp_path / "a.json", rank=0, names=names)
    b = write_moe_trace(tmp_path / "b.json", rank=1, names=names, shift_us=hour)
    a_id = ingest_trace(store, a, label="nightly").source_id
    b_id = ingest_trace(store, b, label="nightly").source_id
    # Same label, but tonight's rank 1 ran an hour after yesterday's rank 0.
    assert rows(store, "SELECT count(*) AS n FROM rank_pairs") == [{"n": 0}]
    # Asked for by name, they still pair, and say they do not overlap.
    got = rows(store, "SELECT overlapping, start_skew_ns FROM rank_pair($1, $2)", [a_id, b_id])
    assert got == [{"overlapping": False, "start_skew_ns": hour * 1000}] * 2


def test_step_details_from_named_groups(store: Store, tmp_path: Path) -> None:
    names = [
        "execute_context_2(512)_generation_0(0)",
        "execute_context_1(128)_generation_30(30)",
        "execute_context_0(0)_generation_31(31)",
        "execute_context_0(0)_generation_32(32)",
    ]
    ingest_trace(store, write_moe_trace(tmp_path / "v.json", rank=0, names=names))
    store.use_kernel_rules(KernelRules(steps="vllm"))
    got = rows(
        store,
        "SELECT step_index, phase, tokens, requests, step_number, details FROM steps "
        "ORDER BY step_index",
    )
    assert [(r["phase"], r["tokens"], r["requests"], r["step_number"]) for r in got] == [
        ("prefill", 512, 2, None),
        ("mixed", 158, 31, None),
        ("decode", 31, 31, None),
    ]
    assert dict(got[1]["details"]) == {
        "context_requests": "1",
        "context_tokens": "128",
        "generation_requests": "30",
        "generation_tokens": "30",
    }
    assert store.kernel_rules.steps == STEP_PATTERNS["vllm"]
    # A pattern's own phase group wins; ``step`` gives the step number.
    store.use_kernel_rules(KernelRules(steps=r"^execute_(?P<phase>context)_(?P<step>\d+)"))
    got = rows(store, "SELECT phase, step_number, tokens FROM steps ORDER BY step_index")
    assert got == [{"phase": "context", "step_number": n, "tokens": None} for n in (2, 1, 0)]


# Rules ---------------------------------------------------------------------------------------


def test_rules_from_python_and_toml(store: Store, moe_job, tmp_path: Path) -> None:
    a, _ = moe_job
    store.use_kernel_rules(KernelRules().with_families([("activation", r"^act_and_mul")]))
    got = rows(
        store,
        "SELECT DISTINCT family FROM kernels WHERE name = 'act_and_mul_kernel' AND source_id = $1",
        [a],
    )
    assert got == [{"family": "activation"}]
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text(
        'steps = "^ProfilerStep#(?P<step>[78])$"\n'
        'layers = ["moe_topk", "moe_expert", "moe_expert"]\n'
        "default_families = false\n"
        '[[family]]\nname = "moe_topk"\npattern = "topk"\n'
        '[[family]]\nname = "moe_expert"\npattern = "fused_moe"\n'
        '[[segment]]\nkind = "experts"\nfamilies = ["moe_expert"]\n'
    )
    rules = KernelRules.load(rules_file)
    assert rules.families == (("moe_topk", "topk"), ("moe_expert", "fused_moe"))
    store.use_kernel_rules(rules)
    # ProfilerStep#7 and #8 match: one step; everything unnamed is rest.
    families = rows(
        store,
        "SELECT family, launches FROM step_family_totals WHERE source_id = $1 ORDER BY 1",
        [a],
    )
    assert families == [
        {"family": "moe_expert", "launches": 4},
        {"family": "moe_topk", "launches": 2},
        {"family": "rest", "launches": 7},
    ]
    spans = rows(
        store,
        "SELECT layer_index, span_ns, tail_ns FROM layer_spans WHERE source_id = $1 ORDER BY 1",
        [a],
    )
    assert spans == [
        {"layer_index": 0, "span_ns": 282_000 - 215_000, "tail_ns": 27_000},
        {"layer_index": 1, "span_ns": 365_000 - 312_000, "tail_ns": 20_000},
    ]
    kinds = rows(
        store, "SELECT kind FROM segments WHERE source_id = $1 ORDER BY segment_index", [a]
    )
    # No collective family any more: the whole period is one segment, holding experts.
    assert kinds == [{"kind": "experts"}]
    # Back to the defaults.
    store.use_kernel_rules()
    assert rows(store, "SELECT count(*) AS n FROM steps WHERE source_id = $1", [a]) == [{"n": 2}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[family]]\nname = "x"\npattern = "("\n', "family rule 0 ('x'): '(' is not a valid"),
        ('[[family]]\nname = "9x"\npattern = "a"\n', "[[family]] 1: family name '9x'"),
        ('[[family]]\nname = "x"\n', "[[family]] 1 needs exactly a name and a pattern"),
        ('layers = ["moe_topk", "nope"]\n', "names ['nope'], which no family rule defines"),
        ('layers = ["moe_expert", "moe_expert"]\n', "cannot appear again in the sequence"),
        ('steps = "(?P<x"\n', "step pattern '(?P<x' is not a valid regular expression"),
        ("colour = 1\n", "unknown key(s) ['colour']"),
        ("default_families = 1\n", "default_families must be true or false"),
        ("steps = [\n", "not a TOML rules file"),
        ('[[segment]]\nkind = "a"\nfamilies = []\n', "segment kind 'a' needs a list of family"),
    ],
)
def test_bad_rules_name_the_problem(store: Store, tmp_path: Path, text: str, message: str) -> None:
    rules_file = tmp_path / "bad.toml"
    rules_file.write_text(text)
    with pytest.raises(RulesError) as caught:
        store.use_kernel_rules(KernelRules.load(rules_file))
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"{rules_file}: ") or "rule 0 (" in message
    # The store keeps applying its previous rules.
    assert store.kernel_rules == KernelRules()


def test_a_regex_only_python_accepts_is_refused(store: Store) -> None:
    with pytest.raises(RulesError, match=r"family rule 0 \('x'\): '\(\?=a\)' is not a valid RE2"):
        store.use_kernel_rules(KernelRules(families=[("x", "(?=a)")]))


def test_the_first_pattern_re2_refuses_is_named_among_many(store: Store) -> None:
    """The patterns are compiled together; the one named is the first RE2 refuses, after
    the default families (the step pattern last)."""
    rules = KernelRules().with_families(
        [("fine", "(?i)gemm"), ("ahead", "a(?!b)"), ("x", "(?<=c)")]
    )
    with pytest.raises(RulesError, match=r"^family rule 1 \('ahead'\): 'a\(\?!b\)' is not"):
        store.use_kernel_rules(rules)
    with pytest.raises(RulesError, match=r"^step pattern: '\(\?<=c\)x' is not a valid RE2"):
        store.use_kernel_rules(KernelRules(steps="(?<=c)x"))
    assert store.kernel_rules == KernelRules()


def test_tables_follow_new_traces_and_rules(store: Store, tmp_path: Path) -> None:
    names = ["ProfilerStep#1", "ProfilerStep#2"]
    first = ingest_trace(store, write_moe_trace(tmp_path / "a.json", rank=0, names=names))
    assert rows(store, "SELECT count(*) AS n FROM steps") == [{"n": 1}]
    ingest_trace(store, write_moe_trace(tmp_path / "b.json", rank=1, names=names))
    assert rows(store, "SELECT count(*) AS n FROM steps") == [{"n": 2}]
    store.use_kernel_rules(KernelRules(steps=r"^ProfilerStep#9$"))
    assert rows(store, "SELECT count(*) AS n FROM steps") == [{"n": 0}]
    store.use_kernel_rules()
    got = rows(store, "SELECT source_id FROM steps ORDER BY rank")
    assert [r["source_id"] for r in got][:1] == [first.source_id]
    assert len(got) == 2


def test_every_loaded_trace_at_once(store: Store, a100: str, moe_job) -> None:
    got = rows(store, "SELECT source_id, count(*) AS n FROM steps GROUP BY ALL ORDER BY n")
    assert [r["n"] for r in got] == [2, 2, 4]
    assert got[-1]["source_id"] == a100


# CLI -----------------------------------------------------------------------------------------


def test_cli_kernels_prints_a_per_step_family_table(capsys, tmp_path: Path, a100_events) -> None:
    store = str(tmp_path / "store")
    assert (
        cli.main(["kernels", "--store", store, str(shared_fixture(A100)), "--format", "csv"]) == 0
    )
    out = capsys.readouterr()
    lines = out.out.splitlines()
    steps = ref.steps(a100_events)
    totals = ref.step_totals(a100_events, steps, default_family)
    order = sorted(
        {f for _, f in totals},
        key=lambda f: (-sum(v[2] for k, v in totals.items() if k[1] == f), f),
    )
    breakdown = "stage_ms,computing_ms,communication_ms,communication_not_overlapped_ms,"
    assert lines[0] == "source_id,rank,step,annotation,period_ms,busy_pct," + breakdown + (
        "overlapped_ms,free_ms,"
    ) + ",".join(f"{f}_ms" for f in order)
    assert lines[1].startswith(
        'b8ce7a1a143b55dd,0,0,"ProfilerStep#550",208.697,34.7,'
        "202.276,36.213,29.532,29.072,0.46,136.991,29.532,21.595,"
    )
    assert len(lines) == 5
    assert "b8ce7a1a143b55dd" in out.err  # loaded
    # Again by source id prefix, from the store, with the steps pattern as an option.
    code = cli.main(
        ["kernels", "--store", store, "b8ce7a1a", "--steps", r"^ProfilerStep#55[01]$",
         "--format", "csv"]
    )  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith('b8ce7a1a143b55dd,0,0,"ProfilerStep#550",208.697')


def test_cli_kernels_with_a_rules_file_and_query(capsys, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    trace = write_moe_trace(tmp_path / "t.json", rank=0, names=["ProfilerStep#1", "ProfilerStep#2"])
    rules = tmp_path / "rules.toml"
    rules.write_text('default_families = false\n[[family]]\nname = "moe"\npattern = "moe"\n')
    assert cli.main(["kernels", "--store", store, str(trace), "--rules", str(rules),
                     "--format", "json"]) == 0  # fmt: skip
    table = json.loads(capsys.readouterr().out)
    assert table == [
        {"source_id": table[0]["source_id"], "rank": 0, "step": 0,
         "annotation": "ProfilerStep#1", "period_ms": 1.0, "busy_pct": 26.4,
         "stage_ms": 0.39, "computing_ms": 0.264, "communication_ms": 0.0,
         "communication_not_overlapped_ms": 0.0, "overlapped_ms": 0.0, "free_ms": 0.126,
         "rest_ms": 0.154, "moe_ms": 0.11}
    ]  # fmt: skip
    assert cli.main(["query", "--store", store, "--rules", str(rules), "--format", "csv",
                     "SELECT DISTINCT family FROM kernels ORDER BY 1"]) == 0  # fmt: skip
    assert capsys.readouterr().out.split() == ["family", "moe", "rest"]


def test_cli_kernels_errors(capsys, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    assert cli.main(["kernels", "--store", store, str(shared_fixture(MI250))]) == 1
    err = capsys.readouterr().err
    assert "has no step with a GPU period: 2 annotation(s) match the step pattern" in err
    assert cli.main(["kernels", "--store", store, "0123456789"]) == 1
    assert "'0123456789' is neither a trace file nor the source id of a trace in" in (
        capsys.readouterr().err
    )
    bad = tmp_path / "bad.toml"
    bad.write_text('[[family]]\nname = "x"\npattern = "["\n')
    assert (
        cli.main(["kernels", "--store", store, str(shared_fixture(MI250)), "--rules", str(bad)])
        == 1
    )
    assert "family rule 0 ('x'): '[' is not a valid RE2" in capsys.readouterr().err


def test_kernel_views_over_an_empty_store(store: Store) -> None:
    for view in ("kernels", "steps", "step_family_totals", "segments", "layer_spans"):
        assert store.sql(f"SELECT * FROM {view}").num_rows == 0
    with pytest.raises(QueryError):
        store.sql("SELECT * FROM rank_pair('a')")


def test_a_gzip_trace_and_its_copy_as_rank_one_pair_exactly(store: Store, tmp_path: Path) -> None:
    """The real A100 rank and itself, 1 ms later, as rank 1 of the same job."""
    with gzip.open(shared_fixture(A100), "rt") as f:
        document = json.load(f, parse_float=Decimal)
    for event in document["traceEvents"]:
        if "ts" in event:
            event["ts"] = event["ts"] + 1000
    document["distributedInfo"]["rank"] = 1
    copy = tmp_path / "rank1.json"
    copy.write_text(json.dumps(document, default=str))
    ingest_trace(store, shared_fixture(A100), label="dlrm")
    ingest_trace(store, copy, label="dlrm")
    got = rows(
        store,
        "SELECT step_index, start_skew_ns, period_skew_ns, collective_skew_ns, "
        "paired_collectives, a_wait_ns, b_wait_ns FROM rank_pairs ORDER BY step_index",
    )
    assert got == [
        {"step_index": i, "start_skew_ns": 1_000_000, "period_skew_ns": 0,
         "collective_skew_ns": 0, "paired_collectives": 15, "a_wait_ns": 15_000_000,
         "b_wait_ns": 0}
        for i in range(4)
    ]  # fmt: skip


def test_rules_are_a_value(store: Store) -> None:
    rules = KernelRules(steps="profiler")
    assert rules == KernelRules()
    assert dataclasses.replace(rules, steps="vllm").steps == STEP_PATTERNS["vllm"]
    with pytest.raises(RulesError, match="at least two families"):
        KernelRules(layers=["moe_topk"])
