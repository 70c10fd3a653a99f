"""The outer-kernel and cross-rank tables a query builds are kept in a local store
(``storage/derived.py``): a later ``Store`` loads them instead of building them, exactly as
built, and builds its own wherever what they are made from differs or they are damaged."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from kineto_ranks import nccl_trace

from multicore_profiler.analysis.outer_kernel_rules import OuterKernelRules
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.storage import derived
from multicore_profiler.storage.check import check_store
from multicore_profiler.storage.derived import DERIVED_DIR
from multicore_profiler.storage.sql_modules import REGISTRY
from multicore_profiler.storage.store import Store, open_store

GEMM = "ampere_sgemm_128x64_nn"
RING = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
KERNELS = "SELECT source_id, name, family, ts_ns, dur_ns FROM kernels ORDER BY ALL"
MATERIALIZED = {
    module.name: module.materialized
    for module in REGISTRY.closure(["cross_rank.communication", "outer_kernels.hccl_ops"])
    if module.materialized
}
"""Every module that builds tables, and its tables."""


def ingest_rank(root: Path, rank: int, shift_us: int = 0) -> None:
    """Ingest a small trace of ``rank`` (a GEMM and an all-reduce) into the store at ``root``."""
    group = {"Process Group Name": "0", "Seq": 1}
    trace = nccl_trace(
        root.parent / f"rank{rank}-{shift_us}.json",
        rank=rank,
        kernels=[(GEMM, 100 + shift_us, 50, {}), (RING, 200 + shift_us, 30 + rank, group)],
    )
    with Store(root) as store:
        ingest_trace(store, trace, rank=rank, job="job")


def kept(root: Path) -> list[list[str]]:
    """The files of each kept key, in a fixed order."""
    folder = root / DERIVED_DIR
    if not folder.exists():
        return []
    return sorted(sorted(os.listdir(key)) for key in folder.iterdir())


def table_of(store: Store, table: str) -> tuple[list[tuple[str, str]], list[dict]]:
    """A table's columns with their types, and its rows in a fixed order."""
    with store.reading(modules=list(MATERIALIZED)) as cursor:
        columns = [(r[0], r[1]) for r in cursor.execute(f"DESCRIBE {table}").fetchall()]
        rows = cursor.sql(f"SELECT * FROM {table} ORDER BY ALL").to_arrow_table()
    return columns, rows.to_pylist()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    ingest_rank(root, 0)
    ingest_rank(root, 1)
    return root


def test_a_later_store_loads_every_kept_table_as_it_was_built(root: Path) -> None:
    with Store(root) as first:
        built = {t: table_of(first, t) for tables in MATERIALIZED.values() for t in tables}
    assert len(MATERIALIZED) == 5
    assert kept(root) == sorted(
        sorted([*(f"{t}.parquet" for t in tables), "manifest.json"])
        for tables in MATERIALIZED.values()
    )
    # The island number is a HUGEINT, which Parquet would give back as a double.
    assert ("island", "HUGEINT") in built["step_islands"][0]
    assert len(built["kernels"][1]) == 4
    assert len(built["collective_instances"][1]) == 2
    hour_ago = time.time() - 3600
    for key in (root / DERIVED_DIR).iterdir():
        os.utime(key, (hour_ago, hour_ago))
    with Store(root) as later:
        assert {t: table_of(later, t) for t in built} == built
    # Each key loaded is among the last pruned.
    assert all(key.stat().st_mtime > hour_ago + 60 for key in (root / DERIVED_DIR).iterdir())


def test_a_later_store_reads_the_kept_tables_rather_than_building_them(root: Path) -> None:
    with Store(root) as first:
        assert len(first.sql(KERNELS)) == 4
    # Keep a kernels table of one row, with its digest: a store that loads reads that row.
    (folder,) = [p for p in (root / DERIVED_DIR).iterdir() if (p / "kernels.parquet").exists()]
    with Store(root) as store, store.reading(modules=["outer_kernels.steps"]) as cursor:
        cursor.execute(
            f"COPY (SELECT * FROM kernels ORDER BY ts_ns LIMIT 1) TO '{folder}/kernels.parquet'"
        )
    data = (folder / "kernels.parquet").read_bytes()
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["kernels"] |= {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with Store(root) as later:
        assert later.sql("SELECT name FROM kernels").to_pylist() == [{"name": GEMM}]


def test_new_traces_and_other_rules_have_tables_of_their_own(root: Path) -> None:
    with Store(root) as store:
        assert len(store.sql(KERNELS)) == 4
    assert len(kept(root)) == 2
    ingest_rank(root, 2)
    with Store(root) as store:
        assert len(store.sql(KERNELS)) == 6
        store.use_kernel_rules(OuterKernelRules(families=(("matmul", "sgemm"),)))
        families = store.sql("SELECT DISTINCT family FROM kernels ORDER BY ALL").to_pylist()
        assert families == [{"family": "matmul"}, {"family": "rest"}]
    assert len(kept(root)) == 6  # two modules' tables for each of three states
    with Store(root) as store:  # the default rules again: loaded, still the new trace's
        assert len(store.sql(KERNELS)) == 6
        assert store.sql("SELECT DISTINCT family FROM kernels ORDER BY ALL").to_pylist() == [
            {"family": "collective"},
            {"family": "gemm"},
        ]
    assert len(kept(root)) == 6


@pytest.mark.parametrize("damage", ["truncated", "removed", "manifest"])
def test_damaged_kept_tables_are_built_again(root: Path, damage: str) -> None:
    with Store(root) as first:
        built = first.sql(KERNELS)
    (folder,) = [p for p in (root / DERIVED_DIR).iterdir() if (p / "kernels.parquet").exists()]
    path = folder / "kernels.parquet"
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "removed":
        path.unlink()
    else:
        (folder / "manifest.json").write_text("{")
    with Store(root) as later:
        assert later.sql(KERNELS) == built
    # The key was built again; its tables are kept whole once more.
    manifest = json.loads((folder / "manifest.json").read_text())
    data = path.read_bytes()
    assert manifest["kernels"]["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_store_whose_tables_cannot_be_kept_answers_as_before(root: Path) -> None:
    (root / DERIVED_DIR).write_text("not a directory")
    with Store(root) as store:
        assert len(store.sql(KERNELS)) == 4
    assert (root / DERIVED_DIR).read_text() == "not a directory"


def test_the_newest_keys_are_kept_and_what_crashed_writers_left_is_removed(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(derived, "KEPT_KEYS", 3)
    folder = root / DERIVED_DIR
    folder.mkdir()
    old, recent = folder / ".old.tmp", folder / ".recent.tmp"
    old.mkdir()
    recent.mkdir()
    hour_ago = time.time() - derived.ASIDE_GRACE_SECONDS - 10
    os.utime(old, (hour_ago, hour_ago))
    with Store(root) as store:
        store.sql(KERNELS)
        newest = set(os.listdir(folder)) - {".recent.tmp"}
        store.use_kernel_rules(OuterKernelRules(families=(("matmul", "sgemm"),)))
        store.sql(KERNELS)
    left = set(os.listdir(folder))
    # Four keys were kept, two at a time: the three newest stay, one of the first two.
    assert len(left - {".recent.tmp"}) == 3
    assert len(left & newest) == 1
    assert ".recent.tmp" in left
    assert ".old.tmp" not in left


def test_check_counts_no_kept_table(root: Path) -> None:
    with Store(root) as store:
        before = check_store(store)
        store.sql(KERNELS)
        after = check_store(store)
    assert len(kept(root)) == 2
    assert after.problems == []
    assert after.files_checked == before.files_checked


READER = """
import json, sys
from multicore_profiler.storage.store import Store
with Store(sys.argv[1], create=False) as store:
    print(json.dumps(store.sql(sys.argv[2]).to_pylist()))
"""


def test_processes_that_build_the_same_tables_at_once_keep_one_copy(root: Path) -> None:
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(root), KERNELS],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
        )
        for _ in range(4)
    ]
    answers = [json.loads(reader.communicate(timeout=120)[0]) for reader in readers]
    assert [reader.returncode for reader in readers] == [0] * 4
    with Store(root) as store:
        expected = store.sql(KERNELS).to_pylist()
    assert len(expected) == 4
    assert answers == [expected] * 4
    # One directory per module's key, whoever renamed it first; nothing left aside.
    assert kept(root) == [
        ["device_ops.parquet", "manifest.json", "op_launches.parquet"],
        ["kernels.parquet", "manifest.json", "step_islands.parquet", "step_periods.parquet"],
    ]


def test_a_remote_store_keeps_nothing(tmp_path: Path) -> None:
    base = tmp_path / "tree"
    base.mkdir()
    subtree = pafs.SubTreeFileSystem(str(base), pafs.LocalFileSystem())
    trace = nccl_trace(tmp_path / "r0.json", rank=0, kernels=[(GEMM, 100, 50, {})])
    with open_store("stores/a", filesystem=subtree) as remote:
        ingest_trace(remote, trace, rank=0)
        assert len(remote.sql(KERNELS)) == 1
    assert not (base / "stores" / "a" / DERIVED_DIR).exists()
    shutil.rmtree(base)
