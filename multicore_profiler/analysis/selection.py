"""Which records an analysis, a timeline or an export is about: a ``RecordSelection``.

It is the one value the selection arguments (run, step, invocation, rank, capture window,
a ``where`` condition, or a whole ``query``) make: the analyses, export, fusion, the
capture session and the CLI all build one, so each argument is checked and turned into SQL
in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from multicore_profiler.errors import ExportError
from multicore_profiler.limits import INVOCATION_ID, RANK, STEP, WINDOW, check_given
from multicore_profiler.storage.partitions import check_run_id
from multicore_profiler.storage.sql_policy import one_expression, read_only_statement
from multicore_profiler.storage.sql_text import sql_strings
from multicore_profiler.storage.store import Store


@dataclass(frozen=True)
class SelectedRecords:
    """A selection resolved against a store: the SQL of its records, its description for
    messages, and the runs it reads (``None``: a query, which may read any)."""

    sql: str
    described: str
    runs: list[str] | None


@dataclass(frozen=True)
class RecordSelection:
    """The records of ``run`` (default: the latest run; several runs: a sequence) narrowed
    by ``step``, ``invocation``, ``rank``, capture ``window`` and ``where`` (one SQL
    expression over the columns of ``records_ns``), or the rows of ``query`` (one read-only
    SQL statement whose rows carry the record columns), never both.

    Checked on construction: ``ArgumentError`` for a number out of range, ``StoreError``
    for a run id that cannot name a run, ``StatementError`` for a ``where`` or ``query``
    the read-only policy refuses, ``ExportError`` for a query given with other arguments.
    """

    run: str | tuple[str, ...] | None = None
    step: int | None = None
    invocation: int | None = None
    rank: int | None = None
    window: int | None = None
    where: str | None = None
    query: str | None = None

    def __post_init__(self) -> None:
        check_given(
            (self.step, STEP, "--step"),
            (self.invocation, INVOCATION_ID, "--invocation"),
            (self.rank, RANK, "--rank"),
            (self.window, WINDOW, "--window"),
        )
        if self.where is not None:
            one_expression(self.where, "the --where condition")
        if self.query is not None:
            read_only_statement(self.query, "the --sql query")
            narrowed = (self.run, self.step, self.invocation, self.rank, self.window, self.where)
            if any(v is not None for v in narrowed):
                raise ExportError("give either a query or run/step/invocation/rank/window/where")
        if self.run is not None:
            runs = (self.run,) if isinstance(self.run, str) else tuple(self.run)
            for run_id in runs:
                check_run_id(run_id)
            if not isinstance(self.run, str):
                object.__setattr__(self, "run", runs)

    @classmethod
    def given(
        cls,
        selection: RecordSelection | None,
        run: str | Sequence[str] | None = None,
        step: int | None = None,
        invocation: int | None = None,
        rank: int | None = None,
        window: int | None = None,
        where: str | None = None,
        query: str | None = None,
    ) -> RecordSelection:
        """``selection``, or the selection the other arguments make, as a writer's keyword
        arguments take them: ``ExportError`` when both are given."""
        narrowed = (run, step, invocation, rank, window, where, query)
        if selection is None:
            run = run if run is None or isinstance(run, str) else tuple(run)
            return cls(run, step, invocation, rank, window, where, query)
        if any(v is not None for v in narrowed):
            raise ExportError(
                "give either a selection or run/step/invocation/rank/window/where/query"
            )
        return selection

    def resolve(self, store: Store) -> SelectedRecords:
        """The selection's SQL, description and runs in ``store`` (the latest run when no
        run is given: ``ExportError`` if the store holds none)."""
        if self.query is not None:
            return SelectedRecords(self.query.rstrip().rstrip(";"), f"query {self.query!r}", None)
        if self.run is None:
            latest = store.sql(
                "SELECT run_id FROM runs ORDER BY start_time DESC, run_id DESC LIMIT 1"
            )
            if latest.num_rows == 0:
                raise ExportError(f"no records match: the store at {store.uri} holds no run")
            runs = [latest["run_id"][0].as_py()]
        else:
            runs = [self.run] if isinstance(self.run, str) else list(self.run)
        conditions = [f"run_id IN ({sql_strings(runs)})"]
        described = [f"run {', '.join(runs)}"]
        for column, value in (
            ("step", self.step),
            ("invocation_id", self.invocation),
            ("rank", self.rank),
        ):
            if value is not None:
                conditions.append(f"{column} = {int(value)}")
                described.append(f"{column.removesuffix('_id')} {int(value)}")
        if self.window is not None:
            conditions.append(
                "EXISTS (SELECT 1 FROM invocations i WHERE i.run_id = r.run_id "
                "AND i.rank = r.rank AND i.invocation_id = r.invocation_id "
                f"AND i.window_id = {int(self.window)})"
            )
            described.append(f"window {int(self.window)}")
        if self.where is not None:
            conditions.append(f"({self.where}\n)")
            described.append(f"where {self.where}")
        source = "records" if self.where is None else "records_ns"
        sql = f"SELECT * FROM {source} r WHERE {' AND '.join(conditions)}"
        return SelectedRecords(sql, ", ".join(described), runs)
