"""The ``task_edges`` view: exact release and core-order edges of a small invocation.

The expected edges are worked out by hand from the task graph below (which trigger is the
``wait_count``-th of its event by end cycle), not from the view's SQL.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from golden import AIC, AIV, GMM1, TRIGGER, WAIT, Slot, pack
from task_graphs import tasks_table

from multicore_profiler.abi import BufferLayout
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

RUN = "edges-run"
CONFIG = "edges-config"
LAYOUT = BufferLayout(aic_slots=1, aiv_slots=2, aic_capacity=16, aiv_capacity=16)
SWIGLU = 0x20000 + 102
EVENT, NEVER = 10, 11


def buffer() -> bytearray:
    """Three triggers of event 10 end at cycles 130 (task 1, AIC/0), 205 (task 2, AIC/0)
    and 125 (task 6, AIV/1): by end cycle task 6 is the first, task 1 the second, task 2
    the third. Task 3 (AIV/0) waits for the third, task 4 (AIV/0) for the first, task 5
    (AIV/1) for event 11, which nothing triggers."""
    return pack(
        1,
        2,
        16,
        16,
        [
            Slot(
                AIC,
                0,
                100,
                [
                    (110, 120, GMM1, 1, 0, 0),
                    (120, 130, TRIGGER, 1, 0, 0),
                    (130, 200, GMM1, 2, 1, 0),
                    (200, 205, TRIGGER, 2, 1, 0),
                ],
            ),
            Slot(
                AIV,
                0,
                100,
                [
                    (105, 210, WAIT, 3, 0, 0),
                    (210, 250, SWIGLU, 3, 0, 0),
                    (250, 260, WAIT, 4, 1, 0),
                    (260, 270, SWIGLU, 4, 1, 0),
                ],
            ),
            Slot(
                AIV,
                1,
                100,
                [
                    (101, 115, SWIGLU, 6, 2, 0),
                    (115, 125, TRIGGER, 6, 2, 0),
                    (125, 140, WAIT, 5, 3, 0),
                    (140, 150, SWIGLU, 5, 3, 0),
                ],
            ),
        ],
    )


def tasks() -> pa.Table:
    """Tasks 1, 2 and 6 trigger event 10; 3 waits for it thrice, 4 once; 5 waits on 11."""
    ids = [1, 2, 3, 4, 5, 6]
    return tasks_table(
        CONFIG,
        "EdgesMoe",
        task_id=ids,
        desc_id=[GMM1, GMM1] + [SWIGLU] * 4,
        core_type=[AIC, AIC, AIV, AIV, AIV, AIV],
        worker=[0, 0, 0, 0, 1, 1],
        wait_event=[-1, -1, EVENT, EVENT, NEVER, -1],
        wait_count=[0, 0, 3, 1, 1, 0],
        trigger_event=[EVENT, EVENT, -1, -1, -1, EVENT],
        task_type=[101, 101, 102, 102, 102, 102],
        stage_task_index=[0, 1, 0, 1, 3, 2],
    )


@pytest.fixture
def edges_store(store: Store) -> Store:
    """Invocation 0 with the task graph; invocation 1, the same records, of a kernel that
    handed over none."""
    run = RunInfo.begin(run_id=RUN)
    store.write_run(run)
    for invocation, config in ((0, CONFIG), (1, None)):
        ingest_buffers(
            store,
            [buffer()],
            LAYOUT,
            frequency_hz=50e6,
            run_id=RUN,
            kernel=KernelInfo(kernel_name="EdgesMoe", config_id=config),
            launches=Launches(step=invocation, first_invocation_id=invocation),
        )
    store.write_tasks(RUN, tasks())
    store.write_run(run.finish())
    return store


def edges(store: Store, invocation: int) -> list[tuple]:
    with store.reading() as con:
        return con.execute(
            "SELECT run_id, step, rank, kind, src_core_type, src_block_id, src_record_index, "
            "dst_core_type, dst_block_id, dst_record_index, event FROM task_edges "
            "WHERE invocation_id = ? ORDER BY kind DESC, src_core_type, src_block_id, "
            "src_record_index, dst_record_index",
            [invocation],
        ).fetchall()


def core_order(step: int) -> list[tuple]:
    """Each record and the next on its core: records 0-1, 1-2, 2-3 of each of the three."""
    return [
        (RUN, step, 0, "core_order", core, block, index, core, block, index + 1, None)
        for core, block in ((AIC, 0), (AIV, 0), (AIV, 1))
        for index in range(3)
    ]


def test_release_and_core_order_edges(edges_store: Store) -> None:
    assert edges(edges_store, 0) == [
        # Task 3's wait (AIV/0 #0) is released by the third trigger: task 2's (AIC/0 #3).
        (RUN, 0, 0, "release", AIC, 0, 3, AIV, 0, 0, EVENT),
        # Task 4's wait (AIV/0 #2) by the first: task 6's (AIV/1 #1), ending at cycle 125.
        (RUN, 0, 0, "release", AIV, 1, 1, AIV, 0, 2, EVENT),
        *core_order(0),
    ]


def test_an_invocation_without_task_graph_has_core_order_edges_only(
    edges_store: Store,
) -> None:
    assert edges(edges_store, 1) == core_order(1)


def test_edges_carry_the_records_task_ids_and_cycles(edges_store: Store) -> None:
    with edges_store.reading() as con:
        rows = con.execute(
            "SELECT src_task_id, src_start_cycle, src_end_cycle, dst_task_id, dst_start_cycle, "
            "dst_end_cycle FROM task_edges WHERE invocation_id = 0 AND kind = 'release' "
            "ORDER BY ALL"
        ).fetchall()
    assert rows == [(2, 200, 205, 3, 105, 210), (6, 115, 125, 4, 250, 260)]
