"""One rank of a job writing its steps into a store: run as a process by the scale tests.

``python remote_writer.py STORE RANK STEPS [--stall-before-commit N]`` writes rank RANK's
``runs`` row, then STEPS steps of ``LAUNCHES`` launches of ``KERNEL`` each (invocation ids
from 0), then its finished ``runs`` row. With ``--stall-before-commit N`` it prints
``stalled`` and sleeps just before uploading step N's invocations file (its records and
cores are written), so that a test can kill it there.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage import location as location_module
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store, open_store

KERNEL = SimulatedMoeKernel(experts=2, tiles=2, aic_workers=4, aiv_workers=4)
LAUNCHES = 2
RUN_ID = "job"
START = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)


def write_step(
    store: Store,
    run_id: str,
    rng: np.random.Generator,
    *,
    rank: int = 0,
    step: int = 0,
    launches: int = LAUNCHES,
) -> None:
    """One step of ``launches`` launches of ``KERNEL`` (invocation ids from step x launches)."""
    batch = KERNEL.launches(rng, launches, start_cycle=10**6 * (step + 1), period=10**5)
    ingest_buffers(
        store,
        batch,
        KERNEL.layout,
        frequency_hz=KERNEL.frequency_hz,
        run_id=run_id,
        kernel=KernelInfo(kernel_name=KERNEL.kernel_name, stage_names=KERNEL.stage_names),
        launches=Launches(rank=rank, step=step, first_invocation_id=step * launches),
    )


def run_writers(
    uri: str,
    env: dict[str, str],
    ranks: int,
    steps: int,
    meanwhile: Callable[[], object] | None = None,
) -> int:
    """Run a writer process per rank, each writing ``steps`` steps of run ``RUN_ID``;
    call ``meanwhile`` again and again until they have all finished. Return how many
    times it was called."""
    environment = {**os.environ, **env, "PYTHONPATH": str(Path(__file__).parent)}
    writers = [
        subprocess.Popen(
            [sys.executable, __file__, uri, str(rank), str(steps)],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    calls = 0
    while meanwhile is not None and any(w.poll() is None for w in writers):
        meanwhile()
        calls += 1
    for writer in writers:
        out, err = writer.communicate(timeout=300)
        assert (writer.returncode, out.strip()) == (0, "done"), err
    return calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("rank", type=int)
    parser.add_argument("steps", type=int)
    parser.add_argument("--stall-before-commit", type=int)
    args = parser.parse_args()
    store = open_store(args.store)
    if args.stall_before_commit is not None:
        upload = location_module.StoreLocation.upload
        step_dir = f"invocations/run_id={RUN_ID}/"

        def stalling(self, local, relative):  # type: ignore[no-untyped-def]
            if relative.startswith(step_dir) and stalling.committed == args.stall_before_commit:
                print("stalled", flush=True)
                time.sleep(600)
            if relative.startswith(step_dir):
                stalling.committed += 1
            return upload(self, local, relative)

        stalling.committed = 0  # type: ignore[attr-defined]
        location_module.StoreLocation.upload = stalling  # type: ignore[method-assign]
    run = RunInfo(RUN_ID, START, label="scale", rank=args.rank)
    store.write_run(run)
    rng = np.random.default_rng(args.rank)
    for step in range(args.steps):
        write_step(store, RUN_ID, rng, rank=args.rank, step=step)
    store.write_run(run.finish())
    print("done", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
