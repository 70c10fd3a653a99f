"""Task graphs (rows of the store's ``tasks`` table) for hand-built invocations."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa


def tasks_table(
    config_id: str,
    kernel_name: str,
    *,
    task_id: Sequence[int],
    desc_id: Sequence[int],
    core_type: Sequence[int],
    worker: Sequence[int],
    wait_event: Sequence[int],
    wait_count: Sequence[int],
    trigger_event: Sequence[int],
    task_type: Sequence[int] | None = None,
    stage_task_index: Sequence[int] | None = None,
    owner_id: Sequence[int] | None = None,
    rank: int = 0,
) -> pa.Table:
    """One row per task, the columns given; task type, stage index and owner default to
    0, tiling and input positions are 0."""
    count = len(task_id)
    zeros = [0] * count
    return pa.table(
        {
            "rank": pa.array([rank] * count, pa.int32()),
            "config_id": [config_id] * count,
            "kernel_name": [kernel_name] * count,
            "task_id": pa.array(task_id, pa.uint32()),
            "task_type": pa.array(zeros if task_type is None else task_type, pa.uint32()),
            "desc_id": pa.array(desc_id, pa.uint32()),
            "stage_task_index": pa.array(
                zeros if stage_task_index is None else stage_task_index, pa.uint32()
            ),
            "owner_id": pa.array(zeros if owner_id is None else owner_id, pa.uint32()),
            "core_type": pa.array(core_type, pa.uint8()),
            "worker": pa.array(worker, pa.uint32()),
            "wait_event": pa.array(wait_event, pa.int32()),
            "wait_count": pa.array(wait_count, pa.uint32()),
            "trigger_event": pa.array(trigger_event, pa.int32()),
            "tiling_position": pa.array(zeros, pa.uint32()),
            "input_position": pa.array(zeros, pa.uint32()),
        }
    )
