"""Both ABI generations of hyper-parallel's MegaKernel profiling: generation a (256 records a
slot at most) and generation b (a slot as large as its busiest worker needs, graph stage ids
0x30000 + k), decoded, stored and exported as upstream's own exporter writes them.

The buffers are packed byte by byte (``golden.pack``, ``generation_b.pack_b``); the traces
are compared field by field with traces written out here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from generation_b import FALLBACK, GRAPH_STAGE, MAX_RECORDS_B, SHMEM_GET_MEM, capacity_b, pack_b
from golden import AIC, AIV, NO_OWNER, TRIGGER, WAIT, Slot, pack
from task_graphs import tasks_table
from test_fuse_upstream import named_kineto
from trace_checker import check_trace, load_trace

from multicore_profiler.abi import (
    MAX_CAPACITY_B,
    BufferLayout,
    TaskShape,
    capacity_for,
    infer_generation,
    plan_capacity,
)
from multicore_profiler.analysis.selection import RecordSelection
from multicore_profiler.cli import main
from multicore_profiler.errors import DroppedRecordsWarning, GenerationError, LayoutError, SlotError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.export.timeline import LayoutChanged, Timeline, TimelineGroup, open_timeline
from multicore_profiler.fuse.merge import merge_chrome_traces
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.decode import decode_buffer
from multicore_profiler.ingest.schedule import schedule
from multicore_profiler.ingest.session import mega_kernel_profile
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.kernels.backend import CpuBackend
from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route
from multicore_profiler.kernels.runtime import (
    TASK_SHMEM_PUT_MEM_SIGNAL,
    build_runtime_config,
    new_tasks,
    parse_config,
)
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store, open_store

RUN = "gen-b"
GMM1, SWIGLU, COMBINE = GRAPH_STAGE, GRAPH_STAGE + 1, GRAPH_STAGE + 2
GET_MEM = FALLBACK + SHMEM_GET_MEM
LAYOUT_B = BufferLayout(
    aic_slots=2, aiv_slots=2, aic_capacity=capacity_b(260), aiv_capacity=16, generation="b"
)
CONFIG = "graph-config"
KERNEL = KernelInfo(
    kernel_name="MegaGraph",
    owner_label="Expert",
    stage_names={GMM1: "GMM1", SWIGLU: "SwiGLU", COMBINE: "Combine", GET_MEM: "ShmemGetMem"},
    soc="Ascend910B4",
    config_id=CONFIG,
)
BIG = [(1000 + 10 * i, 1008 + 10 * i, GMM1, i, i, i % 4) for i in range(260)]
"""AIC/0: 260 GMM1 tasks (graph stage 0), more than generation a's 256."""
PARTIAL = [(1010, 1020, WAIT, 300, 0, NO_OWNER), (1020, 1050, SWIGLU, 300, 0, NO_OWNER)]
"""AIC/1: a slot that is not full (2 of 272) and dropped 3 records."""
GRAPH = [
    (1005, 1015, WAIT, 400, 0, 2),
    (1015, 1065, COMBINE, 400, 0, 2),
    (1065, 1070, TRIGGER, 400, 0, 2),
    (1070, 1100, GET_MEM, 401, 0, NO_OWNER),
]
"""AIV/0: a Combine task (graph stage 2) waits and triggers; a ShmemGetMem fallback follows."""
FULL = [(1100 + 5 * j, 1104 + 5 * j, SWIGLU, 500 + j, j, 1) for j in range(16)]
"""AIV/1: a full slot of SwiGLU tasks that dropped 3 more records."""


def buffer_b() -> bytearray:
    return pack_b(
        LAYOUT_B,
        [
            Slot(AIC, 0, 1000, BIG),
            Slot(AIC, 1, 1002, PARTIAL, dropped=3),
            Slot(AIV, 0, 1001, GRAPH),
            Slot(AIV, 1, 1003, FULL, dropped=3),
        ],
    )


def graph() -> pa.Table:
    """The tasks whose waits and triggers the trace names after their stage."""
    return tasks_table(
        CONFIG,
        "MegaGraph",
        task_id=[300, 400, 401],
        desc_id=[SWIGLU, COMBINE, GET_MEM],
        core_type=[AIC, AIV, AIV],
        worker=[1, 0, 0],
        wait_event=[0, 1, -1],
        wait_count=[1, 1, 0],
        trigger_event=[-1, 2, -1],
        task_type=[0, 0, SHMEM_GET_MEM],
        owner_id=[NO_OWNER, 2, NO_OWNER],
        rank=1,
    )


def fill(store: Store, buffers: list[bytearray], layout: BufferLayout, **kernel: Any) -> None:
    run = RunInfo.begin(run_id=RUN, label="graph")
    store.write_run(run)
    ingest_buffers(
        store,
        buffers,
        layout,
        frequency_hz=50e6,
        run_id=RUN,
        kernel=KernelInfo(**{**vars(KERNEL), **kernel}),
        launches=Launches(rank=1, device=6, step=2, first_invocation_id=0),
    )
    store.write_run(run.finish())


@pytest.fixture
def graph_store(store: Store) -> Store:
    with pytest.warns(DroppedRecordsWarning) as caught:
        fill(store, [buffer_b()], LAYOUT_B)
    assert sorted(str(w.message) for w in caught) == [
        "device dropped 3 records on 1 core(s): AIV/1 (3); their slots were full (plan a larger "
        "capacity)",
        "device dropped 3 records on 1 slot(s) that are not full (slot 1 (AIC block 1): 3 "
        "dropped, 2 of 272 records); every record written is kept, and the invocation lists "
        "the slots in partial_slots",
    ]
    store.write_tasks(RUN, graph())
    return store


def exported(store: Store, path: Path, **options: Any) -> dict[str, Any]:
    result = export_chrome_trace(store, path, **options)
    trace = load_trace(path)
    check_trace(trace)
    assert result.metadata == trace["megaKernelCycleTrace"]
    return trace


def us(cycles: int) -> float:
    """Cycles at 50 MHz as microseconds, as the trace writes them (from exact ns)."""
    return cycles * 20 / 1000


def x(name: str, tid: int, entry: int, record: tuple[int, ...], **more: Any) -> dict[str, Any]:
    """The complete event of one record of the graph buffer (anchor cycle 1000)."""
    start, end, desc, task, index, owner = record
    args = {
        "rank": 1,
        "device_id": 6,
        "core_type": tid // 1000,
        "block_id": tid % 1000,
        "core_entry_cycle": entry,
        "invocation_id": 0,
        "step": 2,
        "direction": "forward",
        "task_id": task,
        "desc_id": desc,
        **more,
        "stage_task_index": index,
        "task_number": index + 1,
        **({} if owner == NO_OWNER else {"owner_id": owner}),
        "start_cycle": start,
        "end_cycle": end,
    }
    return {
        "name": name,
        "ph": "X",
        "cat": "MegaKernelInternal",
        "pid": 1,
        "tid": tid,
        "ts": us(start - 1000),
        "dur": us(end - start),
        "args": args,
    }


def meta(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": 1, "tid": tid, "args": args}


def expected_events(detailed: bool) -> list[dict[str, Any]]:
    """What hyper-parallel's newer exporter writes for the graph buffer (in this project's
    event layout): graph stages carry task_type 65536 + k, the fallback its task type."""

    def named(stage: str, record: tuple[int, ...]) -> str:
        if not detailed:
            return stage
        owner = "" if record[5] == NO_OWNER else f"Expert{record[5]}_"
        return f"{owner}{stage}_task{record[4] + 1}"

    return [
        meta("process_name", 0, {"name": "MegaGraph rank 1 device 6"}),
        meta("process_sort_index", 0, {"sort_index": 1}),
        *[
            event
            for sort, tid in enumerate((1000, 1001, 2000, 2001))
            for event in (
                meta(
                    "thread_name", tid, {"name": f"{'AIC' if tid < 2000 else 'AIV'}/{tid % 1000}"}
                ),
                meta("thread_sort_index", tid, {"sort_index": sort}),
            )
        ],
        *[x(named("GMM1", r), 1000, 1000, r, task_type=65536) for r in BIG],
        x(named("SwiGLU_WaitDependency", PARTIAL[0]), 1001, 1002, PARTIAL[0]),
        x(named("SwiGLU", PARTIAL[1]), 1001, 1002, PARTIAL[1], task_type=65537),
        x(named("Combine_WaitDependency", GRAPH[0]), 2000, 1001, GRAPH[0]),
        x(named("Combine", GRAPH[1]), 2000, 1001, GRAPH[1], task_type=65538),
        x(named("Combine_TriggerEvent", GRAPH[2]), 2000, 1001, GRAPH[2]),
        x(named("TaskType_ShmemGetMem", GRAPH[3]), 2000, 1001, GRAPH[3], task_type=107),
        *[x(named("SwiGLU", r), 2001, 1003, r, task_type=65537) for r in FULL],
    ]


def expected_summary(detailed: bool) -> dict[str, Any]:
    invocation = {
        "runId": RUN,
        "invocationId": 0,
        "step": 2,
        "windowIndex": None,
        "direction": "forward",
        "kernelName": "MegaGraph",
        "rank": 1,
        "deviceId": 6,
        "pid": 1,
        "socName": "Ascend910B4",
        "cycleFrequencyMHz": 50.0,
        "cycleFrequencySource": "given",
        "anchorCycle": 1000,
        "offsetUs": 0.0,
        "recordCapacityPerCore": {"AIC": 272, "AIV": 16},
        "recordCount": 282,
        "storedRecordCount": 282,
        "droppedRecordCount": 6,
        "taskGraph": True,
        "abiGeneration": "b",
        "profileBufferBytes": 2 * (64 + 272 * 32) + 2 * (64 + 16 * 32),
    }
    return {
        "schemaVersion": 1,
        "selection": f"run {RUN}",
        "detailedTaskNames": detailed,
        "rank": 1,
        "deviceId": 6,
        "socName": "Ascend910B4",
        "windowIndex": None,
        "cycleFrequencyMHz": 50.0,
        "cycleFrequencySource": "given",
        "anchorCycle": 1000,
        "recordCapacityPerCore": {"AIC": 272, "AIV": 16},
        "maxRecordCapacityPerCore": 134217712,
        "abiGeneration": "b",
        "profileBufferBytes": 18688,
        "invocationCount": 1,
        "recordCount": 282,
        "droppedRecordCount": 6,
        "flowCount": 0,
        "invocationsWithoutTaskGraph": 0,
        "processes": [{"pid": 1, "runId": RUN, "rank": 1, "anchorCycle": 1000}],
        "invocations": [invocation],
        "subTracks": [],
        "warnings": [
            "device dropped 3 records in 1 invocation(s) (full slots; raise the capacity): the "
            "timeline misses their last tasks",
            "device dropped 3 records in 1 invocation(s) on slots that were not full (the "
            "recorder drops a task's records together when they do not all fit): the timeline "
            "misses those tasks",
        ],
    }


# The plan: each generation's capacity rule.


def test_generation_b_lifts_the_cap_to_134217712_records() -> None:
    assert MAX_CAPACITY_B == MAX_RECORDS_B == 134_217_712
    assert [capacity_for(n, "a") for n in (0, 17, 256, 258, 10**6)] == [0, 32, 256, 256, 256]
    assert [capacity_for(n, "b") for n in (0, 17, 256, 258, 10**6)] == [0, 32, 256, 272, 10**6]
    assert capacity_for(MAX_CAPACITY_B, "b") == MAX_CAPACITY_B
    with pytest.raises(LayoutError, match="busiest worker writes 134217713 records, more than"):
        capacity_for(MAX_CAPACITY_B + 1, "b")
    queue = [TaskShape(waits=True, triggers=True)] * 86  # 258 records
    assert (plan_capacity([queue], "a"), plan_capacity([queue], "b")) == (256, 272)
    plan = BufferLayout.plan([queue], [], aic_slots=24, aiv_slots=48, generation="b")
    assert plan == BufferLayout(24, 48, 272, 0, generation="b")
    assert plan.total_bytes == 24 * (64 + 272 * 32) + 48 * 64


def test_a_slot_of_the_largest_capacity_lies_at_64_bit_offsets() -> None:
    layout = BufferLayout(aic_slots=24, aiv_slots=48, aic_capacity=MAX_CAPACITY_B, aiv_capacity=16)
    assert layout.resolved.generation == "b"
    assert layout.stride(AIC) == 4_294_966_848
    assert layout.offset(AIV) == 24 * 4_294_966_848
    assert layout.total_bytes == 24 * 4_294_966_848 + 48 * (64 + 16 * 32) > 2**36


def test_runtime_configs_plan_by_their_generation() -> None:
    """256 tasks on one AIC worker, each a ShmemPutMemSignal or a plain task that triggers
    nothing: generation a counts 1 record each (256), generation b 2 for every task but a
    ShmemPutMemSignal (384 -> 384), uncapped."""
    tasks = new_tasks(256)
    tasks["core_type"] = AIC
    tasks["task_type"] = np.where(np.arange(256) % 2, TASK_SHMEM_PUT_MEM_SIGNAL, 103)

    def build(**kwargs: Any):
        return build_runtime_config(
            tasks, event_count=0, aic_workers=1, aiv_workers=0, backend=CpuBackend(), **kwargs
        )

    a, b = build(), build(generation="b")
    assert a.layout == BufferLayout(1, 0, 256, 0, generation="a")
    assert b.layout == BufferLayout(1, 0, 384, 0, generation="b")
    assert parse_config(np.frombuffer(b.to_bytes(), np.uint8))[0]["abi_generation"] == 1
    assert a.config_id != b.config_id
    with pytest.raises(LayoutError, match=r"no larger than 256, got 272 \(generation a's cap"):
        build(aic_capacity=272)
    with pytest.raises(LayoutError, match="an ABI generation is one of a, b, got 'c'"):
        build(generation="c")


# Decoding: the generation from the layout, or inferred.


def test_a_slot_above_256_records_decodes_as_generation_b() -> None:
    with pytest.warns(DroppedRecordsWarning):
        decoded = decode_buffer(buffer_b(), LAYOUT_B, frequency_hz=50e6)
    assert decoded.layout == LAYOUT_B
    records = decoded.records
    assert records.schema.field("record_index").type == pa.uint32()
    big = records.filter(
        pa.compute.and_(
            pa.compute.equal(records["block_id"], 0), pa.compute.equal(records["core_type"], AIC)
        )
    )
    assert big["record_index"].to_pylist() == list(range(260))
    assert big["desc_id"].to_pylist() == [GMM1] * 260
    assert big["start_cycle"].to_pylist()[-1] == 1000 + 10 * 259
    assert decoded.cores.to_pylist() == [
        {
            "buffer": 0,
            "slot": slot,
            "core_type": core,
            "block_id": block,
            "entry_cycle": entry,
            "record_count": count,
            "dropped_count": dropped,
            "record_capacity": capacity,
        }
        for slot, core, block, entry, count, dropped, capacity in (
            (0, AIC, 0, 1000, 260, 0, 272),
            (1, AIC, 1, 1002, 2, 3, 272),
            (2, AIV, 0, 1001, 4, 0, 16),
            (3, AIV, 1, 1003, 16, 3, 16),
        )
    ]
    assert decoded.partial_slots.to_pylist() == [[1]]
    assert (decoded.record_counts.tolist(), decoded.dropped_counts.tolist()) == ([282], [6])


def test_the_generation_is_inferred_from_capacities_and_graph_stage_ids() -> None:
    """No generation given: a capacity above 256, or a record of a graph stage
    (0x30000..0x3FFFF), can only be generation b; otherwise a. A layout that names
    generation a decodes graph stage ids as a (the host knows what it planned)."""
    inferred = BufferLayout(2, 2, 272, 16)
    with pytest.warns(DroppedRecordsWarning):
        assert decode_buffer(buffer_b(), inferred, frequency_hz=50e6).layout == LAYOUT_B
    small = BufferLayout(1, 1, 16, 16)
    for desc, generation in ((0x10001, "a"), (0x2FFFF, "a"), (GMM1, "b"), (0x3FFFF, "b")):
        raw = pack(1, 1, 16, 16, [Slot(AIV, 0, 10, [(10, 20, desc, 0, 0, 0)])])
        assert decode_buffer(raw, small, frequency_hz=50e6).layout == BufferLayout(
            1, 1, 16, 16, generation=generation
        ), hex(desc)
    graph = pack(1, 1, 16, 16, [Slot(AIV, 0, 10, [(10, 20, GMM1, 0, 0, 0)])])
    for named in ("a", "b"):
        assert decode_buffer(
            graph, BufferLayout(1, 1, 16, 16, named), frequency_hz=50e6
        ).layout == (BufferLayout(1, 1, 16, 16, generation=named))
    assert (infer_generation(256, 0), infer_generation(16, 272), infer_generation()) == (
        "a",
        "b",
        "a",
    )


def test_a_header_above_generation_a_s_cap_is_a_generation_error() -> None:
    """Generation a named, but AIV block 1's header holds 272 records: only b writes that."""
    raw = pack(1, 2, 16, 16, [Slot(AIV, 1, 5, [(5, 6, GMM1, 0, 0, 0)], capacity=272)])
    with pytest.raises(GenerationError) as caught:
        decode_buffer(raw, BufferLayout(1, 2, 16, 16, generation="a"), frequency_hz=50e6)
    error = caught.value
    assert isinstance(error, SlotError)
    assert (error.buffer, error.slot, error.field) == (0, 2, "record_capacity")
    assert str(error) == (
        "slot 2 (AIV block 1): record_capacity is 272, above generation a's cap of 256 records, "
        "so generation b wrote this buffer (decode it as generation b, --abi-generation b, with "
        "the capacities it planned)"
    )
    # Left to inference, the header only contradicts the planned capacity.
    with pytest.raises(SlotError, match="record_capacity is 272, expected the planned 16") as plain:
        decode_buffer(raw, BufferLayout(1, 2, 16, 16), frequency_hz=50e6)
    assert type(plain.value) is SlotError


# The store and the trace.


def test_the_store_keeps_each_invocation_s_generation(graph_store: Store) -> None:
    rows = graph_store.sql(
        "SELECT abi_generation, aic_capacity, partial_slots FROM invocations"
    ).to_pylist()
    assert rows == [{"abi_generation": "b", "aic_capacity": 272, "partial_slots": [1]}]
    indices = graph_store.sql(
        "SELECT max(record_index) AS top, typeof(max(record_index)) AS kind FROM records "
        "WHERE core_type = 1 AND block_id = 0"
    ).to_pylist()
    assert indices == [{"top": 259, "kind": "UINTEGER"}]


def test_generation_b_trace_is_upstream_s(graph_store: Store, tmp_path: Path) -> None:
    trace = exported(graph_store, tmp_path / "b.json")
    assert trace["traceEvents"] == expected_events(detailed=False)
    assert trace["megaKernelCycleTrace"] == expected_summary(detailed=False)


def test_generation_b_detailed_names(graph_store: Store, tmp_path: Path) -> None:
    trace = exported(graph_store, tmp_path / "b.json", detailed_task_names=True)
    assert trace["traceEvents"] == expected_events(detailed=True)
    assert trace["megaKernelCycleTrace"] == expected_summary(detailed=True)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in complete[258:]] == [
        "Expert2_GMM1_task259",
        "Expert3_GMM1_task260",
        "SwiGLU_WaitDependency_task1",
        "SwiGLU_task1",
        "Expert2_Combine_WaitDependency_task1",
        "Expert2_Combine_task1",
        "Expert2_Combine_TriggerEvent_task1",
        "TaskType_ShmemGetMem_task1",
        *[f"Expert1_SwiGLU_task{j + 1}" for j in range(16)],
    ]


def test_the_same_buffer_exports_per_its_generation(store: Store, tmp_path: Path) -> None:
    """A buffer either generation could have written: the capacity limit and the generation
    follow the one named; every event is the same (upstream's exporter writes task_type for
    every desc id from 0x20000 on, and names an unnamed one TaskType_<id - 0x20000>, in both
    generations)."""
    unnamed = (160, 170, GRAPH_STAGE + 5, 8, 0, 3)
    raw = pack(1, 1, 16, 16, [Slot(AIC, 0, 100, [(110, 160, GMM1, 7, 0, NO_OWNER), unnamed])])
    traces = {}
    for generation in ("a", "b"):
        run = f"as-{generation}"
        store.write_run(RunInfo.begin(run_id=run))
        ingest_buffers(
            store,
            [raw],
            BufferLayout(1, 1, 16, 16, generation=generation),
            frequency_hz=50e6,
            run_id=run,
            kernel=KernelInfo(stage_names={GMM1: "GMM1"}),
        )
        traces[generation] = exported(store, tmp_path / f"{generation}.json", run=run)
    (a_event, a_unnamed), (b_event, b_unnamed) = (
        [e for e in traces[g]["traceEvents"] if e["ph"] == "X"] for g in "ab"
    )
    assert (a_event, a_unnamed) == (b_event, b_unnamed)
    assert (a_unnamed["name"], a_unnamed["args"]["task_type"]) == ("TaskType_65541", 65541)
    assert a_event["args"]["task_type"] == 65536
    detailed = exported(store, tmp_path / "d.json", run="as-b", detailed_task_names=True)
    assert [e["name"] for e in detailed["traceEvents"] if e["ph"] == "X"] == [
        "GMM1_task1",
        "Owner3_TaskType_65541_task1",
    ]
    a_meta, b_meta = (traces[g]["megaKernelCycleTrace"] for g in "ab")
    assert (a_meta["maxRecordCapacityPerCore"], b_meta["maxRecordCapacityPerCore"]) == (
        256,
        134217712,
    )
    assert (a_meta["abiGeneration"], b_meta["abiGeneration"]) == ("a", "b")
    assert a_meta["profileBufferBytes"] == b_meta["profileBufferBytes"] == 2 * (64 + 16 * 32)


def test_a_selection_of_both_generations(graph_store: Store, tmp_path: Path) -> None:
    """Invocations of both generations in one trace: the limit is the largest, the buffer
    size and generation per invocation; every record carries its task_type."""
    raw = pack(1, 1, 16, 16, [Slot(AIC, 0, 100, [(110, 160, SWIGLU, 7, 0, NO_OWNER)])])
    ingest_buffers(
        graph_store,
        [raw],
        BufferLayout(1, 1, 16, 16, generation="a"),
        frequency_hz=50e6,
        run_id=RUN,
        kernel=KERNEL,
        launches=Launches(rank=1, device=6, step=3),
    )
    trace = exported(graph_store, tmp_path / "both.json", run=RUN)
    summary = trace["megaKernelCycleTrace"]
    assert summary["maxRecordCapacityPerCore"] == 134217712
    assert (summary["abiGeneration"], summary["profileBufferBytes"]) == (None, None)
    assert [(i["abiGeneration"], i["profileBufferBytes"]) for i in summary["invocations"]] == [
        ("b", 18688),
        ("a", 1152),
    ]
    swiglu = [
        (e["args"]["invocation_id"], e["args"].get("task_type"))
        for e in trace["traceEvents"]
        if e["ph"] == "X" and e["args"]["desc_id"] == SWIGLU
    ]
    assert sorted(swiglu) == [*[(0, 65537)] * 17, (1, 65537)]


def test_records_files_of_older_stores_still_read(graph_store: Store) -> None:
    """A records file written while record_index was uint16 reads beside the new ones."""
    (path,) = sorted(graph_store.root.glob("records/**/*.parquet"))
    older = pq.read_table(path, partitioning=None)
    small = older.filter(pa.compute.less(older["record_index"], 16))
    index = small.schema.get_field_index("record_index")
    pq.write_table(
        small.set_column(index, "record_index", small["record_index"].cast(pa.uint16())),
        path.with_name("older.parquet"),
    )
    path.unlink()
    with pytest.warns(DroppedRecordsWarning):
        ingest_buffers(
            graph_store,
            [buffer_b()],
            LAYOUT_B,
            frequency_hz=50e6,
            run_id=RUN,
            kernel=KERNEL,
            launches=Launches(rank=1, device=6, step=2, first_invocation_id=5),
        )
    query = (
        "SELECT invocation_id, count(*) AS n, max(record_index) AS top, "
        "typeof(max(record_index)) AS kind FROM raw_records GROUP BY ALL ORDER BY ALL"
    )
    expected = [
        {"invocation_id": 0, "n": small.num_rows, "top": 15, "kind": "UINTEGER"},
        {"invocation_id": 5, "n": 282, "top": 259, "kind": "UINTEGER"},
    ]
    with open_store(graph_store.root) as reopened:
        assert reopened.sql(query).to_pylist() == expected


# The command line.


def test_ingest_buffer_takes_the_generation(capsys, tmp_path: Path) -> None:
    path = tmp_path / "b.bin"
    path.write_bytes(buffer_b())
    store = ["--store", str(tmp_path / "store")]
    layout = ["--aic-slots", "2", "--aiv-slots", "2", "--aic-capacity", "272"]
    layout += ["--aiv-capacity", "16", "--freq-mhz", "50"]
    code = main(["ingest-buffer", str(path), *layout, "--abi-generation", "b", *store])
    out, err = capsys.readouterr()
    assert (code, out) == (
        0,
        f"run {_only_run(tmp_path)}: 1 invocation(s) from id 0, 282 records, 6 dropped\n",
    )
    assert err.count("mcprof: warning: device dropped 3 records") == 2
    code = main(["ingest-buffer", str(path), *layout, "--abi-generation", "a", *store])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err == (
        "mcprof: error: aic_capacity must be a multiple of 16 no larger than 256, got 272 "
        "(generation a's cap; generation b lifts it to 134217712)\n"
    )
    assert main(["query", "--format", "csv", "SELECT abi_generation FROM invocations", *store]) == 0
    assert capsys.readouterr().out == "abi_generation\nb\n"


def _only_run(tmp_path: Path) -> str:
    with open_store(tmp_path / "store") as store:
        (row,) = store.sql("SELECT run_id FROM runs").to_pylist()
    return row["run_id"]


# Capture: the generation of the config goes with every invocation.


def test_a_capture_of_a_generation_b_kernel_keeps_its_generation(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    router, w1, w2 = make_moe_weights(4, 32, 64, generator=generator)
    x_in = torch.randn(64, 32, generator=generator)
    with (
        ReferenceMoeKernel(w1, w2, token_tile=16, generation="b") as kernel,
        mega_kernel_profile(
            store=tmp_path / "store", schedule=schedule(wait=0, warmup=0, active=1, repeat=1)
        ) as prof,
    ):
        kernel(x_in, *route(x_in, router, 2))
        prof.step()
        layout = kernel.config_for(64).layout
    assert layout.generation == "b"
    rows = prof.store.sql(
        "SELECT abi_generation, aic_capacity, aiv_capacity FROM invocations"
    ).to_pylist()
    assert rows == [
        {
            "abi_generation": "b",
            "aic_capacity": layout.aic_capacity,
            "aiv_capacity": layout.aiv_capacity,
        }
    ]
    summary = prof.export_chrome_trace(tmp_path / "t.json").metadata
    assert (summary["abiGeneration"], summary["maxRecordCapacityPerCore"]) == ("b", 134217712)
    assert summary["profileBufferBytes"] == layout.total_bytes


# Timelines of slots above 256 records: flow ids and sub-tracks.


def test_flows_and_sub_tracks_of_a_slot_above_256_records(store: Store, tmp_path: Path) -> None:
    """AIC/1 holds 260 records: record 258 overlaps record 257 (a sub-track), and record 259
    is a wait that AIC/0's trigger released. The arrow's id is the wait's slot code above its
    record index, which now needs 9 bits: (1 << 9) | 259."""
    records = [(100 + 10 * i, 108 + 10 * i, GMM1, i, i, NO_OWNER) for i in range(258)]
    records += [(2665, 2690, GMM1, 258, 258, NO_OWNER), (2700, 2720, WAIT, 900, 0, NO_OWNER)]
    trigger = [(150, 160, TRIGGER, 901, 0, NO_OWNER)]
    layout = BufferLayout(2, 1, 272, 16, generation="b")
    store.write_run(RunInfo.begin(run_id=RUN))
    ingest_buffers(
        store,
        [pack_b(layout, [Slot(AIC, 0, 100, trigger), Slot(AIC, 1, 100, records)])],
        layout,
        frequency_hz=50e6,
        run_id=RUN,
        kernel=KernelInfo(config_id=CONFIG),
    )
    store.write_tasks(
        RUN,
        tasks_table(
            CONFIG,
            "MegaKernel",
            task_id=[900, 901],
            desc_id=[GMM1, GMM1],
            core_type=[AIC, AIC],
            worker=[1, 0],
            wait_event=[0, -1],
            wait_count=[1, 0],
            trigger_event=[-1, 0],
        ),
    )
    with open_timeline(store, RecordSelection(run=RUN), flow_ids=True) as timeline:
        groups = [group.slices for group in _passes(timeline)]
        tracks = timeline.tracks.select(["tid", "name"]).to_pylist()
    slices = pa.concat_tables(groups).select(["tid", "task_id", "desc_id", "flows_in", "flows_out"])
    flow = (1 << 9) | 259
    rows = slices.to_pylist()
    assert rows[0] == {"tid": 1000, "task_id": 901, "desc_id": TRIGGER, "flows_in": [],
                       "flows_out": [flow]}  # fmt: skip
    assert rows[-1] == {"tid": 1001, "task_id": 900, "desc_id": WAIT, "flows_in": [flow],
                        "flows_out": []}  # fmt: skip
    assert [r["task_id"] for r in rows if r["tid"] == 11001] == [258]
    assert tracks == [
        {"tid": 1000, "name": "AIC/0"},
        {"tid": 1001, "name": "AIC/1"},
        {"tid": 11001, "name": "AIC/1 overlap 1"},
    ]
    trace = exported(store, tmp_path / "t.json")
    assert trace["megaKernelCycleTrace"]["flowCount"] == 1
    assert trace["megaKernelCycleTrace"]["subTracks"] == [
        {"pid": 0, "tid": 11001, "parentTid": 1001, "records": 1}
    ]


def _passes(timeline: Timeline) -> list[TimelineGroup]:
    """The groups of a timeline's last pass (a pass that finds sub-tracks starts again)."""
    try:
        return list(timeline.groups())
    except LayoutChanged:
        return list(timeline.groups())


def test_invocations_written_before_the_generation_was_kept_are_generation_a(
    store: Store, tmp_path: Path
) -> None:
    raw = pack(1, 1, 16, 16, [Slot(AIC, 0, 100, [(110, 160, GMM1, 7, 0, NO_OWNER)])])
    store.write_run(RunInfo.begin(run_id=RUN))
    ingest_buffers(store, [raw], BufferLayout(1, 1, 16, 16), frequency_hz=50e6, run_id=RUN)
    (path,) = store.root.glob("invocations/**/*.parquet")
    pq.write_table(pq.read_table(path, partitioning=None).drop_columns(["abi_generation"]), path)
    with open_store(store.root) as older:
        assert older.sql("SELECT abi_generation FROM invocations").to_pylist() == [
            {"abi_generation": None}
        ]
        trace = exported(older, tmp_path / "t.json")
    assert trace["megaKernelCycleTrace"]["abiGeneration"] == "a"
    assert trace["megaKernelCycleTrace"]["maxRecordCapacityPerCore"] == 256
    (event,) = (e for e in trace["traceEvents"] if e["ph"] == "X")
    assert event["args"]["task_type"] == GMM1 - 0x20000


def test_a_generation_b_invocation_fuses_from_the_store_and_from_its_trace(
    graph_store: Store, tmp_path: Path
) -> None:
    """The 282 records of the generation b invocation (a slot of 260) land on the outer
    kernel of its name, from the store and from its standalone trace alike: first record at
    the kernel's start, raw ids and task_type kept, one thread per core."""
    outer = tmp_path / "outer.json"
    named_kineto(outer, [("mega_graph_kernel", "10.000", "60.000")])
    export_chrome_trace(graph_store, tmp_path / "b.json")
    fused = {}
    for source, given in (("store", graph_store), ("trace", tmp_path / "b.json")):
        merge_chrome_traces(outer, given, tmp_path / f"fused-{source}.json", rank=1)
        fused[source] = load_trace(tmp_path / f"fused-{source}.json")
    added = {
        source: [e for e in trace["traceEvents"] if e.get("cat") == "MegaKernelInternal"]
        for source, trace in fused.items()
    }
    assert added["store"] == added["trace"]
    complete = [e for e in added["store"] if e["ph"] == "X"]
    assert len(complete) == 282
    assert complete[0] == {
        "name": "GMM1",
        "ph": "X",
        "cat": "MegaKernelInternal",
        "pid": 0,
        "tid": 8,
        "ts": 1000010.0,
        "dur": 0.16,
        "args": {
            "rank": 1,
            "device_id": 6,
            "core_type": 1,
            "block_id": 0,
            "core_entry_cycle": 1000,
            "invocation_id": 0,
            "step": 2,
            "direction": "forward",
            "task_id": 0,
            "desc_id": GMM1,
            "task_type": 65536,
            "stage_task_index": 0,
            "task_number": 1,
            "owner_id": 0,
            "start_cycle": 1000,
            "end_cycle": 1008,
            "parent_kernel": "mega_graph_kernel",
            "parent_kernel_ts": 1000010.0,
            "parent_kernel_dur": 60.0,
        },
    }
    last = max((e for e in complete if e["name"] == "GMM1"), key=lambda e: e["ts"])
    assert (last["args"]["task_id"], round(last["ts"] + last["dur"], 2)) == (259, 1000061.96)
    report = fused["store"]["megaKernelTraceMerge"]
    (invocation,) = report["invocations"]
    assert (invocation["outerKernel"]["name"], invocation["internalEventCount"]) == (
        "mega_graph_kernel",
        282,
    )
    assert (invocation["spanUs"], invocation["exceedsOuterKernelUs"]) == (51.96, 0.0)
    assert [t["name"] for t in report["threads"]] == [
        "MegaGraph/AIC/0",
        "MegaGraph/AIC/1",
        "MegaGraph/AIV/0",
        "MegaGraph/AIV/1",
    ]
    for trace in fused.values():
        check_trace(trace)
