"""Schedule sanity (``schedule_sanity``, ``schedule_faults``, ``event_sanity``): each
worker's recorded tasks against its planned queue, and each event's triggers against its
waits, with exact counts on hand-built invocations (one per fault), on the CPU reference
kernel's captured run, and none on invocations without a planned task graph.

The expected rows are worked out by hand from the queues below, not from the views' SQL.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import torch
from golden import AIC, AIV, TRIGGER, WAIT, Slot, pack
from proton_packer import Cta, Layout, pack_buffer, scopes
from simpler_packer import deps_document, records_document, task_token, write_json
from task_graphs import tasks_table

from multicore_profiler import mega_kernel_profile
from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import DroppedRecordsWarning
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.imports import import_profile
from multicore_profiler.ingest.step_rows import KernelInfo
from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

RUN = "schedule-run"
CONFIG = "schedule-config"
LAYOUT = BufferLayout(aic_slots=1, aiv_slots=2, aic_capacity=16, aiv_capacity=16)
GEMM, SWIGLU = 0x30001, 0x30002
EVENT, DONE = 0, 1

SCHEDULE = (
    "SELECT core, block_id, planned, recorded, missing, extra, repeated, out_of_order, "
    "dropped, verdict, tail_missing FROM schedule_sanity WHERE run_id = $1 "
    "ORDER BY core_type, block_id"
)
EVENTS = (
    "SELECT event, planned_triggers, recorded_triggers, waiters, waits, max_wait_count, "
    "unreleased_waits, trigger_dropped, verdict FROM event_sanity WHERE run_id = $1 "
    "ORDER BY event"
)
FAULTS = (
    "SELECT core, block_id, fault, task_id, position, record_index, previous_position "
    "FROM schedule_faults WHERE run_id = $1 ORDER BY core_type, block_id, fault, task_id, "
    "record_index"
)


def tasks() -> pa.Table:
    """AIC worker 0 queues tasks 0, 1, 2; AIV worker 0 tasks 3, 4; AIV worker 1 task 5.
    Tasks 0 and 2 trigger event 0, which task 3 waits for twice; task 3 triggers event 1,
    which task 5 waits for once."""
    return tasks_table(
        CONFIG,
        "ScheduleMoe",
        task_id=[0, 1, 2, 3, 4, 5],
        desc_id=[GEMM] * 3 + [SWIGLU] * 3,
        core_type=[AIC, AIC, AIC, AIV, AIV, AIV],
        worker=[0, 0, 0, 0, 0, 1],
        wait_event=[-1, -1, -1, EVENT, -1, DONE],
        wait_count=[0, 0, 0, 2, 0, 1],
        trigger_event=[EVENT, -1, EVENT, DONE, -1, -1],
    )


def compute(task: int, start: int) -> tuple[int, int, int, int, int, int]:
    return (start, start + 10, GEMM if task < 3 else SWIGLU, task, 0, 0)


def trigger(task: int, start: int) -> tuple[int, int, int, int, int, int]:
    return (start, start + 2, TRIGGER, task, 0, 0)


def wait(task: int, start: int, end: int) -> tuple[int, int, int, int, int, int]:
    return (start, end, WAIT, task, 0, 0)


AIC_QUEUE = [compute(0, 100), trigger(0, 110), compute(1, 112), compute(2, 122), trigger(2, 132)]
"""AIC/0 running its queue: task 0 and its trigger, task 1, task 2 and its trigger."""
AIV0_QUEUE = [wait(3, 100, 134), compute(3, 134), trigger(3, 144), compute(4, 146)]
"""AIV/0 running its queue: task 3 waits for both triggers of event 0, then task 4."""
AIV1_QUEUE = [wait(5, 100, 146), compute(5, 146)]
"""AIV/1 running its queue: task 5 waits for task 3's trigger."""


def judged(
    store: Store,
    aic: list | None = None,
    aiv0: list | None = None,
    aiv1: list | None = None,
    *,
    aic_dropped: int = 0,
    config: str | None = CONFIG,
) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """One invocation of the graph above whose slots hold these records (each defaults to
    its queue run as planned): its schedule_sanity, event_sanity and schedule_faults rows."""
    slots = [
        Slot(AIC, 0, 90, AIC_QUEUE if aic is None else aic, dropped=aic_dropped),
        Slot(AIV, 0, 90, AIV0_QUEUE if aiv0 is None else aiv0),
        Slot(AIV, 1, 90, AIV1_QUEUE if aiv1 is None else aiv1),
    ]
    run = RunInfo.begin(run_id=RUN)
    store.write_run(run)
    ingest_buffers(
        store,
        [pack(1, 2, 16, 16, slots)],
        LAYOUT,
        frequency_hz=50e6,
        run_id=RUN,
        kernel=KernelInfo(kernel_name="ScheduleMoe", config_id=config),
    )
    store.write_tasks(RUN, tasks())
    store.write_run(run.finish())
    return tuple(store.sql(sql, [RUN]).to_pylist() for sql in (SCHEDULE, EVENTS, FAULTS))


def row(core: str, block: int, planned: int, recorded: int, **counts: object) -> dict:
    """A schedule_sanity row: the counts given, every other one 0, verdict ok."""
    fields = {"missing": 0, "extra": 0, "repeated": 0, "out_of_order": 0, "dropped": 0}
    return (
        {"core": core, "block_id": block, "planned": planned, "recorded": recorded}
        | fields
        | {"verdict": "ok", "tail_missing": 0}
        | counts
    )


def event(
    number: int, planned: int, recorded: int, waits: int, max_count: int | None, **rest: object
) -> dict:
    """An event_sanity row of one waiter: no unreleased wait, nothing dropped, ok."""
    fields = {"unreleased_waits": 0, "trigger_dropped": 0, "verdict": "ok"} | rest
    return {
        "event": number,
        "planned_triggers": planned,
        "recorded_triggers": recorded,
        "waiters": 1,
        "waits": waits,
        "max_wait_count": max_count,
    } | fields


CLEAN = [row("AIC", 0, 3, 3), row("AIV", 0, 2, 2), row("AIV", 1, 1, 1)]
CLEAN_EVENTS = [event(EVENT, 2, 2, 1, 2), event(DONE, 1, 1, 1, 1)]


def test_a_clean_invocation_is_ok_everywhere(store: Store) -> None:
    schedule, events, faults = judged(store)
    assert schedule == CLEAN
    assert events == CLEAN_EVENTS
    assert faults == []


def test_a_missing_task_in_the_middle_of_a_queue(store: Store) -> None:
    # AIC/0 skips task 1: 0, 2 recorded, task 1 (position 1) missing, not at the tail.
    schedule, events, faults = judged(store, aic=[AIC_QUEUE[i] for i in (0, 1, 3, 4)])
    assert schedule == [row("AIC", 0, 3, 2, missing=1, verdict="missing"), *CLEAN[1:]]
    assert events == CLEAN_EVENTS
    assert faults == [
        {"core": "AIC", "block_id": 0, "fault": "missing", "task_id": 1, "position": 1,
         "record_index": None, "previous_position": None},
    ]  # fmt: skip


def test_a_worker_that_recorded_nothing_misses_its_whole_queue(store: Store) -> None:
    schedule, events, _ = judged(store, aiv1=[])
    assert schedule == [
        *CLEAN[:2],
        row("AIV", 1, 1, 0, missing=1, tail_missing=1, verdict="missing"),
    ]
    # Task 5's wait for event 1 was not recorded either: no wait to judge.
    assert events == [CLEAN_EVENTS[0], event(DONE, 1, 1, 0, None)]


def test_a_task_run_by_another_worker_is_extra_there_and_missing_here(store: Store) -> None:
    # Task 4, queued on AIV/0, ran on AIV/1 after task 5.
    schedule, _, faults = judged(store, aiv0=AIV0_QUEUE[:3], aiv1=[*AIV1_QUEUE, compute(4, 156)])
    assert schedule == [
        CLEAN[0],
        row("AIV", 0, 2, 1, missing=1, tail_missing=1, verdict="missing"),
        row("AIV", 1, 1, 2, extra=1, verdict="extra"),
    ]
    assert faults == [
        {"core": "AIV", "block_id": 0, "fault": "missing", "task_id": 4, "position": 1,
         "record_index": None, "previous_position": None},
        {"core": "AIV", "block_id": 1, "fault": "extra", "task_id": 4, "position": None,
         "record_index": 2, "previous_position": None},
    ]  # fmt: skip


def test_a_task_run_twice_is_repeated(store: Store) -> None:
    aic = [*AIC_QUEUE[:3], compute(1, 122), compute(2, 132), trigger(2, 142)]
    schedule, events, faults = judged(store, aic=aic)
    # recorded 4 = planned 3 - missing 0 + extra 0 + repeated 1.
    assert schedule == [row("AIC", 0, 3, 4, repeated=1, verdict="repeated"), *CLEAN[1:]]
    assert events == CLEAN_EVENTS
    assert faults == [
        {"core": "AIC", "block_id": 0, "fault": "repeated", "task_id": 1, "position": 1,
         "record_index": 3, "previous_position": None},
    ]  # fmt: skip


def test_two_swapped_tasks_are_out_of_order(store: Store) -> None:
    # AIC/0 runs task 2 (and its trigger) before task 1: positions 0, 2, 1.
    aic = [compute(0, 100), trigger(0, 110), compute(2, 112), trigger(2, 122), compute(1, 124)]
    schedule, events, faults = judged(store, aic=aic)
    assert schedule == [row("AIC", 0, 3, 3, out_of_order=1, verdict="out_of_order"), *CLEAN[1:]]
    assert events == CLEAN_EVENTS
    assert faults == [
        {"core": "AIC", "block_id": 0, "fault": "out_of_order", "task_id": 1, "position": 1,
         "record_index": 4, "previous_position": 2},
    ]  # fmt: skip


def test_a_slot_that_dropped_its_queues_tail_is_dropped_not_missing(store: Store) -> None:
    # AIC/0 kept task 0's two records and dropped three: task 1's compute, task 2's compute
    # and trigger. Task 3's wait still ended: one trigger of event 0 recorded of the two it
    # waited for, explained by the drop on the slot of event 0's triggers.
    with pytest.warns(DroppedRecordsWarning, match="3 dropped"):
        schedule, events, faults = judged(store, aic=AIC_QUEUE[:2], aic_dropped=3)
    assert schedule == [
        row("AIC", 0, 3, 1, missing=2, tail_missing=2, dropped=3, verdict="dropped"),
        *CLEAN[1:],
    ]
    assert events == [
        event(EVENT, 2, 1, 1, 2, unreleased_waits=1, trigger_dropped=3, verdict="dropped"),
        CLEAN_EVENTS[1],
    ]
    assert [(f["fault"], f["task_id"]) for f in faults] == [("missing", 1), ("missing", 2)]


def test_a_drop_does_not_explain_a_task_missing_before_a_recorded_one(store: Store) -> None:
    with pytest.warns(DroppedRecordsWarning, match="1 dropped"):
        schedule, _, _ = judged(store, aic=[AIC_QUEUE[i] for i in (0, 1, 3, 4)], aic_dropped=1)
    assert schedule[0] == row("AIC", 0, 3, 2, missing=1, dropped=1, verdict="missing")


def test_a_wait_needing_more_triggers_than_recorded_is_unreleased(store: Store) -> None:
    # Task 2 ran but left no trigger record, and nothing was dropped: task 3's wait for the
    # second trigger of event 0 ended with one recorded.
    schedule, events, _ = judged(store, aic=AIC_QUEUE[:4])
    assert schedule == CLEAN
    assert events == [
        event(EVENT, 2, 1, 1, 2, unreleased_waits=1, verdict="unreleased"),
        CLEAN_EVENTS[1],
    ]


def test_a_trigger_recorded_twice_is_an_extra_trigger(store: Store) -> None:
    schedule, events, _ = judged(store, aiv0=[*AIV0_QUEUE[:3], trigger(3, 146), compute(4, 148)])
    assert schedule == CLEAN
    assert events == [CLEAN_EVENTS[0], event(DONE, 1, 2, 1, 1, verdict="extra_triggers")]


def test_an_invocation_without_a_task_graph_has_no_rows(store: Store) -> None:
    assert judged(store, config=None) == ([], [], [])


# --- imports without a planned schedule --------------------------------------------------


def test_a_proton_import_has_no_rows(tmp_path: Path, store: Store) -> None:
    warp = scopes(("S0", 100), ("E0", 110), ("S1", 120), ("E1", 150))
    buffer = pack_buffer(
        [Cta(0, 7, 1000, 10**6, 10**6 + 300, [warp])], Layout(uids=(0,), total_unit=1)
    )
    path = tmp_path / "proton.bin"
    path.write_bytes(buffer)
    imported = import_profile(store, [path], format="proton", run_id=RUN)
    assert imported.records == 2
    assert [store.sql(sql, [RUN]).num_rows for sql in (SCHEDULE, EVENTS, FAULTS)] == [0, 0, 0]


def test_an_imported_dependency_graph_is_no_planned_schedule(tmp_path: Path, store: Store) -> None:
    # simpler's graph files each task under the core that ran it (t0 on AIC 0, t1 on AIC 1,
    # t2 on AIV 2 after both): a graph of recorded predecessors, not planned queues.
    rows = [
        [0, task_token(1, 0), 0, 1000, 1400, 5],
        [1, task_token(1, 1), 0, 1010, 1600, 5],
        [2, task_token(1, 2), 0, 1700, 1750, 5],
    ]
    records = write_json(tmp_path / "records.json", records_document(["aic", "aic", "aiv"], rows))
    graph = {task_token(1, 0): [3, -1, -1], task_token(1, 1): [3, -1, -1],
             task_token(1, 2): [-1, 7, -1]}  # fmt: skip
    edges = [(task_token(1, 0), task_token(1, 2)), (task_token(1, 1), task_token(1, 2))]
    deps = write_json(tmp_path / "deps.json", deps_document(graph, edges))
    import_profile(store, [records], format="simpler", dependencies=deps, run_id=RUN)
    assert store.sql("SELECT count(*) AS n FROM task_dependencies").to_pylist() == [{"n": 2}]
    assert [store.sql(sql, [RUN]).num_rows for sql in (SCHEDULE, EVENTS, FAULTS)] == [0, 0, 0]


# --- the CPU reference kernel ------------------------------------------------------------


def captured(store: Store, **options: object) -> str:
    """Two recorded launches of the reference kernel (4 experts, 2 tiles each, 64 tokens in
    2 token tiles; 2 AIC and 2 AIV workers): the run id."""
    generator = torch.Generator().manual_seed(0)
    router, w1, w2 = make_moe_weights(4, 32, 64, generator=generator)
    x = torch.randn(64, 32, generator=generator)
    with (
        ReferenceMoeKernel(w1, w2, **options) as kernel,  # type: ignore[arg-type]
        mega_kernel_profile(store=store) as prof,
    ):
        for _ in range(2):
            kernel(x, *route(x, router, 2))
            prof.step()
    assert prof.run_id is not None
    return prof.run_id


REFERENCE = (
    "SELECT invocation_id, core, block_id, planned, recorded, missing, extra, repeated, "
    "out_of_order, dropped, verdict, tail_missing FROM schedule_sanity WHERE run_id = $1 "
    "ORDER BY invocation_id, core_type, block_id"
)


def test_the_reference_kernel_runs_its_planned_queues(store: Store) -> None:
    run = captured(store)
    # Its graph: 8 Dispatch and 8 SwiGLU tasks (AIV), 8 GMM1 and 8 GMM2 (AIC), 2 Combine
    # (AIV), task i of a core type on worker i % 2: 8 tasks per AIC worker, 9 per AIV one.
    queues = store.sql(
        "SELECT core_type, worker, count(*) AS tasks FROM tasks WHERE run_id = $1 "
        "GROUP BY ALL ORDER BY ALL",
        [run],
    ).to_pylist()
    assert [q["tasks"] for q in queues] == [8, 8, 9, 9]
    assert store.sql(REFERENCE, [run]).to_pylist() == [
        {"invocation_id": invocation} | row(core, block, tasks, tasks)
        for invocation in (0, 1)
        for core, block, tasks in (("AIC", 0, 8), ("AIC", 1, 8), ("AIV", 0, 9), ("AIV", 1, 9))
    ]
    events = store.sql(
        "SELECT invocation_id, verdict, count(*) AS events, sum(planned_triggers) AS planned, "
        "sum(recorded_triggers) AS recorded, sum(waits) AS waits FROM event_sanity "
        "WHERE run_id = $1 GROUP BY ALL ORDER BY ALL",
        [run],
    ).to_pylist()
    # 25 events: 24 chaining the stages of the 8 (expert, tile) pairs, one triggered by
    # each of the 8 GMM2 tasks, on which both Combine tasks wait (26 waits in all).
    assert events == [
        {"invocation_id": i, "verdict": "ok", "events": 25, "planned": 32, "recorded": 32,
         "waits": 26}
        for i in (0, 1)
    ]  # fmt: skip


def test_the_reference_kernel_with_full_slots_dropped_its_queues_tails(store: Store) -> None:
    with pytest.warns(DroppedRecordsWarning, match="dropped 16 records"):
        run = captured(store, aic_capacity=16)
    # Each AIC worker needs 24 records (8 tasks that wait, compute and trigger): it kept
    # the first 16, tasks 1-5 whole and task 6's wait, and dropped 8: tasks 6-8 unrecorded.
    aic = {"missing": 3, "dropped": 8, "tail_missing": 3, "verdict": "dropped"}
    assert store.sql(REFERENCE, [run]).to_pylist() == [
        {"invocation_id": invocation} | row(core, block, planned, recorded, **counts)
        for invocation in (0, 1)
        for core, block, planned, recorded, counts in (
            ("AIC", 0, 8, 5, aic),
            ("AIC", 1, 8, 5, aic),
            ("AIV", 0, 9, 9, {}),
            ("AIV", 1, 9, 9, {}),
        )
    ]
    # The shared event of the 8 GMM2 tasks: 2 of its triggers were recorded (one per AIC
    # worker), and both Combine waits for 8 ended: explained by the 16 dropped records.
    done = store.sql(
        "SELECT invocation_id, planned_triggers, recorded_triggers, waits, max_wait_count, "
        "unreleased_waits, trigger_dropped, verdict FROM event_sanity "
        "WHERE run_id = $1 AND event = 24 ORDER BY invocation_id",
        [run],
    ).to_pylist()
    assert done == [
        {"invocation_id": i, "planned_triggers": 8, "recorded_triggers": 2, "waits": 2,
         "max_wait_count": 8, "unreleased_waits": 2, "trigger_dropped": 16,
         "verdict": "dropped"}
        for i in (0, 1)
    ]  # fmt: skip
