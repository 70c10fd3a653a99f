"""Across ranks, in Arrow tables: which rank holds each step back, by how much, where its
extra time went, and how much of each rank's communication waited for the slowest arrival.

``cross_rank`` reads the cross-rank views for the jobs of outer traces (``cross_rank.steps``,
``cross_rank.communication``) and for MegaKernel runs (``records.kernel_ranks``), scoped to
the jobs, runs and steps asked for, and turns the views that name bad inputs (a rank
missing from a step or a group, ops that do not pair) into warnings. See docs/cross-rank.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.errors import AnalysisError
from multicore_profiler.storage.connection import query_error
from multicore_profiler.storage.store import Store

_JOBS = "SELECT job_id, count(*) AS sources FROM job_sources GROUP BY job_id ORDER BY job_id"
"""The store's jobs, each with its count of trace sources (cross_rank.steps' job_sources)."""

_OUTER = {
    "step_stragglers": "SELECT * FROM step_stragglers",
    "slow_rank_causes": "SELECT * FROM slow_rank_causes",
    "rank_step_breakdown": "SELECT * FROM rank_step_breakdown",
    "collective_waits": "SELECT * FROM collective_waits",
    "slow_ranks": "SELECT * FROM slow_ranks",
    "slow_rank_advice": "SELECT * FROM slow_rank_advice WHERE flagged",
    "rank_clock_offsets": "SELECT * FROM rank_clock_offsets",
}
"""The outer traces' tables of a report, each filtered to the jobs (and steps) asked for."""
_KERNEL = {
    "kernel_rank_steps": "SELECT * FROM kernel_rank_steps",
    "kernel_slow_rank_stages": "SELECT * FROM kernel_slow_rank_stages WHERE excess_rank = 1",
}
"""The MegaKernel runs' tables, filtered to the runs (and steps) asked for."""


@dataclass(frozen=True)
class CrossRank:
    """The cross-rank tables of the jobs and runs asked for, and warnings naming what
    their inputs lack. Each table keeps its view's columns (ns, exact)."""

    jobs: tuple[str, ...]
    runs: tuple[str, ...]
    step_stragglers: pa.Table
    slow_rank_causes: pa.Table
    rank_step_breakdown: pa.Table
    collective_waits: pa.Table
    slow_ranks: pa.Table
    slow_rank_advice: pa.Table
    rank_clock_offsets: pa.Table
    warnings: tuple[str, ...]
    kernel_rank_steps: pa.Table | None = None
    kernel_slow_rank_stages: pa.Table | None = None
    """The MegaKernel runs' tables: ``None`` where no run was asked for."""

    def tables(self) -> dict[str, pa.Table]:
        """Every table by its view's name, in the order a report shows them (the
        MegaKernel runs' where runs were asked for)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("jobs", "runs", "warnings") and getattr(self, f.name) is not None
        }


_STEPLESS = ("rank_clock_offsets",)
"""The tables whose rows hold for a whole job, not one step."""
_OUTER_MODULES = ("cross_rank.steps", "cross_rank.communication", "cross_rank.stragglers")
_KERNEL_MODULES = ("records.kernel_ranks",)


@contextmanager
def _reading(
    store: Store, modules: Sequence[str], runs: Sequence[str] | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """``store.reading``'s cursor, DuckDB's errors raised as ``store.sql`` raises them."""
    try:
        with store.reading(modules=modules, runs=runs) as con:
            yield con
    except duckdb.Error as exc:
        raise query_error(exc) from exc


def _fetch(con: duckdb.DuckDBPyConnection, query: str, params: dict | None = None) -> pa.Table:
    return con.sql(query, params=params).to_arrow_table()


def _read(
    con: duckdb.DuckDBPyConnection,
    name: str,
    query: str,
    ids: list[str],
    steps: Sequence[int] | None,
) -> pa.Table:
    """The rows of ``query`` (the table ``name``) of the jobs or runs ``ids``, and of
    ``steps`` where given and the table has steps."""
    where, params = "list_contains($ids, job_id)", {"ids": ids}
    if steps is not None and name not in _STEPLESS:
        where += " AND list_contains($steps, step)"
        params["steps"] = list(steps)
    return _fetch(con, f"SELECT * FROM ({query}) WHERE {where} ORDER BY ALL", params)


def _job_gaps(con: duckdb.DuckDBPyConnection, jobs: list[str]) -> list[str]:
    """A line per rank missing from a step of its job, or from its job's groups."""
    if not jobs:
        return []
    query = "SELECT detail FROM rank_gaps WHERE list_contains($ids, job_id) ORDER BY ALL"
    return _fetch(con, query, {"ids": jobs}).column("detail").to_pylist()


def _run_gaps(con: duckdb.DuckDBPyConnection, runs: list[str]) -> list[str]:
    """A line per rank missing from an invocation the other ranks of its run ran."""
    query = "SELECT * FROM kernel_rank_gaps WHERE list_contains($ids, job_id) ORDER BY ALL"
    return [
        f"run {row['job_id']} step {row['step']}: invocation {row['invocation_order']} "
        f"({row['kernel_name']}) has no records of rank(s) "
        + ", ".join(str(rank) for rank in row["missing_ranks"])
        for row in _fetch(con, query, {"ids": runs}).to_pylist()
    ]


def cross_rank(
    store: Store,
    *,
    jobs: Sequence[str] | None = None,
    runs: Sequence[str] | None = None,
    steps: Sequence[int] | None = None,
) -> CrossRank:
    """The cross-rank tables of ``jobs`` (outer traces' jobs; default: every job of two
    ranks or more) and ``runs`` (MegaKernel runs; default: none), kept to ``steps`` where
    given. Raises ``AnalysisError`` naming a job that is not in the store.

    The outer tables are read through one cursor, and the runs' through another scoped to
    them: the modules are installed, and their tables checked for freshness, once each."""
    picked = list(dict.fromkeys(runs or ()))
    with _reading(store, _OUTER_MODULES) as con:
        counted = _fetch(con, _JOBS)
        known = counted.column("job_id").to_pylist()
        if jobs is None:
            chosen = counted.filter(pc.field("sources") > 1).column("job_id").to_pylist()
        else:
            chosen = list(dict.fromkeys(jobs))
            unknown = [job for job in chosen if job not in known]
            if unknown:
                shown = ", ".join(known) if known else "none"
                raise AnalysisError(f"no job {unknown[0]!r} in {store.uri} (its jobs: {shown})")
        tables = {name: _read(con, name, query, chosen, steps) for name, query in _OUTER.items()}
        warnings = _job_gaps(con, chosen)
    if picked:
        with _reading(store, _KERNEL_MODULES, picked) as con:
            tables.update({name: _read(con, name, q, picked, steps) for name, q in _KERNEL.items()})
            warnings += _run_gaps(con, picked)
    return CrossRank(jobs=tuple(chosen), runs=tuple(picked), warnings=tuple(warnings), **tables)
