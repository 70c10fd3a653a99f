"""The store's Parquet files per table, listed again at every query but cheaply.

Listing is what a query pays for the size of the store: a store of months of runs has
tens of thousands of partition directories. In a local store a directory's listing is
kept with its modification time and reused while that time holds, so a query stats
the directories instead of reading them; a directory changed within ``RACY_NS`` of
being listed is listed again (a file system with coarse times could hide a change in
the same tick). Object stores have no directory times: a remote store is listed a
table at a time (a request per thousand files), and the sizes it gives are kept, so
that reading a file needs no request to learn its size.

Tables are listed in ``LISTING_ORDER``: a table whose rows commit another's is listed
before it. A file is written before the file that commits it, so a query that lists
the commit also lists what it commits: no step is seen with its invocations but
without its records, nor a compaction's supersessions without its merged files. On
object storage, where each listing is a request, the tables that commit nothing
(``COMMITTED``) are listed at once, after all the others.

A query scoped to some runs (``Store.sql(..., runs=...)``) lists only their directories:
it costs what it would in a store of those runs alone.
"""

from __future__ import annotations

import functools
import os
import stat
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.partitions import PARQUET_SUFFIX, check_run_id
from multicore_profiler.storage.schema import (
    CORES,
    DISCARDS,
    GROUPED,
    INVOCATIONS,
    RECORDS,
    RUNS,
    TASKS,
    TRACE_EVENTS,
    TRACE_SOURCES,
    TableSpec,
    file_spec,
)

RACY_NS = 2_000_000_000
"""How long after its last change a directory's listing is not trusted to stay valid."""
LISTING_ORDER = (DISCARDS, INVOCATIONS, TRACE_SOURCES, RUNS, TASKS, CORES, RECORDS, TRACE_EVENTS)
"""Committing tables before the tables they commit (see the module's docstring)."""
COMMITTED = (TASKS, CORES, RECORDS, TRACE_EVENTS)
"""The tables whose rows commit no other's: the last of ``LISTING_ORDER``."""
REMOTE_SCOPED_LISTINGS = 16
"""Up to this many runs, a scoped query lists each run's prefixes rather than the store."""
_T = TypeVar("_T")


@dataclass
class _Listed:
    mtime_ns: int
    listed_ns: int
    directories: list[str]
    files: list[str]


class FileCatalog:
    """The live files of each table of a store (``*.parquet``, at partition depth, or in
    a run's directory for the files of several steps of ``GROUPED`` tables)."""

    def __init__(self, location: StoreLocation) -> None:
        self._location = location
        self._listed: dict[str, _Listed] = {}
        self._sizes: dict[str, dict[str, int]] = {}
        """A remote store's files by table, each with its size as the last listing of
        its prefix gave it (a path names one object, written once)."""

    def sizes(self, spec: TableSpec, paths: Sequence[str]) -> dict[str, int] | None:
        """The size of each of ``paths`` of ``spec``'s table, as listed; None in a local
        store or where a path was not listed."""
        listed = self._sizes.get(spec.name, {})
        try:
            return {path: listed[path] for path in paths}
        except KeyError:
            return None

    def files(
        self, runs: Sequence[str] | None = None, tables: Sequence[TableSpec] = LISTING_ORDER
    ) -> dict[str, tuple[str, ...]]:
        """Each table's files (sorted paths as the store's filesystem names them); a table
        without files is absent. With ``runs``, the run-partitioned tables hold only the
        files of those runs, and only their directories are listed; with ``tables``, only
        those tables are listed (in ``LISTING_ORDER``)."""
        wanted = None if runs is None else {f"run_id={check_run_id(r)}" for r in runs}
        listed = tuple(spec for spec in LISTING_ORDER if spec in tables)
        if not self._location.is_local:
            return self._remote(wanted, listed)
        found = {}
        for spec in listed:
            scoped = wanted if spec.partition_by[0] == "run_id" else None
            root = self._location.join(spec.name)
            files = self._walk(root, len(spec.partition_by), scoped)
            if spec.name in GROUPED:  # files of several steps, in the run's directory
                files += self._walk(root, 1, scoped)
            if files:
                found[spec.name] = tuple(sorted(files))
        return found

    def _remote(
        self, wanted: set[str] | None, tables: tuple[TableSpec, ...]
    ) -> dict[str, tuple[str, ...]]:
        """Each of ``tables`` listed, those that commit others one after another in
        ``LISTING_ORDER``, then the ``COMMITTED`` ones at once."""
        committing = [spec for spec in tables if spec not in COMMITTED]
        committed = [spec for spec in tables if spec in COMMITTED]
        listings = [self._remote_table(spec, wanted) for spec in committing]
        listings += _at_once(
            [functools.partial(self._remote_table, spec, wanted) for spec in committed]
        )
        found = {}
        for spec, (files, sizes) in zip(committing + committed, listings, strict=True):
            self._sizes[spec.name] = sizes
            if files:
                found[spec.name] = tuple(sorted(files))
        return found

    def _remote_table(
        self, spec: TableSpec, wanted: set[str] | None
    ) -> tuple[list[str], dict[str, int]]:
        """The files of ``spec``'s table (of the ``wanted`` run partitions) and the sizes
        known of its files after listing them."""
        run_partitioned = spec.partition_by[0] == "run_id"
        if wanted is None or not run_partitioned or len(wanted) > REMOTE_SCOPED_LISTINGS:
            prefixes = [spec.name]
        else:  # a listing per run: fewer requests than the whole table's
            prefixes = [f"{spec.name}/{part}" for part in sorted(wanted)]
        table = self._location.join(spec.name) + "/"
        files = []
        # The whole table's listing replaces what is known of its files; a run's adds.
        sizes = {} if prefixes == [spec.name] else dict(self._sizes.get(spec.name, {}))
        for prefix in prefixes:
            for info in self._location.files(prefix):
                *partitions, name = info.path.removeprefix(table).split("/")
                if (
                    name.endswith(PARQUET_SUFFIX)
                    and file_spec(spec, len(partitions)).partition_by
                    == tuple(p.split("=")[0] for p in partitions)
                    and (wanted is None or not run_partitioned or partitions[0] in wanted)
                ):
                    files.append(info.path)
                    sizes[info.path] = info.size
        return files, sizes

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
        """A directory's partition directories and ``*.parquet`` files, none through a
        symbolic link (``mcprof check`` reports links; a query follows none)."""
        try:
            found = os.lstat(directory)
        except FileNotFoundError:
            found = None
        if found is None or not stat.S_ISDIR(found.st_mode):
            self._listed.pop(directory, None)
            return None
        mtime = found.st_mtime_ns
        cached = self._listed.get(directory)
        if cached and cached.mtime_ns == mtime and cached.listed_ns - mtime > RACY_NS:
            return cached
        now = time.time_ns()
        directories, files = [], []
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and "=" in entry.name:
                    directories.append(entry.path)
                elif entry.name.endswith(PARQUET_SUFFIX) and entry.is_file(follow_symlinks=False):
                    files.append(entry.path)
        listed = self._listed[directory] = _Listed(mtime, now, directories, files)
        return listed


def _at_once(calls: Sequence[Callable[[], _T]]) -> list[_T]:
    """The results of ``calls``, made on threads of their own (each a request to wait
    for), in order; the first failure is raised."""
    if len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(len(calls), thread_name_prefix="mcprof-listing") as pool:
        return list(pool.map(lambda call: call(), calls))
