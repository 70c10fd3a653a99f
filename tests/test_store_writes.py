"""The store's write path alone: ``StoreWrites`` on a location, what a step writes and
flushes, and the light import a writer process relies on."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from task_graphs import tasks_table

from multicore_profiler.errors import StoreError
from multicore_profiler.storage import partitions
from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store, open_store
from multicore_profiler.storage.writes import StoreWrites

RUN = "job"


def step_rows(step: int, first_id: int, rank: int = 0) -> dict[str, pa.Table]:
    """Two invocations of a step, each with one core and two records."""
    ids = [first_id, first_id + 1]
    invocations = pa.table(
        {
            "rank": pa.array([rank, rank], pa.int32()),
            "device": pa.array([0, 0], pa.int32()),
            "step": pa.array([step, step], pa.int64()),
            "invocation_id": pa.array(ids, pa.int64()),
            "direction": ["forward", "forward"],
            "kernel_name": ["Mega", "Mega"],
            "soc": pa.array([None, None], pa.string()),
            "frequency_hz": [50e6, 50e6],
            "frequency_source": ["given", "given"],
            "anchor_cycle": pa.array([1000, 2000], pa.uint64()),
            "aic_slots": pa.array([1, 1], pa.uint32()),
            "aiv_slots": pa.array([0, 0], pa.uint32()),
            "aic_capacity": pa.array([16, 16], pa.uint32()),
            "aiv_capacity": pa.array([0, 0], pa.uint32()),
            "record_count": pa.array([2, 2], pa.int64()),
            "dropped_count": pa.array([0, 0], pa.int64()),
            "owner_label": ["Owner", "Owner"],
            "stage_names": pa.array(
                [[(7, "GMM1")], [(7, "GMM1")]], pa.map_(pa.uint32(), pa.string())
            ),
            "window_id": pa.array([None, None], pa.int64()),
            "config_id": pa.array([None, None], pa.string()),
            "partial_slots": pa.array([[], []], pa.list_(pa.uint32())),
            "abi_generation": ["a", "a"],
        }
    )
    cores = pa.table(
        {
            "rank": pa.array([rank, rank], pa.int32()),
            "invocation_id": pa.array(ids, pa.int64()),
            "slot": pa.array([0, 0], pa.uint32()),
            "core_type": pa.array([1, 1], pa.uint8()),
            "block_id": pa.array([0, 0], pa.uint32()),
            "entry_cycle": pa.array([1000, 2000], pa.uint64()),
            "record_count": pa.array([2, 2], pa.uint32()),
            "dropped_count": pa.array([0, 0], pa.uint32()),
            "record_capacity": pa.array([16, 16], pa.uint32()),
        }
    )
    starts = [1010, 1030, 2010, 2030]
    records = pa.table(
        {
            "rank": pa.array([rank] * 4, pa.int32()),
            "invocation_id": pa.array([ids[0], ids[0], ids[1], ids[1]], pa.int64()),
            "core_type": pa.array([1] * 4, pa.uint8()),
            "block_id": pa.array([0] * 4, pa.uint32()),
            "record_index": pa.array([0, 1, 0, 1], pa.uint32()),
            "start_cycle": pa.array(starts, pa.uint64()),
            "end_cycle": pa.array([s + 15 for s in starts], pa.uint64()),
            "desc_id": pa.array([7] * 4, pa.uint32()),
            "task_id": pa.array([3, 4, 3, 4], pa.uint32()),
            "stage_task_index": pa.array([0, 1, 0, 1], pa.uint32()),
            "owner_id": pa.array([2] * 4, pa.uint32()),
            "phase": pa.array(["compute"] * 4)
            .dictionary_encode()
            .cast(pa.dictionary(pa.int8(), pa.string())),
        }
    )
    return {"invocations": invocations, "cores": cores, "records": records}


def record_rows(store: Store) -> list[tuple[int, int, int, int, int]]:
    """(step, invocation id, record index, start, end) of every record a view shows."""
    rows = store.sql(
        "SELECT step, invocation_id, record_index, start_cycle, end_cycle FROM records "
        "ORDER BY step, invocation_id, record_index"
    ).to_pylist()
    return [tuple(r.values()) for r in rows]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A new, empty local store's directory (made by a ``Store``, as a session does)."""
    where = tmp_path / "store"
    open_store(where).close()
    return where


def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (device, inode) of each file or directory ``os.fsync`` is called on, in order."""
    calls: list[tuple[int, int]] = []
    real = os.fsync

    def counting(fd: int) -> None:
        info = os.fstat(fd)
        calls.append((info.st_dev, info.st_ino))
        real(fd)

    monkeypatch.setattr(partitions.os, "fsync", counting)
    return calls


def identity(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return (info.st_dev, info.st_ino)


def test_a_step_flushes_only_its_commit(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writes = StoreWrites(StoreLocation.local(root))
    calls = fsynced(monkeypatch)
    writes.write_step(RUN, 4, **step_rows(4, 0))

    commit = root / "invocations" / f"run_id={RUN}"
    (committed,) = commit.glob("*.parquet")
    # The invocations file, then its directory (the rename): nothing of cores or records.
    assert calls == [identity(committed), identity(commit)]
    for table in ("cores", "records"):
        assert len(list((root / table / f"run_id={RUN}" / "step=4").glob("*.parquet"))) == 1
    assert list(root.rglob("*.tmp")) == []


@pytest.mark.parametrize("method", ["write_run", "write_tasks", "discard_writes"])
def test_other_writes_flush_their_file_and_directory(
    root: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    writes = StoreWrites(StoreLocation.local(root))
    calls = fsynced(monkeypatch)
    if method == "write_run":
        writes.write_run(RunInfo.begin(run_id=RUN))
        table = "runs"
    elif method == "write_tasks":
        graph = tasks_table(
            "cfg",
            "Mega",
            task_id=[0, 1],
            desc_id=[7, 7],
            core_type=[1, 1],
            worker=[0, 0],
            wait_event=[-1, 1],
            wait_count=[0, 1],
            trigger_event=[1, -1],
        )
        writes.write_tasks(RUN, graph)
        table = "tasks"
    else:
        writes.discard_writes(RUN, 0, [11, 12], reason="retried")
        table = "discards"
    directory = root / table / f"run_id={RUN}"
    (written,) = directory.glob("*.parquet")
    assert calls == [identity(written), identity(directory)]


def test_steps_go_into_new_and_existing_partition_directories(root: Path) -> None:
    writes = StoreWrites(StoreLocation.local(root))
    records = root / "records" / f"run_id={RUN}" / "step=2"
    assert not records.parent.exists()
    writes.write_step(RUN, 2, **step_rows(2, 0))  # no run directory yet
    writes.write_step(RUN, 2, **step_rows(2, 2))  # into the directories the first made
    assert len(list(records.glob("*.parquet"))) == 2
    writes.write_step(RUN, 3, **step_rows(3, 4))  # a new step directory in the run's
    shutil.rmtree(root / "cores" / f"run_id={RUN}")  # as a vacuum removes a run's files
    shutil.rmtree(root / "records" / f"run_id={RUN}")
    shutil.rmtree(root / "invocations" / f"run_id={RUN}")
    writes.write_step(RUN, 3, **step_rows(3, 6))  # made again
    with open_store(root) as store:
        assert record_rows(store) == [
            (3, 6, 0, 1010, 1025),
            (3, 6, 1, 1030, 1045),
            (3, 7, 0, 2010, 2025),
            (3, 7, 1, 2030, 2045),
        ]
        cores = store.sql("SELECT count(*) AS n FROM raw_cores")["n"].to_pylist()
    assert cores == [2]


def test_store_writes_alone_fill_a_store(root: Path) -> None:
    writes = StoreWrites(StoreLocation.local(root))
    run = RunInfo.begin(run_id=RUN, label="alone")
    writes.write_run(run)
    first = writes.write_step(RUN, 0, **step_rows(0, 0, rank=1))
    second = writes.write_step(RUN, 1, **step_rows(1, 2, rank=1))
    writes.discard_writes(RUN, 1, [first], reason="a dead window")
    writes.write_run(run.finish())

    with open_store(root, create=False) as store:
        assert record_rows(store) == [
            (1, 2, 0, 1010, 1025),
            (1, 2, 1, 1030, 1045),
            (1, 3, 0, 2010, 2025),
            (1, 3, 1, 2030, 2045),
        ]
        invocations = store.sql(
            "SELECT rank, step, invocation_id, write_id, origin_write_id, kernel_name, "
            "stage_names FROM invocations ORDER BY invocation_id"
        ).to_pylist()
        assert invocations == [
            {
                "rank": 1,
                "step": 1,
                "invocation_id": i,
                "write_id": second,
                "origin_write_id": None,
                "kernel_name": "Mega",
                "stage_names": [(7, "GMM1")],
            }
            for i in (2, 3)
        ]
        runs = store.sql("SELECT run_id, label, status FROM runs").to_pylist()
        assert runs == [{"run_id": RUN, "label": "alone", "status": "complete"}]
        discards = store.sql("SELECT rank, write_id, reason FROM raw_discards").to_pylist()
        assert discards == [{"rank": 1, "write_id": first, "reason": "a dead window"}]


def test_staged_steps_show_only_once_committed_and_then_together(root: Path) -> None:
    writes = StoreWrites(StoreLocation.local(root))
    staged = [writes.stage_step(RUN, step, **step_rows(step, 2 * step)) for step in (0, 1)]
    with open_store(root, create=False) as store:
        assert record_rows(store) == []
        writes.commit(RUN, staged)
        assert store.sql(
            "SELECT step, list(invocation_id ORDER BY invocation_id) AS ids, "
            "count(DISTINCT write_id) AS writes FROM invocations GROUP BY step ORDER BY step"
        ).to_pylist() == [
            {"step": 0, "ids": [0, 1], "writes": 1},
            {"step": 1, "ids": [2, 3], "writes": 1},
        ]
        assert len(record_rows(store)) == 8
    # One commit file for the two steps.
    assert len(list((root / "invocations").rglob("*.parquet"))) == 1
    with pytest.raises(StoreError, match=r"^no staged step to commit$"):
        writes.commit(RUN, [])


def test_step_checks_are_those_of_the_store(root: Path) -> None:
    writes = StoreWrites(StoreLocation.local(root))
    rows = step_rows(5, 0)
    with pytest.raises(StoreError, match="invocations written to step 6 carry steps \\[5\\]"):
        writes.write_step(RUN, 6, **rows)
    stray = rows["records"].set_column(1, "invocation_id", pa.array([0, 1, 1, 9], pa.int64()))
    with pytest.raises(
        StoreError, match="records rows name a invocation_id that no invocation of the step has"
    ):
        writes.write_step(RUN, 5, **{**rows, "records": stray})
    assert not (root / "records").exists()


LEAN_IMPORT = """
import importlib.util, json, sys
spec = importlib.util.find_spec("multicore_profiler")
module = importlib.util.module_from_spec(spec)
sys.modules["multicore_profiler"] = module
import multicore_profiler.storage.writes
heavy = ("duckdb", "pandas", "pyarrow.dataset", "torch")
print(json.dumps(sorted(m for m in sys.modules if m in heavy or m.split(".")[0] in heavy)))
"""


def test_the_write_path_imports_no_reader() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LEAN_IMPORT], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == []


def test_locations_pickle(tmp_path: Path) -> None:
    local = StoreLocation.local(tmp_path / "store")
    subtree = StoreLocation.parse(
        "store", pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    )
    s3 = StoreLocation.parse("s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http")
    for location in (local, subtree, s3):
        again = pickle.loads(pickle.dumps(location))
        assert (again, again.uri, again.is_local) == (location, location.uri, location.is_local)
    assert pickle.loads(pickle.dumps(StoreWrites(local))).location == local
