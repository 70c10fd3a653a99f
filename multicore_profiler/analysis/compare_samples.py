"""The samples of a run comparison, read from the store in SQL.

A level (``LEVELS``) says what one sample is: a record's duration, an invocation's wall
time, an outer-trace kernel's duration, or the share of an invocation's makespan that a
stage holds on its critical path. For each group of the ``by`` columns, each side (base,
head) has the values of its runs (or traces) in that group; ``read_samples`` reads them,
with how many units (invocations, traces) each side has: what a group adds is counted per
unit. ``comparability`` says where base and head differ in what shapes their values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from multicore_profiler.errors import SelectorError
from multicore_profiler.storage.selectors import RunSelector
from multicore_profiler.storage.sql_text import sql_identifier

if TYPE_CHECKING:
    from multicore_profiler.storage.store import Store


@dataclass(frozen=True)
class Level:
    """What one sample is: the SQL of the samples (``id``: the run or trace they belong to,
    the group columns, ``value``), of the units what a group adds is counted per (one row
    each, with ``id``), the columns a comparison may group by, its default grouping, whether
    its selectors choose runs or traces, and the unit of its values: ``ns`` (a duration) or
    ``share`` (of a makespan, 0 to 1).

    Where ``pooled`` names columns, one sample pools the rows of ``samples`` that share
    them and the group's columns, and ``value`` is the SQL aggregate over those rows that
    makes its value (at level ``critical``, a stage's kinds in one invocation); else each
    row is one sample and ``value`` its column."""

    samples: str
    units: str
    columns: tuple[str, ...]
    default_by: tuple[str, ...]
    of: str
    unit: str = "ns"
    pooled: tuple[str, ...] = ()
    value: str = "value"


LEVELS = {
    "records": Level(
        "SELECT run_id AS id, *, dur_ns AS value FROM records_ns",
        "SELECT run_id AS id FROM invocations",
        ("kernel_name", "direction", "stage", "phase", "core", "owner_id", "rank", "step"),
        ("kernel_name", "stage", "phase"),
        "runs",
    ),
    # An invocation's wall time: its last record's end minus its first record's start.
    "invocations": Level(
        """SELECT run_id AS id, kernel_name, direction, rank, step,
                  max(ts_ns + dur_ns) - min(ts_ns) AS value
           FROM records_ns GROUP BY run_id, rank, invocation_id, kernel_name, direction, step""",
        "SELECT run_id AS id FROM invocations",
        ("kernel_name", "direction", "rank", "step"),
        ("kernel_name",),
        "runs",
    ),
    # Device kernels of the outer traces in the store (see the outer-kernel views).
    "kernels": Level(
        "SELECT source_id AS id, family, name, kind, rank, dur_ns AS value FROM kernels",
        "SELECT source_id AS id FROM trace_sources",
        ("family", "name", "kind", "rank"),
        ("family",),
        "traces",
    ),
    # The share of an invocation's makespan on its critical path per stage (and kind): every
    # invocation of a kernel has a sample in each group seen on the critical paths of that
    # kernel's selected invocations, 0 where the group is not on its own path.
    "critical": Level(
        """WITH summary AS MATERIALIZED (
               SELECT run_id, rank, invocation_id, write_id, step, kernel_name, direction,
                      stage, kind, dur_ns, makespan_ns
               FROM critical_path_summary
           ),
           walked AS (
               SELECT DISTINCT run_id, rank, invocation_id, write_id, step, kernel_name,
                      direction, makespan_ns
               FROM summary
           ),
           seen AS (SELECT DISTINCT kernel_name, stage, kind FROM summary)
           SELECT w.run_id AS id, w.run_id, w.rank, w.invocation_id, w.write_id, w.step,
                  w.kernel_name, w.direction, g.stage, g.kind,
                  coalesce(s.dur_ns, 0) AS dur_ns, w.makespan_ns
           FROM walked w
           JOIN seen g USING (kernel_name)
           LEFT JOIN summary s
               ON s.run_id = w.run_id AND s.rank = w.rank
               AND s.invocation_id = w.invocation_id AND s.write_id = w.write_id
               AND s.stage IS NOT DISTINCT FROM g.stage AND s.kind = g.kind""",
        "SELECT run_id AS id FROM invocations",
        ("kernel_name", "direction", "stage", "kind", "rank", "step"),
        ("kernel_name", "stage"),
        "runs",
        unit="share",
        pooled=("run_id", "rank", "invocation_id", "write_id"),
        value="sum(dur_ns) / any_value(makespan_ns)",
    ),
    # The slowest rank's share of each aligned invocation of a multi-rank run: the part of
    # the slowest rank's makespan above the median rank's (kernel_rank_spread), 0 when the
    # ranks are even; one sample per step and invocation order.
    "ranks": Level(
        """SELECT job_id AS id, kernel_name, direction, step, invocation_order,
                  recoverable_ns / max_ns AS value
           FROM kernel_rank_spread WHERE ranks > 1 AND max_ns > 0""",
        "SELECT job_id AS id FROM kernel_rank_spread WHERE ranks > 1",
        ("kernel_name", "direction", "step", "invocation_order"),
        ("kernel_name",),
        "runs",
        unit="share",
    ),
}
"""What a comparison compares: device records, kernel invocations, the kernels of outer
(torch / torch_npu) traces, the stages' shares of the invocations' critical paths, or the
slowest rank's share of each aligned invocation of a multi-rank run."""

METRICS = ("duration", "share")
"""What is compared: durations in ns (of a record, an invocation or a trace kernel) or
shares of a makespan (level ``critical``); each level compares its own."""

_METRIC = {"ns": "duration", "share": "share"}


def metric_of(level: str) -> str:
    """The metric a level compares: ``duration`` or ``share``."""
    return _METRIC[LEVELS[level].unit]


def grouping(
    level: str, by: Sequence[str] | None, metric: str | None
) -> tuple[Level, tuple[str, ...]]:
    """The level and the group columns of a comparison (``by`` or the level's default);
    ``SelectorError`` for an unknown level or metric, a metric the level does not compare,
    or a column the level lacks."""
    if level not in LEVELS:
        raise SelectorError(f"unknown level {level!r}; one of {sorted(LEVELS)}")
    kind = LEVELS[level]
    by = tuple(kind.default_by if by is None else by)
    unknown = [column for column in by if column not in kind.columns]
    if not by or unknown:
        raise SelectorError(
            f"cannot group {level} by {unknown or 'nothing'}; by takes {kind.columns}"
        )
    if metric is not None and metric not in METRICS:
        raise SelectorError(f"unknown metric {metric!r}; one of {METRICS}")
    if metric is not None and metric != metric_of(level):
        raise SelectorError(f"level {level} compares {metric_of(level)}, not {metric}")
    return kind, by


@dataclass(frozen=True)
class Side:
    """One side of a comparison: its selector as text and the ids it selects."""

    text: str
    ids: tuple[str, ...]


def select_side(store: Store, selector: RunSelector | str | Sequence[str], of: str) -> Side:
    """The runs (``of="runs"``) or traces a selector, its text or a list of ids selects."""
    if isinstance(selector, (str, RunSelector)):
        select = store.select_runs if of == "runs" else store.select_traces
        return Side(str(selector), tuple(select(selector)))
    ids = tuple(selector)
    if not ids:
        raise SelectorError(f"an empty list of {of} selects nothing")
    return Side(",".join(ids), ids)


@dataclass(frozen=True)
class Samples:
    """Each group's values (in the level's unit, sorted) by side (``False``: base,
    ``True``: head), and how many units (invocations or traces) each side has."""

    groups: dict[tuple, dict[bool, np.ndarray]]
    units: dict[bool, int]


def read_samples(store: Store, level: str, by: tuple[str, ...], base: Side, head: Side) -> Samples:
    """The samples of both sides at ``level``, grouped by ``by``; ``SelectorError`` when a
    side has no units or no samples."""
    kind = LEVELS[level]
    sides = {"head": list(head.ids), "ids": [*base.ids, *head.ids]}
    scope = sides["ids"] if kind.of == "runs" else None  # read only these runs' files
    columns = ", ".join(sql_identifier(column) for column in by)
    source = kind.samples
    if kind.pooled:
        pooled = ", ".join(sql_identifier(column) for column in kind.pooled)
        source = f"""SELECT id, {columns}, {kind.value} AS value FROM ({source})
                     GROUP BY id, {pooled}, {columns}"""
    samples = store.sql(
        f"""SELECT {columns}, list_contains($head, id) AS head,
                   list(value ORDER BY value) AS values
            FROM ({source}) WHERE list_contains($ids, id) AND value IS NOT NULL
            GROUP BY ALL ORDER BY ALL""",
        sides,
        runs=scope,
    )
    units = {
        row["head"]: row["n"]
        for row in store.sql(
            f"""SELECT list_contains($head, id) AS head, count(*) AS n FROM ({kind.units})
                WHERE list_contains($ids, id) GROUP BY ALL""",
            sides,
            runs=scope,
        ).to_pylist()
    }
    found = set(samples["head"].to_pylist())  # the sides that have samples
    for is_head, side in ((False, base), (True, head)):
        if not units.get(is_head) or is_head not in found:
            raise SelectorError(
                f"the {kind.of} of {side.text} ({', '.join(side.ids)}) hold no {level}"
            )

    groups: dict[tuple, dict[bool, np.ndarray]] = {}
    offsets = samples["values"].combine_chunks()
    values = offsets.values.to_numpy(zero_copy_only=False).astype(np.float64)
    starts = offsets.offsets.to_numpy()
    keys = samples.select(list(by)).to_pylist()
    for row, (key, is_head) in enumerate(zip(keys, samples["head"].to_pylist(), strict=True)):
        groups.setdefault(tuple(key.values()), {})[is_head] = values[starts[row] : starts[row + 1]]
    return Samples(groups, units)


_COMPARABLE = (
    ("SoC", "invocations", "soc"),
    ("frequency (Hz)", "invocations", "frequency_hz"),
    ("buffer layout", "invocations", "[aic_slots, aiv_slots, aic_capacity, aiv_capacity]"),
    ("kernel spec (stage names)", "invocations", "stage_names"),
    ("schedule", "runs", "schedule"),
    # Without one, an invocation's critical path cannot cross to a trigger's core.
    ("whether the kernel handed over its task graph", "invocations", "config_id IS NOT NULL"),
)
"""What shapes durations and critical paths besides the code: (what, the view it is in,
its SQL)."""


def comparability(store: Store, base: Sequence[str], head: Sequence[str]) -> list[str]:
    """Warnings where the base and head runs differ in what shapes their values."""
    runs = [*base, *head]
    warnings = []
    for what, view, expression in _COMPARABLE:
        found = store.sql(
            f"""SELECT list_contains($head, run_id) AS head,
                       list_sort(list_distinct(list(({expression})::VARCHAR))) AS seen
                FROM {view} WHERE list_contains($runs, run_id) GROUP BY ALL""",
            {"head": list(head), "runs": runs},
            runs=runs,
        ).to_pylist()
        seen = {row["head"]: ", ".join(row["seen"]) for row in found}
        if seen.get(False) != seen.get(True):
            warnings.append(
                f"base and head differ in {what}: base {seen.get(False)}; head {seen.get(True)}"
            )
    return warnings
