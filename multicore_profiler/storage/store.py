"""The store: hive-partitioned Parquet files, queried through DuckDB views.

``open_store(where)`` returns a ``Store`` in a local directory or under a URI of any
pyarrow filesystem (``s3://bucket/prefix``; see ``location``); ``Store.sql(query)``
returns a ``pyarrow.Table``. Views (``runs``, ``invocations``, ``cores``, ``records``,
``records_ns``, ``stage_stats``, ``run_summary``) span every run in the store and
are re-listed at each query, so rows written by other processes appear as soon as
their files do.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from datetime import datetime, timedelta
from functools import cache, partial
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from multicore_profiler.errors import IntegrityError, QueryError, SelectorError, StoreError
from multicore_profiler.extension import Extensible
from multicore_profiler.storage.catalog import FileCatalog
from multicore_profiler.storage.connection import connection, query_error
from multicore_profiler.storage.default_store import default_store_path
from multicore_profiler.storage.derived import DerivedTables
from multicore_profiler.storage.location import MARKER, StoreLocation, store_write
from multicore_profiler.storage.partitions import (
    CorruptFileError,
    files_by_spec,
    read_verified,
    relative_path,
    schema_misfit,
    spec_of_file,
    verified_parquet,
)
from multicore_profiler.storage.schema import (
    DISCARDS,
    INVOCATIONS,
    TABLES,
    WIDENED,
    TableSpec,
)
from multicore_profiler.storage.selectors import RunSelector
from multicore_profiler.storage.sql_modules import InstalledModules, deferred, query_names
from multicore_profiler.storage.sql_text import sql_identifier, sql_string, sql_strings
from multicore_profiler.storage.swap import LOCK_FILE, StoreLock, pending, recover
from multicore_profiler.storage.vacuum import GRACE
from multicore_profiler.storage.verified import VerifiedRecord
from multicore_profiler.storage.writes import StoreWrites

if TYPE_CHECKING:
    import pyarrow.dataset as ds

    from multicore_profiler.storage.compact import CompactionReport
    from multicore_profiler.storage.retention import GcPlan

FORMAT_VERSION = 1

_PARTITION_TYPES = {"run_id": pa.string(), "step": pa.int64(), "source_id": pa.string()}
_SQL_TYPES = {
    pa.bool_(): "BOOLEAN",
    pa.uint8(): "UTINYINT",
    pa.int32(): "INTEGER",
    pa.uint32(): "UINTEGER",
    pa.int64(): "BIGINT",
    pa.uint64(): "UBIGINT",
    pa.float64(): "DOUBLE",
    pa.string(): "VARCHAR",
    pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
}
"""DuckDB's types of the Arrow types the store's columns have (lists and maps of them too)."""
OUTER_KERNEL_RULES = "outer_kernel_rules"
"""The SQL module whose setting is the outer-kernel rules (see ``analysis``)."""
PLAN_CHECKS_KEPT = 1024
"""Query texts whose reader choice is remembered (see ``Store.sql``)."""
VERIFY_THREADS = os.cpu_count() or 1
"""Threads that check new files before a query reads them (pyarrow releases the GIL)."""
NATIVE_MAX_FILES = 256
"""Up to this many files a local table is read by DuckDB's Parquet reader; above, as a
pyarrow dataset (see ``Store._point``)."""


def _sql_type(kind: pa.DataType) -> str:
    """The type DuckDB reads an Arrow column of ``kind`` as (a dictionary as its values)."""
    if pa.types.is_dictionary(kind):
        return _sql_type(kind.value_type)
    if pa.types.is_list(kind):
        return f"{_sql_type(kind.value_type)}[]"
    if pa.types.is_map(kind):
        return f"MAP({_sql_type(kind.key_type)}, {_sql_type(kind.item_type)})"
    return _SQL_TYPES[kind]


_UNDISCARDED = (
    "CREATE OR REPLACE VIEW invocations AS "
    "SELECT * FROM raw_invocations WHERE origin_write_id IS NULL"
)
"""``invocations`` over a ``raw_discards`` without a file (see ``invocations.sql``)."""


@cache
def _invocations_view(discarded: bool, temp: bool) -> str:
    """The statement that defines ``invocations`` for the ``raw_discards`` a connection
    (or, ``temp``, a cursor) sees: with the discards' rules where it has files
    (``invocations.sql``), else as the filter those rules come to. Unbound, as every view
    (``deferred``)."""
    if discarded:
        text = resources.files(__package__).joinpath("invocations.sql").read_text()
    else:
        text = _UNDISCARDED
    create = "CREATE OR REPLACE VIEW"
    return deferred(text.replace(create, "CREATE OR REPLACE TEMP VIEW", 1) if temp else text)


def _raw_view(spec: TableSpec, source: str, *, temp: bool = False) -> str:
    """The statement that makes ``raw_<table>`` (a ``temp`` one: a cursor's own) read
    ``source`` with the table's columns (``_with_empty``), unbound (``deferred``)."""
    kind = "TEMP VIEW" if temp else "VIEW"
    return deferred(f"CREATE OR REPLACE {kind} raw_{spec.name} AS {_with_empty(spec, source)}")


@cache
def _empty_tables() -> str:
    """The script that makes each table's typed, empty table (``empty_<table>``, partition
    keys first), the columns a query sees, and its ``raw_<table>`` view over it alone.
    Plain DDL: an empty Arrow table would have DuckDB import ``pyarrow.compute`` (a
    thirtieth of a second) in every command."""
    script = []
    for spec in TABLES.values():
        columns = [(k, _PARTITION_TYPES[k]) for k in spec.partition_by]
        columns += [(field.name, field.type) for field in spec.schema]
        typed = ", ".join(f"{sql_identifier(name)} {_sql_type(kind)}" for name, kind in columns)
        script.append(f"CREATE TABLE empty_{spec.name} ({typed});")
        script.append(f"{_raw_view(spec, f'empty_{spec.name}')};")
    return "\n".join(script)


class Store(Extensible, StoreWrites):
    """A multicore_profiler store, local or remote; see ``open_store``. Higher rooms add
    methods (``compare``) with ``Store.extend``."""

    def __init__(
        self,
        where: Path | str | StoreLocation,
        *,
        create: bool = True,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        location = (
            where if isinstance(where, StoreLocation) else StoreLocation.parse(where, filesystem)
        )
        with store_write(f"open the store at {location}"):
            if location.is_local:
                _init_local(location.directory, create)
            else:
                _init_remote(location, create)
        _check_marker(location)
        self._location = location
        self._lock = StoreLock(location.directory) if location.is_local else None
        self._views = threading.Lock()
        self._resources = ExitStack()
        self._db = self._resources.enter_context(connection())
        self._db.execute("SET enable_progress_bar = false; SET TimeZone = 'UTC'")
        self._catalog = FileCatalog(location)
        self._datasets: dict[
            str, tuple[tuple[tuple[str, ...], dict[str, int] | None], ds.Dataset]
        ] = {}
        self._tables: dict[tuple[str, ...], pa.Table] = {}
        self._ids: dict[str, pa.Table] = {}
        """The ``rank`` and ``invocation_id`` columns of invocations files read so far."""
        self._verified: dict[str, bool] = {}
        """Files whose pages and schema were checked, or that the store's record vouches
        for, each with whether it has every column of its table at its type (not the
        narrower one of ``WIDENED``); files never change once named."""
        self._record = VerifiedRecord(location.directory) if location.is_local else None
        """What earlier processes checked (see ``verified``)."""
        self._vouched: set[str] = set()
        """Files of ``_verified`` this object never read: the record vouched for them, or
        this object wrote them (``_wrote``)."""
        self._shared_files: dict[str, tuple[str, ...]] = {}
        self._discarded = False
        """Whether the store connection's ``invocations`` applies the discards' rules (its
        ``raw_discards`` has files); see ``_invocations_view``."""
        self._big: bool | None = None
        """Whether the last whole-store listing found a table too big for DuckDB's reader."""
        self._plans: dict[tuple[str, Any], Any] = {}
        """Choices made from queries' plans, by text (see ``_read_plan``, ``_dataset_filtered``)."""
        # Over empty tables until a query finds files (see _point).
        views = resources.files(__package__).joinpath("views.sql").read_text()
        self._db.execute(
            f"{_empty_tables()}\n{_invocations_view(False, False)};\n{deferred(views)}"
        )
        self._modules = InstalledModules()
        self._kept = (
            DerivedTables(location.directory, f"{_empty_tables()}\n{views}")
            if location.is_local
            else None
        )
        """Where the modules' materialized tables are kept between processes (see
        ``derived``): local stores only."""

    @property
    def uri(self) -> str:
        """The store's path or URI, as ``--store`` takes it."""
        return self._location.uri

    @property
    def root(self) -> Path:
        """The store's directory; ``StoreError`` for a remote store."""
        return self._location.directory

    @property
    def lock(self) -> StoreLock:
        """The lock queries share and file swaps (compaction) take alone (local stores)."""
        if self._lock is None:
            raise StoreError(f"the store at {self.uri} is remote: it has no file lock")
        return self._lock

    def setting(self, module: str) -> Any:
        """The setting a configurable SQL module uses in this ``Store`` object."""
        with self._views:
            return self._modules.setting(module)

    def configure(self, module: str, setting: Any | None = None) -> None:
        """Give a configurable SQL module a setting (default: its own default) for every
        query of this ``Store`` object after this call; it is checked first."""
        with self._views:
            self._modules.configure(self._db, module, setting)

    @property
    def kernel_rules(self) -> Any:
        """The ``OuterKernelRules`` the outer-kernel views (``kernels``, ``steps``, ...)
        apply now."""
        return self.setting(OUTER_KERNEL_RULES)

    def use_kernel_rules(self, rules: Any | None = None) -> None:
        """Apply ``OuterKernelRules`` (default: the built-in ones) to the outer-kernel views
        of this ``Store`` object, for every query after this call."""
        self.configure(OUTER_KERNEL_RULES, rules)

    def gc(
        self,
        *,
        keep_last: int | None = None,
        older_than: timedelta | None = None,
        labels: Sequence[str] = (),
        apply: bool = False,
    ) -> GcPlan:
        """Remove whole runs by a retention rule; with ``apply=False`` (the default) only
        say which. See ``retention.plan_gc``."""
        from multicore_profiler.storage.retention import collect, plan_gc  # and tqdm

        plan = plan_gc(self, keep_last=keep_last, older_than=older_than, labels=labels)
        return collect(self, plan) if apply else plan

    def compact(
        self,
        run_ids: Sequence[str] | None = None,
        *,
        grace: timedelta = GRACE,
        now: datetime | None = None,
    ) -> CompactionReport:
        """Delete the files no view shows again, then merge each partition's small files
        into one (default: every run); see ``compact``."""
        from multicore_profiler.storage.compact import compact  # and tqdm: for this alone

        return compact(self, run_ids, grace=grace, now=now)

    def _point(
        self,
        cursor: duckdb.DuckDBPyConnection,
        runs: Sequence[str] | None,
        native: bool = False,
        given: Mapping[str, Sequence[str]] | None = None,
    ) -> frozenset[str]:
        """Point each ``raw_<table>`` at the files listed now (of ``runs`` only, when
        given), or only the tables ``given`` at the files given; return the tables read
        as datasets.

        A local table is read by DuckDB's own Parquet reader, the fastest scan, when the
        query is scoped to runs, has at most ``NATIVE_MAX_FILES`` files, or ``native`` is
        asked for. Otherwise, and in a remote store, it is read as a pyarrow dataset:
        DuckDB hands it its constant filters on partition columns (run, step, source)
        and it opens no file of another partition, where the native reader would first
        parse every file's path. A file written before a column was added reads that
        column as NULL either way. The views every query shares live on the store's
        connection and change only with the files; the others are ``cursor``'s own."""
        if given is None:
            since = time.time_ns()
            listed = self._catalog.files(runs)
            if runs is None:
                self._big = _big(map(len, listed.values()))
            if runs is None and self._record is not None:
                self._record.listed([p for paths in listed.values() for p in paths], since)
        else:
            listed = {table: tuple(sorted(paths)) for table, paths in given.items()}
        datasets = set()
        moved = []  # the store connection's views to point at other files, in one script
        for spec in TABLES.values():
            files = listed.get(spec.name, ())
            scoped = runs is not None and spec.partition_by[0] == "run_id"
            big = len(files) > NATIVE_MAX_FILES
            if given is not None and spec.name not in given:
                source = f"empty_{spec.name}"
            elif not self._location.is_local:
                source = self._dataset_scan(cursor, spec, files) if files else None
                if files:
                    datasets.add(spec.name)
            elif scoped or given is not None or (big and native):
                source = self._native_scan(spec, files) if files else f"empty_{spec.name}"
            elif big:
                source = self._dataset_scan(cursor, spec, files)
                datasets.add(spec.name)
            else:
                if self._shared_files.get(spec.name) != files:
                    moved.append((spec, files))
                continue
            if source is not None:
                cursor.execute(_raw_view(spec, source, temp=True))
                # The cursor's own discards: its own invocations, unless the shared one's
                # rules fit (it has none, and neither has the store connection's).
                if spec is DISCARDS and (files or self._discarded):
                    cursor.execute(_invocations_view(bool(files), True))
        if moved:
            shared = self._shared_files | {spec.name: files for spec, files in moved}
            discarded = bool(shared.get(DISCARDS.name))
            script = [self._shared_view(spec, files) for spec, files in moved]
            if discarded != self._discarded:
                script.append(_invocations_view(discarded, False))
            self._db.execute(";\n".join(script))
            self._shared_files, self._discarded = shared, discarded
        self.save_verified()
        return frozenset(datasets)

    def _shared_view(self, spec: TableSpec, files: tuple[str, ...]) -> str:
        """The statement that points the store connection's ``raw_<table>`` at ``files``
        (checked first, see ``_native_scan``)."""
        source = self._native_scan(spec, files) if files else f"empty_{spec.name}"
        return _raw_view(spec, source)

    def _native_scan(self, spec: TableSpec, files: tuple[str, ...]) -> str:
        """``read_parquet`` of local files. Each file is checked once (see ``_verify``),
        new files in parallel threads, unless the store's record vouches for it; only
        where one lacks a column does DuckDB unify by name."""
        new = [path for path in files if path not in self._verified]
        if new and self._record is not None:
            vouched = self._record.vouched(new)
            self._verified.update(vouched)
            self._vouched.update(vouched)
            new = [path for path in new if path not in vouched]
        if len(new) > 1:
            from concurrent.futures import ThreadPoolExecutor  # new files only

            with ThreadPoolExecutor(min(VERIFY_THREADS, len(new))) as pool:
                list(pool.map(partial(self._verify, spec), new))
        elif new:
            self._verify(spec, new[0])
        if new:  # the pages read to check them: hand them back rather than hold them
            pa.default_memory_pool().release_unused()
        scans = []
        for kind, paths in files_by_spec(spec, files):
            current = all(self._verified[path] for path in paths)
            types = ", ".join(
                f"{sql_string(k)}: {_sql_type(_PARTITION_TYPES[k])}" for k in kind.partition_by
            )
            scans.append(
                f"read_parquet([{sql_strings(paths)}], hive_partitioning = true, "
                f"hive_types = {{{types}}}, union_by_name = {str(not current).lower()})"
            )
        if len(scans) == 1:
            return scans[0]
        return "(" + " UNION ALL BY NAME ".join(f"SELECT * FROM {scan}" for scan in scans) + ")"

    def verified_file(self, spec: TableSpec, path: str, *, keep: bool = True) -> pa.Table:
        """A file's rows (with ``keep=False`` none, only its columns), after checking every
        page against its checksum and its schema against the table's (``CorruptFileError``
        naming the file if either fails). Each file is checked once (files never change
        once named): later queries read it without checking again, and so do later
        ``Store`` objects while it is unchanged (see ``save_verified``)."""
        record = self._record
        before = None if record is None else record.before(path)
        spec = spec_of_file(spec, path)
        try:
            table = read_verified(self._location, path, keep=keep)
            misfit = schema_misfit(table.schema, spec)
            if misfit is not None:
                raise CorruptFileError(
                    relative_path(self._location, path), "schema", misfit, spec.name
                )
        except CorruptFileError:
            if record is not None:
                record.failed(path)
            raise
        current = set(table.schema.names) >= set(spec.schema.names) and not any(
            WIDENED.get((spec.name, f.name)) == f.type for f in table.schema
        )
        self._verified[path] = current
        self._vouched.discard(path)
        if record is not None and before is not None:
            record.passed(path, before, current)
        return table

    def save_verified(self) -> None:
        """Add the files this object checked since (and drop those that failed) to the
        store's record, so that later ``Store`` objects (later commands) trust them while
        they are unchanged; see ``verified``. Queries save it; so does ``check_store``."""
        if self._record is not None:
            self._record.save()

    def _wrote(self, path: str) -> None:
        """A file this object has just written, with its table's current columns (rows are
        conformed to the spec before they are written): its queries read it without
        checking it first, as it checks the files it read once. Reading back what it
        wrote a moment ago (``trace-buffer``'s records, an ingested trace's events before
        its first query) cost a whole decode of each file. The store's record is not told:
        a later ``Store`` checks the file once, as for any file it has not read."""
        self._verified[path] = True
        self._vouched.add(path)

    def _verify(self, spec: TableSpec, path: str) -> None:
        """Check a file before DuckDB's reader, which checks no checksum, reads it."""
        self.verified_file(spec, path, keep=False)

    def invocation_ids(self, run_id: str, rank: int) -> np.ndarray:
        """The invocation ids committed to (run, rank) by any write, shown or hidden since,
        sorted and distinct (``int64``). Only the run's invocations files are listed, and
        each is read once (files never change once named)."""
        parts = []
        with self._unswapped():  # a compaction swaps none of them until they are read
            listed = self._catalog.files([run_id], tables=(INVOCATIONS,))
            for path in listed.get(INVOCATIONS.name, ()):
                ids = self._ids.get(path)
                if ids is None:
                    try:
                        table = self.verified_file(INVOCATIONS, path)
                    except FileNotFoundError:
                        # Remote: its run removed since, or a rewrite of it listed too.
                        continue
                    ids = self._ids[path] = table.select(["rank", "invocation_id"])
                parts.append(ids)
        if not parts:
            return np.empty(0, np.int64)
        table = pa.concat_tables(parts)
        mine = table["rank"].to_numpy() == rank
        return np.unique(table["invocation_id"].to_numpy()[mine]).astype(np.int64)

    def _culprit(self, runs: Sequence[str] | None) -> IntegrityError | None:
        """After a query failed reading files: the first file of ``runs`` (default: all)
        that fails its checks, as the error to raise, or None when all pass. A file the
        record vouched for is read too: bytes may rot without changing its stamp."""
        for name, paths in self._catalog.files(runs).items():
            for path in paths:
                if path not in self._verified or path in self._vouched:
                    try:
                        self._verify(TABLES[name], path)
                    except FileNotFoundError:
                        continue
                    except IntegrityError as err:
                        return err
        return None

    def _dataset_scan(
        self, cursor: duckdb.DuckDBPyConnection, spec: TableSpec, files: tuple[str, ...]
    ) -> str:
        """Register the table's dataset on ``cursor``; return its name there. The
        ``discards`` table, a few rows that every query joins several times, is read
        whole once per set of files and scanned from memory."""
        dataset = self._dataset(spec, files)
        if spec is DISCARDS:
            cached = self._tables.get(files)
            if cached is None:
                self._tables.clear()
                cached = self._tables[files] = dataset.to_table()
            cursor.register(f"files_{spec.name}", cached)
        else:
            cursor.register(f"files_{spec.name}", dataset)
        return f"files_{spec.name}"

    def _dataset(self, spec: TableSpec, files: tuple[str, ...]) -> ds.Dataset:
        """A pyarrow dataset of a table's files, made again only when they changed
        (``pyarrow.dataset``, which imports pandas, is imported by the first). A remote
        store's files carry the sizes its listing gave: opening one then costs no
        request for its size, a round trip per file and query otherwise."""
        import pyarrow.dataset as ds

        sizes = self._catalog.sizes(spec, files)
        cached = self._datasets.get(spec.name)
        if cached is None or cached[0] != (files, sizes):
            partitions = pa.schema([(k, _PARTITION_TYPES[k]) for k in spec.partition_by])
            schema = pa.unify_schemas([partitions, spec.schema])
            base = self._location.join(spec.name)
            filesystem = self._location.filesystem
            parquet = verified_parquet()
            parts = []
            for kind, paths in files_by_spec(spec, files):
                partitioning = ds.partitioning(
                    pa.schema([(k, _PARTITION_TYPES[k]) for k in kind.partition_by]),
                    flavor="hive",
                )
                if sizes is None:
                    part = ds.dataset(
                        list(paths),
                        schema=schema,
                        format=parquet,
                        filesystem=filesystem,
                        partitioning=partitioning,
                        partition_base_dir=base,
                    )
                else:
                    fragments = [
                        parquet.make_fragment(
                            path,
                            filesystem,
                            partitioning.parse(path.removeprefix(base)),
                            file_size=sizes[path],
                        )
                        for path in paths
                    ]
                    part = ds.FileSystemDataset(fragments, schema, parquet, filesystem)
                parts.append(part)
            dataset = parts[0] if len(parts) == 1 else ds.dataset(parts)
            cached = self._datasets[spec.name] = ((files, sizes), dataset)
        return cached[1]

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB cursor of the store's in-process database, for work on rows already
        read, such as formatting a result: cheaper than a database of its own (about
        15 ms). It reads no file; close it when done."""
        return self._db.cursor()

    @contextmanager
    def reading(
        self,
        *,
        modules: Sequence[str] = (),
        query: str | None = None,
        runs: Sequence[str] | None = None,
        files: Mapping[str, Sequence[str]] | None = None,
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """A DuckDB cursor over the store's current views, for work of several statements
        (temporary tables included): the files it reads stay in place until it closes. A
        read that fails on a corrupt file raises a ``CorruptFileError`` naming it.
        The SQL modules named in ``modules`` are installed, with what they need, their tables
        holding what is committed now (as for a query naming them in ``sql``). With
        ``query``, the statement the work will run, the cursor gets only those and the
        modules ``query`` names (as ``sql`` would install for it); without, every module
        of views too, for statements not known yet. With
        ``runs``, the views hold those runs only, and listing and reading cost what they
        would in a store of those runs alone. With ``files`` too (paths by table, listed
        before in commit order, committing tables first), the tables named there read
        exactly those files and the others no rows: work in several steps, such as a
        compaction, then sees one snapshot of those runs."""
        if files is not None and runs is None:
            raise StoreError("reading given files needs the runs they belong to (runs=...)")
        with self._reading(query, modules, runs, files) as (cursor, _):
            yield cursor

    @contextmanager
    def _reading(
        self,
        query: str | None,
        modules: Sequence[str],
        runs: Sequence[str] | None,
        files: Mapping[str, Sequence[str]] | None = None,
        *,
        native: bool = False,
    ) -> Iterator[tuple[duckdb.DuckDBPyConnection, frozenset[str]]]:
        """``reading``'s cursor, and the tables it reads as datasets (none with
        ``native``: see ``_point``)."""
        with self._unswapped():
            cursor = self._db.cursor()
            try:
                with self._views:
                    try:
                        datasets = self._point(cursor, runs, native, given=files)
                    except (pa.ArrowException, OSError) as exc:
                        raise self._culprit(runs) or QueryError(
                            f"cannot read the store's files: {exc}"
                        ) from exc
                    self._modules.prepare(
                        cursor,
                        query,
                        modules,
                        scoped=runs is not None,
                        kept=self._kept if files is None else None,
                    )
                yield cursor, datasets
            except (duckdb.Error, pa.ArrowException) as exc:
                # Whoever reads through the cursor: a file that cannot be read is
                # named, whatever DuckDB or pyarrow said about it.
                culprit = self._culprit(runs) if _reading_failed(exc) else None
                if culprit is None:
                    raise
                raise culprit from exc
            finally:
                cursor.close()

    def _has_big_table(self) -> bool:
        """Whether a table has more files than DuckDB's reader reads for an unscoped
        query (``NATIVE_MAX_FILES``), so that it would be read as a pyarrow dataset, which
        costs its import and making: as the last whole-store listing found, else as the
        record of verified files says (a store's first query in a big store then lists
        none of it before its plan may pin it to its runs), else as a listing made now
        (which the query's listing then reuses). Only a choice of reading: a wrong
        answer costs time, never rows."""
        if self._big is None:
            recorded = self._record.files_per_table() if self._record is not None else {}
            self._big = _big(recorded.values()) or _big(map(len, self._catalog.files().values()))
        return self._big

    def _read_plan(
        self, query: str, params: Sequence[Any] | Mapping[str, Any] | None
    ) -> tuple[list[str] | None, bool]:
        """What the plan of ``query`` says of its reading: the runs it is pinned to, and,
        where it is pinned to none, whether it reads whole tables.

        Pinned: DuckDB's plan filters every scan of a table of runs to constant run ids
        (``run_id = 'r'``, an ``IN`` list or ``OR`` of them) or the table has no file: the
        rows of other runs then cannot change its answer, so it reads as a query scoped to
        those runs does (their files only, listed, checked and read natively). Whole: no
        scan is filtered on a partition column, so it is read by DuckDB's own reader from
        the start: a dataset of a big table (its import and making, then a second plan,
        see ``_dataset_filtered``) would only give way to it.

        Planned before its views point at any file, over the empty tables (with the
        optimizer rules that would fold their scans away turned off); the plan's reading
        is remembered per text without parameters. A local store plans any query but one
        that builds tables from the data; a remote one only a query naming ``run_id`` (it
        reads datasets either way). No runs and not whole for any other query, and for one
        that cannot be planned."""
        key = ("pinned", query)
        found = self._plans.get(key)
        if found is None:
            found = self._pinned_scans(query, params)
            if params is None:
                self._remember(key, found)
        runs, loose, whole = found
        if not runs or (loose and self._catalog.files(tables=loose)):
            return None, whole
        return sorted(runs), False

    def _pinned_scans(
        self, query: str, params: Sequence[Any] | Mapping[str, Any] | None
    ) -> tuple[set[str], list[TableSpec], bool]:
        """``_read_plan``'s plan read: the runs its scans of tables of runs are filtered
        to, the tables of runs it scans unfiltered (no runs: nothing is pinned), and
        whether no scan is filtered on a partition column."""
        names = query_names(query)
        planned = "run_id" in names or self._location.is_local
        if not planned or self._modules.reads_data(names):
            return set(), [], False
        cursor = self._db.cursor()
        try:
            for spec in TABLES.values():
                cursor.execute(_raw_view(spec, f"empty_{spec.name}", temp=True))
            # Discards hide invocations of their own run only: whatever they hold, a query
            # pinned to runs reads their invocations as the whole store does.
            cursor.execute(_invocations_view(False, True))
            with self._views:
                self._modules.prepare(cursor, query)
                # A setting of the whole database: on for the plan only (a query another
                # thread runs meanwhile is planned without them, slower, not otherwise).
                cursor.execute(f"SET disabled_optimizers = '{_KEPT_SCANS}'")
                try:
                    scans = _plan_scans(cursor, query, params)
                finally:
                    cursor.execute("RESET disabled_optimizers")
        finally:
            cursor.close()
        runs: set[str] = set()
        loose: list[TableSpec] = []
        if scans is None:
            return runs, loose, False
        whole = not any(_PARTITION_FILTER.search(str(info.get("Filters", ""))) for info in scans)
        for info in scans:
            if "Function" in info:
                return set(), [], False  # a table function
            table = str(info["Table"]).rpartition(".")[2]
            if not table.startswith("empty_"):
                continue  # a setting's table (the clock correction's): none is built from data
            spec = TABLES[table.removeprefix("empty_")]
            if spec.partition_by[0] != "run_id":
                continue  # a scoped query reads the other tables whole
            pinned = _pinned_runs(info.get("Filters"))
            if pinned is None:
                loose.append(spec)
            else:
                runs |= pinned
        return runs, loose, whole

    def _dataset_filtered(
        self,
        cursor: duckdb.DuckDBPyConnection,
        query: str,
        params: Sequence[Any] | Mapping[str, Any] | None,
        datasets: frozenset[str],
    ) -> bool:
        """Whether DuckDB's plan of ``query`` hands every dataset scan a filter on a
        partition column. If not, the query reads whole tables, which DuckDB's own reader
        scans about twice as fast; a query that cannot be explained (not a SELECT) keeps
        the datasets. Remembered per text: its plan, hence the choice, is the same for
        every run of it."""
        key = (query, datasets)
        if key not in self._plans:
            scans = _plan_scans(cursor, query, params)
            self._remember(
                key,
                scans is None
                or all(
                    any(
                        f'"{column}"' in str(info.get("Filters", "")) for column in _PARTITION_TYPES
                    )
                    for info in scans
                    if "ARROW_SCAN" in str(info.get("Function", ""))
                ),
            )
        return self._plans[key]

    def _remember(self, key: tuple[str, Any], choice: Any) -> None:
        if len(self._plans) >= PLAN_CHECKS_KEPT:
            self._plans.clear()
        self._plans[key] = choice

    @contextmanager
    def _unswapped(self) -> Iterator[None]:
        """Hold a local store's lock shared, once no swap is left half done (finishing any
        first): a compaction renames and unlinks no file until the block ends, so the files
        listed inside it stay there to be read. A remote store has no lock."""
        while True:
            with self._lock.shared() if self._lock else nullcontext():
                if self._lock is None or not pending(self.root):
                    yield
                    return
            recover(self.root, self.lock)

    def sql(
        self,
        query: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        runs: Sequence[str] | None = None,
    ) -> pa.Table:
        """Run one SQL statement over the store's views; return its rows as Arrow.

        ``runs`` scopes the query to those runs (see ``reading``): the way to query a
        set of runs chosen at run time, which a ``WHERE run_id IN (subquery)`` cannot
        prune. A query whose plan pins every scan to constant run ids (``WHERE run_id =
        '...'``) is read as scoped to them (``_read_plan``). Raises ``QueryError`` with
        DuckDB's reason when the query cannot run.
        """
        try:
            # A remote store reads every table as a dataset, after listing all of it.
            whole = False
            if runs is None and (not self._location.is_local or self._has_big_table()):
                runs, whole = self._read_plan(query, params)
            native = whole and self._location.is_local
            with self._reading(query, (), runs, native=native) as (cursor, datasets):
                if (
                    datasets
                    and self._location.is_local
                    and not self._dataset_filtered(cursor, query, params, datasets)
                ):
                    with self._views:  # it scans whole tables: the native reader is faster
                        self._point(cursor, runs, native=True)
                result = cursor.sql(query, params=params)
                return pa.table({}) if result is None else result.to_arrow_table()
        except duckdb.Error as exc:
            raise query_error(exc) from exc
        except pa.ArrowException as exc:
            raise QueryError(f"query failed: {exc}") from exc

    def select_runs(self, selector: RunSelector | str) -> list[str]:
        """The ids of the runs a selector (``RunSelector`` or its text) selects, oldest
        first; ``SelectorError`` when it selects none."""
        return self._select(selector, "runs")

    def select_traces(self, selector: RunSelector | str) -> list[str]:
        """The source ids of the outer traces a selector selects (``run:`` a source id,
        ``label:``, ``tag:``, ``since:``/``until:`` their ingest time, ``latest:``)."""
        return self._select(selector, "traces")

    def _select(self, selector: RunSelector | str, of: str) -> list[str]:
        if isinstance(selector, str):
            selector = RunSelector.parse(selector)
        query, params = selector.sql(of)
        ids = self.sql(query, params)["id"].to_pylist()
        if not ids:
            table = "runs" if of == "runs" else "trace_sources"
            total = self.sql(f"SELECT count(*) AS n FROM {table}").to_pylist()[0]["n"]
            raise SelectorError(f"selector {selector} selects none of the {total} {of} in {self}")
        absent = self.sql(*selector.absent_sql(of))["term"].to_pylist()
        if absent:
            raise selector.absent_error(absent, str(self), of)
        return ids

    def close(self) -> None:
        """Release the DuckDB connection and remove its spill directory."""
        self._resources.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"


def open_store(
    where: Path | str | None = None,
    *,
    create: bool = True,
    filesystem: pafs.FileSystem | None = None,
) -> Store:
    """Open the store at ``where``: a directory or a URI such as ``s3://bucket/prefix``
    (default ``$MCPROF_STORE`` or ``./mcprof-store``), or a path on ``filesystem``.

    With ``create=False`` a missing store is an error instead of a new empty one.
    """
    return Store(
        default_store_path() if where is None else where, create=create, filesystem=filesystem
    )


_PARTITION_FILTER = re.compile(rf'\b"?(?:{"|".join(_PARTITION_TYPES)})"?\b')
"""A partition column named in a scan's filters."""
_KEPT_SCANS = "statistics_propagation,empty_result_pullup"
"""The optimizer rules that would fold a plan's scans of empty tables away."""
_RUN = r"'([A-Za-z0-9._-]+)'"
_PINNED = re.compile(
    r"(?:optional: )?(?:"
    rf'\("?run_id"? = {_RUN}\)'
    rf'|\("?run_id"? IN \({_RUN}(?:, {_RUN})*\)\)'
    rf'|\(\("?run_id"? = {_RUN}\)(?: OR \("?run_id"? = {_RUN}\))+\)'
    ")"
)
"""One of a scan's filters that pins its rows to constant run ids, as DuckDB's JSON plan
writes it. An ``optional:`` one is a copy, for pruning, of a filter that DuckDB applies
right above the scan: what it lets through is all the query uses of the scan too."""


def _big(counts: Iterable[int]) -> bool:
    """Whether a table of these file counts has more than ``NATIVE_MAX_FILES`` files."""
    return any(count > NATIVE_MAX_FILES for count in counts)


def _plan_scans(
    cursor: duckdb.DuckDBPyConnection,
    query: str,
    params: Sequence[Any] | Mapping[str, Any] | None,
) -> list[dict[str, Any]] | None:
    """What DuckDB's plan of ``query`` says of each scan (``Table`` or ``Function``, and
    its ``Filters``); None for a query it cannot explain (not a SELECT)."""
    try:
        found = cursor.sql(f"EXPLAIN (FORMAT json) {query}", params=params).fetchall()
        plan = json.loads(found[0][1])
    except (duckdb.Error, IndexError, ValueError):
        return None
    scans = []
    pending: list[Any] = [plan]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
        elif isinstance(node, dict):
            info = node.get("extra_info")
            if isinstance(info, dict) and ("Table" in info or "Function" in info):
                scans.append(info)
            pending.extend(node.values())
    return scans


def _pinned_runs(filters: Any) -> set[str] | None:
    """The run ids a scan's filters (one, or a list of conjuncts) let through, if one of
    them pins ``run_id`` to constants (several: those all of them let through)."""
    found = None
    for conjunct in [filters] if isinstance(filters, str) else filters or []:
        if _PINNED.fullmatch(str(conjunct)):
            runs = set(re.findall(_RUN, str(conjunct)))
            found = runs if found is None else found & runs
    return found


def _reading_failed(exc: Exception) -> bool:
    """Whether a query's error may come from a store file that cannot be read (a failed
    page checksum, a broken footer), rather than from its SQL."""
    if isinstance(exc, (duckdb.IOException, duckdb.InvalidInputException, pa.ArrowException)):
        return True
    text = str(exc).lower()
    return any(word in text for word in ("parquet", "checksum", "arrow scan"))


def _check_marker(location: StoreLocation) -> None:
    """Refuse a store whose marker is not ``{"format": FORMAT_VERSION}``, naming the
    marker and what is wrong with it."""
    marker = location.join(MARKER)
    with store_write(f"open the store at {location}"):
        data = location.read_bytes(MARKER)
    try:
        content = json.loads(data)
    except ValueError as exc:
        raise StoreError(
            f"the store marker {marker} is not JSON ({exc}); it must hold "
            f'{{"format": {FORMAT_VERSION}}}'
        ) from None
    if not isinstance(content, dict):
        raise StoreError(
            f"the store marker {marker} holds {_json_kind(content)}, not a JSON object such as "
            f'{{"format": {FORMAT_VERSION}}}'
        )
    if "format" not in content:
        raise StoreError(f'the store marker {marker} names no format (no "format" key)')
    version = content["format"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise StoreError(
            f"the store marker {marker} gives the format as {_json_kind(version)} "
            f"({json.dumps(version)}), not a number: this version reads format {FORMAT_VERSION}"
        )
    if version != FORMAT_VERSION:
        raise StoreError(
            f"{location} is a store of format {version}; this version reads {FORMAT_VERSION}"
        )


def _json_kind(value: object) -> str:
    """What JSON value ``value`` is, in words: ``a string``, ``an array``."""
    kinds = ((bool, "a boolean"), (str, "a string"), (int, "an integer"), (float, "a number"))
    kinds += ((list, "an array"), (dict, "an object"), (type(None), "null"))
    return next(word for kind, word in kinds if isinstance(value, kind))


def _with_empty(spec: TableSpec, source: str) -> str:
    """The table's columns, typed, from ``source``: by name with the typed empty table, so
    that a column no file has yet reads NULL."""
    columns = ", ".join(sql_identifier(c) for c in spec.columns)
    return (
        f"SELECT {columns} FROM (SELECT * FROM empty_{spec.name} "
        f"UNION ALL BY NAME SELECT * FROM {source})"
    )


def _init_local(root: Path, create: bool) -> None:
    """Make the directory a store if it is new and empty; refuse any other directory.

    Processes that open a new store at once (the ranks of a job) all make it: each writes
    the same marker aside and renames it into place. What another is doing meanwhile (its
    lock file, its marker aside) does not make the directory someone else's, and once the
    marker is there, it is a store whatever else has been written since."""
    marker = root / MARKER
    if not root.exists():
        if not create:
            raise StoreError(f"no store at {root} (nothing has been written there yet)")
        root.mkdir(parents=True, exist_ok=True)
    if not root.is_dir():
        raise StoreError(f"{root} is not a directory, so it cannot hold a store")
    if not marker.exists():
        foreign = any(not _made_by_creation(entry.name) for entry in root.iterdir())
        if marker.exists():  # another process made it, and may have written since
            return
        if foreign or not create:
            raise StoreError(f"{root} is not a multicore_profiler store (no {MARKER} in it)")
        aside = root / f".{MARKER}.{os.getpid()}.tmp"
        try:
            (root / LOCK_FILE).touch()
            aside.write_text(json.dumps({"format": FORMAT_VERSION}) + "\n")
            os.replace(aside, marker)
        finally:
            aside.unlink(missing_ok=True)


def _made_by_creation(name: str) -> bool:
    """Whether a file at a store's root is one that making the store writes."""
    return name in (MARKER, LOCK_FILE) or (name.startswith(f".{MARKER}.") and name.endswith(".tmp"))


def _init_remote(location: StoreLocation, create: bool) -> None:
    """Write the marker of a new store under an empty prefix; refuse a prefix that holds
    other files. Two ranks creating the store at once write the same marker; one that
    finds the other's marker (and what it wrote after) in its listing has a store."""
    if location.info(MARKER).type == pafs.FileType.File:
        return
    if not create:
        raise StoreError(f"no store at {location} (nothing has been written there yet)")
    listed = location.files()
    if any(info.base_name == MARKER for info in listed):
        return
    if listed:
        raise StoreError(f"{location} is not a multicore_profiler store (no {MARKER} in it)")
    location.write_bytes(MARKER, (json.dumps({"format": FORMAT_VERSION}) + "\n").encode())
