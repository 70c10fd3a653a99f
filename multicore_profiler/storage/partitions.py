"""Hive-partitioned Parquet files, each appearing whole under a name no one else picks.

A reader globbing ``*.parquet`` never sees a file being written. In a local store it
is written under a ``.tmp`` name, flushed to disk, then renamed; in a remote one it is
written to a local scratch file and uploaded, and an object store shows an upload only
once it completes. File names are random, so any number of processes (every rank of a
job) can add files to the same partition at once.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from multicore_profiler.errors import StoreError
from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.schema import TableSpec

PARQUET_SUFFIX = ".parquet"
TMP_SUFFIX = ".tmp"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it can name a partition directory, else raise ``StoreError``."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise StoreError(
            f"run id {run_id!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return run_id


def partition_dir(spec: TableSpec, values: Mapping[str, object]) -> str:
    """The directory of one partition in a store: ``<table>/run_id=<id>[/step=<n>]``."""
    parts = [spec.name]
    for key in spec.partition_by:
        if key not in values:
            raise StoreError(f"a {spec.name} partition needs a value for {key!r}")
        value = values[key]
        if key in ("run_id", "source_id"):
            check_run_id(value)
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StoreError(f"{key} must be a non-negative integer, got {value!r}")
        parts.append(f"{key}={value}")
    return "/".join(parts)


def conform(table: pa.Table, spec: TableSpec) -> pa.Table:
    """The table with exactly the spec's columns, in order and type, or a ``StoreError``."""
    names = set(table.column_names)
    missing = [n for n in spec.schema.names if n not in names]
    extra = sorted(names - set(spec.schema.names))
    if missing or extra:
        raise StoreError(
            f"rows for {spec.name!r} do not fit its schema: missing {missing}, unexpected {extra}"
        )
    selected = table.select(spec.schema.names)
    if selected.schema.equals(spec.schema):
        return selected
    try:
        return selected.cast(spec.schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise StoreError(f"rows for {spec.name!r} do not fit its schema: {exc}") from exc


def write_parquet(path: Path, tables: Iterable[pa.Table], spec: TableSpec) -> int:
    """Write ``tables`` (already conformed) to one file at ``path``, durably; return its rows.

    Small tables are gathered into row groups of about the spec's ``row_group_rows``.
    On any failure the file is removed.
    """
    pending: list[pa.Table] = []
    rows = buffered = 0
    try:
        with (
            open(path, "wb") as sink,
            pq.ParquetWriter(
                sink,
                spec.schema,
                compression="snappy",
                use_dictionary=list(spec.dictionary_columns),
                column_encoding=dict.fromkeys(spec.delta_columns, "DELTA_BINARY_PACKED"),
                write_statistics=[n for n in spec.schema.names if n not in spec.dictionary_columns],
            ) as writer,
        ):
            for table in tables:
                pending.append(table)
                buffered += table.num_rows
                if buffered >= spec.row_group_rows:
                    writer.write_table(
                        pa.concat_tables(pending), row_group_size=spec.row_group_rows
                    )
                    rows += buffered
                    pending, buffered = [], 0
            if pending:
                writer.write_table(pa.concat_tables(pending), row_group_size=spec.row_group_rows)
                rows += buffered
            writer.close()
            sink.flush()
            os.fsync(sink.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return rows


def read_file(location: StoreLocation, path: str | Path, spec: TableSpec) -> pa.Table:
    """One file's rows with the spec's columns; columns the file predates are null."""
    table = pq.read_table(str(path), filesystem=location.filesystem, partitioning=None)
    columns = [
        table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
        for f in spec.schema
    ]
    return pa.Table.from_arrays(columns, schema=spec.schema)


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_file_name() -> str:
    """A partition file name no other writer will pick."""
    return f"part-{uuid.uuid4().hex}{PARQUET_SUFFIX}"


def tmp_path(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place (invisible to readers)."""
    return path.with_name(path.name + TMP_SUFFIX)


def write_partition(
    location: StoreLocation,
    spec: TableSpec,
    values: Mapping[str, object],
    table: pa.Table | Iterable[pa.Table],
) -> str:
    """Add one file of rows to a partition, atomically; return its path. The rows may
    come as a stream of tables, written as they come."""
    tables = [table] if isinstance(table, pa.Table) else table
    conformed = (conform(t, spec) for t in tables)
    relative = f"{partition_dir(spec, values)}/{new_file_name()}"
    if not location.is_local:
        with tempfile.TemporaryDirectory(prefix="mcprof-") as scratch:
            staged = Path(scratch) / "part.parquet"
            write_parquet(staged, conformed, spec)
            return location.upload(staged, relative)
    final = location.directory / relative
    final.parent.mkdir(parents=True, exist_ok=True)
    aside = tmp_path(final)
    write_parquet(aside, conformed, spec)
    os.replace(aside, final)
    fsync_dir(final.parent)
    return str(final)


def run_partitions(root: Path, spec: TableSpec, run_id: str) -> Iterator[tuple[Path, list[Path]]]:
    """Each partition directory of a run in a local store with its live files, in a
    stable order."""
    base = root / spec.name / f"run_id={check_run_id(run_id)}"
    if not base.is_dir():
        return
    nested = len(spec.partition_by) > 1
    directories = sorted(p for p in base.iterdir() if p.is_dir()) if nested else [base]
    for directory in directories:
        files = sorted(directory.glob(f"*{PARQUET_SUFFIX}"))
        if files:
            yield directory, files
