"""The store's record of verified files: a new ``Store`` (every ``mcprof`` command) reads
again only the files that are new or changed since a check, and a corrupt file still
fails the query naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hostile import read_only, snapshot
from test_store_integrity import KERNEL, fill, flip_bit, records_file

from multicore_profiler.errors import IntegrityError
from multicore_profiler.storage import store as store_module
from multicore_profiler.storage import verified as verified_module
from multicore_profiler.storage.check import check_store
from multicore_profiler.storage.store import Store, open_store
from multicore_profiler.storage.verified import RECORD, RECORD_FILES

QUERY = "SELECT run_id, rank, count(*) AS n FROM records_ns GROUP BY ALL ORDER BY ALL"
DATA_FILES = 7
"""A run of ``fill``: its runs row, two steps of (invocations, cores, records)."""


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every file the store reads to check it, by path relative to the store (a counting
    wrapper of ``read_verified``, which still reads). Files count as recorded as soon as
    they are checked (no wait for the file system's clock: see ``verified.RACY_NS``)."""
    counted: Counter[str] = Counter()
    real = store_module.read_verified

    def counting(location, path, *, keep=True):
        counted[str(path).removeprefix(location.path + "/")] += 1
        return real(location, path, keep=keep)

    monkeypatch.setattr(store_module, "read_verified", counting)
    monkeypatch.setattr(verified_module, "RACY_NS", -1)
    return counted


def data_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))


def once(root: Path) -> Counter[str]:
    """Each data file of the store, read once."""
    return Counter(data_files(root))


def recorded(root: Path) -> list[str]:
    return sorted(pq.read_table(root / RECORD)["path"].to_pylist())


def query(root: Path) -> list[dict[str, object]]:
    with open_store(root) as store:
        return store.sql(QUERY).to_pylist()


def test_a_new_store_reads_no_unchanged_file_again(tmp_path: Path, reads: Counter[str]) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store)
    reads.clear()
    first = query(root)
    assert reads == once(root)
    assert len(reads) == DATA_FILES
    assert recorded(root) == data_files(root)
    reads.clear()
    assert query(root) == first
    assert reads == Counter()  # every file trusted from the record


def test_a_store_reads_the_files_it_wrote_without_checking_them(
    tmp_path: Path, reads: Counter[str]
) -> None:
    """Reading back what it has just written (``trace-buffer``'s temporary store, a trace
    ingested before its first query) cost the store a whole decode of each file. It now
    trusts its own files as it trusts those it checked, and tells the record nothing of
    them: a new ``Store`` checks each once."""
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store)
        # The second step's commit read the first's invocation ids: that file was read.
        [read] = reads
        assert read.startswith("invocations/")
        assert reads[read] == 1
        reads.clear()
        first = store.sql(QUERY).to_pylist()
        assert reads == Counter()
        assert first == [{"run_id": "r", "rank": 0, "n": 4 * KERNEL.records_per_launch}]
    assert recorded(root) == [read]
    assert query(root) == first
    assert reads == once(root) - Counter([read])
    assert recorded(root) == data_files(root)


def test_a_changed_file_is_read_again(tmp_path: Path, reads: Counter[str]) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store)
    expected = query(root)
    path = records_file(root)
    name = str(path.relative_to(root))
    # Rewritten with the same bytes (so the same size), and a new modification time.
    data = path.read_bytes()
    path.write_bytes(data)
    found = path.stat()
    os.utime(path, ns=(found.st_atime_ns, found.st_mtime_ns + 1_000_000_000))
    reads.clear()
    assert query(root) == expected
    assert reads == Counter({name: 1})
    # Replaced by a copy of itself: another file at the same path.
    copy = tmp_path / "copy.parquet"
    copy.write_bytes(data)
    os.replace(copy, path)
    reads.clear()
    assert query(root) == expected
    assert reads == Counter({name: 1})
    reads.clear()
    assert query(root) == expected
    assert reads == Counter()


@pytest.mark.parametrize("how", ["flipped", "truncated", "replaced"])
def test_a_file_corrupted_after_its_check_fails_the_query_naming_it(
    tmp_path: Path, reads: Counter[str], how: str
) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store)
    query(root)
    path = records_file(root)
    name = str(path.relative_to(root))
    if how == "flipped":
        flip_bit(path)
    elif how == "truncated":
        with open(path, "r+b") as file:
            file.truncate(path.stat().st_size // 2)
    else:  # another file, of the same size, renamed onto it
        corrupt = tmp_path / "corrupt.parquet"
        corrupt.write_bytes(path.read_bytes())
        flip_bit(corrupt)
        os.replace(corrupt, path)
    reads.clear()
    with open_store(root) as store, pytest.raises(IntegrityError) as raised:
        store.sql(QUERY)
    assert str(raised.value).startswith(f"store file {name} is corrupt: ")
    assert reads == Counter({name: 1})
    with open_store(root) as store:
        report = check_store(store)
    assert [(p.path, p.check) for p in report.problems] == [
        (name, "parquet" if how == "truncated" else "checksum")
    ]
    assert name not in recorded(root)


def test_a_file_checked_right_after_it_changed_is_not_recorded(tmp_path: Path) -> None:
    # Without the test's shortcut: a file changed within RACY_NS of its check could change
    # again within the same tick of a coarse clock, so it is checked again next time.
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store)
    query(root)
    assert not (root / RECORD).exists()


def test_the_check_reads_every_file_again_and_refreshes_the_record(
    tmp_path: Path, reads: Counter[str]
) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store)
    query(root)
    (root / RECORD).unlink()
    reads.clear()
    with open_store(root) as store:
        report = check_store(store)
    assert (report.ok, report.files_checked) == (True, 2 + DATA_FILES)  # marker, lock, data
    assert reads == once(root)
    assert recorded(root) == data_files(root)
    reads.clear()
    with open_store(root) as store:
        assert check_store(store).ok
    assert reads == once(root)  # a check trusts no record
    reads.clear()
    query(root)
    assert reads == Counter()


def test_the_records_of_removed_runs_are_dropped(tmp_path: Path, reads: Counter[str]) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store, run_id="a")
        fill(store, run_id="b")
    query(root)
    assert len(recorded(root)) == 2 * DATA_FILES
    with open_store(root) as store:
        store.gc(labels=[], keep_last=1, apply=True)  # removes run a
        fill(store, run_id="c")
    reads.clear()
    query(root)
    assert sorted(reads) == [f for f in data_files(root) if "run_id=c" in f]
    assert recorded(root) == data_files(root)
    assert not any("run_id=a" in path for path in recorded(root))


def test_concurrent_commands_each_add_their_files(tmp_path: Path, reads: Counter[str]) -> None:
    root = tmp_path / "store"
    runs = [f"r{i}" for i in range(4)]
    with open_store(root) as store:
        for run_id in runs:
            fill(store, run_id=run_id)
    # The clock's shortcut lives in this process only: age the files past RACY_NS instead.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = (
        "import sys\n"
        "from multicore_profiler.storage import verified\n"
        "from multicore_profiler.cli import main\n"
        "verified.RACY_NS = -1\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    commands = [
        subprocess.Popen(
            [sys.executable, "-c", script, "query", "--store", str(root), "--run", run_id, QUERY],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        for run_id in runs
    ]
    assert [command.wait() for command in commands] == [0] * len(runs)
    assert recorded(root) == data_files(root)
    reads.clear()
    query(root)
    assert reads == Counter()


def test_a_read_only_store_keeps_no_record(tmp_path: Path, reads: Counter[str]) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store)
    before = snapshot(root)
    reads.clear()
    with read_only(root):
        assert query(root) == query(root)
    assert snapshot(root) == before
    assert sorted(reads.values()) == [2] * DATA_FILES


def test_a_remote_store_keeps_no_record(s3_uri: str, reads: Counter[str]) -> None:
    with open_store(s3_uri) as store:
        fill(store)
        store.sql(QUERY)
        names = {info.path.rsplit("/", 1)[-1] for info in store.location.files()}
    assert not names & set(RECORD_FILES)


def test_the_record_is_no_problem_for_the_check(store: Store, reads: Counter[str]) -> None:
    fill(store)
    store.sql(QUERY)
    assert (store.root / RECORD).exists()
    report = check_store(store)
    assert (report.ok, report.files_checked) == (True, 2 + DATA_FILES)


def test_a_big_stores_record_spares_a_run_query_the_listing_of_other_runs(
    tmp_path: Path, reads: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a table is too big for DuckDB's reader decides whether a query naming
    ``run_id`` is planned for the runs it pins. The record of verified files counts each
    table's files, so a new ``Store`` (a new command) in a big store lists only the runs a
    query pins, where it listed the whole store first. Without a record, or where the
    record counts no big table, it lists the whole store as before."""
    root = tmp_path / "store"
    with open_store(root) as store:
        for run in ("a1", "b2", "c3"):
            fill(store, steps=1, run_id=run)
    counts = query(root)  # every file checked, so recorded
    assert [row["run_id"] for row in counts] == ["a1", "b2", "c3"]
    listed: list[list[str] | None] = []
    files = store_module.FileCatalog.files

    def listing(catalog, runs=None, **kwargs):
        listed.append(None if runs is None else list(runs))
        return files(catalog, runs, **kwargs)

    monkeypatch.setattr(store_module.FileCatalog, "files", listing)
    pinned = "SELECT count(*) AS n FROM records_ns WHERE run_id = 'b2'"
    expected = [{"n": counts[1]["n"]}]

    def first_listings(max_files: int) -> list[list[str] | None]:
        monkeypatch.setattr(store_module, "NATIVE_MAX_FILES", max_files)
        listed.clear()
        with open_store(root) as store:
            assert store.sql(pinned).to_pylist() == expected
        return listed

    assert first_listings(0) == [["b2"]]  # every table "big": by the record, no listing
    assert first_listings(256) == [None, None]  # not big: the whole store, read natively
    (root / RECORD).unlink()
    monkeypatch.setattr(verified_module, "RACY_NS", 1 << 62)  # checks recorded no more
    reads.clear()
    assert first_listings(0) == [None, ["b2"]]  # no record: a listing says it is big
    # It checked the files it read, its run's only (scoped), and recorded none.
    assert sorted(path.split("/")[:2] for path in reads) == [
        [table, "run_id=b2"] for table in ("cores", "invocations", "records", "runs")
    ]
    assert not (root / RECORD).exists()
