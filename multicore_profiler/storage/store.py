"""The store: a directory of hive-partitioned Parquet files, queried through DuckDB views.

``open_store(path)`` returns a ``Store``; ``Store.sql(query)`` returns a
``pyarrow.Table``. Views (``runs``, ``invocations``, ``cores``, ``records``,
``records_ns``, ``stage_stats``, ``run_summary``) span every run in the store and
are re-listed at each query, so rows written by other processes appear as soon as
their files do.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.errors import QueryError, SelectorError, StoreError
from multicore_profiler.storage.compact import CompactionReport, compact
from multicore_profiler.storage.compare import Comparison, compare
from multicore_profiler.storage.kernel_rules import (
    KernelRules,
    build_kernel_tables,
    mentions_kernel_views,
)
from multicore_profiler.storage.partitions import glob_pattern, write_partition
from multicore_profiler.storage.runs import RunInfo
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
from multicore_profiler.storage.selectors import RunSelector
from multicore_profiler.storage.sql_text import sql_identifier, sql_string
from multicore_profiler.storage.swap import LOCK_FILE, StoreLock, pending, recover

STORE_ENV = "MCPROF_STORE"
DEFAULT_STORE = "mcprof-store"
MARKER = "mcprof-store.json"
FORMAT_VERSION = 1

_HIVE_TYPES = {"run_id": "VARCHAR", "step": "BIGINT", "source_id": "VARCHAR"}
_PARTITION_TYPES = {"run_id": pa.string(), "step": pa.int64(), "source_id": pa.string()}


def default_store_path() -> Path:
    """``$MCPROF_STORE`` if set, else ``./mcprof-store``."""
    return Path(os.environ.get(STORE_ENV) or DEFAULT_STORE)


def _empty_table(spec: TableSpec) -> pa.Table:
    """A typed, empty table with the columns a query sees (partition keys first)."""
    fields = [pa.field(k, _PARTITION_TYPES[k]) for k in spec.partition_by]
    for field in spec.schema:
        kind = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
        fields.append(pa.field(field.name, kind))
    return pa.schema(fields).empty_table()


class Store:
    """A multicore_profiler store rooted at a directory; see ``open_store``."""

    def __init__(self, root: Path | str, *, create: bool = True) -> None:
        root = Path(root).expanduser().absolute()
        marker = root / MARKER
        if not root.exists():
            if not create:
                raise StoreError(f"no store at {root} (nothing has been written there yet)")
            root.mkdir(parents=True, exist_ok=True)
        if not root.is_dir():
            raise StoreError(f"{root} is not a directory, so it cannot hold a store")
        if not marker.exists():
            if any(root.iterdir()) or not create:
                raise StoreError(f"{root} is not a multicore_profiler store (no {MARKER} in it)")
            (root / LOCK_FILE).touch()
            aside = root / f".{MARKER}.{os.getpid()}.tmp"
            aside.write_text(json.dumps({"format": FORMAT_VERSION}) + "\n")
            os.replace(aside, marker)
        version = json.loads(marker.read_text()).get("format")
        if version != FORMAT_VERSION:
            raise StoreError(
                f"{root} is a store of format {version}; this version reads {FORMAT_VERSION}"
            )
        self._root = root
        self._lock = StoreLock(root)
        self._views = threading.Lock()
        self._db = duckdb.connect()
        self._db.execute("SET enable_progress_bar = false; SET TimeZone = 'UTC'")
        self._pointed: dict[str, bool] = {}
        for spec in TABLES.values():
            self._db.from_arrow(_empty_table(spec)).create(f"empty_{spec.name}")
        self._point()
        self._db.execute(resources.files(__package__).joinpath("views.sql").read_text())
        # The kernel-level views are installed by the first query that names one: most
        # uses of a store never do, and installing them costs a tenth of a second.
        self._kernel_rules = KernelRules()
        self._kernel_views_installed = False
        self._kernel_tables_of: list[tuple[str, int]] | None = None

    @property
    def root(self) -> Path:
        """The store's directory."""
        return self._root

    @property
    def lock(self) -> StoreLock:
        """The lock queries share and file swaps (compaction) take alone."""
        return self._lock

    @property
    def kernel_rules(self) -> KernelRules:
        """The rules the kernel-level views (``kernels``, ``steps``, ...) apply now."""
        return self._kernel_rules

    def use_kernel_rules(self, rules: KernelRules | None = None) -> None:
        """Apply ``rules`` (default: the built-in ones) to the kernel-level views of this
        ``Store`` object, for every query after this call."""
        rules = KernelRules() if rules is None else rules
        with self._views:
            rules.check(self._db)
            self._kernel_rules = rules
            self._kernel_views_installed = False

    def compact(self, run_ids: Sequence[str] | None = None) -> CompactionReport:
        """Merge each partition's small files into one (default: every run); see ``compact``."""
        return compact(self, run_ids)

    def _has_files(self, spec: TableSpec) -> bool:
        relative = Path(glob_pattern(self._root, spec)).relative_to(self._root)
        return next(self._root.glob(str(relative)), None) is not None

    def _point(self) -> None:
        """Define each ``raw_<table>`` over the table's files, or over an empty table while
        it has none (DuckDB refuses a glob that matches nothing); only what changed."""
        for spec in TABLES.values():
            has_files = self._has_files(spec)
            if self._pointed.get(spec.name) == has_files:
                continue
            columns = ", ".join(sql_identifier(c) for c in spec.columns)
            source = f"empty_{spec.name}"
            if has_files:
                types = ", ".join(f"{sql_string(k)}: {_HIVE_TYPES[k]}" for k in spec.partition_by)
                files = (
                    f"read_parquet({sql_string(glob_pattern(self._root, spec))}, "
                    f"hive_partitioning = true, hive_types = {{{types}}}, union_by_name = true)"
                )
                # By name with the typed empty table: a column no file has yet reads NULL.
                source = f"(SELECT * FROM {source} UNION ALL BY NAME SELECT * FROM {files})"
            self._db.execute(
                f"CREATE OR REPLACE VIEW raw_{spec.name} AS SELECT {columns} FROM {source}"
            )
            self._pointed[spec.name] = has_files

    def _build_kernel_tables(self) -> None:
        """Install the kernel-level views (which builds their tables) if they are not, else
        rebuild their tables if the committed traces changed since they were built."""
        committed = self._db.execute(
            "SELECT source_id, write_id FROM trace_sources ORDER BY ALL"
        ).fetchall()
        if not self._kernel_views_installed:
            self._kernel_rules.install(self._db)
            self._kernel_views_installed = True
        elif committed != self._kernel_tables_of:
            build_kernel_tables(self._db)
        self._kernel_tables_of = committed

    @contextmanager
    def reading(self, *, kernel_views: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A DuckDB cursor over the store's current views, for work of several statements
        (temporary tables included): the files it reads stay in place until it closes.
        With ``kernel_views``, the kernel-level tables hold the traces committed now."""
        while True:
            with self._lock.shared():
                if not pending(self._root):
                    with self._views:
                        self._point()
                        if kernel_views:
                            self._build_kernel_tables()
                    cursor = self._db.cursor()
                    try:
                        yield cursor
                    finally:
                        cursor.close()
                    return
            recover(self._root, self._lock)

    def sql(self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pa.Table:
        """Run one SQL statement over the store's views; return its rows as Arrow.

        Raises ``QueryError`` with DuckDB's reason when the query cannot run.
        """
        try:
            with self.reading(kernel_views=mentions_kernel_views(query)) as cursor:
                result = cursor.sql(query, params=params)
                return pa.table({}) if result is None else result.to_arrow_table()
        except duckdb.Error as exc:
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
        return ids

    def compare(
        self,
        base: RunSelector | str | Sequence[str],
        head: RunSelector | str | Sequence[str],
        **options: Any,
    ) -> Comparison:
        """Compare the records of two sets of runs group by group; see ``compare``."""
        return compare(self, base, head, **options)

    def write_run(self, run: RunInfo) -> None:
        """Record a run's current state (a newer row for the same run supersedes older ones)."""
        write_partition(self._root, RUNS, {"run_id": run.run_id}, run.to_table())

    def write_step(
        self,
        run_id: str,
        step: int,
        *,
        invocations: pa.Table,
        cores: pa.Table,
        records: pa.Table,
    ) -> int:
        """Write one step's invocations with their cores and records; return the write id.

        Cores and records are written first and the invocations last, all stamped with
        a fresh ``write_id``: until the invocations' file exists, no view shows the
        step's rows, so a writer that dies half-way leaves nothing a query sees, even
        after a retry writes the same invocation ids.
        """
        if invocations.num_rows == 0:
            raise StoreError("a step needs at least one invocation")
        steps = pc.unique(invocations["step"]).to_pylist()
        if steps != [step]:
            raise StoreError(f"invocations written to step {step} carry steps {steps}")
        for name, table in (("cores", cores), ("records", records)):
            for key in ("rank", "invocation_id"):
                if key in table.column_names and not _within(table[key], invocations[key]):
                    raise StoreError(f"{name} rows name a {key} that no invocation of the step has")
        write_id = pa.scalar(secrets.randbits(63), pa.int64())
        partition = {"run_id": run_id, "step": step}
        for spec, table in ((RECORDS, records), (CORES, cores), (INVOCATIONS, invocations)):
            if table.num_rows or spec is INVOCATIONS:
                stamped = table.append_column("write_id", pa.repeat(write_id, table.num_rows))
                write_partition(self._root, spec, partition, stamped)
        return write_id.as_py()

    def write_tasks(self, run_id: str, tasks: pa.Table) -> Path:
        """Write task graphs (rows of the ``tasks`` table) of a run; return the file.

        A graph is keyed by (rank, config_id); writing one again (a retry) adds no row
        to the ``tasks`` view.
        """
        if tasks.num_rows == 0:
            raise StoreError("no task to write")
        return write_partition(self._root, TASKS, {"run_id": run_id}, tasks)

    def discard_writes(
        self,
        run_id: str,
        rank: int,
        write_ids: Sequence[int],
        *,
        window_id: int | None = None,
        reason: str = "",
    ) -> None:
        """Withdraw committed step writes of a rank: one file, after which no view shows
        any of their rows (all of them disappear at once)."""
        if not write_ids:
            return
        count = len(write_ids)
        rows = pa.table(
            {
                "rank": pa.repeat(pa.scalar(rank, pa.int32()), count),
                "write_id": pa.array(write_ids, pa.int64()),
                "window_id": pa.repeat(pa.scalar(window_id, pa.int64()), count),
                "discarded_at": pa.repeat(pa.scalar(datetime.now(timezone.utc)), count),
                "reason": pa.repeat(pa.scalar(reason, pa.string()), count),
            }
        )
        write_partition(self._root, DISCARDS, {"run_id": run_id}, rows)

    def close(self) -> None:
        """Release the DuckDB connection."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self._root)!r})"


def _within(values: pa.ChunkedArray, allowed: pa.ChunkedArray) -> bool:
    """Whether every value is one of ``allowed``: by min and max when ``allowed`` is a
    range of integers without holes (the usual case), else by lookup."""
    allowed = pc.unique(allowed)
    low, high = pc.min_max(allowed).values()
    if low.is_valid and high.as_py() - low.as_py() + 1 == len(allowed):
        seen = pc.min_max(values)
        return len(values) == 0 or (
            seen["min"].as_py() >= low.as_py() and seen["max"].as_py() <= high.as_py()
        )
    return pc.all(pc.is_in(values, value_set=allowed)).as_py() is not False


def open_store(path: Path | str | None = None, *, create: bool = True) -> Store:
    """Open the store at ``path`` (default ``$MCPROF_STORE`` or ``./mcprof-store``).

    With ``create=False`` a missing store is an error instead of a new empty one.
    """
    return Store(default_store_path() if path is None else path, create=create)
