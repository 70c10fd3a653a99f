"""Compaction: merge a run's many small partition files into one file per partition.

Every step of every rank adds files; compaction rewrites each partition of a run as
one sorted file without changing any query's answer. Only committed rows are merged
(cores and records whose invocation is written); files of a step still being written
are left alone. In a local store the merged file replaces its sources in one journaled
swap, so a query running meanwhile sees each row exactly once. A remote store has no
rename and no lock: there the run's writes are rewritten and then superseded by one
file (see ``supersede``). Either way a compaction first vacuums the run: it deletes
the files no view can show again (see ``vacuum``).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from multicore_profiler.errors import StoreError
from multicore_profiler.progress import progress
from multicore_profiler.storage.location import StoreLocation, store_write
from multicore_profiler.storage.partitions import (
    new_file_name,
    read_file,
    read_verified,
    run_partitions,
    tmp_path,
    write_parquet,
)
from multicore_profiler.storage.schema import (
    CORES,
    DISCARDS,
    INVOCATIONS,
    RECORDS,
    RUNS,
    TABLES,
    TASKS,
    TableSpec,
)
from multicore_profiler.storage.supersede import plan_rewrite
from multicore_profiler.storage.swap import recover, swap
from multicore_profiler.storage.vacuum import GRACE, run_files, stale_leftovers, vacuum

if TYPE_CHECKING:
    from multicore_profiler.storage.handle import StoreHandle

COMPACT_LOCK = ".mcprof.compact.lock"
_KEYED = (CORES, RECORDS)
_KEYED_NAMES = {spec.name for spec in _KEYED}


@dataclass(frozen=True)
class CompactionReport:
    """What a compaction did: partitions merged, files before and after, rows moved."""

    runs: int
    partitions: int
    files_before: int
    files_after: int
    rows: int
    uncommitted_files: int
    """Files left alone because their invocations are not written (yet, or ever), task
    graphs that no invocation names among them; a local store's count (a remote
    compaction leaves such files to the vacuum alone)."""
    files_deleted: int = 0
    """Files the vacuum deleted: hidden for good, or a dead writer's leftovers (files of
    writes never committed, task graphs no invocation names, ``*.parquet.tmp`` files)."""


_KEY = ["rank", "invocation_id", "write_id"]


def _keys(table: pa.Table) -> list[tuple[int, int, int]]:
    """The distinct invocation keys (rank, invocation_id, write_id) of a table, sorted."""
    found = table.group_by(_KEY).aggregate([])
    return sorted(zip(*(found[k].to_pylist() for k in _KEY), strict=True))


def _invocation_keys(location: StoreLocation, path: Path) -> list[tuple[int, int, int]]:
    """The invocations a cores or records file holds rows of (its pages verified)."""
    return _keys(read_verified(location, path).select(_KEY))


def _graphs(table: pa.Table) -> list[tuple[int, str]]:
    """The (rank, config_id) pairs of a table's rows."""
    return list(zip(table["rank"].to_pylist(), table["config_id"].to_pylist(), strict=True))


def _file_graphs(location: StoreLocation, path: Path) -> set[tuple[int, str]]:
    """The task graphs a ``tasks`` file holds (its pages verified)."""
    return set(_graphs(read_verified(location, path).select(["rank", "config_id"])))


def _merged(location: StoreLocation, files: list[Path], spec: TableSpec) -> Iterator[pa.Table]:
    """The rows of ``files`` in the spec's order (files of cores and records come
    pre-ordered: a group's by step, then by invocation)."""
    if spec.name in _KEYED_NAMES:
        yield from (read_file(location, path, spec) for path in files)
        return
    table = pa.concat_tables(read_file(location, f, spec) for f in files)
    yield table.sort_by([(c, "ascending") for c in spec.sort_by])


def compact(
    store: StoreHandle,
    run_ids: Sequence[str] | None = None,
    *,
    grace: timedelta = GRACE,
    now: datetime | None = None,
) -> CompactionReport:
    """Vacuum, then merge, the files of the given runs (default: every run in the store).

    ``grace`` is how long files hidden for good stay for the queries that listed them
    before; ``now`` is the time the vacuum judges ages by. Raises ``StoreError`` if
    another compaction of a local store is running.
    """
    if grace < timedelta(0):
        raise StoreError(f"the grace period must not be negative, got {grace}")
    now = now or datetime.now(timezone.utc)
    with store_write(f"compact the store at {store.uri}"):
        report = (
            _compact_remote(store, _known_runs(store, run_ids), now, grace)
            if not store.location.is_local
            else _compact_local(store, run_ids, now, grace)
        )
        if run_ids is None:  # the whole store: the outer traces' leftovers too
            report = replace(report, files_deleted=report.files_deleted + _sweep(store, now))
    return report


def _sweep(store: StoreHandle, now: datetime) -> int:
    """Delete the day-old ``*.parquet.tmp`` files of the tables not partitioned by run
    (the outer traces'); return how many."""
    location = store.location
    infos = [
        info
        for spec in TABLES.values()
        if spec.partition_by[0] != "run_id"
        for info in location.files(spec.name)
    ]
    stale = stale_leftovers(infos, now)
    for path in sorted(stale):
        location.delete_file(path)
    return len(stale)


def _compact_local(
    store: StoreHandle, run_ids: Sequence[str] | None, now: datetime, grace: timedelta
) -> CompactionReport:
    """Vacuum, then merge each partition's committed files in one journaled swap."""
    root = store.root
    with open(root / COMPACT_LOCK, "a") as guard:
        try:
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(f"another compaction of the store at {root} is running") from None
        recover(root, store.lock)
        run_ids = _known_runs(store, run_ids)
        deleted = 0
        for run_id in run_ids:
            files = run_files(store.location, run_id)
            deleted += files.count - vacuum(store, run_id, files, now=now, grace=grace).count

        work: list[tuple[TableSpec, Path, list[Path]]] = []
        uncommitted = 0
        for run_id in run_ids:
            query = f"SELECT {', '.join(_KEY)} FROM raw_invocations WHERE run_id = $1"
            written = set(_keys(store.sql(query, [run_id])))
            query = "SELECT DISTINCT rank, config_id FROM raw_invocations WHERE run_id = $1"
            named = set(_graphs(store.sql(query, [run_id])))
            for spec in (RUNS, INVOCATIONS, TASKS, DISCARDS, CORES, RECORDS):
                for directory, files, kind in run_partitions(root, spec, run_id):
                    if spec in _KEYED:
                        keyed = [(_invocation_keys(store.location, f), f) for f in files]
                        ready = sorted((k, f) for k, f in keyed if set(k) <= written)
                        uncommitted += len(files) - len(ready)
                        files = [f for _, f in ready]
                    elif spec is TASKS:  # a graph no invocation names yet stays on its own
                        ready = [f for f in files if _file_graphs(store.location, f) <= named]
                        uncommitted += len(files) - len(ready)
                        files = ready
                    if len(files) > 1:
                        work.append((kind, directory, files))

        rows = 0
        for spec, directory, files in progress(work, desc="compacting", unit="partition"):
            final = directory / new_file_name()
            staged = tmp_path(final)
            rows += write_parquet(staged, _merged(store.location, files, spec), spec)
            swap(root, store.lock, [(staged, final)], files)
    return CompactionReport(
        runs=len(run_ids),
        partitions=len(work),
        files_before=sum(len(files) for _, _, files in work),
        files_after=len(work),
        rows=rows,
        uncommitted_files=uncommitted,
        files_deleted=deleted,
    )


def _known_runs(store: StoreHandle, run_ids: Sequence[str] | None) -> list[str]:
    """``run_ids`` (default: every run in the store), each checked to be there
    (``StoreError`` naming those that are not)."""
    present = store.sql(
        "SELECT run_id FROM raw_runs UNION SELECT run_id FROM raw_invocations ORDER BY run_id"
    )["run_id"].to_pylist()
    if run_ids is None:
        return present
    unknown = sorted(set(run_ids) - set(present))
    if unknown:
        raise StoreError(f"no run {', '.join(map(repr, unknown))} in the store at {store.uri}")
    return list(run_ids)


def _compact_remote(
    store: StoreHandle, run_ids: list[str], now: datetime, grace: timedelta
) -> CompactionReport:
    """Vacuum each run, then rewrite and supersede its writes (see ``supersede``)."""
    deleted = partitions = before = after = rows = 0
    for run_id in progress(run_ids, desc="compacting", unit="run"):
        files = run_files(store.location, run_id)
        left = vacuum(store, run_id, files, now=now, grace=grace)
        deleted += files.count - left.count
        rewrite = plan_rewrite(store, run_id, left)
        if rewrite is None:
            continue
        rewrite.write(store)
        rewrite.commit(store, datetime.now(timezone.utc))
        partitions += len(rewrite.sources)
        before += sum(len(files) for files in rewrite.sources.values())
        after += rewrite.written
        rows += rewrite.rows
    return CompactionReport(
        runs=len(run_ids),
        partitions=partitions,
        files_before=before,
        files_after=after,
        rows=rows,
        uncommitted_files=0,
        files_deleted=deleted,
    )
