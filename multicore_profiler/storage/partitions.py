"""Hive-partitioned Parquet files, each appearing whole under a name no one else picks.

A reader globbing ``*.parquet`` never sees a file being written. In a local store it
is written under a ``.tmp`` name, flushed to disk (unless the caller defers that to a
later commit), then renamed; in a remote one it is written to a local scratch file and
uploaded, and an object store shows an upload only once it completes. File names are
random, so any number of processes (every rank of a job) can add files to the same
partition at once.

Every page carries a CRC-32 (Parquet page checksums), and every read through pyarrow
verifies it: a flipped bit fails the read, naming the file, instead of changing a value.

Writing and checking files import no ``pyarrow.dataset`` (and so no pandas): a writer
process that only adds files stays light. Reading a table as a dataset loads it on first
use.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta, timezone
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from multicore_profiler.errors import IntegrityError, QueryError, StoreError
from multicore_profiler.scratch import ScratchDirectory
from multicore_profiler.storage.location import StoreLocation, store_write
from multicore_profiler.storage.schema import WIDENED, TableSpec, file_spec

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    import pyarrow.dataset as ds

PARQUET_SUFFIX = ".parquet"
TMP_SUFFIX = ".tmp"
ORPHAN_AGE = timedelta(days=1)
"""How old an uncommitted file (or a claim) must be to count as a dead writer's leftover."""


def utc(moment: datetime) -> datetime:
    """A listing's modification time as an aware UTC time (some filesystems give naive)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def past_orphan_age(mtime: datetime | None, now: datetime) -> bool:
    """Whether a file listed with ``mtime`` is older than ``ORPHAN_AGE``: if its write never
    committed, a dead writer's leftover rather than a write under way."""
    return mtime is not None and utc(mtime) < now - ORPHAN_AGE


@cache
def verified_parquet() -> ds.ParquetFileFormat:
    """The format of every pyarrow dataset of store files: each page read is checked
    against its CRC. Made on first use, so that writing needs no ``pyarrow.dataset``."""
    import pyarrow.dataset as ds

    return ds.ParquetFileFormat(
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True)
    )


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class CorruptFileError(IntegrityError, QueryError):
    """A store file that cannot be read as its table: a page failing its checksum, a
    broken footer, a schema that does not fit. A query that meets one fails with it (a
    ``QueryError``, as every failed query is); ``mcprof check`` lists them all.

    ``path`` is the file relative to the store, ``check`` what failed (``checksum``,
    ``parquet`` or ``schema``), ``reason`` why."""

    def __init__(self, path: str, check: str, reason: str, table: str = "") -> None:
        what = f"does not fit the {table} table" if check == "schema" else "is corrupt"
        super().__init__(f"store file {path} {what}: {reason}")
        self.path = path
        self.check = check
        self.reason = reason


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
    if table.schema.equals(spec.schema):
        return table
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


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)


def create_file(path: str | Path) -> int:
    """A descriptor of a new, empty file at ``path``, open for writing. Its directory is
    made only when the open finds none: a partition's directory costs a ``mkdir`` once,
    and a directory a vacuum removed meanwhile is made again."""
    try:
        return os.open(path, _NEW_FILE, 0o666)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, _NEW_FILE, 0o666)


SMALL_FILE_BYTES = 16 << 20
"""A file of one table of at most this many bytes (a step's) is encoded in memory and
written in one call: a ``ParquetWriter`` writing to a file makes a call per page."""


def write_parquet(
    path: str | Path, tables: Iterable[pa.Table], spec: TableSpec, *, durable: bool = True
) -> int:
    """Write ``tables`` (already conformed) to one file at ``path``; return its rows.

    With ``durable`` the file is flushed to disk before this returns; without, it may
    sit in the page cache (see ``write_partition``). On any failure the file is removed.
    """
    try:
        with open(create_file(path), "wb") as sink:
            # The buffers' size, not ``nbytes``, which walks every column (35 us).
            if (
                isinstance(tables, list)
                and len(tables) == 1
                and tables[0].get_total_buffer_size() <= SMALL_FILE_BYTES
            ):
                encoded = pa.BufferOutputStream()
                rows = _encode(encoded, tables, spec)
                sink.write(encoded.getvalue())
            else:
                rows = _encode(sink, tables, spec)
            if durable:
                sink.flush()
                os.fsync(sink.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    return rows


def _encode(sink: pa.NativeFile | BinaryIO, tables: Iterable[pa.Table], spec: TableSpec) -> int:
    """Write ``tables`` as one Parquet file of the spec's encodings to ``sink``; return
    its rows. Small tables are gathered into row groups of about ``row_group_rows``.

    A row group that fills before ``tables`` ends is encoded on a thread of its own (Arrow
    releases the GIL) while the next one is gathered, one at a time: what makes the
    tables (an ingest's trace reader) goes on meanwhile, a few percent of the ingest of a
    260 MB trace on 2 cores. A write in flight always ends before the file is closed."""
    pending: list[pa.Table] = []
    rows = buffered = 0
    pool: ThreadPoolExecutor | None = None
    writing: Future[None] | None = None
    with pq.ParquetWriter(
        sink,
        spec.schema,
        compression="snappy",
        use_dictionary=list(spec.dictionary_columns),
        column_encoding=dict.fromkeys(spec.delta_columns, "DELTA_BINARY_PACKED"),
        write_statistics=[n for n in spec.schema.names if n not in spec.dictionary_columns],
        write_page_checksum=True,
    ) as writer:
        try:
            for table in tables:
                pending.append(table)
                buffered += table.num_rows
                if buffered >= spec.row_group_rows:
                    group = pa.concat_tables(pending)
                    if writing is not None:
                        writing.result()
                    if pool is None:
                        from concurrent.futures import ThreadPoolExecutor  # big files only

                        pool = ThreadPoolExecutor(1, thread_name_prefix="mcprof-parquet")
                    writing = pool.submit(
                        writer.write_table, group, row_group_size=spec.row_group_rows
                    )
                    rows += buffered
                    pending, buffered = [], 0
            if writing is not None:
                writing.result()
            if pending:
                table = pending[0] if len(pending) == 1 else pa.concat_tables(pending)
                writer.write_table(table, row_group_size=spec.row_group_rows)
                rows += buffered
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
    return rows


def relative_path(location: StoreLocation, path: str | Path) -> str:
    """A store file's path relative to the store, as messages name it."""
    return str(path).removeprefix(location.path.rstrip("/") + "/")


def read_verified(location: StoreLocation, path: str | Path, *, keep: bool = True) -> pa.Table:
    """A whole store file, every page checked against its checksum, or an
    ``IntegrityError`` naming the file (relative to the store) and what failed. With
    ``keep=False`` the pages are checked a batch at a time and only the file's schema is
    returned (as an empty table): memory stays that of one batch, whatever the file.
    Read as a ``ParquetFile``, not a dataset: a check imports no ``pyarrow.dataset``
    (which imports pandas), so a command that reads a few checked files starts faster."""
    try:
        with pq.ParquetFile(
            str(path), filesystem=location.filesystem, page_checksum_verification=True
        ) as parquet:
            if keep:
                return parquet.read()
            for _batch in parquet.iter_batches():
                pass
            return pa.Table.from_batches([], parquet.schema_arrow)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError) as exc:
        relative = relative_path(location, path)
        reason = str(exc).replace(f"'{path}'", "").replace(str(path), relative)
        check = "checksum" if "checksum" in reason else "parquet"
        raise CorruptFileError(relative, check, " ".join(reason.split())) from exc


KEY_COLUMNS = {
    "runs": ("updated_at",),
    "invocations": ("rank", "invocation_id", "write_id"),
    "cores": ("rank", "invocation_id", "write_id"),
    "records": ("rank", "invocation_id", "write_id"),
    "tasks": ("rank", "config_id", "task_id"),
    "discards": ("rank", "write_id"),
    "trace_events": ("write_id", "event_index"),
    "trace_sources": ("write_id",),
}
"""The columns every file of a table holds (its rows' identity); a file may lack others,
written before they were added."""


def schema_misfit(schema: pa.Schema, spec: TableSpec) -> str | None:
    """Why a file's schema does not fit its table (a column the table lacks, a column of
    another type, a key column missing), or None. Other columns may be missing: a file
    written before a column was added reads it as NULL; a column of ``WIDENED`` may have
    the narrower type older files hold."""
    keys = KEY_COLUMNS.get(spec.name, ())
    wanted = {f.name: f.type for f in spec.schema}
    problems = []
    for field in schema:
        kind = wanted.get(field.name)
        if kind is None:
            problems.append(f"column {field.name!r} is not a column of {spec.name}")
        elif _value_type(field.type) != _value_type(kind) and field.type != WIDENED.get(
            (spec.name, field.name)
        ):
            problems.append(f"column {field.name!r} is {field.type}, not {kind}")
    missing = [k for k in keys if k not in schema.names]
    if missing:
        problems.append(f"it lacks the column(s) {', '.join(map(repr, missing))}")
    return "; ".join(problems) or None


def _value_type(kind: pa.DataType) -> pa.DataType:
    """A dictionary column's value type (the index width does not matter); others as is."""
    return kind.value_type if pa.types.is_dictionary(kind) else kind


def spec_of_file(spec: TableSpec, path: str | Path) -> TableSpec:
    """The spec of the file of ``spec`` at ``path``: the grouped one (``GROUPED``) for a
    step-partitioned table's file in a run's directory, which holds several steps."""
    parent = str(path).rsplit("/", 2)[-2]
    return file_spec(spec, 1) if parent.startswith("run_id=") else spec


def files_by_spec(spec: TableSpec, paths: Iterable[str]) -> list[tuple[TableSpec, tuple[str, ...]]]:
    """``paths`` of ``spec``'s files by the spec each is read with (``spec_of_file``), in
    the order first met: a step-partitioned table's files of one step and its files of
    several steps (``GROUPED``) lie in different hive layouts, so each needs a scan of its
    own."""
    found: dict[int, tuple[TableSpec, list[str]]] = {}
    for path in paths:
        kind = spec_of_file(spec, path)
        found.setdefault(len(kind.partition_by), (kind, []))[1].append(path)
    return [(kind, tuple(kind_paths)) for kind, kind_paths in found.values()]


def read_file(location: StoreLocation, path: str | Path, spec: TableSpec) -> pa.Table:
    """One file's rows with the spec's columns, its checksums verified; columns the file
    predates are null."""
    table = read_verified(location, path)
    columns = [
        table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
        for f in spec.schema
    ]
    return pa.Table.from_arrays(columns, schema=spec.schema)


def fsync_dir(path: str | Path) -> None:
    """Make a rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_file_name() -> str:
    """A partition file name no other writer will pick (128 random bits)."""
    return f"part-{os.urandom(16).hex()}{PARQUET_SUFFIX}"


_AnyPath = TypeVar("_AnyPath", str, Path)


def tmp_path(path: _AnyPath) -> _AnyPath:
    """Where ``path`` is written before it is renamed into place (invisible to readers)."""
    return type(path)(f"{path}{TMP_SUFFIX}")


def write_partition(
    location: StoreLocation,
    spec: TableSpec,
    values: Mapping[str, object],
    table: pa.Table | Iterable[pa.Table],
    *,
    durable: bool = True,
) -> str:
    """Add one file of rows to a partition, atomically; return its path. The rows may
    come as a stream of tables, written as they come.

    In a local store, ``durable`` (the default) flushes the file to disk before its
    rename and the rename after it, so the file survives a power cut once this returns.
    ``durable=False`` skips both: a later durable write (a step's commit) makes what
    matters durable, and until the page cache is written back only a power cut, never a
    process crash, can lose the file. A remote store's upload is durable either way."""
    if isinstance(table, pa.Table):
        conformed: Iterable[pa.Table] = [conform(table, spec)]
    else:
        conformed = (conform(t, spec) for t in table)
    relative = f"{partition_dir(spec, values)}/{new_file_name()}"
    with store_write(f"write {spec.name} to the store at {location}"):
        if not location.is_local:
            with ScratchDirectory("mcprof-") as scratch:
                staged = scratch / "part.parquet"
                write_parquet(staged, conformed, spec, durable=False)  # a scratch copy
                return location.upload(staged, relative)
        final = location.join(relative)
        aside = tmp_path(final)
        write_parquet(aside, conformed, spec, durable=durable)
        try:
            os.replace(aside, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(aside)
            raise
        if durable:
            fsync_dir(os.path.dirname(final))
        return final


def run_partitions(
    root: Path, spec: TableSpec, run_id: str
) -> Iterator[tuple[Path, list[Path], TableSpec]]:
    """Each partition directory of a run in a local store with its live files and their
    spec (a step-partitioned table's files of several steps, in the run's directory, are
    one more), in a stable order; nothing reached through a symbolic link (a compaction
    never merges or unlinks what a link points to)."""
    base = root / spec.name / f"run_id={check_run_id(run_id)}"
    if base.parent.is_symlink() or base.is_symlink() or not base.is_dir():
        return
    directories = [(base, file_spec(spec, 1))]
    if len(spec.partition_by) > 1:
        directories += [(d, spec) for d in sorted(_real_entries(base, stat.S_ISDIR))]
    for directory, kind in directories:
        files = sorted(_real_entries(directory, stat.S_ISREG, PARQUET_SUFFIX))
        if files:
            yield directory, files, kind


def _real_entries(directory: Path, kind: Callable[[int], bool], suffix: str = "") -> Iterator[Path]:
    """The entries of ``directory`` of one kind (by their ``lstat``: a link is neither
    a file nor a directory) whose names end with ``suffix``."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(suffix):
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except FileNotFoundError:
                    continue
                if kind(mode):
                    yield Path(entry.path)
