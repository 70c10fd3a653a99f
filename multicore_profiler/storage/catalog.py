"""The store's Parquet files per table, listed again at every query but cheaply.

Listing is what a query pays for the size of the store: a store of months of runs has
tens of thousands of partition directories. In a local store a directory's listing is
kept with its modification time and reused while that time holds, so a query stats
the directories instead of reading them; a directory changed within ``RACY_NS`` of
being listed is listed again (a file system with coarse times could hide a change in
the same tick). Object stores have no directory times: a remote store is listed in
one pass (a request per thousand files).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.partitions import PARQUET_SUFFIX
from multicore_profiler.storage.schema import TABLES

RACY_NS = 2_000_000_000
"""How long after its last change a directory's listing is not trusted to stay valid."""


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

    def files(self) -> dict[str, tuple[str, ...]]:
        """Each table's files (sorted paths as the store's filesystem names them); a table
        without files is absent."""
        if not self._location.is_local:
            return self._remote()
        found = {}
        for spec in TABLES.values():
            files = self._walk(self._location.join(spec.name), len(spec.partition_by))
            if files:
                found[spec.name] = tuple(sorted(files))
        return found

    def _remote(self) -> dict[str, tuple[str, ...]]:
        listed: dict[str, list[str]] = {}
        base = self._location.path.rstrip("/") + "/"
        for info in self._location.files():
            if info.path.endswith(PARQUET_SUFFIX):
                table = info.path.removeprefix(base).split("/", 1)[0]
                listed.setdefault(table, []).append(info.path)
        return {table: tuple(sorted(files)) for table, files in listed.items() if table in TABLES}

    def _walk(self, directory: str, depth: int) -> list[str]:
        """The files ``depth`` levels of partition directories below ``directory``."""
        listed = self._list(directory)
        if listed is None:
            return []
        if depth == 0:
            return listed.files
        return [f for d in listed.directories for f in self._walk(d, depth - 1)]

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
