"""Across ranks, in Arrow tables: which rank holds each step back, by how much, where its
extra time went, and how much of each rank's communication waited for the slowest arrival.

``cross_rank`` reads the cross-rank views for the jobs of outer traces (``cross_rank.steps``,
``cross_rank.communication``) and for MegaKernel runs (``records.kernel_ranks``), scoped to
the jobs, runs and steps asked for, and turns the views that name bad inputs (a rank
missing from a step or a group, ops that do not pair) into warnings. See docs/cross-rank.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import pyarrow as pa

from multicore_profiler.errors import AnalysisError
from multicore_profiler.storage.store import Store

_JOBS = "SELECT DISTINCT job_id FROM trace_sources ORDER BY job_id"

_OUTER = {
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
    slow_rank_causes: pa.Table
    rank_step_breakdown: pa.Table
    collective_waits: pa.Table
    slow_ranks: pa.Table
    slow_rank_advice: pa.Table
    rank_clock_offsets: pa.Table
    kernel_rank_steps: pa.Table
    kernel_slow_rank_stages: pa.Table
    warnings: tuple[str, ...]

    def tables(self) -> dict[str, pa.Table]:
        """Every table by its view's name, in the order a report shows them."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("jobs", "runs", "warnings")
        }


_STEPLESS = ("rank_clock_offsets",)
"""The tables whose rows hold for a whole job, not one step."""


def _read(
    store: Store, name: str, query: str, ids: list[str], steps: Sequence[int] | None, **scope
) -> pa.Table:
    """The rows of ``query`` (the table ``name``) of the jobs or runs ``ids``, and of
    ``steps`` where given and the table has steps."""
    where, params = "list_contains($ids, job_id)", {"ids": ids}
    if steps is not None and name not in _STEPLESS:
        where += " AND list_contains($steps, step)"
        params["steps"] = list(steps)
    return store.sql(f"SELECT * FROM ({query}) WHERE {where} ORDER BY ALL", params, **scope)


def _warnings(store: Store, jobs: list[str], runs: list[str]) -> list[str]:
    """A line per gap the gap views find: a rank missing from a step of its job, or from
    an invocation the other ranks of a run ran."""
    lines = []
    if jobs:
        for row in store.sql(
            "SELECT * FROM rank_gaps WHERE list_contains($ids, job_id) ORDER BY ALL",
            {"ids": jobs},
        ).to_pylist():
            lines.append(row["detail"])
    if runs:
        for row in store.sql(
            "SELECT * FROM kernel_rank_gaps WHERE list_contains($ids, job_id) ORDER BY ALL",
            {"ids": runs},
            runs=runs,
        ).to_pylist():
            missing = ", ".join(str(rank) for rank in row["missing_ranks"])
            lines.append(
                f"run {row['job_id']} step {row['step']}: invocation {row['invocation_order']} "
                f"({row['kernel_name']}) has no records of rank(s) {missing}"
            )
    return lines


def cross_rank(
    store: Store,
    *,
    jobs: Sequence[str] | None = None,
    runs: Sequence[str] | None = None,
    steps: Sequence[int] | None = None,
) -> CrossRank:
    """The cross-rank tables of ``jobs`` (outer traces' jobs; default: every job of two
    ranks or more) and ``runs`` (MegaKernel runs; default: none), kept to ``steps`` where
    given. Raises ``AnalysisError`` naming a job that is not in the store."""
    known = store.sql(_JOBS).column("job_id").to_pylist()
    if jobs is None:
        counted = store.sql(
            "SELECT job_id FROM trace_sources GROUP BY job_id HAVING count(*) > 1 ORDER BY 1"
        )
        chosen = counted.column("job_id").to_pylist()
    else:
        chosen = list(dict.fromkeys(jobs))
        unknown = [job for job in chosen if job not in known]
        if unknown:
            shown = ", ".join(known) if known else "none"
            raise AnalysisError(f"no job {unknown[0]!r} in {store.uri} (its jobs: {shown})")
    picked = list(dict.fromkeys(runs or ()))
    tables = {name: _read(store, name, query, chosen, steps) for name, query in _OUTER.items()}
    tables.update(
        {
            name: _read(store, name, query, picked, steps, runs=picked)
            for name, query in _KERNEL.items()
        }
    )
    return CrossRank(
        jobs=tuple(chosen),
        runs=tuple(picked),
        warnings=tuple(_warnings(store, chosen, picked)),
        **tables,
    )
