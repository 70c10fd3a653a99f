"""Scale benchmark: a per-stage aggregate over a store of many runs, and over one run.

Builds a store of ``--runs`` runs x ``--records`` records (default 200 x 500 k = 100 M
records) from the simulated MoE MegaKernel: one run's steps are simulated and decoded
once, and every run writes the same rows under its own run id, ten steps each. Then:

- the ``stage_stats`` view over every run of the big store;
- the same view for one run of the big store, filtered (``WHERE run_id = ...``) and
  scoped (``Store.sql(..., runs=[run])``, which lists and reads that run's files only);
- baseline, measured in the same run: that run alone in a store of its own.

Goal: the one-run query on the big store within 1.5x of the one-run store, whatever
the big store holds (partition pruning: DuckDB opens no file of another run).

    .venv/bin/python bench/scale.py [--runs 200] [--records 500000] [--repeat 5] [--dir D]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from multicore_profiler.ingest.decode import decode_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches, step_tables
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store, open_store

STEPS = 10
START = datetime(2026, 11, 1, tzinfo=timezone.utc)


def one_run(records: int) -> list[tuple[pa.Table, pa.Table, pa.Table]]:
    """The (invocations, cores, records) of each step of a run of about ``records``."""
    kernel = SimulatedMoeKernel()
    per_step = max(1, round(records / STEPS / kernel.records_per_launch))
    rng = np.random.default_rng(0)
    base = kernel.launches(rng, 8, start_cycle=10**6, period=10**6)
    info = KernelInfo(
        kernel_name=kernel.kernel_name,
        owner_label=kernel.owner_label,
        stage_names=kernel.stage_names,
        soc="Ascend910B4",
    )
    steps = []
    for step in range(STEPS):
        batch = np.resize(base, (per_step, base.shape[1]))
        decoded = decode_buffers(batch, kernel.layout, frequency_hz=kernel.frequency_hz)
        launches = Launches(step=step, first_invocation_id=step * per_step)
        steps.append(step_tables(decoded, info, launches))
    return steps


def write(store: Store, run_id: str, index: int, steps: list[tuple[pa.Table, ...]]) -> None:
    run = RunInfo(run_id, START + timedelta(hours=index), commit=f"{index:08x}", label="scale")
    store.write_run(run)
    for step, (invocations, cores, records) in enumerate(steps):
        store.write_step(run_id, step, invocations=invocations, cores=cores, records=records)
    store.write_run(run.finish())


def timed(
    store: Store, query: str, repeat: int, runs: list[str] | None = None
) -> tuple[float, int]:
    """Median seconds of ``query`` (after one warm-up) and its row count."""
    rows = store.sql(query, runs=runs).num_rows
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        store.sql(query, runs=runs)
        times.append(time.perf_counter() - began)
    return statistics.median(times), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--records", type=int, default=500_000, help="records per run")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="where the stores go (default: a temp dir)")
    args = parser.parse_args()
    steps = one_run(args.records)
    per_run = sum(t[2].num_rows for t in steps)
    with tempfile.TemporaryDirectory(prefix="mcprof-scale-", dir=args.dir) as scratch:
        root = Path(scratch)
        target = f"run-{args.runs // 2:04d}"
        began = time.perf_counter()
        with open_store(root / "big") as big:
            for index in tqdm(range(args.runs), desc="writing runs", unit="run", disable=None):
                write(big, f"run-{index:04d}", index, steps)
        written = time.perf_counter() - began
        with open_store(root / "one") as one:
            write(one, target, args.runs // 2, steps)
        total = args.runs * per_run
        print(f"store: {args.runs} runs x {per_run:,} records = {total:,} records")
        print(f"written in {written:.1f} s ({total / written / 1e6:.1f} M records/s)")
        everything = "SELECT * FROM stage_stats ORDER BY ALL"
        only = f"SELECT * FROM stage_stats WHERE run_id = '{target}' ORDER BY ALL"
        with open_store(root / "big") as big, open_store(root / "one") as one:
            all_s, all_rows = timed(big, everything, max(1, args.repeat // 2))
            big_s, big_rows = timed(big, only, args.repeat)
            scoped_s, scoped_rows = timed(big, everything, args.repeat, runs=[target])
            one_s, one_rows = timed(one, only, args.repeat)
            assert big_rows == scoped_rows == one_rows, (big_rows, scoped_rows, one_rows)
            expected = one.sql(only)
            assert big.sql(only).equals(expected), "the two stores disagree"
            assert big.sql(everything, runs=[target]).equals(expected), "scoping disagrees"
        print(
            f"stage_stats, all {args.runs} runs:          {all_s * 1e3:9.1f} ms ({all_rows} rows)"
        )
        print(f"  one run of the big store, WHERE run_id: {big_s * 1e3:9.1f} ms ({big_rows} rows)")
        print(f"  one run of the big store, runs=[run]:   {scoped_s * 1e3:9.1f} ms")
        print(f"  the one-run store:                      {one_s * 1e3:9.1f} ms (baseline)")
        for what, seconds in (("WHERE run_id", big_s), ("runs=[run]", scoped_s)):
            ratio = seconds / one_s
            verdict = "met" if ratio <= 1.5 else "NOT met"
            print(f"one run ({what}), big / one-run store: {ratio:.2f}x (goal <= 1.5x: {verdict})")


if __name__ == "__main__":
    main()
