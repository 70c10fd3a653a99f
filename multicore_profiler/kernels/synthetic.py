"""A simulated MoE MegaKernel: the task graph, worker queues and profile buffer of a launch.

It computes nothing. It schedules the tasks of a MoE layer (Dispatch -> GMM1 ->
SwiGLU -> GMM2 per tile, then Combine per expert) on AIC and AIV workers as the device
would (task queues, event waits, triggers), draws compute times around realistic
means, and writes the records of the launch into a buffer of the ABI's layout. It
stands in for a device where there is none: in the demo, the benchmarks and tests
that need many realistic buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from multicore_profiler.abi import (
    DESC_TRIGGER_EVENT,
    DESC_WAIT_DEPENDENCY,
    BufferLayout,
    CoreType,
)

DISPATCH, GMM1, SWIGLU, GMM2, COMBINE = 1, 2, 3, 4, 5
STAGE_NAMES = {
    DISPATCH: "Dispatch",
    GMM1: "GMM1",
    SWIGLU: "SwiGLU",
    GMM2: "GMM2",
    COMBINE: "Combine",
}
_CORE = {
    DISPATCH: CoreType.AIV,
    GMM1: CoreType.AIC,
    SWIGLU: CoreType.AIV,
    GMM2: CoreType.AIC,
    COMBINE: CoreType.AIV,
}
_MEAN_US = {DISPATCH: 6.0, GMM1: 25.0, SWIGLU: 4.0, GMM2: 20.0, COMBINE: 8.0}
_TRIGGER_US = 0.2
_EVENT_LATENCY_US = 1.0


@dataclass(frozen=True)
class Task:
    """One task of the graph: its stage, owner (expert), worker and the tasks it waits on."""

    task_id: int
    stage: int
    stage_task_index: int
    owner: int
    core_type: CoreType
    worker: int
    depends_on: tuple[int, ...]
    triggers: bool

    @property
    def waits(self) -> bool:
        """Whether the task waits on an event (it does when it depends on other tasks)."""
        return bool(self.depends_on)


class SimulatedMoeKernel:
    """A MoE layer's MegaKernel, simulated on the host; see the module docstring.

    Tasks go to workers round-robin per core type (task i of a core type -> worker
    i % workers), and the buffer layout is planned from those queues.
    """

    kernel_name = "SimulatedMegaMoe"
    owner_label = "Expert"
    stage_names = STAGE_NAMES

    def __init__(
        self,
        *,
        experts: int = 8,
        tiles: int = 8,
        aic_workers: int = 24,
        aiv_workers: int = 24,
        aic_slots: int = 24,
        aiv_slots: int = 48,
        frequency_hz: float = 50e6,
        stage_us: dict[int, float] | None = None,
    ) -> None:
        self.frequency_hz = frequency_hz
        self.stage_us = {**_MEAN_US, **(stage_us or {})}
        """Mean compute time of each stage's tasks, in us (``stage_us`` overrides some: a
        known slowdown to find)."""
        workers = {CoreType.AIC: aic_workers, CoreType.AIV: aiv_workers}
        assigned = {CoreType.AIC: 0, CoreType.AIV: 0}
        tasks: list[Task] = []
        ids: dict[tuple[int, int, int], int] = {}

        def add(stage: int, owner: int, tile: int, index: int, deps: tuple[int, ...]) -> None:
            core = _CORE[stage]
            task = Task(
                task_id=len(tasks),
                stage=stage,
                stage_task_index=index,
                owner=owner,
                core_type=core,
                worker=assigned[core] % workers[core],
                depends_on=deps,
                triggers=stage != COMBINE,
            )
            assigned[core] += 1
            ids[stage, owner, tile] = task.task_id
            tasks.append(task)

        for stage, previous in ((DISPATCH, None), (GMM1, DISPATCH), (SWIGLU, GMM1), (GMM2, SWIGLU)):
            for expert in range(experts):
                for tile in range(tiles):
                    deps = () if previous is None else (ids[previous, expert, tile],)
                    add(stage, expert, tile, tile, deps)
        for expert in range(experts):
            add(COMBINE, expert, 0, 0, tuple(ids[GMM2, expert, t] for t in range(tiles)))

        self.tasks = tasks
        self.queues = {
            core: [[t for t in tasks if t.core_type == core and t.worker == w] for w in range(n)]
            for core, n in workers.items()
        }
        self.layout = BufferLayout.plan(
            self.queues[CoreType.AIC],
            self.queues[CoreType.AIV],
            aic_slots=aic_slots,
            aiv_slots=aiv_slots,
        )

    @property
    def records_per_launch(self) -> int:
        """Records one launch writes: compute, plus a wait and a trigger where the task has them."""
        return sum(1 + t.waits + t.triggers for t in self.tasks)

    def tasks_table(self, config_id: str, rank: int = 0) -> pa.Table:
        """The task graph as rows of the store's ``tasks`` table: a task that depends on
        others waits on an event of its own (its task id), which each of them triggers once."""
        consumer = {d: t.task_id for t in self.tasks for d in t.depends_on}
        tasks = self.tasks
        count = len(tasks)
        return pa.table(
            {
                "rank": pa.array([rank] * count, pa.int32()),
                "config_id": [config_id] * count,
                "kernel_name": [self.kernel_name] * count,
                "task_id": pa.array([t.task_id for t in tasks], pa.uint32()),
                "task_type": pa.array([t.stage for t in tasks], pa.uint32()),
                "desc_id": pa.array([t.stage for t in tasks], pa.uint32()),
                "stage_task_index": pa.array([t.stage_task_index for t in tasks], pa.uint32()),
                "owner_id": pa.array([t.owner for t in tasks], pa.uint32()),
                "core_type": pa.array([int(t.core_type) for t in tasks], pa.uint8()),
                "worker": pa.array([t.worker for t in tasks], pa.uint32()),
                "wait_event": pa.array([t.task_id if t.waits else -1 for t in tasks], pa.int32()),
                "wait_count": pa.array([len(t.depends_on) for t in tasks], pa.uint32()),
                "trigger_event": pa.array(
                    [consumer.get(t.task_id, -1) if t.triggers else -1 for t in tasks], pa.int32()
                ),
                "tiling_position": pa.array([0] * count, pa.uint32()),
                "input_position": pa.array([0] * count, pa.uint32()),
            }
        )

    def launch(self, rng: np.random.Generator, start_cycle: int) -> np.ndarray:
        """Simulate one launch starting at ``start_cycle``; return its profile buffer."""
        cycles_per_us = self.frequency_hz / 1e6
        trigger = max(1, round(_TRIGGER_US * cycles_per_us))
        latency = round(_EVENT_LATENCY_US * cycles_per_us)
        jitter = rng.lognormal(0.0, 0.15, len(self.tasks))
        free = {
            core: np.full(len(q), start_cycle + 20, np.int64) for core, q in self.queues.items()
        }
        done = np.zeros(len(self.tasks), np.int64)
        rows: dict[CoreType, list[tuple[int, int, int, int, int, int, int]]] = {
            CoreType.AIC: [],
            CoreType.AIV: [],
        }
        for task in self.tasks:
            out = rows[task.core_type]
            begin = int(free[task.core_type][task.worker])
            ids = (task.task_id, task.stage_task_index, task.owner)
            if task.waits:
                ready = max(begin, max(int(done[d]) for d in task.depends_on) + latency)
                out.append((task.worker, begin, ready, DESC_WAIT_DEPENDENCY, *ids))
                begin = ready
            mean = self.stage_us[task.stage]
            end = begin + max(1, round(mean * cycles_per_us * jitter[task.task_id]))
            out.append((task.worker, begin, end, task.stage, *ids))
            if task.triggers:
                out.append((task.worker, end, end + trigger, DESC_TRIGGER_EVENT, *ids))
                end += trigger
            done[task.task_id] = end
            free[task.core_type][task.worker] = end

        buffer = self.layout.new_buffer()
        for core, written in rows.items():
            region = self.layout.region(buffer, core)
            _fill(region, np.array(written, dtype=np.int64).reshape(-1, 7), core, start_cycle)
        return buffer

    def launches(
        self, rng: np.random.Generator, count: int, *, start_cycle: int, period: int
    ) -> np.ndarray:
        """``count`` launches, one every ``period`` cycles from ``start_cycle``: their
        buffers as the rows of a 2-D array (buffer x byte)."""
        return np.stack([self.launch(rng, start_cycle + i * period) for i in range(count)])


def _fill(region: np.ndarray, rows: np.ndarray, core: CoreType, entry_cycle: int) -> None:
    """Write records (worker, start, end, desc, task, index, owner) into a region's slots."""
    capacity = region["records"].shape[1]
    worker = rows[:, 0]
    order = np.argsort(worker, kind="stable")
    worker, rows = worker[order], rows[order]
    counts = np.bincount(worker, minlength=len(region))
    position = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    kept = position < capacity
    records = region["records"]
    for column, name in enumerate(
        ("start_cycle", "end_cycle", "desc_id", "task_id", "stage_task_index", "owner_id"), start=1
    ):
        records[name][worker[kept], position[kept]] = rows[kept, column]
    header = region["header"]
    active = np.flatnonzero(counts)
    header["entry_cycle"][active] = entry_cycle
    header["record_count"][active] = np.minimum(counts[active], capacity)
    header["dropped_count"][active] = np.maximum(counts[active] - capacity, 0)
    header["core_type"][active] = core
    header["block_id"][active] = active
    header["record_capacity"][active] = capacity
