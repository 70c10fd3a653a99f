"""Compaction: merge a run's many small partition files into one file per partition.

Every step of every rank adds files; compaction rewrites each partition of a run as
one sorted file without changing any query's answer. Only committed rows are merged
(cores and records whose invocation is written); files of a step still being written
are left alone. The merged file replaces its sources in one journaled swap, so a
query running meanwhile sees each row exactly once.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from multicore_profiler.errors import StoreError
from multicore_profiler.storage.partitions import (
    new_file_name,
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
    TASKS,
    TableSpec,
)
from multicore_profiler.storage.swap import recover, swap

if TYPE_CHECKING:
    from multicore_profiler.storage.store import Store

COMPACT_LOCK = ".mcprof.compact.lock"
_KEYED = (CORES, RECORDS)


@dataclass(frozen=True)
class CompactionReport:
    """What a compaction did: partitions merged, files before and after, rows moved."""

    runs: int
    partitions: int
    files_before: int
    files_after: int
    rows: int
    uncommitted_files: int
    """Files left alone because their invocations are not written (yet, or ever)."""


def _read(path: Path, spec: TableSpec) -> pa.Table:
    """A file's rows with the spec's columns; columns the file predates are null."""
    table = pq.read_table(path, partitioning=None)
    columns = [
        table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
        for f in spec.schema
    ]
    return pa.Table.from_arrays(columns, schema=spec.schema)


_KEY = ["rank", "invocation_id", "write_id"]


def _keys(table: pa.Table) -> list[tuple[int, int, int]]:
    """The distinct invocation keys (rank, invocation_id, write_id) of a table, sorted."""
    found = table.group_by(_KEY).aggregate([])
    return sorted(zip(*(found[k].to_pylist() for k in _KEY), strict=True))


def _invocation_keys(path: Path) -> list[tuple[int, int, int]]:
    """The invocations a cores or records file holds rows of."""
    return _keys(pq.read_table(path, columns=_KEY, partitioning=None))


def _merged(files: list[Path], spec: TableSpec) -> Iterator[pa.Table]:
    """The rows of ``files`` in the spec's order (files of cores and records come pre-ordered)."""
    if spec in _KEYED:
        yield from (_read(path, spec) for path in files)
        return
    table = pa.concat_tables(_read(f, spec) for f in files)
    yield table.sort_by([(c, "ascending") for c in spec.sort_by])


def compact(store: Store, run_ids: Sequence[str] | None = None) -> CompactionReport:
    """Merge the small files of the given runs (default: every run in the store).

    Raises ``StoreError`` if another compaction of the store is running.
    """
    if not store.location.is_local:
        raise StoreError(
            f"the store at {store.uri} is remote: compaction swaps files under readers with a "
            "journal and a file lock, which object storage has not; compact a local store"
        )
    root = store.root
    with open(root / COMPACT_LOCK, "a") as guard:
        try:
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(f"another compaction of the store at {root} is running") from None
        recover(root, store.lock)
        present = store.sql(
            "SELECT run_id FROM raw_runs UNION SELECT run_id FROM raw_invocations ORDER BY run_id"
        )["run_id"].to_pylist()
        if run_ids is None:
            run_ids = present
        unknown = sorted(set(run_ids) - set(present))
        if unknown:
            raise StoreError(f"no run {', '.join(map(repr, unknown))} in the store at {root}")

        work: list[tuple[TableSpec, Path, list[Path]]] = []
        uncommitted = 0
        for run_id in run_ids:
            query = f"SELECT {', '.join(_KEY)} FROM raw_invocations WHERE run_id = $1"
            written = set(_keys(store.sql(query, [run_id])))
            for spec in (RUNS, INVOCATIONS, TASKS, DISCARDS, CORES, RECORDS):
                for directory, files in run_partitions(root, spec, run_id):
                    if spec in _KEYED:
                        keyed = [(_invocation_keys(f), f) for f in files]
                        ready = sorted((k, f) for k, f in keyed if set(k) <= written)
                        uncommitted += len(files) - len(ready)
                        files = [f for _, f in ready]
                    if len(files) > 1:
                        work.append((spec, directory, files))

        rows = 0
        for spec, directory, files in tqdm(work, desc="compacting", unit="partition", disable=None):
            final = directory / new_file_name()
            staged = tmp_path(final)
            rows += write_parquet(staged, _merged(files, spec), spec)
            swap(root, store.lock, [(staged, final)], files)
    return CompactionReport(
        runs=len(run_ids),
        partitions=len(work),
        files_before=sum(len(files) for _, _, files in work),
        files_after=len(work),
        rows=rows,
        uncommitted_files=uncommitted,
    )
