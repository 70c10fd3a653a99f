"""A capture writer's group of steps: one cores and one records file for several steps
of a window, read beside the files of one step, maintained like them."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from moe_layer import moe_layer

from multicore_profiler import Store, mega_kernel_profile, open_store, schedule
from multicore_profiler.errors import CaptureError, SessionError
from multicore_profiler.ingest import committer
from multicore_profiler.kernels.reference import ReferenceMoeKernel
from multicore_profiler.storage import store as store_module
from multicore_profiler.storage.check import check_store
from multicore_profiler.storage.partitions import ORPHAN_AGE

KEYS = """SELECT step, invocation_id, core_type, block_id, record_index, desc_id, task_id
          FROM records ORDER BY ALL"""
"""What a record is, whatever the clock read when it was recorded."""
PER_STEP = "SELECT step, count(*) AS n FROM records GROUP BY step ORDER BY step"


@pytest.fixture
def kernel() -> Iterator[tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]]]:
    layer = moe_layer(48, hidden=16, intermediate=32)
    with ReferenceMoeKernel(layer.w1, layer.w2, token_tile=16) as k:
        yield k, layer.batch


def record(
    store: Store,
    kernel: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
    steps: int,
    group_steps: int,
    **options: object,
) -> str:
    """Record ``steps`` steps of two launches each; return the run id."""
    k, batch = kernel
    with mega_kernel_profile(store=store, group_steps=group_steps, **options) as prof:
        for _ in range(steps):
            k(*batch)
            k(*batch)
            prof.step()
    return prof.run_id


def group_files(store: Store, table: str, run_id: str) -> list[list[int]]:
    """The steps of each file of several steps of a run's table, each file's in its
    order, sorted by first step."""
    run = store.root / table / f"run_id={run_id}"
    files = [p for p in run.iterdir() if p.is_file()]
    return sorted(pq.read_table(f, columns=["step"])["step"].to_pylist() for f in files)


def test_groups_store_what_files_per_step_store(
    tmp_path: Path, kernel: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]]
) -> None:
    """Windows of 5 steps in groups of 3: a window's end writes its open group, and no
    group spans two windows."""
    windows = schedule(wait=0, warmup=0, active=5)
    found = {}
    for group_steps in (1, 3):
        with open_store(tmp_path / f"store-{group_steps}") as store:
            run_id = record(store, kernel, 7, group_steps, schedule=windows)
            found[group_steps] = (
                store.sql(KEYS).to_pylist(),
                store.sql("SELECT step, invocation_id, slot FROM cores ORDER BY ALL").to_pylist(),
                store.sql(
                    "SELECT window_id, step, invocation_id FROM invocations ORDER BY ALL"
                ).to_pylist(),
                store.sql("SELECT * FROM records WHERE step = 3 ORDER BY ALL").num_rows,
            )
            if group_steps == 1:
                continue
            per_launch = found[1][3] // 2
            rows = [[0] * 2 * per_launch + [1] * 2 * per_launch + [2] * 2 * per_launch]
            rows += [[3] * 2 * per_launch + [4] * 2 * per_launch]
            rows += [[5] * 2 * per_launch + [6] * 2 * per_launch]
            assert group_files(store, "records", run_id) == rows
            assert [sorted(set(f)) for f in group_files(store, "cores", run_id)] == [
                [0, 1, 2],
                [3, 4],
                [5, 6],
            ]
            assert not list((store.root / "records" / f"run_id={run_id}").glob("step=*"))
            assert check_store(store).problems == []
    assert found[3] == found[1]
    assert found[1][0]  # records were stored
    assert [w["window_id"] for w in found[1][2]] == [0] * 10 + [1] * 4


def test_a_step_waits_at_most_group_seconds(
    store: Store,
    kernel: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A group that does not fill is written when its first step has waited
    ``GROUP_SECONDS``, and shows when its window ends."""
    monkeypatch.setattr(committer, "GROUP_SECONDS", 0.05)
    k, batch = kernel
    with mega_kernel_profile(store=store, group_steps=100, writer="thread") as prof:
        k(*batch)
        prof.step()
        prof.flush()
        deadline = time.monotonic() + 30
        while not store.sql("SELECT count(*) AS n FROM raw_records")["n"][0].as_py():
            assert time.monotonic() < deadline, "the group was never written"
            time.sleep(0.02)
        assert store.sql("SELECT count(*) AS n FROM records").to_pylist() == [{"n": 0}]
        k(*batch)
        prof.step()
    run = store.root / "records" / f"run_id={prof.run_id}"
    assert sorted(sorted(set(f)) for f in group_files(store, "records", prof.run_id)) == [
        [0],
        [1],
    ]
    assert not list(run.glob("step=*"))
    counts = store.sql(PER_STEP).to_pylist()
    assert [c["step"] for c in counts] == [0, 1]
    assert counts[0]["n"] == counts[1]["n"] > 0


def test_both_layouts_read_as_one_table_and_compact(
    store: Store,
    kernel: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One run written by a session with a file per step and one with groups (a store
    written before groups, then added to; both sessions number their steps from 0, so
    steps 0 and 1 have files of both layouts): every reader sees one table."""
    monkeypatch.setenv("MCPROF_RUN_ID", "mixed")
    record(store, kernel, 2, 1)
    record(store, kernel, 5, 2)
    run = store.root / "records" / "run_id=mixed"
    assert sorted(p.name for p in run.glob("step=*")) == ["step=0", "step=1"]
    assert [sorted(set(f)) for f in group_files(store, "records", "mixed")] == [
        [0, 1],
        [2, 3],
        [4],
    ]
    keys = store.sql(KEYS).to_pylist()
    counts = store.sql(PER_STEP).to_pylist()
    step = counts[4]["n"]  # one session's step
    assert counts == [{"step": s, "n": step * (2 if s < 2 else 1)} for s in range(5)]
    for s in (1, 4):
        found = store.sql(f"SELECT count(*) AS n FROM records WHERE step = {s}")["n"]
        assert found.to_pylist() == [counts[s]["n"]]
    monkeypatch.setattr(store_module, "NATIVE_MAX_FILES", 0)  # read as pyarrow datasets
    with open_store(store.root, create=False) as datasets:
        assert datasets.sql(KEYS).to_pylist() == keys
        assert datasets.sql("SELECT count(*) AS n FROM cores WHERE step = 4")["n"][0].as_py() > 0

    store.compact()
    # The group files of each table merge into one; the steps' files are one each already.
    assert [len(list(d.iterdir())) for d in sorted(run.glob("step=*"))] == [1, 1]
    assert group_files(store, "records", "mixed") == [[s for s in range(5) for _ in range(step)]]
    assert store.sql(KEYS).to_pylist() == keys
    assert check_store(store).problems == []


def test_a_withdrawn_window_takes_its_group_files_with_it(
    store: Store, kernel: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]]
) -> None:
    k, batch = kernel

    def job() -> None:
        with mega_kernel_profile(store=store, group_steps=2) as prof:
            for _ in range(3):
                k(*batch)
                prof.step()
            prof.flush()  # steps 0 and 1 are a group staged; step 2 is in memory
            raise RuntimeError("job died")

    with pytest.raises(RuntimeError, match="job died"):
        job()
    assert store.sql("SELECT count(*) AS n FROM raw_records").to_pylist()[0]["n"] > 0
    assert store.sql("SELECT count(*) AS n FROM records").to_pylist() == [{"n": 0}]
    # Never committed: a vacuum deletes them once they are a day old.
    store.compact(now=datetime.now(timezone.utc) + 2 * ORPHAN_AGE)
    assert not list((store.root / "records").rglob("*.parquet"))
    assert not list((store.root / "cores").rglob("*.parquet"))
    assert check_store(store).problems == []


def test_check_names_a_corrupt_group_file_and_leaves_its_run_out_of_the_counts(
    store: Store, kernel: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]]
) -> None:
    """Which steps a file that cannot be read holds is not known: its run's invocations
    are not counted against their records, the file itself is the problem."""
    run_id = record(store, kernel, 3, 8)
    (path,) = (store.root / "records" / f"run_id={run_id}").glob("*.parquet")
    data = bytearray(path.read_bytes())
    data[4:64] = bytes(60)  # the first page's header and data
    path.write_bytes(bytes(data))
    problems = check_store(store).problems
    assert [(p.path, p.check) for p in problems] == [
        (f"records/run_id={run_id}/{path.name}", "parquet")
    ]


def test_a_group_that_fails_when_its_time_runs_out_fails_the_next_step(
    store: Store,
    kernel: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The error of a group written by its time bound, between two messages, is the
    answer to the session's next one."""
    monkeypatch.setattr(committer, "GROUP_SECONDS", 0.05)
    real = pq.ParquetWriter.write_table

    def full(self: pq.ParquetWriter, table: pa.Table, *args: object, **kwargs: object) -> None:
        if "record_index" in table.column_names:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    k, batch = kernel
    message = (
        "profile buffers could not be stored: cannot write records to the store at "
        f"{store.root}: No space left on device"
    )
    with (  # noqa: PT012 (raised at a later step)
        pytest.raises(CaptureError) as raised,
        mega_kernel_profile(store=store, group_steps=100, writer="thread") as prof,
    ):
        k(*batch)
        prof.step()
        prof.flush()
        time.sleep(0.5)  # the group's time runs out: its write fails
        for _ in range(3):
            k(*batch)
            prof.step()
    assert str(raised.value) == message
    assert store.sql("SELECT count(*) AS n FROM raw_records").to_pylist() == [{"n": 0}]
    assert store.sql("SELECT count(*) AS n FROM raw_invocations").to_pylist() == [{"n": 0}]
    assert store.sql("SELECT status FROM runs").to_pylist() == [{"status": "failed"}]
    assert check_store(store).problems == []


@pytest.mark.parametrize("value", [0, True, 2.0])
def test_group_steps_is_a_positive_int(store: Store, value: object) -> None:
    with pytest.raises(SessionError) as raised:
        mega_kernel_profile(store=store, group_steps=value)  # type: ignore[arg-type]
    assert str(raised.value) == f"group_steps must be an int >= 1, got {value!r}"
