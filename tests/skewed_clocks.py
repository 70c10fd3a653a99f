"""A hand-built run whose AIV/0 clock lags AIC/0's by a known number of cycles, so that a
release edge is contradicted: what the clock correction tests read.

Step 0 (invocation 0) and step 1 (invocation 1) hold the same two cores at 50 MHz (a cycle
is 20 ns), invocation 1 ``LATER`` cycles after invocation 0. On one shared clock AIC/0
computes task 1 (GMM1, 100..150) and triggers event 10 (150..160); AIV/0 waits for it
(100..170), computes task 2 (170..220) and triggers event 11 (220..230); AIC/0 waits for
that (160..240) and computes task 3 (240..300). Invocation 0's AIV/0 records (and entry
cycle) are recorded ``LAG`` = 30 cycles early (its counter lags): its wait ends at cycle
140, 20 cycles before the trigger that released it ended (160), and AIC/0's wait ends 40
cycles after AIV/0's trigger (200). Invocation 1 is on one clock. The correction solves
offset(AIC/0) - offset(AIV/0) <= -20 and offset(AIV/0) - offset(AIC/0) <= 40: AIC/0 (the
reference) keeps 0, AIV/0 gets +20 (400 ns), its interval [20, 40] cycles ([400, 800] ns).
"""

from __future__ import annotations

import pyarrow as pa
from golden import AIC, AIV, GMM1, TRIGGER, WAIT, Slot, pack
from task_graphs import tasks_table

from multicore_profiler.abi import BufferLayout
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

RUN = "skewed-run"
CONFIG = "skewed-config"
KERNEL = "SkewedMoe"
LAYOUT = BufferLayout(aic_slots=1, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
SWIGLU = 0x20000 + 102
FREQUENCY_HZ = 50e6
LAG = 30
"""Cycles by which invocation 0's AIV/0 counter lags AIC/0's."""
LATER = 1000
"""Cycles from invocation 0's records to invocation 1's."""
FIRST_EVENT, SECOND_EVENT = 10, 11


def buffer(lag: int, later: int, aic_wait_end: int = 240) -> bytearray:
    """The two cores' records (module docstring) ``later`` cycles on, AIV/0's ``lag``
    cycles early, AIC/0's wait ending at ``aic_wait_end``."""
    aic = [
        (100, 150, GMM1, 1, 0, 0),
        (150, 160, TRIGGER, 1, 0, 0),
        (160, aic_wait_end, WAIT, 3, 1, 0),
        (aic_wait_end, 300, GMM1, 3, 1, 0),
    ]
    aiv = [
        (100, 170, WAIT, 2, 0, 0),
        (170, 220, SWIGLU, 2, 0, 0),
        (220, 230, TRIGGER, 2, 0, 0),
    ]
    return pack(
        1,
        1,
        16,
        16,
        [
            Slot(AIC, 0, later + 90, [(s + later, e + later, *r) for s, e, *r in aic]),
            Slot(
                AIV,
                0,
                later + 90 - lag,
                [(s + later - lag, e + later - lag, *r) for s, e, *r in aiv],
            ),
        ],
    )


def tasks() -> pa.Table:
    """Task 1 (AIC) triggers event 10, which task 2 (AIV) waits for; task 2 triggers 11,
    which task 3 (AIC) waits for."""
    return tasks_table(
        CONFIG,
        KERNEL,
        task_id=[1, 2, 3],
        desc_id=[GMM1, SWIGLU, GMM1],
        core_type=[AIC, AIV, AIC],
        worker=[0, 0, 0],
        wait_event=[-1, FIRST_EVENT, SECOND_EVENT],
        wait_count=[0, 1, 1],
        trigger_event=[FIRST_EVENT, SECOND_EVENT, -1],
        task_type=[101, 102, 101],
        stage_task_index=[0, 0, 1],
    )


def write_skewed_run(store: Store, aic_wait_end: int = 240) -> Store:
    """The run of the module docstring: invocation 0 skewed, invocation 1 not. An
    ``aic_wait_end`` before 200 makes invocation 0's AIC/0 wait end before AIV/0's trigger
    too: the two edges contradict each other around a cycle that no offset can satisfy."""
    run = RunInfo.begin(run_id=RUN)
    store.write_run(run)
    for invocation, lag, later in ((0, LAG, 0), (1, 0, LATER)):
        ingest_buffers(
            store,
            [buffer(lag, later, aic_wait_end if lag else 240)],
            LAYOUT,
            frequency_hz=FREQUENCY_HZ,
            run_id=RUN,
            kernel=KernelInfo(kernel_name=KERNEL, config_id=CONFIG),
            launches=Launches(step=invocation, first_invocation_id=invocation),
        )
    store.write_tasks(RUN, tasks())
    store.write_run(run.finish())
    return store
