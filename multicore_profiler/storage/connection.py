"""The DuckDB connections of the storage room: they reach the store's files and nothing else.

Left to its defaults, DuckDB installs and loads an extension the moment a query names
a function or a path that needs one (``sqlite_scan``, ``https://``, ``s3://``): it fetches
it over HTTP and writes it under ``~/.duckdb/extensions``. And it spills what does not fit
in memory to ``.tmp`` in the working directory. A connection made here does neither:

- no extension is installed or loaded at query time. What a store needs, ``parquet``,
  ``json`` and ``icu`` (its ``UTC`` time zone), is built into the ``duckdb`` package the
  project depends on (``REQUIRED_EXTENSIONS``). A remote store's files reach DuckDB as
  pyarrow datasets, read through the store's own filesystem, so S3 needs no ``httpfs``.
  A query naming anything else fails, naming the function or file and the extension
  (``extension_refusal``);
- it spills under a directory of its own in the system's temporary directory, removed
  when the connection's context ends (``arrow_cursor``'s database: when the process ends),
  or by a later process where this one was killed first (``scratch``).

A store has a database of its own (``connection``): its views are its own. Statements
over Arrow tables that a caller registers (a command's summary tables and their
printing, a check's counts) take a cursor of one database the process keeps
(``arrow_cursor``): making a database costs 10-25 ms, a cursor 0.1 ms.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from multicore_profiler.errors import QueryError
from multicore_profiler.scratch import ScratchDirectory

REQUIRED_EXTENSIONS = ("parquet", "json", "icu")
"""The DuckDB extensions a store uses, all built into the ``duckdb`` package."""

_SETTINGS = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
_MISSING = (
    re.compile(
        r'Function with name "?(?P<what>[^"\s]+)"? is not in the catalog, but it exists in the '
        r"(?P<extension>\w+) extension"
    ),
    re.compile(r"File (?P<what>\S+) requires the extension (?P<extension>\w+) to be loaded"),
)

_SCRATCH_PREFIX = "mcprof-duckdb-"
"""The name of a database's spill directory, under the system's temporary directory."""


@contextmanager
def connection() -> Iterator[duckdb.DuckDBPyConnection]:
    """An in-memory DuckDB connection that installs and loads no extension and spills to
    a temporary directory of its own; both go when the block ends."""
    with ScratchDirectory(_SCRATCH_PREFIX) as scratch, _database(scratch) as con:
        yield con


def _database(scratch: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory database that installs and loads no extension and spills under
    ``scratch``."""
    return duckdb.connect(config={**_SETTINGS, "temp_directory": str(scratch / "spill")})


_ARROW_DATABASE: dict[int, tuple[duckdb.DuckDBPyConnection, ScratchDirectory]] = {}
"""``arrow_cursor``'s database and its scratch directory, by the process that made them:
a forked child inherits its parent's, whose threads did not survive the fork, and
leaves them alone."""
_ARROW_LOCK = threading.Lock()


@contextmanager
def arrow_cursor() -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor of the process's own database (made as ``connection`` makes one, once,
    and closed at exit), for statements over Arrow tables registered on it: what the
    cursor registers or creates as temporary goes when the block ends. Cursors of other
    threads are other connections to that database."""
    pid = os.getpid()
    with _ARROW_LOCK:
        if pid not in _ARROW_DATABASE:  # a forked child makes its own
            scratch = ScratchDirectory(_SCRATCH_PREFIX)
            _ARROW_DATABASE[pid] = (_database(scratch.path), scratch)
            atexit.register(_close_arrow_database, pid)
        cursor = _ARROW_DATABASE[pid][0].cursor()
    try:
        yield cursor
    finally:
        cursor.close()


def _close_arrow_database(pid: int) -> None:
    """Close ``arrow_cursor``'s database and remove its directory, in the process that
    made them only (a forked child inherits the parent's exit handlers)."""
    if os.getpid() == pid and pid in _ARROW_DATABASE:
        database, scratch = _ARROW_DATABASE.pop(pid)
        database.close()
        scratch.remove()


def extension_refusal(exc: duckdb.Error) -> str | None:
    """What a query that failed for want of an extension asked for, in one line (the
    function or file, and the extension), or None for any other failure."""
    for pattern in _MISSING:
        found = pattern.search(str(exc))
        if found:
            return (
                f"{found['what']} needs DuckDB's {found['extension']} extension, which the "
                "store neither installs nor loads: a query reads the store's views, whose "
                f"extensions ({', '.join(REQUIRED_EXTENSIONS)}) come built into duckdb"
            )
    return None


def query_error(exc: duckdb.Error) -> QueryError:
    """DuckDB's failure of a store query as the ``QueryError`` it raises: DuckDB's reason,
    or what a missing extension asked for."""
    return QueryError(f"query failed: {extension_refusal(exc) or exc}")
