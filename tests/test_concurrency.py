"""Several processes write one store at once; a writer killed mid-step loses only that step."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage import swap
from multicore_profiler.storage.catalog import LISTING_ORDER
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.schema import INVOCATIONS
from multicore_profiler.storage.store import open_store

KERNEL = {
    "experts": 2,
    "tiles": 2,
    "aic_workers": 4,
    "aiv_workers": 4,
    "aic_slots": 4,
    "aiv_slots": 8,
}
LAUNCHES_PER_STEP = 2
PER_LAUNCH = SimulatedMoeKernel(**KERNEL).records_per_launch

WRITER = """
import sys, time, numpy as np
from pathlib import Path
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import open_store

root, rank, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
store = open_store(root)
kernel = SimulatedMoeKernel(**{kernel})
if rank == 0:
    store.write_run(RunInfo.begin(run_id="job"))
rng = np.random.default_rng(rank)
{prepare}
for step in range(steps):
    {before_step}
    buffers = kernel.launches(rng, {n}, start_cycle=10**6 * (step * {n} + 1), period=10**6)
    ingest_buffers(
        store, buffers, kernel.layout, frequency_hz=kernel.frequency_hz, run_id="job",
        kernel=KernelInfo(kernel_name=kernel.kernel_name, stage_names=kernel.stage_names),
        launches=Launches(rank=rank, device=rank, step=step, first_invocation_id=step * {n}),
    )
"""


def writer(
    root: Path, rank: int, steps: int, *, prepare: str = "", before_step: str = "pass"
) -> subprocess.Popen:
    script = WRITER.format(
        kernel=KERNEL,
        n=LAUNCHES_PER_STEP,
        prepare=textwrap.dedent(prepare),
        before_step=before_step,
    )
    return subprocess.Popen([sys.executable, "-c", script, str(root), str(rank), str(steps)])


def counts(root: Path) -> dict[str, int]:
    with open_store(root, create=False) as store:
        row = store.sql(
            """SELECT (SELECT count(*) FROM records) AS records,
                      (SELECT count(*) FROM cores) AS cores,
                      (SELECT count(*) FROM invocations) AS invocations,
                      (SELECT count(DISTINCT (rank, step)) FROM records) AS steps"""
        )
    return row.to_pylist()[0]


def test_four_writer_processes_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    root = tmp_path / "store"
    open_store(root).close()
    procs = [writer(root, rank, 10) for rank in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    invocations = 4 * 10 * LAUNCHES_PER_STEP
    assert counts(root)["records"] == invocations * PER_LAUNCH
    assert counts(root)["invocations"] == invocations
    assert counts(root)["steps"] == 40
    with open_store(root) as store:
        unique = store.sql(
            "SELECT count(DISTINCT (rank, invocation_id, core_type, block_id, record_index)) AS n "
            "FROM records"
        )
    assert unique["n"].to_pylist() == [invocations * PER_LAUNCH]


# Where the writer of step 5 stops: inside the records file, or after it is in place but
# before the invocations file that commits the step.
KILL_POINTS = {
    "mid-file": """
import types
import pyarrow.parquet as pq
import multicore_profiler.storage.partitions as partitions
class Stalling(pq.ParquetWriter):
    def write_table(self, table, *args, **kwargs):
        super().write_table(table.slice(0, len(table) // 2), *args, **kwargs)
        if STALL:
            Path(sys.argv[1], "stalled").touch()
            time.sleep(600)
        super().write_table(table.slice(len(table) // 2), *args, **kwargs)
partitions.pq = types.SimpleNamespace(**{**vars(pq), "ParquetWriter": Stalling})
STALL = False
""",
    "before-commit": """
import multicore_profiler.storage.writes as writes_module
from multicore_profiler.storage.schema import INVOCATIONS
real_write = writes_module.write_partition
def stalling(root, spec, values, table, **options):
    if STALL and spec is INVOCATIONS:
        Path(sys.argv[1], "stalled").touch()
        time.sleep(600)
    return real_write(root, spec, values, table, **options)
writes_module.write_partition = stalling
STALL = False
""",
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_writer_killed_mid_step_leaves_earlier_steps_whole(tmp_path: Path, point: str) -> None:
    root = tmp_path / "store"
    open_store(root).close()
    proc = writer(root, 0, 6, prepare=KILL_POINTS[point], before_step="STALL = step == 5")
    deadline = time.monotonic() + 120
    while not (root / "stalled").exists():
        assert proc.poll() is None, "the writer ended before it reached step 5"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)

    expected = {
        "records": 5 * LAUNCHES_PER_STEP * PER_LAUNCH,
        "invocations": 5 * LAUNCHES_PER_STEP,
        "steps": 5,
    }
    got = counts(root)
    assert {k: got[k] for k in expected} == expected
    for path in root.rglob("*.parquet"):
        pq.read_metadata(path)  # every visible file is whole
    if point == "mid-file":
        assert list(root.rglob("*.parquet.tmp")), "the half-written file was written aside"
    else:
        with open_store(root) as store:
            raw = store.sql("SELECT count(*) AS n FROM raw_records")["n"].to_pylist()[0]
        assert raw == expected["records"] + LAUNCHES_PER_STEP * PER_LAUNCH

    # The store goes on: the step can be written again and counts once.
    again = writer(root, 1, 6)
    assert again.wait(timeout=120) == 0
    assert counts(root)["records"] == expected["records"] + 6 * LAUNCHES_PER_STEP * PER_LAUNCH


class WaitReporter:
    """``fcntl`` for the store lock: when an exclusive lock (a compaction's) would wait
    for a reader, it sets ``progress`` and waits for ``then`` before it waits for the
    lock, so that what the compaction does next comes after ``then``, whatever the
    threads' timing."""

    LOCK_SH, LOCK_EX, LOCK_UN = fcntl.LOCK_SH, fcntl.LOCK_EX, fcntl.LOCK_UN

    def __init__(self, progress: threading.Event, then: threading.Event) -> None:
        self.progress = progress
        self.then = then

    def flock(self, fd: int, mode: int) -> None:
        if mode == fcntl.LOCK_EX:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                self.progress.set()
                assert self.then.wait(120)
        fcntl.flock(fd, mode)


MAINTENANCE = {
    # What each did: the files a compaction merged (the ingest's among them), the runs a
    # gc removed (the ingest's step with its run).
    "compact": lambda store: store.compact(["job"]).files_before,
    "gc": lambda store: len(store.gc(keep_last=0, apply=True).runs),
}
AFTER = {"compact": (3, [0, 0, 1, 1, 2]), "gc": (1, [])}
"""What the maintenance did, and the steps of the invocations left, in id order."""


@pytest.mark.parametrize("command", list(MAINTENANCE))
def test_an_ingest_beside_maintenance_that_removes_what_it_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """A compaction (or a gc) runs between the moment an ingest lists the run's
    invocations files (to find the next free ids) and the moment it opens them. It
    waits for the ingest's read; it unlinked the files under it before (a
    FileNotFoundError)."""
    root = tmp_path / "store"
    kernel = SimulatedMoeKernel(**KERNEL)
    with open_store(root) as store:
        store.write_run(RunInfo.begin(run_id="job").finish())
        for step in range(2):
            batch = kernel.launches(np.random.default_rng(step), 2, start_cycle=10**6, period=10**6)
            ingest_buffers(
                store, batch, kernel.layout, frequency_hz=kernel.frequency_hz, run_id="job",
                launches=Launches(step=step),
            )  # fmt: skip
    assert len(list((root / "invocations/run_id=job").glob("*.parquet"))) == 2

    progress = threading.Event()  # the maintenance finished, or waits for the ingest
    ingested = threading.Event()
    monkeypatch.setattr(swap, "fcntl", WaitReporter(progress, ingested))
    maintainer = open_store(root)
    done: list[int] = []

    def maintain() -> None:
        try:
            done.append(MAINTENANCE[command](maintainer))
        finally:
            progress.set()

    thread = threading.Thread(target=maintain)
    ingest = open_store(root)
    listing = ingest._catalog.files

    def files_then_maintenance(runs=None, tables=LISTING_ORDER):  # type: ignore[no-untyped-def]
        listed = listing(runs, tables)
        if tables == (INVOCATIONS,) and thread.ident is None:
            thread.start()
            assert progress.wait(120)
        return listed

    monkeypatch.setattr(ingest._catalog, "files", files_then_maintenance)
    batch = kernel.launches(np.random.default_rng(2), 1, start_cycle=10**6, period=10**6)
    try:
        written = ingest_buffers(
            ingest, batch, kernel.layout, frequency_hz=kernel.frequency_hz, run_id="job",
            launches=Launches(step=2),
        )  # fmt: skip
    finally:
        ingested.set()
        thread.join(120)
    assert written.invocation_ids == range(4, 5)
    did, steps = AFTER[command]
    assert done == [did]  # it waited for the ingest, then did its work
    with open_store(root) as store:
        rows = store.sql("SELECT invocation_id, step FROM invocations ORDER BY invocation_id")
    assert rows.to_pylist() == [{"invocation_id": i, "step": step} for i, step in enumerate(steps)]
    maintainer.close()
    ingest.close()


def test_a_file_removed_while_its_directory_is_listed_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction unlinks a file between the listing of its directory and its stat: the
    listing (of a claim, of a vacuum) leaves it out rather than failing."""
    root = tmp_path / "store"
    location = open_store(root).location
    directory = root / "invocations" / "run_id=job"
    directory.mkdir(parents=True)
    for name in ("part-a.parquet", "part-b.parquet"):
        (directory / name).write_bytes(b"x")
    scandir = os.scandir

    @contextmanager
    def listed_then_unlinked(path):  # type: ignore[no-untyped-def]
        with scandir(path) as entries:
            found = list(entries)
        if Path(path) == directory:
            (directory / "part-a.parquet").unlink()
        yield iter(found)

    monkeypatch.setattr(os, "scandir", listed_then_unlinked)
    found = location.files("invocations")
    assert [(Path(i.path).name, i.size) for i in found] == [("part-b.parquet", 1)]
