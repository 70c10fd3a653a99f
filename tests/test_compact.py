"""Compaction merges small files without changing any answer, even for a query running meanwhile."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from polling_reader import QUERY, poll_during

from multicore_profiler.errors import StoreError
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.check import check_store
from multicore_profiler.storage.partitions import write_partition
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.schema import RECORDS
from multicore_profiler.storage.store import Store, open_store

KERNEL = SimulatedMoeKernel(
    experts=2, tiles=2, aic_workers=4, aiv_workers=4, aic_slots=4, aiv_slots=8
)
INFO = KernelInfo(
    kernel_name=KERNEL.kernel_name, owner_label="Expert", stage_names=KERNEL.stage_names
)
QUERIES = {
    "records": "SELECT * FROM records ORDER BY ALL",
    "cores": "SELECT * FROM cores ORDER BY ALL",
    "invocations": "SELECT * FROM invocations ORDER BY ALL",
    "runs": "SELECT * FROM runs ORDER BY ALL",
    "stage_stats": "SELECT * FROM stage_stats ORDER BY ALL",
    "run_summary": "SELECT * FROM run_summary ORDER BY ALL",
}


def fill(store: Store, runs: int = 2, ranks: int = 2, steps: int = 3) -> int:
    """Runs of several ranks and steps, two launches a step; returns the record count."""
    rng = np.random.default_rng(0)
    for r in range(runs):
        run = RunInfo.begin(run_id=f"run{r}")
        store.write_run(run)
        for rank in range(ranks):
            for step in range(steps):
                buffers = KERNEL.launches(rng, 2, start_cycle=10**6 * (step * 2 + 1), period=10**6)
                ingest_buffers(
                    store,
                    buffers,
                    KERNEL.layout,
                    frequency_hz=KERNEL.frequency_hz,
                    run_id=run.run_id,
                    kernel=INFO,
                    launches=Launches(rank=rank, step=step, first_invocation_id=step * 2),
                )
        store.write_run(run.finish())
    return runs * ranks * steps * 2 * KERNEL.records_per_launch


def parquet_files(store: Store) -> list[Path]:
    return sorted(store.root.rglob("*.parquet"))


def test_compaction_changes_no_answer_and_leaves_one_file_per_partition(store: Store) -> None:
    fill(store)
    before = {name: store.sql(q) for name, q in QUERIES.items()}
    files = len(parquet_files(store))
    report = store.compact()
    # Per run: runs (2 rows) and invocations (ranks x steps) files, cores and records per step.
    assert (report.runs, report.partitions, report.files_before) == (2, 2 * (1 + 1 + 3 + 3), files)
    assert report.files_after == report.partitions
    assert len(parquet_files(store)) == report.partitions
    for name, query in QUERIES.items():
        assert store.sql(query).equals(before[name]), name
    assert store.compact().partitions == 0
    assert not list(store.root.rglob("*.tmp"))


def test_compacting_one_run_leaves_the_others(store: Store) -> None:
    fill(store)
    other = sorted(p for p in parquet_files(store) if "run_id=run1" in str(p))
    assert store.compact(["run0"]).runs == 1
    assert sorted(p for p in parquet_files(store) if "run_id=run1" in str(p)) == other
    with pytest.raises(StoreError, match="no run 'nope' in the store"):
        store.compact(["nope"])


def test_rows_of_uncommitted_invocations_are_left_alone(store: Store) -> None:
    fill(store, runs=1, ranks=1, steps=2)
    stray = store.sql("SELECT * EXCLUDE (run_id, step) FROM raw_records WHERE step = 1")
    stray = stray.set_column(2, "write_id", pa.array([77] * len(stray), pa.int64()))
    orphan = Path(write_partition(store.location, RECORDS, {"run_id": "run0", "step": 1}, stray))
    before = store.sql(QUERIES["records"])
    report = store.compact()
    assert report.uncommitted_files == 1
    assert orphan.exists()
    assert store.sql(QUERIES["records"]).equals(before)


def test_a_second_compaction_at_once_is_refused(store: Store) -> None:
    fill(store, runs=1, ranks=1, steps=1)
    with open(store.root / ".mcprof.compact.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(StoreError, match=r"another compaction of the store at .* is running"):
            store.compact()


def test_a_query_during_compaction_sees_every_row_once(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    total = fill(store, runs=3, ranks=2, steps=4)
    expected = store.sql(QUERY).to_pylist()[0]
    report, answers, during = poll_during(str(store.root), tmp_path, store.compact)
    assert report.partitions == 3 * (1 + 1 + 4 + 4)
    assert during, "no query ran while the compaction did"
    assert answers == {f"{total} {expected['s']} {total}"}


CRASHING_COMPACTION = """
import os, signal, sys
from pathlib import Path
from multicore_profiler.storage.store import open_store
real_unlink = Path.unlink
def unlink(self, *args, **kwargs):
    if self.suffix == ".parquet":  # the merged file is in place; its sources are not gone yet
        os.kill(os.getpid(), signal.SIGKILL)
    return real_unlink(self, *args, **kwargs)
Path.unlink = unlink
open_store(sys.argv[1]).compact()
"""


def test_a_compaction_killed_mid_swap_is_finished_by_the_next_reader(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    total = fill(store, runs=1, ranks=2, steps=2)
    before = store.sql(QUERIES["records"])
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_COMPACTION, str(store.root)], check=False
    )
    assert crashed.returncode == -9
    assert list((store.root / "_journal").glob("*.json")), "the swap was journaled"
    merged_and_sources = len(parquet_files(store))
    assert store.sql("SELECT count(*) AS n FROM records")["n"].to_pylist() == [total]
    assert store.sql(QUERIES["records"]).equals(before)
    assert not list((store.root / "_journal").glob("*.json"))
    assert len(parquet_files(store)) < merged_and_sources


WRITER = """
import sys, numpy as np
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.store import open_store
store = open_store(sys.argv[1])
kernel = SimulatedMoeKernel(
    experts=2, tiles=2, aic_workers=4, aiv_workers=4, aic_slots=4, aiv_slots=8
)
rng = np.random.default_rng(1)
for step in range(20):
    buffers = kernel.launches(rng, 2, start_cycle=10**6, period=10**6)
    ingest_buffers(store, buffers, kernel.layout, frequency_hz=kernel.frequency_hz, run_id="live",
                   launches=Launches(rank=5, step=step, first_invocation_id=2 * step))
"""


def test_compacting_a_run_that_is_being_written(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    store.write_run(RunInfo.begin(run_id="live"))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(store.root)])
    while writer.poll() is None:
        store.compact(["live"])
    assert writer.returncode == 0
    store.compact(["live"])
    assert store.sql("SELECT count(*) AS n FROM records")["n"].to_pylist() == [
        40 * KERNEL.records_per_launch
    ]
    assert store.sql("SELECT count(*) AS n FROM raw_records")["n"].to_pylist() == [
        40 * KERNEL.records_per_launch
    ]


def test_the_vacuum_deletes_a_dead_writers_task_graphs_a_day_old(store: Store) -> None:
    """A writer writes a config's task graph just before the first step that names it;
    one that died in between leaves a ``tasks`` file no invocation names."""
    run = RunInfo.begin(run_id="r")
    store.write_run(run.finish())
    named = Path(store.write_tasks("r", KERNEL.tasks_table("c1")))
    buffers = KERNEL.launches(np.random.default_rng(0), 2, start_cycle=10**6, period=10**6)
    ingest_buffers(
        store, buffers, KERNEL.layout, frequency_hz=KERNEL.frequency_hz, run_id="r",
        kernel=replace(INFO, config_id="c1"), launches=Launches(step=0),
    )  # fmt: skip
    dead = Path(store.write_tasks("r", KERNEL.tasks_table("c2")))  # its writer died here
    young = Path(store.write_tasks("r", KERNEL.tasks_table("c3", rank=1)))  # one writing now
    two_days_ago = (datetime.now(timezone.utc) - timedelta(days=2)).timestamp()
    for path in (named, dead):
        os.utime(path, (two_days_ago, two_days_ago))
    graphs = "SELECT config_id, rank, count(*) AS tasks FROM tasks GROUP BY ALL ORDER BY ALL"
    tasks = len(KERNEL.tasks)
    assert store.sql(graphs).to_pylist() == [
        {"config_id": c, "rank": rank, "tasks": tasks}
        for c, rank in (("c1", 0), ("c2", 0), ("c3", 1))
    ]

    assert [str(p) for p in check_store(store).problems] == [
        f"tasks/run_id=r/{dead.name}: orphan: task graphs that no invocation names, over 1 day "
        "old (their writer died before the steps that name them): no view joins them; "
        "'mcprof compact' deletes the file"
    ]
    report = store.compact()
    # The graph being written is merged with no other: its own file keeps its age.
    assert (report.files_deleted, report.uncommitted_files, report.partitions) == (1, 1, 0)
    assert (named.exists(), dead.exists(), young.exists()) == (True, False, True)
    assert store.sql(graphs).to_pylist() == [
        {"config_id": c, "rank": rank, "tasks": tasks} for c, rank in (("c1", 0), ("c3", 1))
    ]
    assert check_store(store).ok

    later = store.compact(now=datetime.now(timezone.utc) + timedelta(days=2))
    assert (later.files_deleted, later.uncommitted_files) == (1, 0)
    assert (named.exists(), young.exists()) == (True, False)
    assert store.sql(graphs).to_pylist() == [{"config_id": "c1", "rank": 0, "tasks": tasks}]
