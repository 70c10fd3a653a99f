"""Where a selection's kernel time goes, and what a faster stage would buy, in Arrow tables.

``analyze`` reads the record analyses (``core_breakdown``, ``core_imbalance``,
``wait_attribution``, ``critical_path``, ``critical_path_summary``) for the invocations a
``RecordSelection`` picks, and replays them (``replay``) for the static bound and the
replay's fidelity; ``what_if`` and ``speedup_curves`` replay them with changed compute
durations. An invocation is analysed whole when any of its records is selected. With
``clock_correction``, each reads the records with the cores' clocks corrected first
(``clock_correction.corrected_clocks``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import duckdb
import pyarrow as pa

from multicore_profiler.analysis import replay
from multicore_profiler.analysis import what_if as changes_module
from multicore_profiler.analysis.changes import Change
from multicore_profiler.analysis.clock_correction import corrected_clocks
from multicore_profiler.analysis.selection import RecordSelection
from multicore_profiler.analysis.what_if import DEFAULT_SPEEDUPS
from multicore_profiler.errors import AnalysisError
from multicore_profiler.storage.store import Store

_MODULES = (
    "records.core_breakdown",
    "records.wait_attribution",
    "records.critical_path",
    "records.replay_records",
    "records.clock_sanity",
)
_SELECTED = "SEMI JOIN _analyzed USING (run_id, rank, invocation_id)"
_COMPARABLE = "SEMI JOIN _comparable USING (run_id, rank, invocation_id)"
_REPLAYED = "SEMI JOIN _replayed USING (run_id, rank, invocation_id)"

# _contradicted: the selected invocations whose records contradict causality beyond the
# clock tolerance (a wait that ended before the trigger that released it ended: the cores'
# clocks disagree), with how many edges do and by how much at most.
# _comparable: the selected invocations whose cores' times can be compared, all but those
# whose producer counted on a clock per core with no anchor (clock_domain per_core) and the
# contradicted ones.
# _overlapping: imported invocations whose producer recorded spans that overlap on one core
# (concurrent warps, groups or units), which the replay, chaining each core's records, and
# its static bound cannot hold. _dependency_graphs: the selected invocations whose task
# graph is recorded dependency edges alone (no wait or trigger records for the replay to
# release their tasks by). _replayed: what the replay takes, the comparable ones less those
# two kinds. This is the one place that keeps invocations out of the replay.
_REPLAY_SETS = """
CREATE TEMP TABLE _contradicted AS
SELECT run_id, rank, invocation_id, count(*) AS violations,
    max(violation_cycles) AS max_violation_cycles, max(violation_ns) AS max_violation_ns
FROM clock_violations
SEMI JOIN _analyzed USING (run_id, rank, invocation_id)
WHERE beyond_tolerance
GROUP BY ALL;
CREATE TEMP TABLE _comparable AS
SELECT run_id, rank, invocation_id FROM _analyzed
SEMI JOIN (SELECT * FROM invocations WHERE clock_domain IS DISTINCT FROM 'per_core')
    USING (run_id, rank, invocation_id)
ANTI JOIN _contradicted USING (run_id, rank, invocation_id);
CREATE TEMP TABLE _overlapping AS
WITH imported AS (
    SELECT run_id, rank, invocation_id, write_id FROM invocations
    SEMI JOIN _comparable USING (run_id, rank, invocation_id)
    WHERE producer IS NOT NULL
),
placed AS (
    SELECT run_id, rank, invocation_id, start_cycle,
        max(end_cycle) OVER (
            PARTITION BY run_id, rank, invocation_id, write_id, core_type, block_id
            ORDER BY record_index ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
        ) AS before_end
    FROM aligned_raw_records
    SEMI JOIN imported USING (run_id, rank, invocation_id, write_id)
)
SELECT DISTINCT run_id, rank, invocation_id FROM placed WHERE start_cycle < before_end;
CREATE TEMP TABLE _dependency_graphs AS
SELECT i.run_id, i.rank, i.invocation_id FROM invocations i
SEMI JOIN _analyzed USING (run_id, rank, invocation_id)
SEMI JOIN tasks g
    ON g.run_id = i.run_id AND g.rank = i.rank AND g.config_id = i.config_id
    AND g.depends_on IS NOT NULL;
CREATE TEMP TABLE _replayed AS
SELECT c.* FROM _comparable c
ANTI JOIN _overlapping USING (run_id, rank, invocation_id)
ANTI JOIN _dependency_graphs USING (run_id, rank, invocation_id);
"""

# What the analyses cannot say, per run, kernel and reason: of any invocation, that its
# records contradict causality (clock_contradiction); of imported ones, that their producer
# recorded no waits or no task graph, or counted on a clock per core.
_LIMITS = """
WITH analyzed AS (
    SELECT i.run_id, i.rank, i.invocation_id, i.write_id, i.kernel_name, i.producer,
        i.config_id, coalesce(i.clock_domain, 'shared') AS clock_domain, i.frequency_hz
    FROM invocations i
    SEMI JOIN _analyzed USING (run_id, rank, invocation_id)
),
selected AS (SELECT * FROM analyzed WHERE producer IS NOT NULL),
waits AS (  -- recorded waits, or the dependency edges the blockers follow instead
    SELECT DISTINCT run_id, rank, invocation_id
    FROM raw_records
    SEMI JOIN selected USING (run_id, rank, invocation_id, write_id)
    WHERE phase = 'wait'
    UNION
    SELECT * FROM _dependency_graphs
),
spreads AS (
    SELECT c.run_id, c.rank, c.invocation_id, c.write_id,
        max((c.clock_high_cycles - c.clock_low_cycles) / s.frequency_hz * 1e9) AS spread_ns
    FROM raw_cores c
    JOIN selected s USING (run_id, rank, invocation_id, write_id)
    GROUP BY ALL
),
reasons AS (
    SELECT s.*, 'per_core' AS reason, NULL::DOUBLE AS spread_ns, NULL::BIGINT AS violations,
        NULL::BIGINT AS violation_cycles, NULL::DOUBLE AS violation_ns
    FROM selected s WHERE clock_domain = 'per_core'
    UNION ALL
    SELECT s.*, 'anchored', p.spread_ns, NULL, NULL, NULL
    FROM selected s LEFT JOIN spreads p USING (run_id, rank, invocation_id, write_id)
    WHERE clock_domain = 'anchored'
    UNION ALL
    SELECT s.*, 'no_waits', NULL, NULL, NULL, NULL
    FROM selected s ANTI JOIN waits USING (run_id, rank, invocation_id)
    UNION ALL
    SELECT s.*, 'no_task_graph', NULL, NULL, NULL, NULL FROM selected s WHERE config_id IS NULL
    UNION ALL
    SELECT s.*, 'dependency_graph', NULL, NULL, NULL, NULL
    FROM selected s SEMI JOIN _dependency_graphs USING (run_id, rank, invocation_id)
    UNION ALL
    SELECT s.*, 'overlapping_records', NULL, NULL, NULL, NULL
    FROM selected s SEMI JOIN _overlapping USING (run_id, rank, invocation_id)
    UNION ALL
    SELECT a.*, 'clock_contradiction', NULL, c.violations, c.max_violation_cycles,
        c.max_violation_ns
    FROM analyzed a JOIN _contradicted c USING (run_id, rank, invocation_id)
)
SELECT
    run_id, kernel_name, producer, reason, count(*) AS invocations,
    max(spread_ns) AS clock_spread_ns,
    CASE reason
        WHEN 'clock_contradiction' THEN sum(violations)::VARCHAR || ' causal edge(s) of '
            || 'their records contradict causality beyond the clock tolerance of '
            || clock_tolerance_ns()::VARCHAR || ' ns (a wait recorded as ending before the '
            || 'trigger that released it ended, or a task starting before a predecessor '
            || 'ended), by up to ' || max(violation_cycles)::VARCHAR || ' cycles ('
            || round(max(violation_ns), 1)::VARCHAR || ' ns): the cores'' clocks disagree, '
            || 'so these invocations get no critical path and no replay (no static bound, no '
            || 'what-if prediction); run mcprof check --clocks to see which cores, or analyze '
            || 'with --clock-correction to correct the clocks from the records'' causality '
            || 'first'
        WHEN 'per_core' THEN 'each core counted on a clock of its own and the producer recorded '
            || 'no anchor: times of different cores cannot be compared, so these invocations '
            || 'get no critical path and no replay, and core_breakdown lays each core from '
            || 'its own start'
        WHEN 'anchored' THEN 'each core counted on a clock of its own, placed on a common clock '
            || 'by the producer''s anchors: a core''s place may be off by up to '
            || coalesce(round(max(spread_ns))::BIGINT::VARCHAR || ' ns', 'an unknown amount')
        WHEN 'no_waits' THEN 'the producer recorded no waits: no wait is attributed to what '
            || 'released it (blockers) and the critical path crosses no wait'
        WHEN 'no_task_graph' THEN 'the producer recorded no task graph: no release edges, '
            || 'so the critical path follows each core''s own records'
        WHEN 'overlapping_records' THEN 'the producer recorded spans that overlap on one '
            || 'core (concurrent warps, groups or units): the replay, which runs a core''s '
            || 'records one after another, and its static bound do not apply, so these '
            || 'invocations get no static bound and no what-if prediction'
        WHEN 'dependency_graph' THEN 'the producer recorded its task graph as dependency '
            || 'edges without wait or trigger records: the critical path and blockers follow '
            || 'the edges, but the replay releases tasks only by waits and triggers, so these '
            || 'invocations get no static bound and no what-if prediction'
    END AS note
FROM reasons
GROUP BY run_id, kernel_name, producer, reason
ORDER BY run_id, kernel_name, reason
"""

# The analysis reads the two views its tables share once, into _cores (core_breakdown)
# and _path (critical_path) of the selected invocations; _bounds and _fidelity are the
# replay's tables.
_INVOCATIONS = """
SELECT
    b.run_id, b.rank, b.invocation_id, b.write_id, b.step, b.kernel_name, b.direction,
    count(*) AS cores, sum(b.records)::BIGINT AS records, any_value(b.makespan_ns) AS makespan_ns,
    any_value(p.path_ns) AS critical_path_ns,
    any_value(p.path_ns) = any_value(b.makespan_ns) AS path_tiles,
    any_value(s.static_bound_ns) AS static_bound_ns, any_value(s.slack_ns) AS slack_ns,
    any_value(s.slack_share) AS slack_share,
    any_value(f.replayed_makespan_ns) AS replayed_makespan_ns,
    any_value(f.fidelity_error) AS fidelity_error, any_value(f.faithful) AS faithful
FROM _cores b
LEFT JOIN (
    SELECT run_id, rank, invocation_id, sum(dur_ns)::BIGINT AS path_ns FROM _path GROUP BY ALL
) p USING (run_id, rank, invocation_id)
LEFT JOIN _bounds s USING (run_id, rank, invocation_id, write_id)
LEFT JOIN _fidelity f USING (run_id, rank, invocation_id, write_id)
GROUP BY ALL
ORDER BY b.run_id, b.rank, b.invocation_id
"""

_SHARES = """
WITH spans AS (
    SELECT kernel_name, sum(makespan_ns) AS total_ns FROM (
        SELECT DISTINCT run_id, rank, invocation_id, kernel_name, makespan_ns FROM _path
    ) GROUP BY ALL
)
SELECT
    c.kernel_name, c.stage, c.kind, count(*) AS pieces, sum(c.dur_ns)::BIGINT AS dur_ns,
    sum(c.dur_ns) / any_value(s.total_ns) AS share
FROM _path c
JOIN spans s USING (kernel_name)
GROUP BY ALL
ORDER BY c.kernel_name, share DESC, c.stage NULLS LAST, c.kind
"""

_BLOCKERS = f"""
SELECT
    kernel_name, consumer_stage, producer_stage, producer_core, attributed,
    count(*) AS waits,
    sum(wait_ns)::BIGINT AS total_wait_ns,
    sum(wait_ns)
        / nullif(sum(sum(wait_ns)) OVER (PARTITION BY kernel_name, consumer_stage), 0)
        AS wait_share,
    quantile_cont(wait_ns, 0.5) AS p50_wait_ns,
    quantile_cont(wait_ns, 0.99) AS p99_wait_ns,
    quantile_cont(release_latency_ns, 0.5) AS p50_latency_ns,
    quantile_cont(release_latency_ns, 0.99) AS p99_latency_ns
FROM wait_attribution
{_SELECTED}
GROUP BY kernel_name, consumer_stage, producer_stage, producer_core, attributed
ORDER BY kernel_name, consumer_stage, total_wait_ns DESC, producer_stage NULLS LAST
"""


@dataclass(frozen=True)
class KernelAnalysis:
    """The analyses of one selection, each an Arrow table (see docs/analysis.md):

    - ``invocations``: per invocation its makespan, the critical path's total (``path_tiles``:
      it equals the makespan), the static bound and slack, and the replay's fidelity;
    - ``core_breakdown`` and ``core_imbalance``: the views' rows for the selection;
    - ``blockers``: waits per consumer stage by the producer stage and core type that
      released them, with their share of the consumer stage's wait;
    - ``critical_path`` and ``critical_path_summary``: the views' rows;
    - ``critical_shares``: share of the selection's total makespan per kernel, stage and
      kind on the critical paths (the selection's ``bound_by``);
    - ``limits``: what the analyses cannot say (per run, kernel and reason: of any
      invocation, that its records contradict causality beyond the clock tolerance, which
      keeps it out of the critical path and the replay; of imported ones, that their
      producer recorded no waits, no task graph or one of dependency edges alone, or
      counted on a clock per core), in words (``note``);
    - ``clock_correction``: with ``clock_correction``, the cores of the selected invocations
      that the correction moved (``clock_correction.APPLIED_COLUMNS``); None without, and
      then no table of that name.

    ``what_if`` and ``speedup_curves`` replay the same invocations again, without reading
    the store.
    """

    described: str
    invocations: pa.Table
    core_breakdown: pa.Table
    core_imbalance: pa.Table
    blockers: pa.Table
    critical_path: pa.Table
    critical_path_summary: pa.Table
    critical_shares: pa.Table
    limits: pa.Table
    graph: replay.ReplayGraph | None = field(repr=False)
    clock_correction: pa.Table | None = None

    def tables(self) -> dict[str, pa.Table]:
        """Every table by name, in the order above."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in _NOT_TABLES and getattr(self, f.name) is not None
        }

    def what_if(self, changes: Sequence[Change | str], *, strict: bool = False) -> pa.Table:
        """``what_if`` of these invocations (see the module function)."""
        return changes_module.what_if(_replayable(self.graph), changes, strict=strict)

    def speedup_curves(
        self, stages: Sequence[str] | None = None, speedups: Sequence[float] = DEFAULT_SPEEDUPS
    ) -> pa.Table:
        """``speedup_curves`` of these invocations (see the module function)."""
        return changes_module.speedup_curves(_replayable(self.graph), stages, speedups)


_NOT_TABLES = ("described", "graph")


@dataclass(frozen=True)
class _Selected:
    """A cursor whose ``_analyzed`` holds the selection's invocations, its description, and
    the cores a clock correction moved (None: none applied)."""

    con: duckdb.DuckDBPyConnection
    described: str
    correction: pa.Table | None


@contextmanager
def _selected(
    store: Store, selection: RecordSelection | None, clock_correction: bool
) -> Iterator[_Selected]:
    """The selection's invocations on a cursor (``_Selected``), with the cores' clocks
    corrected first where ``clock_correction`` asks; ``AnalysisError`` if it selects none."""
    resolved = (selection or RecordSelection()).resolve(store)
    with (
        corrected_clocks(store, resolved.runs, clock_correction) as correction,
        store.reading(modules=_MODULES, query=resolved.sql, runs=resolved.runs) as con,
    ):
        try:
            con.execute(
                "CREATE TEMP TABLE _analyzed AS SELECT DISTINCT run_id, rank, invocation_id "
                f"FROM ({resolved.sql})"
            )
        except duckdb.Error as exc:
            raise AnalysisError(f"cannot read {resolved.described}: {exc}") from None
        if _fetch(con, "SELECT count(*) FROM _analyzed").column(0)[0].as_py() == 0:
            raise AnalysisError(f"no records match {resolved.described}")
        con.execute(_REPLAY_SETS)
        if correction is not None:
            con.register("_moved_cores", correction)
            correction = _fetch(
                con,
                "SELECT * FROM _moved_cores SEMI JOIN _analyzed "
                "USING (run_id, rank, invocation_id) "
                "ORDER BY run_id, rank, invocation_id, core, block_id",
            )
        yield _Selected(con, resolved.described, correction)


def _fetch(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    return con.sql(sql).to_arrow_table()


def _graph(con: duckdb.DuckDBPyConnection) -> replay.ReplayGraph | None:
    """The replayable DAG of the selected invocations the replay can chain (``_replayed``);
    None where there is none."""
    if not _fetch(con, "SELECT count(*) FROM _replayed").column(0)[0].as_py():
        return None
    return replay.prepare(_fetch(con, f"SELECT * FROM replay_records {_REPLAYED}"))


def _replayable(graph: replay.ReplayGraph | None) -> replay.ReplayGraph:
    """``graph``, or an ``AnalysisError`` saying why there is none."""
    if graph is None:
        raise AnalysisError(
            "no selected invocation can be replayed: their cores counted on clocks of their "
            "own with no anchor (clock domain per_core), or their producer recorded spans "
            "that overlap on one core or a task graph of dependency edges alone, which the "
            "replay cannot chain or release (see analyze's notes)"
        )
    return graph


_NO_REPLAY = """
CREATE TEMP TABLE _bounds AS
SELECT run_id, rank, invocation_id, write_id, NULL::BIGINT AS static_bound_ns,
    NULL::BIGINT AS slack_ns, NULL::DOUBLE AS slack_share
FROM _cores LIMIT 0;
CREATE TEMP TABLE _fidelity AS
SELECT run_id, rank, invocation_id, write_id, NULL::BIGINT AS replayed_makespan_ns,
    NULL::DOUBLE AS fidelity_error, NULL::BOOLEAN AS faithful
FROM _cores LIMIT 0;
"""


def analyze(
    store: Store, selection: RecordSelection | None = None, *, clock_correction: bool = False
) -> KernelAnalysis:
    """Every analysis of the invocations ``selection`` picks (default: the latest run); with
    ``clock_correction``, of their records with the cores' clocks corrected from the records'
    causality (``ClockError`` where they cannot be), the moved cores in ``clock_correction``
    and the store's records as they were afterwards."""
    with _selected(store, selection, clock_correction) as selected:
        con = selected.con
        con.execute(f"CREATE TEMP TABLE _cores AS SELECT * FROM core_breakdown {_SELECTED}")
        con.execute(f"CREATE TEMP TABLE _path AS SELECT * FROM critical_path {_COMPARABLE}")
        graph = _graph(con)
        if graph is None:
            con.execute(_NO_REPLAY)
        else:
            con.register("_bounds", replay.static_bound(graph))
            con.register("_fidelity", replay.replay(graph))
        invocations = _fetch(con, _INVOCATIONS)
        tables = {
            "core_breakdown": _fetch(
                con,
                "SELECT * FROM _cores ORDER BY run_id, rank, invocation_id, core_type, block_id",
            ),
            "core_imbalance": _fetch(
                con,
                f"SELECT * FROM core_imbalance {_SELECTED} "
                "ORDER BY run_id, rank, invocation_id, core_type",
            ),
            "blockers": _fetch(con, _BLOCKERS),
            "critical_path": _fetch(
                con, "SELECT * FROM _path ORDER BY run_id, rank, invocation_id, seq"
            ),
            "critical_path_summary": _fetch(
                con,
                f"SELECT * FROM critical_path_summary {_SELECTED} "
                "ORDER BY run_id, rank, invocation_id, share DESC, stage NULLS LAST, kind",
            ),
            "critical_shares": _fetch(con, _SHARES),
            "limits": _fetch(con, _LIMITS),
        }
    return KernelAnalysis(
        described=selected.described,
        invocations=invocations,
        graph=graph,
        clock_correction=selected.correction,
        **tables,
    )


def what_if(
    store: Store,
    selection: RecordSelection | None,
    changes: Sequence[Change | str],
    *,
    strict: bool = False,
    clock_correction: bool = False,
) -> pa.Table:
    """The predicted makespan of each selected invocation with ``changes`` (``Change``
    objects or their text, ``'GMM1*0.8'``, ``'GMM1+200us'``), applied in order; with
    ``strict``, ``AnalysisError`` where the replay is not faithful (see ``replay``); with
    ``clock_correction``, as ``analyze``'s."""
    with _selected(store, selection, clock_correction) as selected:
        graph = _replayable(_graph(selected.con))
    return changes_module.what_if(graph, changes, strict=strict)


def speedup_curves(
    store: Store,
    selection: RecordSelection | None = None,
    stages: Sequence[str] | None = None,
    speedups: Sequence[float] = DEFAULT_SPEEDUPS,
    *,
    clock_correction: bool = False,
) -> pa.Table:
    """Per selected invocation, stage and speed-up, the predicted makespan with the
    stage's compute that much faster (Coz's question: which stage, made faster, shortens
    the kernel most); with ``clock_correction``, as ``analyze``'s."""
    with _selected(store, selection, clock_correction) as selected:
        graph = _replayable(_graph(selected.con))
    return changes_module.speedup_curves(graph, stages, speedups)
