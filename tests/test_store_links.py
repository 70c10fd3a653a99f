"""Symbolic links inside a store: never followed, by a query, a check, a compaction or a
removal; reported by ``mcprof check``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hostile import snapshot

from multicore_profiler.cli import main
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.check import Problem, check_store
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store, open_store

KERNEL = SimulatedMoeKernel(
    experts=2, tiles=2, aic_workers=4, aiv_workers=4, aic_slots=4, aiv_slots=8
)
UNFOLLOWED = (
    "the store follows no link and reads only regular files, so no query, compaction or "
    "removal reads it or what it points to"
)


def fill(store: Store, run_id: str = "r", steps: int = 2) -> None:
    """A finished run of ``steps`` steps of two launches each."""
    store.write_run(RunInfo.begin(run_id=run_id).finish())
    for step in range(steps):
        batch = KERNEL.launches(np.random.default_rng(step), 2, start_cycle=10**6, period=10**6)
        ingest_buffers(
            store, batch, KERNEL.layout, frequency_hz=KERNEL.frequency_hz, run_id=run_id,
            launches=Launches(step=step),
        )  # fmt: skip


def mcprof(*argv: str) -> subprocess.CompletedProcess[str]:
    """``mcprof argv`` in a process of its own: a command that followed a looping link
    would never end, and the timeout fails the test instead."""
    return subprocess.run(
        [sys.executable, "-m", "multicore_profiler.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_link_looping_up_the_store_is_reported_and_never_followed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store)
        records = store.sql("SELECT count(*) AS n FROM records").to_pylist()
    (root / "records/run_id=r/loop").symlink_to("../../..")

    checked = mcprof("check", "--store", str(root))
    assert (checked.returncode, checked.stdout) == (
        1,
        f"records/run_id=r/loop: special: a symbolic link to ../../..: {UNFOLLOWED}\n",
    )
    assert checked.stderr.endswith("1 problem(s) in 1 file(s)\n"), checked.stderr
    checked = mcprof("check", "--store", str(root), "--run", "r")
    assert checked.returncode == 1
    assert checked.stdout.startswith("records/run_id=r/loop: special: "), checked.stdout
    alias = tmp_path / "alias"  # the store's own directory may be a link
    alias.symlink_to(root)
    with open_store(alias) as store:
        assert [p.path for p in check_store(store).problems] == ["records/run_id=r/loop"]

    compacted = mcprof("compact", "--store", str(root))
    assert (compacted.returncode, compacted.stderr) == (0, ""), compacted.stderr
    assert compacted.stdout == (
        "compacted 1 run(s): 2 files in 1 partition(s) merged into 1 (4 rows)\n"
    )
    assert os.readlink(root / "records/run_id=r/loop") == "../../.."
    with open_store(root) as store:
        assert store.sql("SELECT count(*) AS n FROM records").to_pylist() == records


def test_a_link_out_of_the_store_is_neither_read_nor_compacted(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store)
        records = store.sql("SELECT count(*) AS n FROM records").to_pylist()
    # A directory outside the store that looks like a step of run r, with a copy of its
    # records: read through the link, its rows would count twice; merged, they would go.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    [source] = (root / "records/run_id=r/step=1").glob("*.parquet")
    shutil.copy(source, outside / source.name)
    (root / "records/run_id=r/step=7").symlink_to(outside)
    (root / "cores/run_id=r/step=0" / source.name).symlink_to(outside / source.name)
    before = snapshot(outside)

    with open_store(root) as store:
        assert store.sql("SELECT count(*) AS n FROM records").to_pylist() == records
        report = check_store(store)
        assert report.problems == [
            Problem(
                f"cores/run_id=r/step=0/{source.name}",
                "special",
                f"a symbolic link to {outside / source.name}: {UNFOLLOWED}",
            ),
            Problem(
                "records/run_id=r/step=7", "special", f"a symbolic link to {outside}: {UNFOLLOWED}"
            ),
        ]
        assert report.files_checked == 11  # marker, lock, 7 data files, 2 links
        compacted = store.compact()
        assert (compacted.partitions, compacted.files_before, compacted.files_after) == (1, 2, 1)
        assert store.sql("SELECT count(*) AS n FROM records").to_pylist() == records
    assert snapshot(outside) == before
    assert (root / "records/run_id=r/step=7").is_symlink()


def test_gc_removes_a_run_whose_folder_is_a_link_whole_and_leaves_its_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store, "old")
        fill(store, "new")
    # The run's cores moved to another disk, and a link left in their place.
    moved = tmp_path / "other-disk" / "cores-old"
    shutil.move(root / "cores/run_id=old", moved)
    (root / "cores/run_id=old").symlink_to(moved)
    before = snapshot(moved)

    with open_store(root) as store:
        [(run, *_)] = [(r["run_id"], r["files"]) for r in store.gc(keep_last=1, apply=False).runs]
        assert run == "old"
    assert main(["gc", "--store", str(root), "--keep-last", "1", "--apply"]) == 0
    capsys.readouterr()
    left = sorted(str(p.relative_to(root)) for p in root.glob("*/run_id=old"))
    assert left == []
    assert not (root / "cores/run_id=old").is_symlink()
    assert snapshot(moved) == before
    with open_store(root) as store:
        assert store.sql("SELECT DISTINCT run_id FROM invocations").to_pylist() == [
            {"run_id": "new"}
        ]


def test_gc_deletes_nothing_through_a_linked_table_directory(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store, "old")
    # A discards directory that is a link to another store's: not this store's files.
    other = tmp_path / "other" / "discards"
    (other / "run_id=old").mkdir(parents=True)
    (other / "run_id=old" / "part-theirs.parquet").write_bytes(b"theirs")
    (root / "discards").symlink_to(other)
    with open_store(root) as store:
        assert store.gc(keep_last=0, apply=True).summary().startswith("removed 1 run(s)")
        assert store.sql("SELECT count(*) AS n FROM raw_invocations").to_pylist() == [{"n": 0}]
    assert (other / "run_id=old" / "part-theirs.parquet").read_bytes() == b"theirs"
    assert (root / "discards").is_symlink()
