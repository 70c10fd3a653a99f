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
  when the connection's context ends.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from multicore_profiler.errors import QueryError

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


@contextmanager
def connection() -> Iterator[duckdb.DuckDBPyConnection]:
    """An in-memory DuckDB connection that installs and loads no extension and spills to
    a temporary directory of its own; both go when the block ends."""
    with (
        tempfile.TemporaryDirectory(prefix="mcprof-duckdb-") as scratch,
        duckdb.connect(config={**_SETTINGS, "temp_directory": str(Path(scratch) / "spill")}) as con,
    ):
        yield con


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
