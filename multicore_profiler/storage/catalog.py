"""The store's Parquet files per table, listed again at every query but cheaply.

Listing is what a query pays for the size of the store: a store of months of runs has
tens of thousands of partition directories. In a local store a directory's listing is
kept with its modification time and reused while that time holds, so a query stats
the directories instead of reading them; a directory changed within ``RACY_NS`` of
being listed is listed again (a file system with coarse times could hide a change in
the same tick). Object stores have no directory times: a remote store is listed in
one pass (a request per thousand files).

A query scoped to some runs (``Store.sql(..., runs=...)``) lists only their directories:
it costs what it would in a store of those runs alone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.partitions import PARQUET_SUFFIX, check_run_id
from multicore_profiler.storage.schema import TABLES

RACY_NS = 2_000_000_000
"""How long after its last change a directory's listing is not trusted to stay valid."""
REMOTE_SCOPED_LISTINGS = 16
"""Up to this many runs, a scoped query lists each run's prefixes rather than the store."""


@dataclass
class _Listed:
    mtime_ns: int
    listed_ns: int
    directories: list[str]
    files: list[str]


class FileCatalog:
    """The live files of each table of a store (``*.parquet``, at partition depth)."""

    def __init__(self, location: StoreLocation) -> None:
        self._location = location
        self._listed: dict[str, _Listed] = {}

    def files(self, runs: Sequence[str] | None = None) -> dict[str, tuple[str, ...]]:
        """Each table's files (sorted paths as the store's filesystem names them); a table
        without files is absent. With ``runs``, the run-partitioned tables hold only the
        files of those runs, and only their directories are listed."""
        wanted = None if runs is None else {f"run_id={check_run_id(r)}" for r in runs}
        if not self._location.is_local:
            return self._remote(wanted)
        found = {}
        for spec in TABLES.values():
            scoped = wanted if spec.partition_by[0] == "run_id" else None
            files = self._walk(self._location.join(spec.name), len(spec.partition_by), scoped)
            if files:
                found[spec.name] = tuple(sorted(files))
        return found

    def _remote(self, wanted: set[str] | None) -> dict[str, tuple[str, ...]]:
        listed: dict[str, list[str]] = {}
        base = self._location.path.rstrip("/") + "/"
        if wanted is None or len(wanted) > REMOTE_SCOPED_LISTINGS:
            infos = self._location.files()
        else:  # a listing per run and table: fewer requests than the whole store's
            infos = [
                info
                for spec in TABLES.values()
                for part in (sorted(wanted) if spec.partition_by[0] == "run_id" else [""])
                for info in self._location.files(f"{spec.name}/{part}".rstrip("/"))
            ]
        for info in infos:
            if not info.path.endswith(PARQUET_SUFFIX):
                continue
            table, first = info.path.removeprefix(base).split("/")[:2]
            spec = TABLES.get(table)
            if spec is None or (
                wanted is not None and spec.partition_by[0] == "run_id" and first not in wanted
            ):
                continue
            listed.setdefault(table, []).append(info.path)
        return {table: tuple(sorted(files)) for table, files in listed.items()}

    def _walk(self, directory: str, depth: int, wanted: set[str] | None = None) -> list[str]:
        """The files ``depth`` levels of partition directories below ``directory``; at the
        first level only the directories named in ``wanted``, when given."""
        listed = self._list(directory)
        if listed is None:
            return []
        if depth == 0:
            return listed.files
        children = listed.directories
        if wanted is not None:
            children = [d for d in children if d.rsplit("/", 1)[-1] in wanted]
        return [f for d in children for f in self._walk(d, depth - 1)]

    def _list(self, directory: str) -> _Listed | None:
        try:
            mtime = os.stat(directory).st_mtime_ns
        except FileNotFoundError:
            self._listed.pop(directory, None)
            return None
        cached = self._listed.get(directory)
        if cached and cached.mtime_ns == mtime and cached.listed_ns - mtime > RACY_NS:
            return cached
        now = time.time_ns()
        directories, files = [], []
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir() and "=" in entry.name:
                    directories.append(entry.path)
                elif entry.name.endswith(PARQUET_SUFFIX) and entry.is_file():
                    files.append(entry.path)
        listed = self._listed[directory] = _Listed(mtime, now, directories, files)
        return listed
