from __future__ import annotations

import numpy as np

from multicore_profiler.abi import BufferLayout, CoreType
from multicore_profiler.ingest.decode import decode_buffer
from multicore_profiler.kernels.synthetic import (
    COMBINE,
    DISPATCH,
    GMM1,
    GMM2,
    SWIGLU,
    SimulatedMoeKernel,
)


def test_graph_queues_and_layout() -> None:
    kernel = SimulatedMoeKernel(
        experts=2, tiles=3, aic_workers=4, aiv_workers=5, aic_slots=4, aiv_slots=8
    )
    stages = [t.stage for t in kernel.tasks]
    assert stages == [DISPATCH] * 6 + [GMM1] * 6 + [SWIGLU] * 6 + [GMM2] * 6 + [COMBINE] * 2
    combine = kernel.tasks[-1]
    assert combine.owner == 1
    assert [kernel.tasks[d].stage for d in combine.depends_on] == [GMM2] * 3
    aic = [t for t in kernel.tasks if t.core_type == CoreType.AIC]
    assert [t.worker for t in aic] == [i % 4 for i in range(12)]
    # AIC: 3 tasks of 3 records on the busiest worker = 9 -> 16; AIV: 4 tasks (D, D/S, S, C) -> 16.
    assert kernel.layout == BufferLayout(aic_slots=4, aiv_slots=8, aic_capacity=16, aiv_capacity=16)
    assert kernel.records_per_launch == 6 * 2 + 6 * 3 + 6 * 3 + 6 * 3 + 2 * 2


def test_launch_follows_the_task_graph() -> None:
    kernel = SimulatedMoeKernel()
    buffer = kernel.launch(np.random.default_rng(7), 5_000)
    decoded = decode_buffer(buffer, kernel.layout, frequency_hz=kernel.frequency_hz)
    records = decoded.records.to_pydict()
    assert len(records["task_id"]) == kernel.records_per_launch
    assert decoded.dropped_counts.tolist() == [0]
    assert decoded.anchor_cycles.tolist() == [5_000]

    done: dict[int, int] = {}
    compute_start: dict[int, int] = {}
    for task, desc, start, end in zip(
        records["task_id"],
        records["desc_id"],
        records["start_cycle"],
        records["end_cycle"],
        strict=True,
    ):
        if desc == 0x10007:
            done[task] = end
        elif desc < 0x10000:
            compute_start[task] = start
            done.setdefault(task, end)
    for task in kernel.tasks:
        assert records["desc_id"][records["task_id"].index(task.task_id)] in (0x10000, task.stage)
        for dependency in task.depends_on:
            assert (
                compute_start[task.task_id] >= done[dependency] + 50
            )  # 1 us event latency at 50 MHz

    # On every core the records follow each other without overlapping.
    core = np.array(records["core_type"]) * 1000 + np.array(records["block_id"])
    start, end = np.array(records["start_cycle"]), np.array(records["end_cycle"])
    for key in np.unique(core):
        on_core = core == key
        assert (start[on_core][1:] >= end[on_core][:-1]).all()
