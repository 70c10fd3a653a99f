"""Chrome Trace (schema v1) of records in the store: of a run, step, invocation or any query.

The trace is a view over the store: SQL selects the records, names them (the
``event_name`` macro) and finds which trigger released which wait; numpy lays
out the tracks; ``json_rows`` renders the events straight into the file. Format:
complete events (``cat`` ``MegaKernelInternal``) with every raw id and cycle in
``args``, ``pid`` = rank, ``tid`` = core type x 1000 + block id, ``ts`` / ``dur``
in microseconds from the process's anchor (its smallest core entry cycle), flow
arrows from triggers to the waits they released, and ``megaKernelCycleTrace``
(also under ``metadata``) describing the selection.

It streams: the selected records go once, compactly, to a scratch Parquet file in a
hidden directory beside the trace, and from there to one Arrow file per group of whole
tracks (about ``GROUP_ROWS`` records); the arrows are found a few invocations at a time
and filed by their wait's group too. Each group's events are then made, sorted and
rendered on their own, and the arrows' rows spooled until every event is written, so
memory does not grow with the run. Every width of the fixed-width rows comes from the
whole selection's value spans, computed first in SQL, so each group is rendered straight
to its place in the file.
"""

from __future__ import annotations

import gzip
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import duckdb
import numpy as np
import orjson
import pyarrow as pa
from tqdm import tqdm

from multicore_profiler.abi import (
    DESC_COMPUTE_FALLBACK,
    DESC_TRIGGER_EVENT,
    DESC_WAIT_DEPENDENCY,
    MAX_CAPACITY,
    MAX_TASK_TYPE,
    NO_OWNER,
)
from multicore_profiler.errors import ExportError, QueryError
from multicore_profiler.export.files import written_aside
from multicore_profiler.export.json_rows import Row, Span, joined, span_of, strings
from multicore_profiler.export.tracks import assign_lanes
from multicore_profiler.limits import INVOCATION_ID, RANK, STEP, WINDOW, check_given
from multicore_profiler.storage.partitions import check_run_id
from multicore_profiler.storage.sql_policy import one_expression, read_only_statement
from multicore_profiler.storage.sql_text import sql_string, sql_strings
from multicore_profiler.storage.store import Store

SCHEMA_VERSION = 1
CATEGORY = "MegaKernelInternal"
FLOW_NAME = "dependency"
CORE_NAMES = {1: "AIC", 2: "AIV"}
LANE_TID_STEP = 10_000
"""A sub-track's tid: the core's tid + 10000 x lane (lane 0 is the core's own track)."""
RUN_PID_STEP = 100_000
"""With several runs in one trace, pid = run's position (from 1) x 100000 + rank."""
GROUP_ROWS = 1 << 17
"""Records made and rendered at once (whole tracks, so one track can make a group
larger): what bounds the export's memory."""

RECORD_COLUMNS = (
    "run_id",
    "rank",
    "invocation_id",
    "core_type",
    "block_id",
    "start_cycle",
    "end_cycle",
    "desc_id",
    "task_id",
    "stage_task_index",
    "owner_id",
)
"""What a query's rows must carry to be exported (``records`` and ``records_ns`` have all)."""

_RECORD_TYPES = {
    "core_type": "UTINYINT",
    "block_id": "UINTEGER",
    "start_cycle": "UBIGINT",
    "end_cycle": "UBIGINT",
    "desc_id": "UINTEGER",
    "task_id": "UINTEGER",
    "stage_task_index": "UINTEGER",
    "owner_id": "UINTEGER",
}
"""The store's types of the record columns a query's values are cast to."""


class ExportQueryError(ExportError, QueryError):
    """SQL of an export that DuckDB cannot run (a missing table, a value that does not
    convert, a cycle difference no time can hold): the message names what was being
    exported and DuckDB's reason, in one line."""


@dataclass(frozen=True)
class ExportedTrace:
    """What ``export_chrome_trace`` wrote: where, how many events, and the trace's
    ``megaKernelCycleTrace`` object."""

    path: Path
    events: int
    records: int
    flows: int
    metadata: dict[str, Any] = field(repr=False)


def _selection(
    store: Store,
    run: str | Sequence[str] | None,
    step: int | None,
    invocation: int | None,
    rank: int | None,
    window: int | None,
    where: str | None,
) -> tuple[str, str, list[str]]:
    """The SQL of the selected records, a description of the selection for messages, and
    the runs it reads."""
    if run is None:
        latest = store.sql("SELECT run_id FROM runs ORDER BY start_time DESC, run_id DESC LIMIT 1")
        if latest.num_rows == 0:
            raise ExportError(f"no records match: the store at {store.uri} holds no run")
        runs = [latest["run_id"][0].as_py()]
    else:
        runs = [run] if isinstance(run, str) else list(run)
        for run_id in runs:
            check_run_id(run_id)
    conditions = [f"run_id IN ({sql_strings(runs)})"]
    described = [f"run {', '.join(runs)}"]
    for column, value in (("step", step), ("invocation_id", invocation), ("rank", rank)):
        if value is not None:
            conditions.append(f"{column} = {int(value)}")
            described.append(f"{column.removesuffix('_id')} {int(value)}")
    if window is not None:
        conditions.append(
            "EXISTS (SELECT 1 FROM invocations i WHERE i.run_id = r.run_id AND i.rank = r.rank "
            f"AND i.invocation_id = r.invocation_id AND i.window_id = {int(window)})"
        )
        described.append(f"window {int(window)}")
    if where is not None:
        conditions.append(f"({where}\n)")
        described.append(f"where {where}")
    source = "records" if where is None else "records_ns"
    selection = f"SELECT * FROM {source} r WHERE {' AND '.join(conditions)}"
    return selection, ", ".join(described), runs


def _check_arguments(
    step: int | None,
    invocation: int | None,
    rank: int | None,
    window: int | None,
    where: str | None,
    query: str | None,
) -> None:
    """Refuse, before anything runs, a number out of its range, a ``where`` that is not one
    SQL expression and a ``query`` that is not one read-only statement
    (``ArgumentError``, ``StatementError``)."""
    check_given(
        (step, STEP, "--step"),
        (invocation, INVOCATION_ID, "--invocation"),
        (rank, RANK, "--rank"),
        (window, WINDOW, "--window"),
    )
    if where is not None:
        one_expression(where, "the --where condition")
    if query is not None:
        read_only_statement(query, "the --sql query")


def export_chrome_trace(
    store: Store,
    path: str | os.PathLike[str],
    *,
    run: str | Sequence[str] | None = None,
    step: int | None = None,
    invocation: int | None = None,
    rank: int | None = None,
    window: int | None = None,
    where: str | None = None,
    query: str | None = None,
    detailed_task_names: bool = False,
) -> ExportedTrace:
    """Write the Chrome Trace of records of the store to ``path`` (gzipped if it ends in
    ``.gz``); return what was written.

    The records are those of ``run`` (default: the latest run) narrowed by ``step``,
    ``invocation``, ``rank``, capture ``window`` and ``where`` (one SQL expression over
    the columns of ``records_ns``), or the rows of ``query``, one read-only SQL statement
    whose rows carry the record columns (``RECORD_COLUMNS``). ``detailed_task_names``
    names each event ``<owner_label><owner>_<stage>_task<n>`` instead of by its stage only.

    Raises ``StatementError`` for a ``where`` or ``query`` the read-only policy refuses and
    ``ArgumentError`` for a number out of range, before anything runs; ``ExportError``
    when the path cannot be written (checked before the query runs), nothing matches, a
    query lacks record columns or holds NULLs there, an invocation has no positive
    frequency, or DuckDB cannot run the SQL (``ExportQueryError``). No file is left behind
    then (the trace is written aside and renamed into place).
    """
    _check_arguments(step, invocation, rank, window, where, query)
    if query is not None:
        if any(v is not None for v in (run, step, invocation, rank, window, where)):
            raise ExportError("give either a query or run/step/invocation/rank/window/where")
        selection, described, runs = query.rstrip().rstrip(";"), f"query {query!r}", None
    else:
        selection, described, runs = _selection(store, run, step, invocation, rank, window, where)
    path = Path(path)
    with (
        written_aside(path, ExportError, "the trace") as aside,
        tempfile.TemporaryDirectory(prefix=".mcprof-export-", dir=aside.parent) as scratch,
        store.reading(runs=runs) as con,
        _query_errors(described),
    ):
        plan = _plan(con, selection, described, detailed_task_names, Path(scratch))
        written = _write(con, aside, path.suffix == ".gz", plan)
    return ExportedTrace(
        path=path,
        events=written.metadata_events + plan.records + written.flow_rows,
        records=plan.records,
        flows=written.metadata["flowCount"],
        metadata=written.metadata,
    )


@contextmanager
def _query_errors(described: str) -> Iterator[None]:
    """DuckDB's errors as ``ExportQueryError`` naming the export and the first line of
    DuckDB's reason."""
    try:
        yield
    except duckdb.Error as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise ExportQueryError(f"cannot export {described}: {reason}") from None


def _fetch(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    return con.sql(sql).to_arrow_table()


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[Any, ...]:
    return con.execute(sql).fetchall()[0]


_CANDIDATES = """
CREATE TEMP TABLE cand AS
SELECT
    run_id, rank, invocation_id,
    (row_number() OVER (ORDER BY run_id, rank, invocation_id) - 1)::INTEGER AS cand
FROM (SELECT DISTINCT run_id, rank, invocation_id FROM invocations)
"""

_SELECTED = """
COPY (
    SELECT c.cand, {columns}
    FROM (
{selection}
    ) q
    LEFT JOIN cand c
        ON c.run_id = q.run_id AND c.rank = q.rank AND c.invocation_id = q.invocation_id
) TO {path} (FORMAT parquet)
"""
"""The selected records, each with its invocation's code (``cand``) instead of its run,
rank and invocation id, streamed to a scratch file: the query runs once, and its rows
are not held in memory."""

_GROUPED = """
SELECT s.*, g.grp
FROM sel s
JOIN inv i USING (cand)
JOIN grp g ON g.inv_index = i.inv_index AND g.core_type = s.core_type AND g.block_id = s.block_id
"""
"""The selected records with their group, for ``_GroupFiles``."""


class _GroupFiles:
    """Rows filed by group, one Arrow IPC file per group under ``scratch`` named
    ``<kind><group>.arrow``, as DuckDB streams them: a group then reads its own file only,
    and no more than a batch of the rows is in memory meanwhile."""

    def __init__(self, scratch: Path, kind: str) -> None:
        self.scratch = scratch
        self.kind = kind
        self._writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}

    def path(self, group: int) -> Path:
        return self.scratch / f"{self.kind}{int(group)}.arrow"

    def add(self, con: duckdb.DuckDBPyConnection, sql: str) -> None:
        """File the rows of ``sql`` (a ``grp`` column says each row's group) by group."""
        for batch in con.sql(sql).to_arrow_reader(1 << 16):
            group = batch.column("grp").to_numpy()
            order = np.argsort(group, kind="stable")
            group = group[order]
            rows = batch.drop_columns(["grp"]).take(pa.array(order))
            edges = np.flatnonzero(np.diff(group)) + 1
            for first, stop in zip(
                [0, *edges.tolist()], [*edges.tolist(), len(group)], strict=True
            ):
                number = int(group[first])
                if number not in self._writers:
                    self._writers[number] = pa.ipc.new_file(self.path(number), rows.schema)
                self._writers[number].write_batch(rows.slice(first, stop - first))

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def read(self, group: int) -> pa.Table | None:
        """The rows of ``group`` (``None`` when it has none)."""
        path = self.path(group)
        if not path.exists():
            return None
        with pa.OSFile(str(path)) as source:
            return pa.ipc.open_file(source).read_all()


def _select(con: duckdb.DuckDBPyConnection, selection: str, described: str, scratch: Path) -> int:
    """Keep the selected records as ``sel`` (``_SELECTED``); check they can make a trace;
    return how many there are."""
    relation = con.sql(selection)
    if relation is None:
        raise ExportError(f"{described} returns no rows to export (it is not a query)")
    missing = [c for c in RECORD_COLUMNS if c not in relation.columns]
    if missing:
        raise ExportError(
            f"{described} lacks the record column(s) {', '.join(missing)}; select them "
            "(e.g. SELECT * FROM records_ns WHERE ...)"
        )
    con.execute(_CANDIDATES)
    columns = ", ".join(f'q."{c}"::{t} AS {c}' for c, t in _RECORD_TYPES.items())
    kept = sql_string(str(scratch / "selected.parquet"))
    con.execute(_SELECTED.format(columns=columns, selection=selection, path=kept))
    con.execute(f"CREATE TEMP VIEW sel AS SELECT * FROM read_parquet({kept})")
    counts = _one(
        con,
        "SELECT count(*), count(*) - count(cand), "
        + ", ".join(f"count(*) - count({c})" for c in _RECORD_TYPES)
        + " FROM sel",
    )
    if counts[0] == 0:
        raise ExportError(f"no records match {described}")
    nulls = [f"{c} ({n})" for c, n in zip(_RECORD_TYPES, counts[2:], strict=True) if n]
    if nulls:
        raise ExportError(
            f"{described} has rows with NULL in the record column(s) {', '.join(nulls)}; "
            "every record needs all of them"
        )
    if counts[1]:
        run_id, rank, invocation = _one(
            con,
            f"SELECT q.run_id, q.rank, q.invocation_id FROM (\n{selection}\n) q ANTI JOIN cand c "
            "ON c.run_id = q.run_id AND c.rank = q.rank AND c.invocation_id = q.invocation_id "
            "ORDER BY ALL LIMIT 1",
        )
        raise ExportError(
            f"{counts[1]} selected record(s) belong to no invocation in the store "
            f"(first: run {run_id} rank {rank} invocation {invocation})"
        )
    return counts[0]


_INVOCATIONS = """
CREATE TEMP TABLE inv AS
WITH keys AS (SELECT cand, count(*) AS selected FROM sel GROUP BY cand),
picked AS (
    SELECT i.*, k.cand, k.selected FROM invocations i
    JOIN cand c ON i.run_id = c.run_id AND i.rank = c.rank AND i.invocation_id = c.invocation_id
    JOIN keys k ON k.cand = c.cand
    QUALIFY row_number() OVER (
        PARTITION BY i.run_id, i.rank, i.invocation_id ORDER BY i.write_id
    ) = 1
)
SELECT
    p.*,
    r.label, r.commit,
    dense_rank() OVER (ORDER BY r.start_time, p.run_id) AS run_order,
    dense_rank() OVER (ORDER BY p.stage_names::VARCHAR, p.owner_label) AS naming,
    EXISTS (
        SELECT 1 FROM tasks g
        WHERE g.run_id = p.run_id AND g.rank = p.rank AND g.config_id = p.config_id
    ) AS has_graph,
    (row_number() OVER (ORDER BY r.start_time, p.run_id, p.rank, p.invocation_id) - 1)::INTEGER
        AS inv_index
FROM picked p LEFT JOIN runs r USING (run_id)
"""

_SLOTS = """
CREATE TEMP TABLE slot AS
SELECT
    i.inv_index, c.core_type, c.block_id, c.entry_cycle, c.record_count,
    (row_number() OVER (ORDER BY i.inv_index, c.core_type, c.block_id) - 1)::INTEGER AS slot_code
FROM cores c
JOIN inv i
    ON c.run_id = i.run_id AND c.rank = i.rank AND c.invocation_id = i.invocation_id
    AND c.write_id = i.write_id
"""

_PROCESSES = """
CREATE TEMP TABLE proc AS
WITH entries AS (
    SELECT i.run_id, i.rank, min(s.entry_cycle) AS anchor
    FROM slot s JOIN inv i USING (inv_index)
    WHERE s.record_count > 0
    GROUP BY ALL
),
starts AS (
    SELECT i.run_id, i.rank, min(s.start_cycle) AS first_start
    FROM sel s JOIN inv i USING (cand) GROUP BY ALL
)
SELECT
    run_id, rank, coalesce(e.anchor, s.first_start) AS anchor,
    CASE WHEN (SELECT count(DISTINCT run_id) FROM inv) = 1 THEN rank
         ELSE (SELECT any_value(run_order) FROM inv i WHERE i.run_id = s.run_id) * {run_step} + rank
    END AS pid
FROM starts s LEFT JOIN entries e USING (run_id, rank)
"""

_TASK_STAGES = """
CREATE TEMP TABLE task_stage AS
SELECT i.inv_index, r.task_id, min(r.desc_id) AS stage_desc_id
FROM records r
JOIN inv i
    ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
    AND r.write_id = i.write_id
WHERE NOT i.has_graph AND r.phase = 'compute'
GROUP BY ALL
"""

_GROUPS = """
CREATE TEMP TABLE grp AS
WITH tracks AS (
    SELECT i.inv_index, p.pid, s.core_type, s.block_id, count(*) AS n
    FROM sel s JOIN inv i USING (cand) JOIN proc p ON p.run_id = i.run_id AND p.rank = i.rank
    GROUP BY ALL
),
placed AS (
    SELECT *, (sum(n) OVER (ORDER BY pid, core_type, block_id) - sum(n) OVER (
        PARTITION BY pid, core_type, block_id)) // {rows} AS raw
    FROM tracks
)
SELECT
    inv_index, pid, core_type, block_id, n,
    (dense_rank() OVER (ORDER BY raw) - 1)::INTEGER AS grp
FROM placed
"""
"""Each (invocation, core)'s group: whole tracks (pid, core) in output order, about
``GROUP_ROWS`` records a group."""

_EVENTS = """
SELECT
    p.pid, s.core_type, s.block_id, i.inv_index, i.naming, sl.slot_code,
    round((s.start_cycle::HUGEINT - p.anchor) * (1e9 / i.frequency_hz))::BIGINT AS ts_ns,
    round((s.end_cycle::HUGEINT - p.anchor) * (1e9 / i.frequency_hz))::BIGINT AS end_ns,
    s.task_id, s.desc_id, s.stage_task_index, s.owner_id, s.start_cycle, s.end_cycle,
    CASE WHEN s.desc_id IN ({wait}, {trigger}) THEN coalesce(g.desc_id, t.stage_desc_id) END
        AS task_stage,
    g.wait_event, g.wait_count
FROM {source} s
JOIN inv i USING (cand)
JOIN proc p ON p.run_id = i.run_id AND p.rank = i.rank
LEFT JOIN slot sl
    ON sl.inv_index = i.inv_index AND sl.core_type = s.core_type AND sl.block_id = s.block_id
LEFT JOIN tasks g
    ON s.desc_id IN ({wait}, {trigger}) AND i.has_graph AND g.run_id = i.run_id
    AND g.rank = i.rank AND g.config_id = i.config_id AND g.task_id = s.task_id
LEFT JOIN task_stage t
    ON s.desc_id IN ({wait}, {trigger}) AND NOT i.has_graph
    AND t.inv_index = i.inv_index AND t.task_id = s.task_id
"""


_KEYS = """
CREATE TEMP TABLE keyed AS
SELECT
    naming, desc_id, task_stage{detail},
    min(ts_ns) AS ts_lo, max(ts_ns) AS ts_hi,
    min(end_ns - ts_ns) AS dur_lo, max(end_ns - ts_ns) AS dur_hi,
    min(task_id) AS task_lo, max(task_id) AS task_hi,
    min(stage_task_index) AS index_lo, max(stage_task_index) AS index_hi,
    min(owner_id) AS owner_lo, max(owner_id) AS owner_hi,
    min(start_cycle) AS start_lo, max(start_cycle) AS start_hi,
    min(end_cycle) AS end_lo, max(end_cycle) AS end_hi
FROM ({events}) e
GROUP BY ALL
"""
"""The naming keys of the events, with the span of every value rendered: one pass over
the records, before any is written."""

_SPANS = """
SELECT
    min(ts_lo), max(ts_hi), min(dur_lo), max(dur_hi), min(task_lo), max(task_hi),
    min(index_lo), max(index_hi), min(owner_lo), max(owner_hi),
    min(start_lo), max(start_hi), min(end_lo), max(end_hi), min(desc_id), max(desc_id),
    min(CASE WHEN {fallback} THEN desc_id - {base} ELSE 0 END),
    max(CASE WHEN {fallback} THEN desc_id - {base} ELSE 0 END)
FROM keyed
"""

_NAMES = """
CREATE TEMP TABLE names AS
WITH namings AS (
    SELECT naming, any_value(stage_names) AS stage_names, any_value(owner_label) AS owner_label
    FROM inv GROUP BY naming
),
named AS (
    SELECT k.naming, k.desc_id, k.task_stage{detail_keys},
           event_name(m.stage_names, m.owner_label, k.desc_id, k.task_stage,
                      {owner}, {index}, {detailed}) AS name
    FROM keyed k JOIN namings m USING (naming)
)
SELECT *, (dense_rank() OVER (ORDER BY name) - 1)::INTEGER AS name_code FROM named
"""

_ORDERED = """
SELECT
    e.pid, e.core_type, e.block_id, e.inv_index, e.slot_code, e.ts_ns, e.end_ns,
    e.task_id, e.desc_id, e.stage_task_index, e.owner_id, e.start_cycle, e.end_cycle,
    n.name_code
FROM ({events}) e
JOIN names n
    ON n.naming = e.naming AND n.desc_id = e.desc_id
    AND n.task_stage IS NOT DISTINCT FROM e.task_stage{detail_join}
ORDER BY e.pid, e.core_type, e.block_id, e.ts_ns, e.end_ns DESC, e.desc_id, e.task_id
"""

_MOVED = """
CREATE TEMP TABLE moved (
    inv_index INTEGER, core_type UTINYINT, block_id UINTEGER, start_cycle UBIGINT,
    end_cycle UBIGINT, desc_id UINTEGER, task_id UINTEGER, lane BIGINT
)
"""
"""Records on a sub-track (lane > 0) by identity, for the arrows' ends; identical
records always share a lane."""

_SAME_RECORD = """m{side}.inv_index = {side}.inv_index AND m{side}.core_type = {side}.core_type
    AND m{side}.block_id = {side}.block_id AND m{side}.start_cycle = {side}.start_cycle
    AND m{side}.end_cycle = {side}.end_cycle AND m{side}.desc_id = {side}.desc_id
    AND m{side}.task_id = {side}.task_id"""

_ARROWS = """
WITH triggers AS (
    SELECT
        i.inv_index, r.task_id, g.trigger_event AS event,
        row_number() OVER (
            PARTITION BY i.inv_index, g.trigger_event
            ORDER BY r.end_cycle, r.start_cycle, r.task_id
        ) AS nth
    FROM records r
    JOIN inv i
        ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
        AND r.write_id = i.write_id
    JOIN tasks g
        ON g.run_id = r.run_id AND g.rank = r.rank AND g.config_id = i.config_id
        AND g.task_id = r.task_id
    WHERE i.has_graph AND r.desc_id = {trigger} AND g.trigger_event >= 0
        AND i.inv_index BETWEEN {first} AND {last}
),
timed AS NOT MATERIALIZED (
    SELECT
        s.*, i.inv_index, i.run_id, i.rank, i.config_id, p.pid,
        round((s.start_cycle::HUGEINT - p.anchor) * (1e9 / i.frequency_hz))::BIGINT AS ts_ns,
        round((s.end_cycle::HUGEINT - p.anchor) * (1e9 / i.frequency_hz))::BIGINT AS end_ns
    FROM sel s
    JOIN inv i USING (cand)
    JOIN proc p ON p.run_id = i.run_id AND p.rank = i.rank
    WHERE i.has_graph AND s.desc_id IN ({wait}, {trigger})
        AND i.inv_index BETWEEN {first} AND {last}
),
sources AS MATERIALIZED (
    SELECT
        t.inv_index, t.event, t.nth, x.pid AS source_pid, x.ts_ns AS source_ts,
        x.core_type * 1000 + x.block_id + {lane_step} * coalesce(mx.lane, 0) AS source_tid
    FROM timed x
    JOIN triggers t ON t.inv_index = x.inv_index AND t.task_id = x.task_id
    LEFT JOIN moved mx ON {same_source}
    WHERE x.desc_id = {trigger}
),
waits AS MATERIALIZED (
    SELECT
        w.*, g.wait_event, g.wait_count,
        w.core_type * 1000 + w.block_id + {lane_step} * coalesce(mw.lane, 0) AS target_tid
    FROM timed w
    JOIN tasks g
        ON g.run_id = w.run_id AND g.rank = w.rank AND g.config_id = w.config_id
        AND g.task_id = w.task_id
    LEFT JOIN moved mw ON {same_target}
    WHERE w.desc_id = {wait} AND g.wait_event >= 0
)
SELECT
    gr.grp, x.source_pid, x.source_tid, x.source_ts, w.pid AS target_pid, w.target_tid,
    w.ts_ns AS target_ts, w.end_ns AS target_end, w.core_type, w.block_id, w.desc_id, w.task_id
FROM waits w
JOIN sources x
    ON x.inv_index = w.inv_index AND x.event = w.wait_event AND x.nth = w.wait_count
JOIN grp gr
    ON gr.inv_index = w.inv_index AND gr.core_type = w.core_type AND gr.block_id = w.block_id
"""
"""The arrows into the selected waits of invocations ``first`` to ``last``, with their
wait's group: from the trigger that released the wait (the ``wait_count``-th trigger of
its event, by end cycle, within its invocation), on the tracks and lanes of both."""

_FLOWS = """
SELECT source_pid, source_tid, source_ts, target_pid, target_tid, target_ts, target_end
FROM mcprof_arrows
ORDER BY target_pid, core_type, block_id, target_ts, target_end DESC, desc_id, task_id
"""
"""The arrows into one group's waits, in the order of their waits."""


@dataclass(frozen=True)
class _Spans:
    """The span of every value of the events, over the whole selection."""

    ts: Span
    dur: Span
    task: Span
    index: Span
    owner: Span
    start: Span
    end: Span
    desc: Span
    task_type: Span


@dataclass
class _Plan:
    """What every group's rendering shares: the selection's tables, names and spans."""

    con: duckdb.DuckDBPyConnection
    scratch: Path
    records: int
    groups: int
    names: np.ndarray
    spans: _Spans
    invocations: pa.Table
    slots: pa.Table
    processes: pa.Table
    invocation_pids: np.ndarray
    described: str
    detailed: bool

    def events(self, group: int) -> pa.Table:
        """One group's events, in their order in the trace, from the group's own file."""
        self.con.register("mcprof_group", _GroupFiles(self.scratch, "records").read(group))
        try:
            return _fetch(
                self.con,
                _ORDERED.format(
                    events=_events("mcprof_group"), detail_join=_detail_join(self.detailed)
                ),
            )
        finally:
            self.con.unregister("mcprof_group")

    def flows(self, arrows: _GroupFiles, group: int) -> pa.Table | None:
        """The arrows into one group's waits, in their waits' order (``None``: none)."""
        filed = arrows.read(group)
        if filed is None:
            return None
        self.con.register("mcprof_arrows", filed)
        try:
            return _fetch(self.con, _FLOWS)
        finally:
            self.con.unregister("mcprof_arrows")


def _events(source: str) -> str:
    """The SQL of the events of the records in ``source`` (``sel`` or a group's file)."""
    marks = {"wait": DESC_WAIT_DEPENDENCY, "trigger": DESC_TRIGGER_EVENT}
    return _EVENTS.format(source=source, **marks)


def _detail_join(detailed: bool) -> str:
    if not detailed:
        return ""
    return " AND n.owner_id = e.owner_id AND n.stage_task_index = e.stage_task_index"


def _plan(
    con: duckdb.DuckDBPyConnection,
    selection: str,
    described: str,
    detailed: bool,
    scratch: Path,
) -> _Plan:
    """Keep the selection, find its invocations, cores and processes, name its events, take
    the span of every value and file the records by group: everything but the events."""
    # Opening the store's files leaves freed Arrow buffers in the pool: give them back first.
    pa.default_memory_pool().release_unused()
    records = _select(con, selection, described, scratch)
    con.execute(_INVOCATIONS)
    bad = con.execute(
        "SELECT run_id, rank, invocation_id, frequency_hz FROM inv "
        "WHERE NOT coalesce(frequency_hz > 0 AND isfinite(frequency_hz), false) ORDER BY ALL"
    ).fetchall()
    if bad:
        run_id, rank, invocation, frequency = bad[0]
        raise ExportError(
            f"invocation {invocation} of run {run_id} rank {rank} has cycle frequency "
            f"{frequency} Hz; cycles cannot become times without a positive frequency"
        )
    con.execute(_SLOTS)
    con.execute(_PROCESSES.format(run_step=RUN_PID_STEP))
    con.execute(_TASK_STAGES)
    con.execute(_GROUPS.format(rows=GROUP_ROWS))
    filed = _GroupFiles(scratch, "records")
    try:
        filed.add(con, _GROUPED)
    finally:
        filed.close()
    detail = ", owner_id, stage_task_index" if detailed else ""
    con.execute(_KEYS.format(detail=detail, events=_events("sel")))
    fallback = (
        f"desc_id BETWEEN {DESC_COMPUTE_FALLBACK} AND {DESC_COMPUTE_FALLBACK + MAX_TASK_TYPE}"
    )
    values = _one(con, _SPANS.format(fallback=fallback, base=DESC_COMPUTE_FALLBACK))
    spans = _Spans(*(tuple(int(v) for v in values[i : i + 2]) for i in range(0, 18, 2)))
    con.execute(
        _NAMES.format(
            detail_keys=", k.owner_id, k.stage_task_index" if detailed else "",
            owner="k.owner_id" if detailed else "NULL",
            index="k.stage_task_index" if detailed else "NULL",
            detailed="true" if detailed else "false",
        ),
    )
    con.execute(_MOVED)
    names = _fetch(con, "SELECT DISTINCT name_code, name FROM names ORDER BY name_code")
    invocations = _fetch(con, "SELECT * EXCLUDE (stage_names) FROM inv ORDER BY inv_index")
    processes = _fetch(con, "SELECT * FROM proc ORDER BY pid")
    return _Plan(
        con=con,
        scratch=scratch,
        records=records,
        groups=_one(con, "SELECT count(DISTINCT grp) FROM grp")[0],
        names=strings(names["name"].to_pylist()),
        spans=spans,
        invocations=invocations,
        slots=_fetch(con, "SELECT * FROM slot ORDER BY slot_code"),
        processes=processes,
        invocation_pids=_invocation_pids(invocations, processes),
        described=described,
        detailed=detailed,
    )


def _column(table: pa.Table, name: str) -> np.ndarray:
    return table[name].to_numpy()


_IDENTITY = ["inv_index", "core_type", "block_id", "start_cycle", "end_cycle", "desc_id", "task_id"]


class _Found(Exception):
    """A pass that assumed no sub-track found some: the (slot, lane) pairs that occur."""

    def __init__(self, pairs: np.ndarray) -> None:
        super().__init__("sub-tracks found")
        self.pairs = pairs


@dataclass(frozen=True)
class _Written:
    metadata: dict[str, Any]
    metadata_events: int
    flow_rows: int


def _write(con: duckdb.DuckDBPyConnection, aside: Path, gz: bool, plan: _Plan) -> _Written:
    """Write the trace to ``aside``. The first pass assumes that no record overlaps another
    of its core (the usual case). If one does, its lane changes the layout of every event,
    so that pass goes on only to find every lane, and a second pass writes the trace."""
    try:
        return _pass(con, aside, gz, plan, None)
    except _Found as found:
        return _pass(con, aside, gz, plan, found.pairs)


def _pass(
    con: duckdb.DuckDBPyConnection,
    aside: Path,
    gz: bool,
    plan: _Plan,
    pairs: np.ndarray | None,
) -> _Written:
    """One pass over the groups: render each group's events and arrows into the file,
    knowing the (slot, lane) ``pairs`` of the sub-tracks (``None``: assume there are none;
    raise ``_Found`` if there are)."""
    slots = plan.slots
    if pairs is None:
        slot_rows, slot_lanes = np.arange(slots.num_rows), np.zeros(slots.num_rows, np.int64)
    else:
        slot_rows, slot_lanes = pairs // 256, pairs % 256
    inv_of_slot = _column(slots, "inv_index")[slot_rows]
    slot_pid = plan.invocation_pids[inv_of_slot]
    slot_tid = (
        _column(slots, "core_type")[slot_rows].astype(np.int64) * 1000
        + _column(slots, "block_id")[slot_rows]
        + LANE_TID_STEP * slot_lanes
    )
    fragments = _slot_fragments(plan.invocations, slots, slot_rows, inv_of_slot, slot_pid, slot_tid)
    meta = _metadata_events(slot_pid, slot_tid, plan.invocations, plan.processes)
    arrows = _GroupFiles(plan.scratch, "arrows" if pairs is None else "arrows-on-lanes")
    _file_arrows(con, plan, arrows)
    head = _head_bytes(meta)
    used = np.zeros(slots.num_rows, dtype=bool)
    found: list[np.ndarray] = []
    identities: list[pa.Table] = []
    moved_pid: list[np.ndarray] = []
    moved_tid: list[np.ndarray] = []
    flows = _FlowSpool(aside.parent)
    with (
        flows,
        gzip.open(aside, "wb", compresslevel=6) if gz else open(aside, "wb") as sink,
        tqdm(total=plan.records, desc="export", unit="event", disable=None) as progress,
    ):
        sink.write(head)
        sink.flush()
        at = len(head)
        for group in range(plan.groups):
            events = plan.events(group)
            pid = _column(events, "pid").astype(np.int64)
            tid = _column(events, "core_type").astype(np.int64) * 1000 + _column(events, "block_id")
            ts, end = _column(events, "ts_ns"), _column(events, "end_ns")
            lane = assign_lanes(pid * (1 << 32) + tid, ts, end)
            slot_code = _column(events, "slot_code").astype(np.int64)
            if pairs is None:
                used[slot_code[lane == 0]] = True
            if lane.any():
                moved = np.flatnonzero(lane)
                moved_pid.append(pid[moved])
                moved_tid.append(tid[moved] + LANE_TID_STEP * lane[moved])
                if pairs is None:
                    found.append(slot_code[moved] * 256 + lane[moved])
                    identities.append(
                        events.take(pa.array(moved))
                        .select(_IDENTITY)
                        .append_column("lane", pa.array(lane[moved]))
                    )
            if found:
                continue  # the layout changes: only the lanes matter now
            codes = slot_code if pairs is None else np.searchsorted(pairs, slot_code * 256 + lane)
            rows = _event_rows(events, plan, fragments, codes, ts, end)
            at = _put(sink, gz, rows, at, progress)
            flows.add(plan.flows(arrows, group))
        if found:
            _note_moved(con, identities)
            raise _Found(np.unique(np.concatenate([np.flatnonzero(used) * 256, *found])))
        progress.total += flows.rows
        progress.refresh()
        for rows in flows.rendered():
            at = _put(sink, gz, rows, at, progress)
        moved_keys = (np.concatenate(moved_pid), np.concatenate(moved_tid)) if moved_pid else None
        metadata = _summary(plan, flows.count, moved_keys)
        if not gz:
            sink.seek(at)
        sink.write(_tail_bytes(metadata))
    return _Written(metadata, len(meta), flows.rows)


def _file_arrows(con: duckdb.DuckDBPyConnection, plan: _Plan, arrows: _GroupFiles) -> None:
    """File every arrow by its wait's group, invocations of about ``4 x GROUP_ROWS``
    records at a time: triggers are ranked within their invocation, so each part is exact
    on its own, and ranking them all at once would hold every trigger of the selection."""
    selected = np.cumsum(_column(plan.invocations, "selected"))
    part = np.concatenate([[0], selected[:-1]]) // (4 * GROUP_ROWS)
    edges = np.flatnonzero(np.diff(part, prepend=-1, append=part[-1] + 1))
    try:
        for first, stop in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
            sql = _ARROWS.format(
                trigger=DESC_TRIGGER_EVENT,
                wait=DESC_WAIT_DEPENDENCY,
                lane_step=LANE_TID_STEP,
                same_source=_SAME_RECORD.format(side="x"),
                same_target=_SAME_RECORD.format(side="w"),
                first=first,
                last=stop - 1,
            )
            arrows.add(con, sql)
    finally:
        arrows.close()


def _put(sink: BinaryIO, gz: bool, rows: Row, at: int, progress: tqdm) -> int:
    """Write ``rows`` at byte ``at`` of the file (gzip: after what is written); return where
    they end. A plain file gets each chunk at its place from the thread that rendered it."""
    if gz:
        for chunk in rows.chunks():
            sink.write(chunk)
            progress.update(len(chunk))
    else:
        for count in rows.write_at(sink.fileno(), at):
            progress.update(count)
    return at + len(rows) * rows.width


def _event_rows(
    events: pa.Table,
    plan: _Plan,
    fragments: np.ndarray,
    codes: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
) -> Row:
    """The complete events of one group, at the widths of the whole selection."""
    count = events.num_rows
    spans = plan.spans
    desc = _column(events, "desc_id")
    owner = _column(events, "owner_id")
    index = _column(events, "stage_task_index")
    fallback = (desc >= DESC_COMPUTE_FALLBACK) & (desc <= DESC_COMPUTE_FALLBACK + MAX_TASK_TYPE)
    number = (spans.index[0] + 1, spans.index[1] + 1)
    return (
        Row(count)
        .lookup(',\n{"name":', plan.names, _column(events, "name_code"))
        .millis(',"ts":', ts, spans.ts)
        .millis(',"dur":', end - ts, spans.dur)
        .lookup("", fragments, codes)
        .integers(',"task_id":', _column(events, "task_id"), spans.task)
        .integers(',"desc_id":', desc, spans.desc)
        .optional(
            fallback,
            Row(count).integers(
                ',"task_type":',
                np.where(fallback, desc - DESC_COMPUTE_FALLBACK, 0).astype(np.uint32),
                spans.task_type,
            ),
        )
        .integers(',"stage_task_index":', index, spans.index)
        .integers(',"task_number":', index.astype(np.uint64) + 1, number)
        .optional(owner != NO_OWNER, Row(count).integers(',"owner_id":', owner, spans.owner))
        .integers(',"start_cycle":', _column(events, "start_cycle"), spans.start)
        .integers(',"end_cycle":', _column(events, "end_cycle"), spans.end)
        .text("}}")
    )


def _note_moved(con: duckdb.DuckDBPyConnection, identities: list[pa.Table]) -> None:
    """Keep the records off lane 0 in ``moved``, for the arrows that end on them."""
    con.register("mcprof_moved_rows", pa.concat_tables(identities))
    try:
        con.execute("INSERT INTO moved SELECT DISTINCT * FROM mcprof_moved_rows")
    finally:
        con.unregister("mcprof_moved_rows")


class _FlowSpool:
    """The arrows' rows (pid, tid, ts), two per arrow, spooled to an unnamed scratch file
    beside the trace as the groups make them, with their spans: their widths are known
    only once every group is done, and they follow every event in the file."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._file: BinaryIO | None = None
        self.rows = 0
        self._spans: list[tuple[Span, Span, Span]] = []

    def __enter__(self) -> _FlowSpool:
        self._file = tempfile.TemporaryFile(dir=self._directory)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._file is not None
        self._file.close()

    @property
    def count(self) -> int:
        return self.rows // 2

    def add(self, flows: pa.Table | None) -> None:
        """Spool the arrows of one group: ``s`` at the trigger's start, ``f`` (bound to the
        enclosing slice) inside the wait, at the trigger's start or the wait's, whichever
        is later."""
        if flows is None or flows.num_rows == 0:
            return
        assert self._file is not None
        rows = np.empty((2 * flows.num_rows, 3), dtype=np.int64)
        source_ts = _column(flows, "source_ts")
        rows[0::2, 0] = _column(flows, "source_pid")
        rows[1::2, 0] = _column(flows, "target_pid")
        rows[0::2, 1] = _column(flows, "source_tid")
        rows[1::2, 1] = _column(flows, "target_tid")
        rows[0::2, 2] = source_ts
        rows[1::2, 2] = np.minimum(
            np.maximum(_column(flows, "target_ts"), source_ts), _column(flows, "target_end")
        )
        self._file.write(rows.tobytes())
        self._spans.append((span_of(rows[:, 0]), span_of(rows[:, 1]), span_of(rows[:, 2])))
        self.rows += len(rows)

    def rendered(self) -> Iterator[Row]:
        """The spooled rows, ``GROUP_ROWS`` at a time, at the widths of them all."""
        if not self.rows:
            return
        assert self._file is not None
        pid_span, tid_span, ts_span = (joined([s[i] for s in self._spans]) for i in range(3))
        self._file.seek(0)
        for first in range(0, self.rows, GROUP_ROWS):
            rows = np.fromfile(self._file, np.int64, 3 * min(GROUP_ROWS, self.rows - first))
            rows = rows.reshape(-1, 3)
            number = np.arange(first, first + len(rows))
            phase = number % 2
            yield (
                Row(len(rows))
                .lookup(',\n{"ph":', strings(["s", "f"]), phase)
                .integers(',"id":', number // 2 + 1, (1, self.count))
                .integers(f',"cat":"{CATEGORY}","name":"{FLOW_NAME}","pid":', rows[:, 0], pid_span)
                .integers(',"tid":', rows[:, 1], tid_span)
                .millis(',"ts":', rows[:, 2], ts_span)
                .optional(phase == 1, Row(len(rows)).text(',"bp":"e"'))
                .text("}")
            )


def _invocation_pids(invocations: pa.Table, processes: pa.Table) -> np.ndarray:
    """The pid of each invocation (by ``inv_index``)."""
    keys = {
        (r, k): p
        for r, k, p in zip(
            processes["run_id"].to_pylist(),
            processes["rank"].to_pylist(),
            processes["pid"].to_pylist(),
            strict=True,
        )
    }
    return np.array(
        [
            keys[r, k]
            for r, k in zip(
                invocations["run_id"].to_pylist(), invocations["rank"].to_pylist(), strict=True
            )
        ],
        dtype=np.int64,
    )


def _slot_fragments(
    invocations: pa.Table,
    slots: pa.Table,
    slot_rows: np.ndarray,
    inv_of_slot: np.ndarray,
    slot_pid: np.ndarray,
    slot_tid: np.ndarray,
) -> np.ndarray:
    """The part of an event its core and invocation fix, from ``ph`` to ``direction``."""
    core_type = _column(slots, "core_type")[slot_rows]
    directions = pa.array(invocations["direction"]).dictionary_encode()
    return (
        Row(len(slot_rows))
        .integers(f',"ph":"X","cat":"{CATEGORY}","pid":', slot_pid)
        .integers(',"tid":', slot_tid)
        .integers(',"args":{"rank":', _column(invocations, "rank")[inv_of_slot])
        .integers(',"device_id":', _column(invocations, "device")[inv_of_slot])
        .integers(',"core_type":', core_type)
        .integers(',"block_id":', _column(slots, "block_id")[slot_rows])
        .integers(',"core_entry_cycle":', _column(slots, "entry_cycle")[slot_rows])
        .integers(',"invocation_id":', _column(invocations, "invocation_id")[inv_of_slot])
        .integers(',"step":', _column(invocations, "step")[inv_of_slot])
        .lookup(
            ',"direction":',
            strings(directions.dictionary.to_pylist()),
            directions.indices.to_numpy()[inv_of_slot],
        )
        .render()
    )


def _metadata_events(
    track_pid: np.ndarray, track_tid: np.ndarray, invocations: pa.Table, processes: pa.Table
) -> list[dict[str, Any]]:
    """Process and thread names and sort order: one of each per process and track."""
    head: list[dict[str, Any]] = []
    several_runs = len(set(processes["run_id"].to_pylist())) > 1
    inv = invocations.to_pylist()
    for process in processes.to_pylist():
        mine = [i for i in inv if i["run_id"] == process["run_id"] and i["rank"] == process["rank"]]
        kernels = ", ".join(dict.fromkeys(i["kernel_name"] for i in mine))
        devices = ", ".join(str(d) for d in dict.fromkeys(i["device"] for i in mine))
        name = f"{kernels} rank {process['rank']} device {devices}"
        if several_runs:
            first = mine[0]
            name += f" ({first['label'] or first['commit'] or process['run_id']})"
        head.append(_meta("process_name", process["pid"], 0, {"name": name}))
        head.append(_meta("process_sort_index", process["pid"], 0, {"sort_index": process["pid"]}))
    # Tracks in order: by process, then core type, block, lane (tid = lane x 10000 + core).
    tracks = np.unique(
        track_pid * (1 << 32) + track_tid % LANE_TID_STEP * 256 + track_tid // LANE_TID_STEP
    )
    sort_index: dict[int, int] = {}
    for key in tracks.tolist():
        pid, core_tid, lane = key >> 32, (key & 0xFFFFFFFF) // 256, key % 256
        core = f"{CORE_NAMES.get(core_tid // 1000, core_tid // 1000)}/{core_tid % 1000}"
        label = core if lane == 0 else f"{core} overlap {lane}"
        tid = core_tid + LANE_TID_STEP * lane
        position = sort_index.get(pid, 0)
        sort_index[pid] = position + 1
        head.append(_meta("thread_name", pid, tid, {"name": label}))
        head.append(_meta("thread_sort_index", pid, tid, {"sort_index": position}))
    return head


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _only(values: Iterable[Any]) -> Any:
    distinct = list(dict.fromkeys(values))
    return distinct[0] if len(distinct) == 1 else None


def _summary(
    plan: _Plan, flows: int, moved: tuple[np.ndarray, np.ndarray] | None
) -> dict[str, Any]:
    """The ``megaKernelCycleTrace`` object: what the trace holds and what to be wary of;
    ``moved`` holds the pid and tid of each record on a sub-track."""
    invocations, processes = plan.invocations, plan.processes
    per_invocation = _column(invocations, "selected")
    procs = {(p["run_id"], p["rank"]): p for p in processes.to_pylist()}
    entries = []
    for row, exported in zip(invocations.to_pylist(), per_invocation.tolist(), strict=True):
        process = procs[row["run_id"], row["rank"]]
        entries.append(
            {
                "runId": row["run_id"],
                "invocationId": row["invocation_id"],
                "step": row["step"],
                "windowIndex": row["window_id"],
                "direction": row["direction"],
                "kernelName": row["kernel_name"],
                "rank": row["rank"],
                "deviceId": row["device"],
                "pid": process["pid"],
                "socName": row["soc"],
                "cycleFrequencyMHz": row["frequency_hz"] / 1e6,
                "cycleFrequencySource": row["frequency_source"],
                "anchorCycle": row["anchor_cycle"],
                "offsetUs": (row["anchor_cycle"] - process["anchor"]) * 1e6 / row["frequency_hz"],
                "recordCapacityPerCore": {"AIC": row["aic_capacity"], "AIV": row["aiv_capacity"]},
                "recordCount": exported,
                "storedRecordCount": row["record_count"],
                "droppedRecordCount": row["dropped_count"],
                "taskGraph": row["has_graph"],
            }
        )
    dropped = sum(e["droppedRecordCount"] for e in entries)
    warnings = []
    if dropped:
        lossy = [e for e in entries if e["droppedRecordCount"]]
        warnings.append(
            f"device dropped {dropped} records in {len(lossy)} invocation(s) (full slots; "
            "raise the capacity): the timeline misses their last tasks"
        )
    sub_tracks = []
    if moved is not None:
        keys, counts = np.unique(np.stack(moved), axis=1, return_counts=True)
        for (track_pid, track_tid), moved_count in zip(
            keys.T.tolist(), counts.tolist(), strict=True
        ):
            sub_tracks.append(
                {
                    "pid": track_pid,
                    "tid": track_tid,
                    "parentTid": track_tid % LANE_TID_STEP,
                    "records": moved_count,
                }
            )
        warnings.append(
            f"{len(moved[0])} records overlapped an earlier record of their core (clock "
            f"granularity) and were moved to {len(sub_tracks)} sub-track(s)"
        )
    without_graph = sum(not e["taskGraph"] for e in entries)
    return {
        "schemaVersion": SCHEMA_VERSION,
        "selection": plan.described,
        "detailedTaskNames": plan.detailed,
        "rank": _only(p["rank"] for p in procs.values()),
        "deviceId": _only(e["deviceId"] for e in entries),
        "socName": _only(e["socName"] for e in entries),
        "windowIndex": _only(e["windowIndex"] for e in entries),
        "cycleFrequencyMHz": _only(e["cycleFrequencyMHz"] for e in entries),
        "cycleFrequencySource": _only(e["cycleFrequencySource"] for e in entries),
        "anchorCycle": _only(p["anchor"] for p in procs.values()),
        "recordCapacityPerCore": {
            "AIC": max(e["recordCapacityPerCore"]["AIC"] for e in entries),
            "AIV": max(e["recordCapacityPerCore"]["AIV"] for e in entries),
        },
        "maxRecordCapacityPerCore": MAX_CAPACITY,
        "invocationCount": len(entries),
        "recordCount": plan.records,
        "droppedRecordCount": dropped,
        "flowCount": flows,
        "invocationsWithoutTaskGraph": without_graph,
        "processes": [
            {"pid": p["pid"], "runId": p["run_id"], "rank": p["rank"], "anchorCycle": p["anchor"]}
            for p in processes.to_pylist()
        ],
        "invocations": entries,
        "subTracks": sub_tracks,
        "warnings": warnings,
    }


def _head_bytes(head: list[dict[str, Any]]) -> bytes:
    """The trace's opening and its metadata events."""
    events = b",\n".join(orjson.dumps(event) for event in head)
    return b'{"schemaVersion":1,"displayTimeUnit":"ns","traceEvents":[\n' + events


def _tail_bytes(metadata: dict[str, Any]) -> bytes:
    summary = orjson.dumps(metadata)
    return (
        b'\n],"megaKernelCycleTrace":'
        + summary
        + b',"metadata":{"megaKernelCycleTrace":'
        + summary
        + b"}}\n"
    )
