"""The tables SQL modules materialize, kept at a local store's root from one process to the next.

The outer-kernel and cross-rank modules build tables from the committed traces
(``device_ops``, ``kernels``, ``rank_steps``, ...). Every process built them again for its
first query that named them: on the A100 fixture a fifth of a second, on a trace ten
times its size about a second, in every ``mcprof kernels``, ``ranks`` or ``query``. The
first process to build a module's tables now saves them, one Parquet file each, under
``.mcprof.derived/<key>/``; a later process with the same key loads them instead.

The key is a digest of all the tables are made from: the module's SQL and that of each
module it needs, their settings (the outer-kernel rules), the answer of its freshness
query (which traces are committed, by write), the store's own views and DuckDB's version.
A new trace, other rules or another version of the package has another key, and builds
and saves its own tables: saved tables are never changed, only added and pruned (the
``KEPT_KEYS`` keys last saved or loaded stay).

A key's directory is written aside and renamed into place whole, with a manifest of its
files' sizes, SHA-256 digests and columns' types (each read back as its type: a HUGEINT
is written as a 38-digit decimal, which Parquet holds exactly). A process loads a key only
if every file is there with its digest; otherwise (a file removed or damaged, or a table
whose types would not come back) it builds the tables, as before. Saving is best effort:
a store this process cannot write to is read as before, with nothing saved. Deleting the
directory is always safe. Remote stores keep nothing: their tables are built in each
process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import metadata
from pathlib import Path

import duckdb

from multicore_profiler.storage.file_digest import file_sha256
from multicore_profiler.storage.sql_text import sql_identifier, sql_string

DERIVED_DIR = ".mcprof.derived"
"""The directory, at a local store's root, of the kept tables."""
KEPT_KEYS = 16
"""Keys whose tables are kept, the most recently saved or loaded (about three states of
the five modules); the others are removed."""
ASIDE_GRACE_SECONDS = 3600
"""Age after which a directory still being written aside is taken for a crashed writer's."""
_MANIFEST = "manifest.json"


class DerivedTables:
    """The kept tables of one local store. ``salt`` is what every key also depends on
    (the store's views and table schemas)."""

    def __init__(self, root: Path, salt: str) -> None:
        self._directory = root / DERIVED_DIR
        self._salt = salt

    def key(self, parts: Iterable[str]) -> str:
        """The key of tables made from ``parts`` (texts, in a fixed order), by this
        version of the package and of DuckDB."""
        digest = hashlib.sha256(f"{_versions()}\n{self._salt}".encode())
        for part in parts:
            encoded = part.encode()
            digest.update(len(encoded).to_bytes(8, "little"))
            digest.update(encoded)
        return digest.hexdigest()[:32]

    def loads(self, key: str, tables: Sequence[str]) -> list[str] | None:
        """The statements that make ``tables`` from the files kept under ``key``, or
        ``None`` unless every one is there whole (its size and digest as saved): what is
        kept there damaged is removed, to be kept again."""
        folder = self._directory / key
        if not folder.is_dir():
            return None
        try:
            manifest = json.loads((folder / _MANIFEST).read_bytes())
            statements = []
            for table in tables:
                path = folder / f"{table}.parquet"
                saved = manifest[table]
                if (saved["bytes"], saved["sha256"]) != file_sha256(path):
                    raise ValueError(f"{path} is not as it was kept")
                columns = [(str(name), str(kind)) for name, kind in saved["columns"]]
                statements.append(
                    f"CREATE OR REPLACE TABLE {sql_identifier(table)} AS {_read(path, columns)}"
                )
        except (OSError, ValueError, KeyError, TypeError):
            self.forget(key)
            return None
        with contextlib.suppress(OSError):  # in use: among the last pruned
            os.utime(folder)
        return statements

    def forget(self, key: str) -> None:
        """Remove what is kept under ``key`` (it could not be loaded)."""
        shutil.rmtree(self._directory / key, ignore_errors=True)

    def save(self, con: duckdb.DuckDBPyConnection, key: str, tables: Sequence[str]) -> None:
        """Keep ``tables`` of ``con`` under ``key``, unless they are kept already, a type
        would not come back from Parquet as it is, or the store cannot be written."""
        final = self._directory / key
        if final.exists():
            return
        aside = self._directory / f".{key}.{uuid.uuid4().hex}.tmp"
        try:
            aside.mkdir(parents=True)
            manifest = {}
            for table in tables:
                path = aside / f"{table}.parquet"
                columns = _columns(con, f"SELECT * FROM {sql_identifier(table)}")
                written = ", ".join(_written(name, kind) for name, kind in columns)
                con.execute(
                    f"COPY (SELECT {written} FROM {sql_identifier(table)}) "
                    f"TO {sql_string(str(path))} (FORMAT parquet)"
                )
                if _columns(con, _read(path, columns)) != columns:
                    return
                size, digest = file_sha256(path)
                manifest[table] = {"bytes": size, "sha256": digest, "columns": columns}
            (aside / _MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
            os.rename(aside, final)  # fails if another process kept the same key first
        except (OSError, duckdb.Error):
            return
        finally:
            shutil.rmtree(aside, ignore_errors=True)
        self._prune()

    def _prune(self) -> None:
        """Remove all but the ``KEPT_KEYS`` keys last saved or loaded, and what crashed
        writers left aside."""
        try:
            entries = [(e.stat().st_mtime, e) for e in os.scandir(self._directory) if e.is_dir()]
        except OSError:
            return
        now = time.time()
        keys = sorted(
            ((mtime, e) for mtime, e in entries if not e.name.startswith(".")),
            key=lambda item: item[0],
            reverse=True,
        )
        stale = [e for _, e in keys[KEPT_KEYS:]]
        stale += [
            e
            for mtime, e in entries
            if e.name.startswith(".") and now - mtime > ASIDE_GRACE_SECONDS
        ]
        for entry in stale:
            shutil.rmtree(entry.path, ignore_errors=True)


@cache
def _versions() -> str:
    """The versions of the package and of DuckDB, which the tables' making depends on."""
    try:
        version = metadata.version("multicore_profiler")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        version = "unknown"
    return f"{version} {duckdb.__version__}"


def _columns(con: duckdb.DuckDBPyConnection, query: str) -> list[tuple[str, str]]:
    """The names and types of ``query``'s columns."""
    return [(str(row[0]), str(row[1])) for row in con.execute(f"DESCRIBE {query}").fetchall()]


def _written(name: str, kind: str) -> str:
    """A column as it is written to Parquet: a HUGEINT as a decimal of 38 digits (DuckDB
    would write a double, inexact past 2^53)."""
    column = sql_identifier(name)
    return f"{column}::DECIMAL(38, 0) AS {column}" if kind == "HUGEINT" else column


def _read(path: Path, columns: Sequence[tuple[str, str]]) -> str:
    """The query that reads a kept table's file back with its columns' own types."""
    cast = ", ".join(
        f"CAST({sql_identifier(name)} AS {kind}) AS {sql_identifier(name)}"
        for name, kind in columns
    )
    return f"SELECT {cast} FROM read_parquet({sql_string(str(path))})"
