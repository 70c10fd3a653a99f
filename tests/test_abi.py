from __future__ import annotations

import numpy as np
import pytest

from multicore_profiler.abi import (
    RECORD_DTYPE,
    SLOT_HEADER_DTYPE,
    BufferLayout,
    CoreType,
    TaskShape,
    plan_capacity,
    task_record_count,
)
from multicore_profiler.errors import LayoutError


def test_header_dtype_is_the_abi_byte_for_byte() -> None:
    assert SLOT_HEADER_DTYPE.itemsize == 64
    offsets = {name: SLOT_HEADER_DTYPE.fields[name][1] for name in SLOT_HEADER_DTYPE.names}
    assert offsets == {
        "entry_cycle": 0,
        "record_count": 8,
        "dropped_count": 12,
        "core_type": 16,
        "block_id": 20,
        "record_capacity": 24,
        "reserved": 28,
    }
    assert SLOT_HEADER_DTYPE["entry_cycle"] == np.dtype("<u8")
    assert all(SLOT_HEADER_DTYPE[n] == np.dtype("<u4") for n in SLOT_HEADER_DTYPE.names[1:])


def test_record_dtype_is_the_abi_byte_for_byte() -> None:
    assert RECORD_DTYPE.itemsize == 32
    offsets = {name: RECORD_DTYPE.fields[name][1] for name in RECORD_DTYPE.names}
    assert offsets == {
        "start_cycle": 0,
        "end_cycle": 8,
        "desc_id": 16,
        "task_id": 20,
        "stage_task_index": 24,
        "owner_id": 28,
    }
    assert [RECORD_DTYPE[n].str for n in RECORD_DTYPE.names] == ["<u8"] * 2 + ["<u4"] * 4


def cube_and_vector_queues(cube_tasks: int) -> tuple[list, list]:
    """Round-robin queues of the worked case: 3 records per task on 24 + 24 workers."""
    task = TaskShape(waits=True, triggers=True)
    aic = [[task] * len(range(w, cube_tasks, 24)) for w in range(24)]
    aiv = [[task] for _ in range(24)]
    return aic, aiv


def test_worked_case_plans_32_and_16_records_in_53760_bytes() -> None:
    aic, aiv = cube_and_vector_queues(121)
    layout = BufferLayout.plan(aic, aiv, aic_slots=24, aiv_slots=48)
    assert layout == BufferLayout(aic_slots=24, aiv_slots=48, aic_capacity=32, aiv_capacity=16)
    assert layout.stride(CoreType.AIC) == 64 + 32 * 32
    assert layout.stride(CoreType.AIV) == 64 + 16 * 32
    assert layout.offset(CoreType.AIV) == 24 * 1088
    assert layout.total_bytes == 53_760
    assert len(layout.new_buffer()) == 53_760


def test_busiest_worker_above_256_records_is_capped() -> None:
    aic, aiv = cube_and_vector_queues(2041)
    assert max(len(q) for q in aic) == 86  # 258 records
    assert BufferLayout.plan(aic, aiv, aic_slots=24, aiv_slots=48).aic_capacity == 256


@pytest.mark.parametrize(
    ("records", "capacity"),
    [(0, 0), (1, 16), (16, 16), (17, 32), (240, 240), (241, 256), (999, 256)],
)
def test_capacity_rounds_up_to_16_and_stops_at_256(records: int, capacity: int) -> None:
    queue = [TaskShape(waits=False, triggers=False)] * records
    assert plan_capacity([queue, queue[: records // 2]]) == capacity


def test_records_per_task_count_compute_waits_and_triggers() -> None:
    assert task_record_count(TaskShape(waits=False, triggers=False)) == 1
    assert task_record_count(TaskShape(waits=True, triggers=False)) == 2
    assert task_record_count(TaskShape(waits=False, triggers=True)) == 2
    assert task_record_count(TaskShape(waits=True, triggers=True)) == 3


def test_more_workers_than_slots_is_refused() -> None:
    with pytest.raises(LayoutError, match="25 AIC workers do not fit in 24 AIC slots"):
        BufferLayout.plan([[]] * 25, [], aic_slots=24, aiv_slots=48)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"aic_capacity": 24}, "aic_capacity must be a multiple of 16"),
        (
            {"aiv_capacity": 272, "generation": "a"},
            "aiv_capacity must be a multiple of 16 no larger than 256, got 272 "
            r"\(generation a's cap; generation b lifts it to 134217712\)",
        ),
        (
            {"aiv_capacity": 134_217_728},
            "aiv_capacity must be a multiple of 16 no larger than 134217712, got 134217728 "
            r"\(generation b's cap\)",
        ),
        ({"generation": "c"}, "an ABI generation is one of a, b, got 'c'"),
        ({"aic_slots": -1}, "aic_slots must be a non-negative integer"),
        ({"aiv_slots": 2.0}, "aiv_slots must be a non-negative integer"),
        ({"aic_slots": 0, "aiv_slots": 0}, "at least one slot"),
    ],
)
def test_impossible_layouts_are_refused(kwargs: dict, message: str) -> None:
    values = {"aic_slots": 2, "aiv_slots": 2, "aic_capacity": 16, "aiv_capacity": 16} | kwargs
    with pytest.raises(LayoutError, match=message):
        BufferLayout(**values)


def test_region_is_a_writable_view_of_the_buffer() -> None:
    layout = BufferLayout(aic_slots=2, aiv_slots=3, aic_capacity=16, aiv_capacity=32)
    buffer = layout.new_buffer()
    aiv = layout.region(buffer, CoreType.AIV)
    assert aiv.shape == (3,)
    assert aiv["records"].shape == (3, 32)
    aiv["header"]["block_id"][2] = 7
    aiv["records"]["owner_id"][2, 31] = 9
    slot = layout.offset(CoreType.AIV) + 2 * layout.stride(CoreType.AIV)
    assert buffer[slot + 20] == 7
    assert buffer[slot + 64 + 31 * 32 + 28] == 9
    assert layout.slot_index(CoreType.AIV, 2) == 4


def test_region_of_a_batch_views_every_buffer() -> None:
    layout = BufferLayout(aic_slots=2, aiv_slots=3, aic_capacity=16, aiv_capacity=0)
    batch = np.zeros((4, layout.total_bytes), np.uint8)
    aic = layout.region(batch, CoreType.AIC)
    assert aic.shape == (4, 2)
    aic["header"]["entry_cycle"][3, 1] = 0x0102
    slot = 3 * layout.total_bytes + layout.stride(CoreType.AIC)
    assert batch.reshape(-1)[slot : slot + 2].tolist() == [2, 1]
    assert layout.region(batch, CoreType.AIV)["records"].shape == (4, 3, 0)
    assert layout.slot_bytes(batch[0], CoreType.AIV).shape == (3, 64)
