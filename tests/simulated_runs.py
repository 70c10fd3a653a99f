"""Runs of the simulated MoE MegaKernel written into a store, for comparison and report tests."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np

from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

START = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)


def write_run(
    store: Store,
    kernel: SimulatedMoeKernel,
    *,
    seed: int,
    commit: str,
    name: str | None = None,
    config_id: str | None = None,
) -> str:
    """Eight launches of ``kernel`` (compute times drawn with ``seed``) as a run of ``commit``,
    with the kernel's task graph under ``config_id`` when one is given."""
    batch = kernel.launches(np.random.default_rng(seed), 8, start_cycle=10**6, period=10**6)
    info = KernelInfo(
        kernel_name=name or kernel.kernel_name,
        owner_label=kernel.owner_label,
        stage_names=kernel.stage_names,
        config_id=config_id,
    )
    run = RunInfo(f"run-{commit}-{seed}", START + timedelta(minutes=seed), commit=commit)
    store.write_run(run)
    if config_id is not None:
        store.write_tasks(run.run_id, kernel.tasks_table(config_id))
    ingest_buffers(
        store,
        batch,
        kernel.layout,
        frequency_hz=kernel.frequency_hz,
        run_id=run.run_id,
        kernel=info,
        launches=Launches(step=0),
    )
    store.write_run(run.finish())
    return run.run_id
