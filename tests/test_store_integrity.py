"""The store's integrity: page checksums, ``check_store``, markers, read-only stores and
the leftovers of killed writers."""

from __future__ import annotations

import hashlib
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hostile import read_only, refused, snapshot

from multicore_profiler.errors import IntegrityError, QueryError, StoreError
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage import store as store_module
from multicore_profiler.storage.check import CheckReport, Problem, check_store
from multicore_profiler.storage.claims import _write_claim, list_claims
from multicore_profiler.storage.partitions import write_partition
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.schema import RECORDS
from multicore_profiler.storage.store import Store, open_store

KERNEL = SimulatedMoeKernel(
    experts=2, tiles=2, aic_workers=4, aiv_workers=4, aic_slots=4, aiv_slots=8
)
DAYS_AGO = (datetime.now(timezone.utc) - timedelta(days=2)).timestamp()


def fill(store: Store, steps: int = 2, run_id: str = "r") -> None:
    """A run of ``steps`` steps of two launches each."""
    store.write_run(RunInfo.begin(run_id=run_id).finish())
    for step in range(steps):
        batch = KERNEL.launches(np.random.default_rng(step), 2, start_cycle=10**6, period=10**6)
        ingest_buffers(
            store,
            batch,
            KERNEL.layout,
            frequency_hz=KERNEL.frequency_hz,
            run_id=run_id,
            launches=Launches(step=step),
        )


def records_file(root: Path, step: int = 1, run_id: str = "r") -> Path:
    [path] = (root / "records" / f"run_id={run_id}" / f"step={step}").glob("*.parquet")
    return path


def flip_bit(path: Path) -> None:
    """Flip one bit of the last byte of the first column's data page (``rank``)."""
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    start = min(o for o in (column.dictionary_page_offset, column.data_page_offset) if o)
    data = bytearray(path.read_bytes())
    data[start + column.total_compressed_size - 1] ^= 0x01
    path.write_bytes(bytes(data))


def relative(store: Store, path: Path) -> str:
    return str(path.relative_to(store.root))


@pytest.mark.parametrize("reader", ["native", "dataset", "s3"])
def test_a_flipped_bit_fails_the_query_and_the_check_naming_the_file(
    tmp_path: Path, reader: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    where = request.getfixturevalue("s3_uri") if reader == "s3" else str(tmp_path / "store")
    with open_store(where) as store:
        fill(store)
        [path] = [info.path for info in store.location.files("records/run_id=r/step=1")]
        name = path.removeprefix(store.location.path + "/")
        filesystem = store.location.filesystem
    scratch = tmp_path / "file.parquet"
    pafs.copy_files(path, str(scratch), source_filesystem=filesystem)
    flip_bit(scratch)
    pafs.copy_files(str(scratch), path, destination_filesystem=filesystem)
    if reader == "dataset":  # every table "big": a query filtered by run reads a dataset
        monkeypatch.setattr(store_module, "NATIVE_MAX_FILES", 0)
    query = "SELECT rank, count(*) FROM records_ns WHERE run_id = 'r' GROUP BY ALL"
    with open_store(where) as store:
        with pytest.raises(QueryError) as raised:
            store.sql(query)
        assert isinstance(raised.value, IntegrityError)
        assert str(raised.value).startswith(f"store file {name} is corrupt: ")
        assert "CRC checksum verification failed" in str(raised.value)
        report = check_store(store)
    assert [(p.path, p.check) for p in report.problems] == [(name, "checksum")]
    assert "CRC checksum verification failed" in report.problems[0].reason


def test_the_cli_names_a_corrupt_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store)
        corrupt = relative(store, records_file(root))
    flip_bit(root / corrupt)
    message = refused(
        capsys, "query", "--store", str(root), "SELECT count(*) FROM records", store=root
    )
    assert message.startswith(f"store file {corrupt} is corrupt: ")


def test_a_clean_store_checks_clean(store: Store) -> None:
    fill(store)
    report = check_store(store)
    # marker, lock, the runs row, 2 x (invocations, cores, records)
    assert (report.ok, report.files_checked, report.problems) == (True, 9, [])
    assert report.summary() == f"checked 9 file(s) of the store at {store.uri}: no problem found"
    assert check_store(store, ["r"]).summary() == (
        f"checked 7 file(s) of 1 run(s) of the store at {store.uri}: no problem found"
    )
    with pytest.raises(StoreError, match="no run 'nope' in the store"):
        check_store(store, ["nope"])


def test_the_check_reports_every_kind_of_problem_by_file(store: Store) -> None:
    fill(store)
    fill(store, steps=1, run_id="other")
    root = store.root
    # An invocation whose record count its records contradict (a step written by hand).
    invocations = store.sql(
        "SELECT * EXCLUDE (run_id, write_id) FROM raw_invocations WHERE step = 1"
    )
    cores = store.sql("SELECT * EXCLUDE (run_id, step) FROM raw_cores WHERE step = 1")
    records = store.sql(
        "SELECT * EXCLUDE (run_id, step) FROM raw_records WHERE step = 1 "
        "ORDER BY invocation_id, core_type, block_id, record_index"
    )
    invocations = invocations.set_column(
        invocations.schema.get_field_index("invocation_id"), "invocation_id", pa.array([7, 8])
    )
    for name in ("cores", "records"):
        table = cores if name == "cores" else records
        ids = pa.array(np.where(table["invocation_id"].to_numpy() == 2, 7, 8))
        table = table.set_column(
            table.schema.get_field_index("invocation_id"), "invocation_id", ids
        )
        table = table.drop_columns(["write_id"])
        if name == "cores":
            cores = table
        else:
            records = table.slice(1)  # one record of invocation 7 lost
    store.write_step("r", 1, invocations=invocations, cores=cores, records=records)
    # A dead writer's records (never committed), a killed writer's file written aside, a
    # claim its writer never withdrew: all two days old. And files outside the layout.
    stray = store.sql("SELECT * EXCLUDE (run_id, step) FROM raw_records WHERE step = 0 LIMIT 3")
    stray = stray.set_column(
        stray.schema.get_field_index("write_id"), "write_id", pa.array([5] * 3)
    )
    orphan = Path(write_partition(store.location, RECORDS, {"run_id": "r", "step": 0}, stray))
    aside = root / "records/run_id=r/step=0/part-dead.parquet.tmp"
    aside.write_bytes(b"half")
    young = root / "records/run_id=r/step=0/part-young.parquet.tmp"
    young.write_bytes(b"half")
    _write_claim(store.location, "r", 0, 100, 101)
    claim = Path(list_claims(store.location, "r", 0)[0].path)
    for path in (orphan, aside, claim):
        os.utime(path, (DAYS_AGO, DAYS_AGO))
    # A file that is not Parquet, and one whose schema is not its table's.
    broken = records_file(root, 0, "other")
    broken.write_bytes(b"not parquet")
    forged = root / "cores/run_id=r/step=0/part-forged.parquet"
    pq.write_table(pa.table({"rank": ["zero"], "slot": pa.array([1], pa.uint32())}), forged)
    (root / "records/run_id=r/notes.txt").write_text("x")
    (root / "elsewhere").mkdir()
    (root / "elsewhere/part-1.parquet").write_bytes(b"x")

    report = check_store(store)
    found = [(p.path, p.check) for p in report.problems]
    [counted] = [p for p in report.problems if p.check == "counts"]
    assert found == sorted(
        [
            (str(claim.relative_to(root)), "leftover"),
            (relative(store, forged), "schema"),
            ("elsewhere/part-1.parquet", "layout"),
            (counted.path, "counts"),
            (relative(store, broken), "parquet"),
            (relative(store, orphan), "orphan"),
            ("records/run_id=r/notes.txt", "layout"),
            ("records/run_id=r/step=0/part-dead.parquet.tmp", "leftover"),
        ]
    )
    reasons = {p.check: p.reason for p in report.problems if p.check != "layout"}
    assert reasons["counts"].startswith("invocation 7 of rank 0 (step 1) counts ")
    assert "records, but the store holds" in reasons["counts"]
    assert "column 'rank' is string, not int32" in reasons["schema"]
    assert "lacks the column(s) 'invocation_id', 'write_id'" in reasons["schema"]
    assert "never committed" in reasons["orphan"]
    leftovers = {p.path: p.reason for p in report.problems if p.check == "leftover"}
    assert leftovers == {
        str(claim.relative_to(root)): "a claim of invocation ids 100..101 of rank 0 that its "
        "writer never withdrew (2.0 days old): 'mcprof compact' deletes it",
        "records/run_id=r/step=0/part-dead.parquet.tmp": "a file a writer left half-written "
        "(2.0 days old): 'mcprof compact' deletes it",
    }
    assert report.in_progress == 1  # the young .tmp file: a write under way, maybe
    assert report.summary() == (
        f"checked {report.files_checked} file(s) of the store at {store.uri}: "
        f"8 problem(s) in 8 file(s); 1 file(s) of writes under way"
    )
    first = report.problems[0]
    assert str(first) == f"{first.path}: {first.check}: {first.reason}"
    # Scoped to the other run: its own broken file only.
    scoped = check_store(store, ["other"])
    assert [(p.path, p.check) for p in scoped.problems] == [(relative(store, broken), "parquet")]


def test_a_check_report_is_a_plain_value() -> None:
    report = CheckReport("/s", None, 3, [Problem("a", "schema", "why")])
    assert (report.ok, report.summary()) == (
        False,
        "checked 3 file(s) of the store at /s: 1 problem(s) in 1 file(s)",
    )


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"{not json", "is not JSON (Expecting property name"),
        (b"\xff\xfe", "is not JSON"),
        (b"[1]", "holds an array, not a JSON object"),
        (b'{"format": "1"}', 'gives the format as a string ("1"), not a number'),
        (b'{"format": true}', "gives the format as a boolean (true), not a number"),
        (b"{}", 'names no format (no "format" key)'),
        (b'{"format": 2}', "is a store of format 2; this version reads 1"),
    ],
)
def test_a_bad_marker_is_one_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, words: str
) -> None:
    root = tmp_path / "store"
    open_store(root).close()
    (root / "mcprof-store.json").write_bytes(content)
    with pytest.raises(StoreError, match=r"mcprof-store\.json|format 2") as raised:
        open_store(root)
    assert words in str(raised.value)
    assert refused(capsys, "runs", "--store", str(root), store=root) == str(raised.value)


@pytest.fixture
def shared_store(tmp_path: Path) -> Path:
    """A filled store, with a launch's buffer beside it, for a test to make read-only."""
    root = tmp_path / "store"
    with open_store(root) as store:
        fill(store)
    KERNEL.launches(np.random.default_rng(0), 1, start_cycle=10**6, period=10**6)[0].tofile(
        tmp_path / "launch.bin"
    )
    return root


def ingest_argv(root: Path) -> list[str]:
    """``mcprof ingest-buffer`` of the shared store's launch into run ``r`` of ``root``."""
    layout = KERNEL.layout
    return [
        "ingest-buffer", str(root.parent / "launch.bin"), "--store", str(root), "--run", "r",
        "--freq-mhz", "50", "--aic-slots", str(layout.aic_slots),
        "--aiv-slots", str(layout.aiv_slots), "--aic-capacity", str(layout.aic_capacity),
        "--aiv-capacity", str(layout.aiv_capacity),
    ]  # fmt: skip


def test_every_write_to_a_read_only_store_is_one_error(
    shared_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = shared_store
    dump = root.parent / "launch.bin"
    layout = KERNEL.layout
    with read_only(root):
        for argv in (
            ingest_argv(root),
            ["compact", "--store", str(root)],
            ["gc", "--keep-last", "0", "--apply", "--store", str(root)],
        ):
            message = refused(capsys, *argv, store=root)
            assert message.startswith("cannot "), message
            assert "Permission denied" in message or "Read-only" in message, message
        with open_store(root) as store:
            assert store.sql("SELECT count(*) AS n FROM invocations").to_pylist() == [{"n": 4}]
            with pytest.raises(StoreError, match=r"cannot claim invocation ids 4\.\.4 of run r"):
                ingest_buffers(
                    store,
                    [np.fromfile(dump, np.uint8)],
                    layout,
                    frequency_hz=KERNEL.frequency_hz,
                    run_id="r",
                )
    assert not list(root.rglob("*.tmp"))


def test_a_new_store_in_a_read_only_directory_is_one_error(
    shared_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = shared_store.parent / "new"
    with read_only(shared_store.parent):
        message = refused(capsys, *ingest_argv(new))
    assert message == f"cannot open the store at {new}: {new}: Permission denied"
    assert not new.exists()


def test_the_vacuum_deletes_a_killed_writers_day_old_tmp_files(store: Store) -> None:
    fill(store)
    root = store.root
    old = root / "records/run_id=r/step=0/part-killed.parquet.tmp"
    old.write_bytes(b"half a file")
    os.utime(old, (DAYS_AGO, DAYS_AGO))
    young = root / "cores/run_id=r/step=1/part-writing.parquet.tmp"
    young.write_bytes(b"being written")
    events = root / "trace_events/source_id=abc/part-killed.parquet.tmp"
    events.parent.mkdir(parents=True)
    events.write_bytes(b"half")
    os.utime(events, (DAYS_AGO, DAYS_AGO))
    before = store.sql("SELECT count(*) AS n FROM records").to_pylist()
    assert store.compact(["r"]).files_deleted == 1  # a run's compaction: its own files
    assert (not old.exists(), young.exists(), events.exists()) == (True, True, True)
    assert store.compact().files_deleted == 1  # the whole store: the traces' too
    assert (young.exists(), events.exists()) == (True, False)
    assert store.sql("SELECT count(*) AS n FROM records").to_pylist() == before
    later = datetime.now(timezone.utc) + timedelta(days=2)
    assert store.compact(now=later).files_deleted == 1
    assert not young.exists()


def test_files_carry_page_checksums(store: Store) -> None:
    fill(store, steps=1)
    path = records_file(store.root, 0)
    before = snapshot(store.root)
    flip_bit(path)
    # pyarrow without verification reads the flipped bit as data; with it, refuses.
    assert pq.read_table(path).num_rows > 0
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        pq.read_table(path, page_checksum_verification=True)
    assert snapshot(store.root) != before


def test_a_forged_file_fails_the_query_naming_it_not_a_binder_dump(store: Store) -> None:
    fill(store)
    forged = store.root / "records/run_id=r/step=0/part-forged.parquet"
    pq.write_table(pa.table({"x": [1]}), forged)  # what a stray COPY ... TO could leave
    with pytest.raises(QueryError) as raised:
        store.sql("SELECT count(*) FROM records")
    assert str(raised.value) == (
        "store file records/run_id=r/step=0/part-forged.parquet does not fit the records "
        "table: column 'x' is not a column of records; it lacks the column(s) 'rank', "
        "'invocation_id', 'write_id'"
    )


def test_a_cursor_of_reading_names_a_corrupt_file_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(tmp_path / "store") as store:
        fill(store)
        corrupt = records_file(store.root)
    flip_bit(corrupt)
    monkeypatch.setattr(store_module, "NATIVE_MAX_FILES", 0)  # datasets, read in the cursor
    name = corrupt.relative_to(tmp_path / "store")
    with (
        open_store(tmp_path / "store") as store,
        pytest.raises(IntegrityError, match=f"store file {name} is corrupt"),
        store.reading() as cursor,
    ):
        cursor.sql("SELECT count(*) FROM records WHERE run_id = 'r'").fetchall()


def test_a_compaction_refuses_a_corrupt_file_naming_it(store: Store) -> None:
    fill(store)
    corrupt = records_file(store.root)
    flip_bit(corrupt)
    before = snapshot(store.root)
    with pytest.raises(IntegrityError, match=f"store file {relative(store, corrupt)} is corrupt"):
        store.compact()
    after = snapshot(store.root)
    assert after.pop(".mcprof.compact.lock") == hashlib.sha256(b"").hexdigest()  # the lock
    assert after == before
