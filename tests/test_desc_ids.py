"""Desc ids as hyper-parallel gives them meaning: the ids it reserves, the names its
exporter writes, the TerminateTask stage and the graph stages of its newer generation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from golden import AIC, AIV, NO_OWNER, TERMINATE, TRIGGER, WAIT, Slot, pack
from task_graphs import tasks_table

from multicore_profiler.abi import BufferLayout, is_stage_desc_id
from multicore_profiler.errors import SpecError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.kernels.backend import CpuBackend
from multicore_profiler.kernels.runtime import build_runtime_config, new_tasks
from multicore_profiler.kernels.spec import GraphOperator, ProfileSpec, ProfileStage
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

RUN = "desc-ids"
CONFIG = "desc-config"
LAYOUT = BufferLayout(aic_slots=1, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
GMM1, DISPATCH = 0x10001, 0x12001
"""Stage ids of hyper-parallel's first generation (its MegaMoe kernel and its tests)."""
SHMEM_GET_MEM = 0x20000 + 107

BOUNDARIES = [
    (0, False),
    (0x10000, False),
    (0x10001, True),
    (0x10005, True),
    (0x10006, False),
    (0x10007, False),
    (0x10008, True),
    (0x1FFFF, True),
    (0x20000, False),
    (0x2FFFF, False),
    (0x30000, True),
    (0xFFFFFFFF, True),
    (0x1_0000_0000, False),
]


@pytest.mark.parametrize(("desc_id", "stage"), BOUNDARIES)
def test_only_what_upstream_reserves_is_refused_as_a_stage(desc_id: int, stage: bool) -> None:
    assert is_stage_desc_id(desc_id) is stage
    if stage:
        assert ProfileStage(desc_id, "S", task_type=1).desc_id == desc_id
    elif desc_id == TERMINATE:
        with pytest.raises(SpecError) as raised:
            ProfileStage(desc_id, "S", task_type=1)
        assert str(raised.value) == (
            "stage 'S': desc_id 0x10006 is the spec's own TerminateTask stage; "
            "set ProfileSpec(terminate_task_type=...) instead"
        )
    else:
        with pytest.raises(SpecError) as raised:
            ProfileStage(desc_id, "S", task_type=1)
        assert str(raised.value) == (
            f"stage 'S': desc_id {desc_id:#x} is not a stage id; use a non-zero 32-bit id "
            "other than the ABI's control ids 0x10000, 0x10006, 0x10007 and fallback ids "
            "0x20000..0x2ffff"
        )


def first_generation_buffer() -> bytearray:
    """AIC/0: task 9 (stage 0x10001, Expert 5, third of its stage) waits, computes and
    triggers; AIV/0: task 10 (stage 0x12001, no owner) does the same, then task 11 (no
    stage, task type 107) and task 12 (TerminateTask) run."""
    return pack(
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
                    (110, 160, WAIT, 9, 2, 5),
                    (160, 400, GMM1, 9, 2, 5),
                    (400, 405, TRIGGER, 9, 2, 5),
                ],
            ),
            Slot(
                AIV,
                0,
                100,
                [
                    (420, 430, WAIT, 10, 0, NO_OWNER),
                    (430, 500, DISPATCH, 10, 0, NO_OWNER),
                    (500, 505, TRIGGER, 10, 0, NO_OWNER),
                    (505, 600, SHMEM_GET_MEM, 11, 0, NO_OWNER),
                    (600, 610, WAIT, 12, 0, NO_OWNER),
                    (610, 620, TERMINATE, 12, 0, NO_OWNER),
                ],
            ),
        ],
    )


def ingest(store: Store, stage_names: dict[int, str], *, graph: bool) -> None:
    store.write_run(RunInfo.begin(run_id=RUN))
    kernel = KernelInfo(
        kernel_name="MegaMoe", owner_label="Expert", stage_names=stage_names, config_id=CONFIG
    )
    ingest_buffers(
        store,
        [first_generation_buffer()],
        LAYOUT,
        frequency_hz=50e6,
        run_id=RUN,
        kernel=kernel,
        launches=Launches(rank=0),
    )
    if graph:
        store.write_tasks(
            RUN,
            tasks_table(
                CONFIG,
                "MegaMoe",
                task_id=[9, 10, 11, 12],
                desc_id=[GMM1, DISPATCH, SHMEM_GET_MEM, TERMINATE],
                core_type=[AIC, AIV, AIV, AIV],
                worker=[0, 0, 0, 0],
                wait_event=[-1, -1, -1, -1],
                wait_count=[0, 0, 0, 0],
                trigger_event=[-1, -1, -1, -1],
            ),
        )


def names(store: Store, tmp_path: Path, *, detailed: bool) -> list[str]:
    export_chrome_trace(store, tmp_path / "t.json", detailed_task_names=detailed)
    trace = json.loads((tmp_path / "t.json").read_bytes())
    return [event["name"] for event in trace["traceEvents"] if event["ph"] == "X"]


def test_first_generation_stage_ids_name_their_waits_and_triggers(
    store: Store, tmp_path: Path
) -> None:
    """hyper-parallel's own names: the stage of the task prefixes its wait and trigger, the
    owner comes first, the task's number last; task type 107 is ShmemGetMem."""
    ingest(store, {GMM1: "GMM1", DISPATCH: "Dispatch", TERMINATE: "TerminateTask"}, graph=True)
    assert names(store, tmp_path, detailed=False) == [
        "GMM1_WaitDependency",
        "GMM1",
        "GMM1_TriggerEvent",
        "Dispatch_WaitDependency",
        "Dispatch",
        "Dispatch_TriggerEvent",
        "TaskType_ShmemGetMem",
        "TerminateTask_WaitDependency",
        "TerminateTask",
    ]
    assert names(store, tmp_path, detailed=True) == [
        "Expert5_GMM1_WaitDependency_task3",
        "Expert5_GMM1_task3",
        "Expert5_GMM1_TriggerEvent_task3",
        "Dispatch_WaitDependency_task1",
        "Dispatch_task1",
        "Dispatch_TriggerEvent_task1",
        "TaskType_ShmemGetMem_task1",
        "TerminateTask_WaitDependency_task1",
        "TerminateTask_task1",
    ]


def test_without_a_task_graph_the_compute_record_gives_the_stage(
    store: Store, tmp_path: Path
) -> None:
    """No graph: a wait or trigger takes its task's stage from the task's compute record, so
    the TerminateTask task's wait (whose task has no compute record) has no prefix."""
    ingest(store, {GMM1: "GMM1", DISPATCH: "Dispatch"}, graph=False)
    assert names(store, tmp_path, detailed=False) == [
        "GMM1_WaitDependency",
        "GMM1",
        "GMM1_TriggerEvent",
        "Dispatch_WaitDependency",
        "Dispatch",
        "Dispatch_TriggerEvent",
        "TaskType_ShmemGetMem",
        "WaitDependency",
        "TerminateTask",
    ]
    assert store.sql("SELECT DISTINCT phase FROM records_ns WHERE desc_id = $1", [GMM1])[
        "phase"
    ].to_pylist() == ["compute"]


@pytest.mark.parametrize(
    ("desc_id", "name"),
    [
        (0x10000, "WaitDependency"),
        (0x10006, "TerminateTask"),
        (0x10007, "TriggerEvent"),
        (0x10003, "DescId_65539"),
        (0x20000, "TaskType_Terminate"),
        (0x20000 + 10, "TaskType_BeginTaskGraph"),
        (0x20000 + 101, "TaskType_AddCustom"),
        (0x20000 + 102, "TaskType_SwiGLU"),
        (0x20000 + 103, "TaskType_MatMul"),
        (0x20000 + 104, "TaskType_GroupedMatMul"),
        (0x20000 + 105, "TaskType_ShmemPutMemSignal"),
        (0x20000 + 106, "TaskType_SwiGLUGrad"),
        (SHMEM_GET_MEM, "TaskType_ShmemGetMem"),
        (0x20000 + 3, "TaskType_3"),
        (0x2FFFF, "TaskType_65535"),
        (0x30000, "TaskType_65536"),
        (0x30005, "TaskType_65541"),
    ],
)
def test_unnamed_ids_as_upstream_names_them(store: Store, desc_id: int, name: str) -> None:
    """Nothing bound: the control ids, hyper-parallel's task types, and every other id from
    0x20000 up as TaskType_<id - 0x20000> (a graph stage 0x30000 + k is 65536 + k)."""
    query = "SELECT stage_name(MAP {}::MAP(UINTEGER, VARCHAR), $1::UINTEGER) AS n"
    assert store.sql(query, [desc_id])["n"].to_pylist() == [name]


def test_a_kernels_task_type_names_override_the_defaults(store: Store) -> None:
    spec = ProfileSpec(task_type_names={107: "Pull", 3: "Copy"})
    query = (
        "SELECT stage_name(map_from_entries($1::STRUCT(k UINTEGER, v VARCHAR)[]), d) AS n "
        "FROM unnest([131179, 131075, 131178]::UINTEGER[]) AS t(d)"
    )
    entries = [{"k": k, "v": v} for k, v in spec.stage_names.items()]
    assert store.sql(query, [entries])["n"].to_pylist() == [
        "TaskType_Pull",
        "TaskType_Copy",
        "TaskType_SwiGLUGrad",
    ]


def config_tasks() -> np.ndarray:
    """Seven tasks of four graph operators (the third has none), then two tasks of type 0
    (hyper-parallel's TerminateTask) that the graph does not cover."""
    tasks = new_tasks(9)
    tasks["task_type"] = [105, 105, 104, 104, 104, 102, 102, 0, 0]
    tasks["core_type"] = [AIV, AIV, AIC, AIC, AIC, AIV, AIV, AIV, AIC]
    return tasks


GRAPH = [
    GraphOperator("dispatch", 2),
    GraphOperator("gate_up_proj", 3),
    GraphOperator("shared_expert", 0),
    GraphOperator("swiglu", 2, diagnostic_name=" SwiGLU "),
]


def test_graph_stages_are_numbered_in_topological_order() -> None:
    spec = ProfileSpec.from_graph(
        GRAPH,
        kernel_name="MegaMoe",
        owner_label="Expert",
        owner_resolver=lambda tasks: tasks["task_id"] % 2,
    )
    assert [(s.desc_id, s.name, s.task_ids) for s in spec.stages] == [
        (0x30000, "Dispatch", range(2)),
        (0x30001, "GateUpProj", range(2, 5)),
        (0x30002, "SharedExpert", range(5, 5)),
        (0x30003, "SwiGLU", range(5, 7)),
    ]
    assert spec.stage_names == {
        0x30000: "Dispatch",
        0x30001: "GateUpProj",
        0x30002: "SharedExpert",
        0x30003: "SwiGLU",
        0x10006: "TerminateTask",
    }
    config = build_runtime_config(
        config_tasks(), event_count=0, aic_workers=1, aiv_workers=1, backend=CpuBackend(), spec=spec
    )
    tasks = config.tasks
    assert (
        tasks["profile_desc_id"].tolist()
        == [0x30000] * 2 + [0x30001] * 3 + [0x30003] * 2 + [0x10006] * 2
    )
    # TerminateTask tasks have no owner, whatever the resolver says.
    assert tasks["profile_owner_id"].tolist() == [0, 1, 0, 1, 0, 1, 0, NO_OWNER, NO_OWNER]
    assert tasks["profile_task_index"].tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 1]
    assert dict(config.metadata.stage_names) == spec.stage_names
    assert config.metadata.kernel_name == "MegaMoe"


def test_the_terminate_stage_takes_only_what_no_stage_selects() -> None:
    """A stage of the kernel's wins over TerminateTask; without terminate_task_type the
    type-0 tasks fall back to 0x20000; the stage's name is the spec's own."""
    stages = [ProfileStage(0x10001, "Dispatch", task_type=0, tiling_position=0)]
    tasks = config_tasks()
    tasks["tiling_position"][8] = 1
    with_terminate = ProfileSpec(stages=stages, terminate_task_type=0)
    assert with_terminate.desc_ids(tasks).tolist() == [0] * 7 + [0x10001, 0x10006]
    assert ProfileSpec(stages=stages).desc_ids(tasks).tolist() == [0] * 7 + [0x10001, 0]
    assert ProfileSpec(stages=stages).stage_names == {0x10001: "Dispatch"}
    with pytest.raises(SpecError) as raised:
        ProfileSpec(stages=[ProfileStage(3, "TerminateTask", task_type=4)], terminate_task_type=0)
    assert str(raised.value) == (
        "kernel MegaKernel: stages 'TerminateTask' and 'TerminateTask' share the name "
        "'TerminateTask'"
    )
    with pytest.raises(SpecError) as raised:
        ProfileSpec(terminate_task_type=0x10000)
    assert str(raised.value) == (
        "kernel MegaKernel: terminate_task_type must be a task type in 0..0xffff, got 65536"
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: GraphOperator(" ", 1), "a graph operator needs a non-empty name, got ' '"),
        (
            lambda: GraphOperator("gmm", -1),
            "graph operator 'gmm': task_count must be a non-negative integer, got -1",
        ),
        (
            lambda: GraphOperator("gmm", True),
            "graph operator 'gmm': task_count must be a non-negative integer, got True",
        ),
        (
            lambda: GraphOperator("gmm", 2.0),
            "graph operator 'gmm': task_count must be a non-negative integer, got 2.0",
        ),
        (
            lambda: GraphOperator("gmm", 1, diagnostic_name=""),
            "graph operator 'gmm': diagnostic_name must be a non-empty string when set, got ''",
        ),
        (
            lambda: GraphOperator("__", 1),
            "graph operator '__': its name has no character to name a stage with; "
            "give it a diagnostic_name",
        ),
        (
            lambda: ProfileSpec.from_graph(
                [GraphOperator("gate_up", 1), GraphOperator("GateUp", 1)]
            ),
            "kernel MegaKernel: graph operators 'gate_up' and 'GateUp' both name a stage "
            "'GateUp'; give one a diagnostic_name",
        ),
        (
            lambda: ProfileStage(0x30000, "Gmm", task_ids=[0, 1]),  # type: ignore[arg-type]
            "stage 'Gmm': task_ids must be a range of step 1, got [0, 1]",
        ),
        (
            lambda: ProfileSpec.from_graph([("gmm", 1)]),  # type: ignore[list-item]
            "kernel MegaKernel: graph operator 0 must be a GraphOperator, got tuple",
        ),
        (
            lambda: ProfileSpec.from_graph([*GRAPH, GraphOperator("combine", 3)]).desc_ids(
                config_tasks()
            ),
            "stage 'Combine' (0x30004) covers task ids 7..9, but the config holds 2 of them "
            "(9 tasks in all)",
        ),
    ],
)
def test_bad_graphs_raise(make, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        make()
    assert str(raised.value) == message
