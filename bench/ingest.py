"""Ingest benchmark: decode + validate + write 10 million realistic device records.

Realistic records come from the simulated MoE MegaKernel (32 experts x 30 tiles on
24 AIC and 48 AIV workers: about 10.6 k records a launch, capacities near 256), its
launches repeated with shifted cycles. Everything runs pinned to one core.

Baseline, measured in the same run on the same bytes: ``numpy.frombuffer`` + copy
(memory bandwidth, the decoder's ceiling). Goals: decode + validate >= 30 % of the
baseline's records/s; end to end into Parquet >= 5 M records/s.

    .venv/bin/python bench/ingest.py [--records 10000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from multicore_profiler.abi import CoreType
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.decode import decode_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store, open_store

LAUNCHES_PER_STEP = 64


def launches(kernel: SimulatedMoeKernel, count: int, distinct: int = 8) -> np.ndarray:
    """``count`` launch buffers (buffer x byte): ``distinct`` simulated ones, repeated later."""
    rng = np.random.default_rng(0)
    period = 10**6
    base = kernel.launches(rng, distinct, start_cycle=period, period=period)
    batch = np.resize(base, (count, base.shape[1]))
    shift = (np.arange(count) // distinct * distinct * period).astype(np.uint64)
    layout = kernel.layout
    for core in (CoreType.AIC, CoreType.AIV):
        slots = layout.region(batch, core)
        header, records = slots["header"], slots["records"]
        active = header["record_count"] > 0
        header["entry_cycle"] += np.where(active, shift[:, None], 0).astype(np.uint64)
        valid = np.arange(records.shape[2]) < header["record_count"][..., None]
        for name in ("start_cycle", "end_cycle"):
            records[name] += np.where(valid, shift[:, None, None], 0).astype(np.uint64)
    return batch


def store_launches(
    store: Store,
    kernel: SimulatedMoeKernel,
    count: int,
    *,
    label: str,
    config_id: str | None = None,
    tasks: pa.Table | None = None,
    batch: np.ndarray | None = None,
) -> str:
    """A run of ``count`` launches of ``kernel`` (``batch``'s buffers if given, else
    ``launches``), ``LAUNCHES_PER_STEP`` a step (and its task graph, if given); return its
    id."""
    batch = launches(kernel, count) if batch is None else batch
    info = KernelInfo(
        kernel_name=kernel.kernel_name,
        owner_label=kernel.owner_label,
        stage_names=kernel.stage_names,
        config_id=config_id,
    )
    run = RunInfo.begin(label=label)
    store.write_run(run)
    if tasks is not None:
        store.write_tasks(run.run_id, tasks)
    for step, first in enumerate(range(0, count, LAUNCHES_PER_STEP)):
        ingest_buffers(
            store,
            batch[first : first + LAUNCHES_PER_STEP],
            kernel.layout,
            frequency_hz=kernel.frequency_hz,
            run_id=run.run_id,
            kernel=info,
            launches=Launches(step=step, first_invocation_id=first),
        )
    store.write_run(run.finish())
    return run.run_id


def best(fn: Callable[[], object], repeat: int) -> float:
    """Fastest of ``repeat`` runs, in seconds (the others are noise on a shared machine)."""
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)

    kernel = SimulatedMoeKernel(experts=32, tiles=30, aic_workers=24, aiv_workers=48)
    count = -(-args.records // kernel.records_per_launch)
    batch = launches(kernel, count)
    records = count * kernel.records_per_launch
    raw = batch.tobytes()
    print(
        f"{records:,} records in {count} launches of {kernel.layout} "
        f"({len(raw) / 1e6:.0f} MB of buffers), one core"
    )

    copy = best(lambda: np.frombuffer(raw, np.uint8).copy(), args.repeat)
    decode = best(lambda: decode_buffers(batch, kernel.layout, frequency_hz=50e6), args.repeat)
    decoded = decode_buffers(batch, kernel.layout, frequency_hz=50e6)
    assert decoded.records.num_rows == records
    assert not decoded.dropped_counts.any()

    info = KernelInfo(
        kernel_name=kernel.kernel_name, owner_label="Expert", stage_names=kernel.stage_names
    )
    totals = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as scratch:
            store = open_store(scratch)
            run = RunInfo.begin(label="bench")
            began = time.perf_counter()
            store.write_run(run)
            for step, first in enumerate(range(0, count, LAUNCHES_PER_STEP)):
                ingest_buffers(
                    store,
                    batch[first : first + LAUNCHES_PER_STEP],
                    kernel.layout,
                    frequency_hz=50e6,
                    run_id=run.run_id,
                    kernel=info,
                    launches=Launches(step=step, first_invocation_id=first),
                )
            store.write_run(run.finish())
            totals.append(time.perf_counter() - began)
            stored = store.sql("SELECT count(*) AS n FROM records")["n"][0].as_py()
            assert stored == records, (stored, records)
    end_to_end = min(totals)

    rate = {name: records / seconds for name, seconds in (("copy", copy), ("decode", decode))}
    print(
        f"baseline numpy.frombuffer + copy : {copy:7.3f} s  {rate['copy'] / 1e6:7.1f} M records/s"
    )
    print(
        f"decode + validate               : {decode:7.3f} s  "
        f"{rate['decode'] / 1e6:7.1f} M records/s"
    )
    print(
        f"end to end into Parquet         : {end_to_end:7.3f} s  {records / end_to_end / 1e6:7.1f} "
        f"M records/s (median {records / statistics.median(totals) / 1e6:.1f})"
    )
    print(
        f"decode / baseline = {rate['decode'] / rate['copy']:.2f} (goal >= 0.30); "
        f"end to end = {records / end_to_end / 1e6:.1f} M records/s (goal >= 5)"
    )


if __name__ == "__main__":
    main()
