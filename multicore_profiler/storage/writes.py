"""What adds rows to a store: runs, steps, task graphs, discards.

``StoreWrites(location)`` writes files and reads none, so it needs no DuckDB,
``pyarrow.dataset``, pandas or torch: a writer process that only adds a job's steps
imports this module alone (``Store`` is a ``StoreWrites`` that also reads). The location is
that of a store already made (``Store.location``); it pickles, so it can be sent to that
process.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa

from multicore_profiler.errors import StoreError
from multicore_profiler.limits import INT64_MAX
from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.partitions import check_run_id, write_partition
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.schema import (
    CORES,
    DISCARDS,
    GROUPED,
    INVOCATIONS,
    OPTIONAL_COLUMNS,
    RECORDS,
    RUNS,
    TASKS,
    TableSpec,
)

_STEP_KEYS = ("rank", "invocation_id")
"""The columns by which a step's cores and records name their invocation."""


@dataclass(frozen=True)
class StagedStep:
    """A step whose cores and records are written and whose invocations are not yet:
    ``StoreWrites.commit`` writes them."""

    write_id: int
    invocations: pa.Table
    """The step's invocation rows, stamped with its write id."""


@dataclass(frozen=True)
class StepRows:
    """One step's rows, for ``StoreWrites.stage_steps``."""

    step: int
    invocations: pa.Table
    cores: pa.Table
    records: pa.Table
    write_id: int | None = None


_WRITE_IDS = random.Random()
"""Seeded from the OS, and again in a forked child; a job's own seeding of ``random``
cannot touch it. It draws without a system call, which ``secrets`` makes per id (a
capture session draws one per step, on the job's thread)."""
os.register_at_fork(after_in_child=_WRITE_IDS.seed)


def new_write_id() -> int:
    """A write id no other write will draw (63 random bits)."""
    return _WRITE_IDS.getrandbits(63)


class StoreWrites:
    """The write methods of the store at ``location``; see the module docstring."""

    def __init__(self, location: StoreLocation) -> None:
        self._location = location

    @property
    def location(self) -> StoreLocation:
        """Where the store lives: its filesystem, base path and URI."""
        return self._location

    def write_file(
        self,
        spec: TableSpec,
        values: Mapping[str, object],
        table: pa.Table | Iterable[pa.Table],
        *,
        durable: bool = True,
    ) -> str:
        """Add one file of rows to a partition of ``spec``'s table (``write_partition``,
        which says what ``durable`` means); return its path. The writes of this object and
        the ingest room's go through here, so that a ``Store`` knows its own files
        (``_wrote``)."""
        path = write_partition(self._location, spec, values, table, durable=durable)
        self._wrote(path)
        return path

    def _wrote(self, path: str) -> None:
        """A file this object has just written: nothing to note here, as a writer reads
        none and keeps no list that grows with a job's steps; a ``Store``, which reads,
        notes it (``Store._wrote``)."""

    def write_run(self, run: RunInfo) -> None:
        """Record a run's current state (a newer row for the same run supersedes older ones)."""
        self.write_file(RUNS, {"run_id": run.run_id}, run.to_table())

    def write_step(
        self,
        run_id: str,
        step: int,
        *,
        invocations: pa.Table,
        cores: pa.Table,
        records: pa.Table,
        write_id: int | None = None,
    ) -> int:
        """Write one step's invocations with their cores and records; return the write id.

        ``stage_step`` then ``commit`` of that one step: until the invocations' file
        exists, no view shows the step's rows, so a writer that dies half-way leaves
        nothing a query sees, even after a retry writes the same invocation ids.
        """
        staged = self.stage_step(
            run_id, step, invocations=invocations, cores=cores, records=records, write_id=write_id
        )
        self.commit(run_id, [staged])
        return staged.write_id

    def stage_step(
        self,
        run_id: str,
        step: int,
        *,
        invocations: pa.Table,
        cores: pa.Table,
        records: pa.Table,
        write_id: int | None = None,
    ) -> StagedStep:
        """Write one step's cores and records, which no view shows until ``commit`` writes
        the invocations returned; return them with the write id.

        Every row is stamped with a fresh ``write_id`` (or the one given: a capture
        session picks it, so that it can withdraw the step even if its writer dies before
        saying it was written). A capture session stages each step of a window as it comes
        (or a group of them, ``stage_steps``) and commits the window's steps together at its
        end: a window shows whole or not at all.

        Durability: only the invocations file, the commit, is flushed to disk (the file,
        then its directory after the rename). The cores and records files are renamed into
        place without a flush of their own. A process crash (the writer's or the job's)
        loses nothing committed: the files of a committed step are in the kernel's page
        cache, which outlives the process. Only a power cut (or a kernel crash) before the
        page cache is written back can lose the cores and records files of the last steps
        committed, whose invocations then show without them.
        """
        staged, rows = self._stamped_step(
            run_id, StepRows(step, invocations, cores, records, write_id)
        )
        partition = {"run_id": run_id, "step": step}
        for spec, table in zip((RECORDS, CORES), rows, strict=True):
            if table.num_rows:
                self.write_file(spec, partition, table, durable=False)
        return staged

    def stage_steps(self, run_id: str, steps: Sequence[StepRows]) -> list[StagedStep]:
        """Write the cores and records of several steps of a run as one file per table
        (``GROUPED``: a ``step`` column, the steps' rows contiguous and in the order
        given), which no view shows until ``commit`` writes the invocations returned.

        Each step is checked and stamped as ``stage_step`` does, with its own write id; a
        capture writer groups the steps of one window only, so a withdrawn window withdraws
        whole files. Two files for the group instead of two a step: a file's fixed cost
        (its Parquet writer, its directory entry) is most of what a small step costs to
        write. Durable as ``stage_step``'s files are."""
        if not steps:
            raise StoreError("no step to stage")
        staged, grouped = [], ([], [])
        for step in steps:
            done, rows = self._stamped_step(run_id, step)
            staged.append(done)
            for tables, table in zip(grouped, rows, strict=True):
                if table.num_rows:
                    number = pa.repeat(pa.scalar(step.step, pa.int64()), table.num_rows)
                    tables.append(table.add_column(0, "step", number))
        for spec, tables in zip((RECORDS, CORES), grouped, strict=True):
            if tables:
                table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
                self.write_file(GROUPED[spec.name], {"run_id": run_id}, table, durable=False)
        return staged

    def _stamped_step(
        self, run_id: str, given: StepRows
    ) -> tuple[StagedStep, tuple[pa.Table, pa.Table]]:
        """A step's rows checked and stamped with its write id: its staged invocations,
        and its records and cores as their files hold them."""
        import pyarrow.compute as pc  # not at import: reading commands never write

        step, invocations, write_id = given.step, given.invocations, given.write_id
        check_run_id(run_id)
        if invocations.num_rows == 0:
            raise StoreError("a step needs at least one invocation")
        steps = pc.unique(invocations["step"]).to_pylist()
        if steps != [step]:
            raise StoreError(f"invocations written to step {step} carry steps {steps}")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise StoreError(f"step must be a non-negative integer, got {step!r}")
        allowed: dict[str, _Allowed] = {}  # each made once, for both tables
        for name, table in (("cores", given.cores), ("records", given.records)):
            for key in _STEP_KEYS:
                if not _has(table, key):
                    continue
                if key not in allowed:
                    allowed[key] = _Allowed(invocations[key])
                if not allowed[key].holds(table[key]):
                    raise StoreError(f"{name} rows name a {key} that no invocation of the step has")
        if write_id is None:
            write_id = new_write_id()
        elif (
            isinstance(write_id, bool)
            or not isinstance(write_id, int)
            or not (0 <= write_id <= INT64_MAX)
        ):
            raise StoreError(f"a write id is a non-negative int64, got {write_id!r}")
        rows = (
            _stamped(given.records, RECORDS, write_id),
            _stamped(_completed(given.cores, CORES), CORES, write_id),
        )
        # A writer's rows are their own origin (only a compaction rewrites them).
        if _has(invocations, "origin_write_id"):
            invocations = invocations.drop_columns(["origin_write_id"])
        stamped = _insert(
            _stamped(_completed(invocations, INVOCATIONS), INVOCATIONS, write_id),
            INVOCATIONS,
            "origin_write_id",
            pa.nulls(invocations.num_rows, pa.int64()),
        )
        return StagedStep(write_id, stamped), rows

    def commit(self, run_id: str, steps: Sequence[StagedStep]) -> None:
        """Commit staged steps of a run with one invocations file: every view shows all
        of their rows from the moment it is renamed into place, none of them before."""
        if not steps:
            raise StoreError("no staged step to commit")
        tables = [s.invocations for s in steps]
        rows = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        self.write_file(INVOCATIONS, {"run_id": run_id}, rows)

    def write_tasks(self, run_id: str, tasks: pa.Table) -> str:
        """Write task graphs (rows of the ``tasks`` table) of a run; return the file.

        A graph is keyed by (rank, config_id); writing one again (a retry) adds no row
        to the ``tasks`` view.
        """
        if tasks.num_rows == 0:
            raise StoreError("no task to write")
        return self.write_file(TASKS, {"run_id": run_id}, _completed(tasks, TASKS))

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
                "replaced_by": pa.nulls(count, pa.int64()),
                "origin_write_id": pa.nulls(count, pa.int64()),
                "generation": pa.nulls(count, pa.int32()),
            }
        )
        self.write_file(DISCARDS, {"run_id": run_id}, rows)

    def __repr__(self) -> str:
        return f"StoreWrites({self._location.uri!r})"


class _Allowed:
    """The values of an invocations column a step's other rows may take, checked by min
    and max when they are a range of integers without holes (the usual case), else by
    lookup."""

    def __init__(self, allowed: pa.ChunkedArray) -> None:
        import pyarrow.compute as pc  # not at import: reading commands never write

        self._values = pc.unique(allowed)
        low, high = pc.min_max(self._values).values()
        whole = low.is_valid and high.as_py() - low.as_py() + 1 == len(self._values)
        self._range = (low.as_py(), high.as_py()) if whole else None

    def holds(self, values: pa.ChunkedArray) -> bool:
        """Whether every one of ``values`` is allowed."""
        import pyarrow.compute as pc

        if self._range is None:
            return pc.all(pc.is_in(values, value_set=self._values)).as_py() is not False
        if len(values) == 0:
            return True
        seen = pc.min_max(values)
        return seen["min"].as_py() >= self._range[0] and seen["max"].as_py() <= self._range[1]


def _has(table: pa.Table, name: str) -> bool:
    """Whether ``table`` has a column ``name`` (without listing its names, 8 us a table)."""
    return bool(table.schema.get_all_field_indices(name))


def _completed(table: pa.Table, spec: TableSpec) -> pa.Table:
    """``table`` with the spec's ``OPTIONAL_COLUMNS`` it lacks, null, at the spec's places."""
    for name in OPTIONAL_COLUMNS.get(spec.name, ()):
        if not _has(table, name):
            table = _insert(
                table, spec, name, pa.nulls(table.num_rows, spec.schema.field(name).type)
            )
    return table


def _stamped(table: pa.Table, spec: TableSpec, write_id: int) -> pa.Table:
    """``table`` with a ``write_id`` column of one value."""
    return _insert(table, spec, "write_id", pa.repeat(pa.scalar(write_id, pa.int64()), len(table)))


def _insert(table: pa.Table, spec: TableSpec, name: str, column: pa.Array) -> pa.Table:
    """``table`` with ``column`` added where the spec has it (at the end when ``table``
    has fewer columns before it): a table in the spec's order stays so, and is written
    without reordering."""
    index = min(spec.schema.get_field_index(name), table.num_columns)
    return table.add_column(index, name, column)
