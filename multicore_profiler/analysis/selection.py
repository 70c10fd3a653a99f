"""Which records an analysis, a timeline or an export is about: a ``RecordSelection``.

It is the one value the selection arguments (run, step, invocation, rank, capture window,
a ``where`` condition, or a whole ``query``) make: the analyses, export, fusion, the
capture session and the CLI all build one, so each argument is checked and turned into SQL
in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from multicore_profiler.errors import ExportError, SelectorError
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
        run is given: ``ExportError`` if the store holds none). ``SelectorError`` names each
        run given that the store does not hold, or else each step, invocation, rank and
        window given that none of the runs' invocations has."""
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
            _check_runs(store, runs)
        self._check_narrowing(store, runs)
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
        source = "aligned_records" if self.where is None else "records_ns"
        sql = f"SELECT * FROM {source} r WHERE {' AND '.join(conditions)}"
        return SelectedRecords(sql, ", ".join(described), runs)

    def _check_narrowing(self, store: Store, runs: list[str]) -> None:
        """``SelectorError`` naming each step, invocation, rank and window given that no
        invocation of ``runs`` has."""
        given = [
            (column, label, int(value))
            for column, label, value in (
                ("step", "step", self.step),
                ("invocation_id", "invocation", self.invocation),
                ("rank", "rank", self.rank),
                ("window_id", "window", self.window),
            )
            if value is not None
        ]
        if not given:
            return
        found = store.sql(
            "SELECT "
            + ", ".join(f"coalesce(bool_or({c} = {v}), false) AS {c}" for c, _, v in given)
            + f" FROM invocations WHERE run_id IN ({sql_strings(runs)})"
        ).to_pylist()[0]
        absent = [f"{label} {value}" for column, label, value in given if not found[column]]
        if absent:
            held = "has" if len(runs) == 1 else "have"
            raise SelectorError(f"{_runs(runs)} {held} no {', '.join(absent)}")


def _runs(runs: Sequence[str]) -> str:
    """``run a`` or ``runs a, b``."""
    return f"run{'s' if len(runs) > 1 else ''} {', '.join(runs)}"


def _check_runs(store: Store, runs: list[str]) -> None:
    """``SelectorError`` naming each of ``runs`` that the store does not hold."""
    held = store.sql(f"SELECT run_id FROM runs WHERE run_id IN ({sql_strings(runs)})")
    present = set(held["run_id"].to_pylist())
    absent = [run for run in dict.fromkeys(runs) if run not in present]
    if absent:
        verb = "is" if len(absent) == 1 else "are"
        raise SelectorError(f"{_runs(absent)} {verb} not in the store at {store.uri}")
