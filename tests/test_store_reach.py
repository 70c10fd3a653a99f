"""What a store's SQL reaches: no extension fetched or loaded at query time, nothing
written to the home or the working directory, even by a query that spills."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hostile import refused
from simulated_runs import write_run

from multicore_profiler.errors import QueryError
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage import connection as connection_module
from multicore_profiler.storage.connection import REQUIRED_EXTENSIONS, arrow_cursor
from multicore_profiler.storage.store import Store, open_store

WHY = (
    "which the store neither installs nor loads: a query reads the store's views, whose "
    "extensions (parquet, json, icu) come built into duckdb"
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty home directory, where DuckDB would install extensions, and an empty
    working directory, where it would spill."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return home


@pytest.mark.parametrize(
    ("sql", "needs"),
    [
        ("SELECT * FROM sqlite_scan('x.db', 't')", "sqlite_scan needs DuckDB's sqlite_scanner"),
        (
            "SELECT * FROM read_csv('https://example.invalid/x.csv')",
            "https://example.invalid/x.csv needs DuckDB's httpfs",
        ),
        ("SELECT * FROM 's3://bucket/x.parquet'", "s3://bucket/x.parquet needs DuckDB's httpfs"),
    ],
)
def test_a_query_needing_an_extension_fails_naming_it_and_installs_nothing(
    home: Path, store: Store, sql: str, needs: str
) -> None:
    with pytest.raises(QueryError) as caught:
        store.sql(sql)
    assert str(caught.value) == f"query failed: {needs} extension, {WHY}"
    assert sorted(os.listdir(home)) == []
    assert sorted(os.listdir(Path.cwd())) == []


def test_the_cli_refuses_an_extension_in_a_query_and_a_where(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        write_run(store, SimulatedMoeKernel(), seed=1, commit="base0001")
    message = refused(
        capsys, "query", "--store", str(root), "SELECT * FROM sqlite_scan('x.db', 't')", store=root
    )
    assert message == f"query failed: sqlite_scan needs DuckDB's sqlite_scanner extension, {WHY}"
    out = tmp_path / "t.json"
    message = refused(
        capsys,
        "export",
        "--store",
        str(root),
        "-o",
        str(out),
        "--where",
        "task_id IN (SELECT 1 FROM 's3://bucket/x.parquet')",
        store=root,
    )
    assert "s3://bucket/x.parquet requires the extension httpfs to be loaded" in message, message
    assert not out.exists()
    assert sorted(os.listdir(home)) == []
    assert sorted(os.listdir(Path.cwd())) == []


def test_the_extensions_a_store_uses_are_built_into_duckdb(store: Store) -> None:
    found = store.sql(
        "SELECT extension_name, loaded, install_mode FROM duckdb_extensions() "
        "WHERE list_contains($names, extension_name) ORDER BY extension_name",
        {"names": list(REQUIRED_EXTENSIONS)},
    ).to_pylist()
    assert found == [
        {"extension_name": name, "loaded": True, "install_mode": "STATICALLY_LINKED"}
        for name in sorted(REQUIRED_EXTENSIONS)
    ]


def test_a_query_that_spills_writes_nothing_to_the_working_directory(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    store = open_store(tmp_path / "store")
    # A sort of 4 M rows of 16 bytes does not fit in 32 MB: it spills.
    sorted_rows = "SELECT i, hash(i) AS h FROM range(4000000) t(i) ORDER BY h"
    with store.reading() as cursor:
        cursor.execute("SET memory_limit = '32MB'; SET threads = 1")
        cursor.execute(f"CREATE TEMP TABLE spilled AS {sorted_rows}")
        assert sorted(os.listdir(Path.cwd())) == []
        spilled = cursor.sql("SELECT path FROM duckdb_temporary_files()").fetchall()
        assert len(spilled) > 0
        assert [Path(path).parent.parent.parent for (path,) in spilled] == [scratch] * len(spilled)
    store.close()
    assert sorted(os.listdir(Path.cwd())) == []
    assert sorted(os.listdir(scratch)) == []
    assert sorted(os.listdir(home)) == []
    with pytest.raises(duckdb.ConnectionException):
        store._db.sql("SELECT 1")


def spill_directory(cursor: duckdb.DuckDBPyConnection) -> str:
    return cursor.execute("SELECT current_setting('temp_directory')").fetchone()[0]


def test_arrow_cursors_share_one_database_and_leave_nothing_behind(home: Path) -> None:
    """Statements over Arrow tables take cursors of one database per process: made
    once (as a store's connection is: no extension at query time, a spill directory of
    its own), each cursor's registrations gone with it."""
    with arrow_cursor() as first:
        first.register("rows", pa.table({"x": [1, 2, 3]}))
        assert first.execute("SELECT sum(x) FROM rows").fetchone() == (6,)
        spill = spill_directory(first)
        with pytest.raises(duckdb.Error, match="sqlite_scanner"):
            first.execute("SELECT * FROM sqlite_scan('x.db', 't')")
    with arrow_cursor() as second:
        assert spill_directory(second) == spill
        with pytest.raises(duckdb.CatalogException, match="rows"):
            second.execute("SELECT * FROM rows")
    assert Path(spill).parent.name.startswith("mcprof-duckdb-")
    assert sorted(os.listdir(home)) == []
    assert sorted(os.listdir(Path.cwd())) == []


def test_a_forked_child_makes_its_own_arrow_database() -> None:
    """DuckDB's threads do not survive a fork: a child uses a database of its own, and
    its exit leaves the parent's spill directory in place."""
    with arrow_cursor() as cursor:
        parent = spill_directory(cursor)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's report is what the test checks
        try:
            with arrow_cursor() as cursor:
                (total,) = cursor.execute("SELECT 41 + 1").fetchone()
                answer = f"{spill_directory(cursor)} {total}"
            connection_module._close_arrow_database(os.getppid())  # the parent's handler
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as report:
        spill, answer = report.read().split()
    os.waitpid(child, 0)
    assert answer == "42"
    assert spill != parent
    assert Path(parent).parent.is_dir()  # the parent's handler did nothing in the child
    with arrow_cursor() as cursor:
        assert spill_directory(cursor) == parent
    shutil.rmtree(Path(spill).parent)  # the child ended without its exit handlers
