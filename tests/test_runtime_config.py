"""Kernel specs applied by the RuntimeConfig builder; the prepare_call hook without a session."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from multicore_profiler.abi import NO_OWNER, BufferLayout
from multicore_profiler.errors import ConfigError, SpecError
from multicore_profiler.kernels import (
    CpuBackend,
    ProfileSpec,
    ProfileStage,
    build_runtime_config,
    new_tasks,
    prepare_call,
)

# A small graph: 3 loads (AIV) feed 3 matmuls (AIC, two tilings), a reduce (AIV) waits for all.
LOAD, MATMUL, REDUCE = 0, 1, 2


def graph() -> np.ndarray:
    tasks = new_tasks(7)
    tasks["task_type"] = [LOAD, LOAD, LOAD, MATMUL, MATMUL, MATMUL, REDUCE]
    tasks["core_type"] = [2, 2, 2, 1, 1, 1, 2]
    tasks["tiling_position"] = [0, 0, 0, 0, 1, 0, 0]
    tasks["input_position"] = [0, 1, 2, 3, 3, 4, 0]
    tasks["args"][:, 0] = [5, 6, 5, 5, 6, 5, 0]  # owner of each task
    tasks["trigger_event"] = [0, 1, 2, 3, 3, 3, -1]
    tasks["wait_event"] = [-1, -1, -1, 0, 1, 2, 3]
    tasks["wait_count"] = [0, 0, 0, 1, 1, 1, 3]
    return tasks


SPEC = ProfileSpec(
    kernel_name="TinyMega",
    owner_label="Expert",
    stages=[
        ProfileStage(0x10, "Load", task_type=LOAD),
        ProfileStage(0x20, "MatmulA", task_type=MATMUL, tiling_position=0),
        ProfileStage(0x30001, "MatmulB", task_type=MATMUL, tiling_position=1),
    ],
    owner_resolver=lambda t: np.where(t["task_type"] == REDUCE, NO_OWNER, t["args"][:, 0]),
)


def build(spec: ProfileSpec | None = SPEC, **kwargs: int):
    return build_runtime_config(
        graph(), event_count=4, aic_workers=2, aiv_workers=2, backend=CpuBackend(), spec=spec,
        **kwargs,
    )  # fmt: skip


def test_spec_writes_stage_owner_and_index_into_each_descriptor() -> None:
    tasks = build().tasks
    assert tasks["profile_desc_id"].tolist() == [0x10, 0x10, 0x10, 0x20, 0x30001, 0x20, 0]
    assert tasks["profile_owner_id"].tolist() == [5, 6, 5, 5, 6, 5, NO_OWNER]
    # Position within (stage, owner), in task order.
    assert tasks["profile_task_index"].tolist() == [0, 0, 1, 0, 0, 1, 0]
    # Task i of a core type runs on worker i % workers.
    assert tasks["worker"].tolist() == [0, 1, 0, 0, 1, 0, 1]


def test_unmatched_tasks_and_no_spec_fall_back() -> None:
    config = build()
    assert config.effective_desc_ids().tolist() == [0x10, 0x10, 0x10, 0x20, 0x30001, 0x20, 0x20002]
    bare = build(spec=None)
    assert bare.tasks["profile_desc_id"].tolist() == [0] * 7
    assert bare.tasks["profile_owner_id"].tolist() == [NO_OWNER] * 7
    assert bare.effective_desc_ids().tolist() == [0x20000] * 3 + [0x20001] * 3 + [0x20002]
    assert bare.metadata.kernel_name == "MegaKernel"
    assert bare.metadata.owner_label == "Owner"
    assert dict(bare.metadata.stage_names) == {}


def test_names_ride_along_without_changing_the_bytes() -> None:
    renamed_stages = [replace(stage, name=stage.name.lower()) for stage in SPEC.stages]
    named = build()
    renamed = build(
        spec=replace(SPEC, kernel_name="Other", owner_label="Head", stages=renamed_stages)
    )
    assert named.to_bytes() == renamed.to_bytes()
    assert named.config_id == renamed.config_id
    assert named.metadata.kernel_name == "TinyMega"
    assert dict(named.metadata.stage_names) == {0x10: "Load", 0x20: "MatmulA", 0x30001: "MatmulB"}


def test_profiling_flag_is_the_only_difference_between_modes() -> None:
    config = build()
    profiled = config.with_profiling()
    assert not config.profile_enabled
    assert profiled.profile_enabled
    assert profiled.with_profiling(False) is config
    assert config.with_profiling() is profiled
    assert profiled.config_id == config.config_id
    diff = np.flatnonzero(
        np.frombuffer(config.to_bytes(), np.uint8) != np.frombuffer(profiled.to_bytes(), np.uint8)
    )
    assert diff.tolist() == [8]  # the header's profile_enabled field
    assert profiled.tensor.tolist() == list(profiled.to_bytes())


def test_capacity_is_planned_from_the_queues() -> None:
    # AIC worker 0 runs two matmuls (wait + compute + trigger each): 6 records -> 16.
    assert build().layout == BufferLayout(
        aic_slots=2, aiv_slots=2, aic_capacity=16, aiv_capacity=16, generation="a"
    )
    tasks = new_tasks(40)
    tasks["core_type"] = 1
    tasks["trigger_event"] = 0
    config = build_runtime_config(
        tasks, event_count=1, aic_workers=2, aiv_workers=0, backend=CpuBackend(), aiv_slots=3
    )
    # 20 tasks x (compute + trigger) on each AIC worker: 40 -> 48; no AIV task -> 0.
    assert config.layout == BufferLayout(
        aic_slots=2, aiv_slots=3, aic_capacity=48, aiv_capacity=0, generation="a"
    )
    forced = build(aic_capacity=32)
    assert forced.layout.aic_capacity == 32


def test_task_matching_two_stages_raises_before_anything_is_written() -> None:
    clash = ProfileSpec(
        kernel_name="TinyMega",
        stages=[
            ProfileStage(1, "Matmul", task_type=MATMUL),
            ProfileStage(2, "Tiling0", tiling_position=0, input_position=3),
        ],
    )
    with pytest.raises(
        SpecError,
        match=r"task 3 matches both stage 'Matmul' and stage 'Tiling0' \(1 task\(s\) match both\)",
    ):
        build(spec=clash)


def test_custom_matcher_combines_with_other_selectors() -> None:
    spec = ProfileSpec(
        stages=[
            ProfileStage(7, "FirstLoad", task_type=LOAD, matcher=lambda t: t["input_position"] == 0)
        ]
    )
    assert build(spec=spec).tasks["profile_desc_id"].tolist() == [7, 0, 0, 0, 0, 0, 0]


def test_task_type_names_name_the_compute_fallback() -> None:
    """A named task type is stored as the name of its fallback desc id 0x20000 + type; a
    stage keeps its own id."""
    spec = ProfileSpec(
        stages=[ProfileStage(0x30001, "GMM1", task_type=1)], task_type_names={1: "Gemm", 7: "Copy"}
    )
    assert spec.stage_names == {0x20001: "Gemm", 0x20007: "Copy", 0x30001: "GMM1"}
    assert build(spec=spec).metadata.stage_names == spec.stage_names


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ProfileStage(0, "Zero", task_type=1), "desc_id 0x0 is not a stage id"),
        (lambda: ProfileStage(0x10000, "Wait", task_type=1), "desc_id 0x10000 is not a stage id"),
        (lambda: ProfileStage(0x20005, "Fallback", task_type=1), "fallback ids 0x20000..0x2ffff"),
        (lambda: ProfileStage(3, "Everything"), "selects nothing"),
        (lambda: ProfileStage(3, "", task_type=1), "needs a name"),
        (
            lambda: ProfileSpec(
                stages=[ProfileStage(3, "A", task_type=1), ProfileStage(3, "B", task_type=2)]
            ),
            "stages 'A' and 'B' share the desc_id 3",
        ),
        (
            lambda: build(spec=ProfileSpec(owner_resolver=lambda t: np.zeros(2))),
            r"owner resolver returned shape \(2,\) for 7 tasks",
        ),
        (lambda: ProfileSpec(task_type_names={0x10000: "Big"}), "a type in 0..0xffff"),
        (lambda: ProfileSpec(task_type_names={3: ""}), "got 3: ''"),
    ],
)
def test_bad_specs_raise(make, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        make()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.__setitem__("core_type", 3), "task 0 has core_type 3; AIC is 1, AIV 2"),
        (lambda t: t["wait_event"].__setitem__(6, 9), "task 6: wait_event 9 is not an event"),
        (
            lambda t: t["wait_count"].__setitem__(6, 4),
            "task 6 waits for 4 triggers of event 3, which only 3 task",
        ),
    ],
)
def test_graphs_that_cannot_run_raise(edit, message: str) -> None:
    tasks = graph()
    edit(tasks)
    with pytest.raises(ConfigError, match=message):
        build_runtime_config(
            tasks, event_count=4, aic_workers=2, aiv_workers=2, backend=CpuBackend()
        )


def test_prepare_call_without_a_session_is_plain() -> None:
    config = build()
    backend = config.backend
    with prepare_call(config, direction="backward") as call:
        assert call.config is config
        assert call.buffer is backend.placeholder
        assert call.direction == "backward"
        assert not call.profiled
    assert call.state == "completed"
    call.cancel()  # idempotent: the first of complete / cancel wins
    assert call.state == "completed"
    assert backend.allocations == 0
