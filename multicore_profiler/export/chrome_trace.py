"""Chrome Trace (schema v1) of records in the store: of a run, step, invocation or any query.

The trace is a view over the store: SQL selects the records, names them (the
``event_name`` macro) and finds which trigger released which wait; numpy lays
out the tracks; ``json_rows`` renders the events straight into the file. Format:
complete events (``cat`` ``MegaKernelInternal``) with every raw id and cycle in
``args``, ``pid`` = rank, ``tid`` = core type x 1000 + block id, ``ts`` / ``dur``
in microseconds from the process's anchor (its smallest core entry cycle), flow
arrows from triggers to the waits they released, and ``megaKernelCycleTrace``
(also under ``metadata``) describing the selection.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import orjson
import pyarrow as pa
from tqdm import tqdm

from multicore_profiler.errors import ExportError, QueryError
from multicore_profiler.export.files import written_aside
from multicore_profiler.export.json_rows import Row, strings
from multicore_profiler.export.tracks import assign_lanes
from multicore_profiler.ingest.abi import (
    DESC_COMPUTE_FALLBACK,
    DESC_TRIGGER_EVENT,
    DESC_WAIT_DEPENDENCY,
    MAX_CAPACITY,
    MAX_TASK_TYPE,
    NO_OWNER,
)
from multicore_profiler.storage.partitions import check_run_id
from multicore_profiler.storage.sql_text import sql_strings
from multicore_profiler.storage.store import Store

SCHEMA_VERSION = 1
CATEGORY = "MegaKernelInternal"
FLOW_NAME = "dependency"
CORE_NAMES = {1: "AIC", 2: "AIV"}
LANE_TID_STEP = 10_000
"""A sub-track's tid: the core's tid + 10000 x lane (lane 0 is the core's own track)."""
RUN_PID_STEP = 100_000
"""With several runs in one trace, pid = run's position (from 1) x 100000 + rank."""

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
        conditions.append(f"({where})")
        described.append(f"where {where}")
    source = "records" if where is None else "records_ns"
    selection = f"SELECT * FROM {source} r WHERE {' AND '.join(conditions)}"
    return selection, ", ".join(described), runs


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
    ``invocation``, ``rank``, capture ``window`` and ``where`` (a SQL condition over the
    columns of ``records_ns``), or the rows of ``query``, any SQL whose rows carry the
    record columns (``RECORD_COLUMNS``). ``detailed_task_names`` names each event
    ``<owner_label><owner>_<stage>_task<n>`` instead of by its stage only.

    Raises ``ExportError`` when nothing matches, a query lacks record columns, an
    invocation has no positive frequency, or the path cannot be written; no file is
    left behind then (the trace is written aside and renamed into place).
    """
    if query is not None:
        if any(v is not None for v in (run, step, invocation, rank, window, where)):
            raise ExportError("give either a query or run/step/invocation/rank/window/where")
        selection, described, runs = query, f"query {query!r}", None
    else:
        selection, described, runs = _selection(store, run, step, invocation, rank, window, where)
    with store.reading(runs=runs) as con:
        trace = _build(con, selection, described, detailed_task_names)
    return _write(Path(path), trace)


@dataclass
class _Trace:
    """Everything to write: metadata events, the event rows, the flow rows, the summary."""

    head: list[dict[str, Any]]
    events: Row
    flows: Row | None
    metadata: dict[str, Any]


@contextmanager
def _query_errors() -> Iterator[None]:
    """DuckDB's errors as ``QueryError``, with DuckDB's reason."""
    try:
        yield
    except duckdb.Error as exc:
        raise QueryError(f"query failed: {exc}") from exc


def _run(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    with _query_errors():
        con.execute(sql)


def _fetch(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    with _query_errors():
        return con.sql(sql).to_arrow_table()


def _select(con: duckdb.DuckDBPyConnection, selection: str, described: str) -> None:
    """Materialize the selected records as ``sel``; check they can make a trace."""
    with _query_errors():
        relation = con.sql(selection)
    if relation is None:
        raise ExportError(f"{described} returns no rows to export (it is not a query)")
    missing = [c for c in RECORD_COLUMNS if c not in relation.columns]
    if missing:
        raise ExportError(
            f"{described} lacks the record column(s) {', '.join(missing)}; select them "
            "(e.g. SELECT * FROM records_ns WHERE ...)"
        )
    columns = ", ".join(f'"{c}"' for c in RECORD_COLUMNS)
    _run(con, f"CREATE TEMP TABLE sel AS SELECT {columns} FROM ({selection}) q")
    if con.execute("SELECT count(*) FROM sel").fetchone()[0] == 0:
        raise ExportError(f"no records match {described}")


_INVOCATIONS = """
CREATE TEMP TABLE inv AS
WITH keys AS (SELECT DISTINCT run_id, rank, invocation_id FROM sel),
picked AS (
    SELECT i.* FROM invocations i
    SEMI JOIN keys k
        ON i.run_id = k.run_id AND i.rank = k.rank AND i.invocation_id = k.invocation_id
    QUALIFY row_number() OVER (PARTITION BY run_id, rank, invocation_id ORDER BY write_id) = 1
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
starts AS (SELECT run_id, rank, min(start_cycle) AS first_start FROM sel GROUP BY ALL)
SELECT
    run_id, rank, coalesce(e.anchor, s.first_start) AS anchor,
    CASE WHEN (SELECT count(DISTINCT run_id) FROM inv) = 1 THEN rank
         ELSE (SELECT any_value(run_order) FROM inv i WHERE i.run_id = s.run_id) * {run_step} + rank
    END AS pid
FROM starts s LEFT JOIN entries e USING (run_id, rank)
"""

_EVENTS = """
CREATE TEMP TABLE ev AS
WITH task_stage AS (
    SELECT i.inv_index, r.task_id, min(r.desc_id) AS stage_desc_id
    FROM records r
    JOIN inv i
        ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
        AND r.write_id = i.write_id
    WHERE NOT i.has_graph AND r.phase = 'compute'
    GROUP BY ALL
)
SELECT
    p.pid, s.core_type, s.block_id, i.inv_index, i.naming, sl.slot_code,
    round((s.start_cycle::HUGEINT - p.anchor) * (1e9 / i.frequency_hz))::BIGINT AS ts_ns,
    round((s.end_cycle::HUGEINT - p.anchor) * (1e9 / i.frequency_hz))::BIGINT AS end_ns,
    s.task_id, s.desc_id, s.stage_task_index, s.owner_id, s.start_cycle, s.end_cycle,
    CASE WHEN s.desc_id IN ({wait}, {trigger}) THEN coalesce(g.desc_id, t.stage_desc_id) END
        AS task_stage,
    g.wait_event, g.wait_count
FROM sel s
JOIN inv i USING (run_id, rank, invocation_id)
JOIN proc p USING (run_id, rank)
LEFT JOIN slot sl
    ON sl.inv_index = i.inv_index AND sl.core_type = s.core_type AND sl.block_id = s.block_id
LEFT JOIN tasks g
    ON s.desc_id IN ({wait}, {trigger}) AND i.has_graph AND g.run_id = s.run_id
    AND g.rank = s.rank AND g.config_id = i.config_id AND g.task_id = s.task_id
LEFT JOIN task_stage t
    ON s.desc_id IN ({wait}, {trigger}) AND NOT i.has_graph
    AND t.inv_index = i.inv_index AND t.task_id = s.task_id
"""

_NAMES = """
CREATE TEMP TABLE names AS
WITH namings AS (
    SELECT naming, any_value(stage_names) AS stage_names, any_value(owner_label) AS owner_label
    FROM inv GROUP BY naming
),
keys AS (SELECT DISTINCT naming, desc_id, task_stage{detail} FROM ev),
named AS (
    SELECT k.*, event_name(m.stage_names, m.owner_label, k.desc_id, k.task_stage,
                           {owner}, {index}, {detailed}) AS name
    FROM keys k JOIN namings m USING (naming)
)
SELECT *, (dense_rank() OVER (ORDER BY name) - 1)::INTEGER AS name_code FROM named
"""

_ORDERED = """
CREATE TEMP TABLE out AS
SELECT e.*, n.name_code
FROM ev e
JOIN names n
    ON n.naming = e.naming AND n.desc_id = e.desc_id
    AND n.task_stage IS NOT DISTINCT FROM e.task_stage{detail_join}
ORDER BY e.pid, e.core_type, e.block_id, e.ts_ns, e.end_ns DESC, e.desc_id, e.task_id
"""

_FLOWS = """
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
),
positioned AS (
    SELECT inv_index, task_id, desc_id, wait_event, wait_count, rowid AS pos
    FROM out WHERE desc_id IN ({wait}, {trigger})
)
SELECT t.pos AS trigger_pos, w.pos AS wait_pos
FROM positioned w
JOIN triggers x
    ON x.inv_index = w.inv_index AND x.event = w.wait_event AND x.nth = w.wait_count
JOIN positioned t
    ON t.inv_index = x.inv_index AND t.task_id = x.task_id AND t.desc_id = {trigger}
WHERE w.desc_id = {wait} AND w.wait_event >= 0
ORDER BY w.pos
"""


def _build(
    con: duckdb.DuckDBPyConnection, selection: str, described: str, detailed: bool
) -> _Trace:
    """Run the trace's SQL over the store and lay out its events."""
    _select(con, selection, described)
    _run(con, _INVOCATIONS)
    orphans = con.execute(
        "SELECT run_id, rank, invocation_id, count(*) AS n FROM sel "
        "ANTI JOIN inv USING (run_id, rank, invocation_id) GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    if orphans:
        run_id, rank, invocation, _ = orphans[0]
        raise ExportError(
            f"{sum(o[3] for o in orphans)} selected record(s) belong to no invocation in the "
            f"store (first: run {run_id} rank {rank} invocation {invocation})"
        )
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
    _run(con, _SLOTS)
    _run(con, _PROCESSES.format(run_step=RUN_PID_STEP))
    marks = {"wait": DESC_WAIT_DEPENDENCY, "trigger": DESC_TRIGGER_EVENT}
    _run(con, _EVENTS.format(**marks))
    detail = ", owner_id, stage_task_index" if detailed else ""
    _run(
        con,
        _NAMES.format(
            detail=detail,
            owner="k.owner_id" if detailed else "NULL",
            index="k.stage_task_index" if detailed else "NULL",
            detailed="true" if detailed else "false",
        ),
    )
    detail_join = (
        " AND n.owner_id = e.owner_id AND n.stage_task_index = e.stage_task_index"
        if detailed
        else ""
    )
    _run(con, _ORDERED.format(detail_join=detail_join))
    # A table scan keeps insertion order (DuckDB's preserve_insertion_order): rowid order.
    events = _fetch(con, "SELECT * EXCLUDE (naming, task_stage, wait_event, wait_count) FROM out")
    flows = _fetch(con, _FLOWS.format(**marks))
    names = _fetch(con, "SELECT DISTINCT name_code, name FROM names ORDER BY name_code")
    invocations = _fetch(con, "SELECT * EXCLUDE (stage_names) FROM inv ORDER BY inv_index")
    slots = _fetch(con, "SELECT * FROM slot ORDER BY slot_code")
    processes = _fetch(con, "SELECT * FROM proc ORDER BY pid")
    return _layout(events, flows, names, invocations, slots, processes, described, detailed)


def _column(table: pa.Table, name: str) -> np.ndarray:
    return table[name].to_numpy()


def _layout(
    events: pa.Table,
    flows: pa.Table,
    names: pa.Table,
    invocations: pa.Table,
    slots: pa.Table,
    processes: pa.Table,
    described: str,
    detailed: bool,
) -> _Trace:
    """Tracks, metadata events, the event and flow rows and the summary of a selection."""
    count = events.num_rows
    pid = _column(events, "pid").astype(np.int64)
    tid = _column(events, "core_type").astype(np.int64) * 1000 + _column(events, "block_id")
    ts = _column(events, "ts_ns")
    end = _column(events, "end_ns")
    lane = assign_lanes(pid * (1 << 32) + tid, ts, end)
    track_tid = tid + LANE_TID_STEP * lane

    slot_code = _column(events, "slot_code")
    if lane.any():
        # A sub-track's events get fragments of their own, with the sub-track's tid.
        pairs, slot_code = np.unique(slot_code * 256 + lane, return_inverse=True)
        slot_rows, slot_lanes = pairs // 256, pairs % 256
    else:
        slot_rows, slot_lanes = np.arange(slots.num_rows), np.zeros(slots.num_rows, np.int64)
    inv_of_slot = _column(slots, "inv_index")[slot_rows]
    slot_pid = _invocation_pids(invocations, processes)[inv_of_slot]
    slot_tid = (
        _column(slots, "core_type")[slot_rows].astype(np.int64) * 1000
        + _column(slots, "block_id")[slot_rows]
        + LANE_TID_STEP * slot_lanes
    )
    fragments = _slot_fragments(invocations, slots, slot_rows, inv_of_slot, slot_pid, slot_tid)

    desc = _column(events, "desc_id")
    owner = _column(events, "owner_id")
    index = _column(events, "stage_task_index")
    fallback = (desc >= DESC_COMPUTE_FALLBACK) & (desc <= DESC_COMPUTE_FALLBACK + MAX_TASK_TYPE)
    rows = (
        Row(count)
        .lookup(',\n{"name":', strings(names["name"].to_pylist()), _column(events, "name_code"))
        .millis(',"ts":', ts)
        .millis(',"dur":', end - ts)
        .lookup("", fragments, slot_code)
        .integers(',"task_id":', _column(events, "task_id"))
        .integers(',"desc_id":', desc)
        .optional(
            fallback,
            Row(count).integers(
                ',"task_type":',
                np.where(fallback, desc - DESC_COMPUTE_FALLBACK, 0).astype(np.uint32),
            ),
        )
        .integers(',"stage_task_index":', index)
        .integers(',"task_number":', index.astype(np.uint64) + 1)
        .optional(owner != NO_OWNER, Row(count).integers(',"owner_id":', owner))
        .integers(',"start_cycle":', _column(events, "start_cycle"))
        .integers(',"end_cycle":', _column(events, "end_cycle"))
        .text("}}")
    )
    flow_rows = _flow_rows(flows, pid, track_tid, ts, end)

    head = _metadata_events(slot_pid, slot_tid, invocations, processes)
    metadata = _summary(
        events, flows, invocations, slots, processes, lane, pid, track_tid, described, detailed
    )
    return _Trace(head, rows, flow_rows, metadata)


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


def _flow_rows(
    flows: pa.Table, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, end: np.ndarray
) -> Row | None:
    """Two rows per flow: ``s`` at the trigger's start, ``f`` (bound to the enclosing slice)
    inside the wait, at the trigger's start or the wait's, whichever is later."""
    if flows.num_rows == 0:
        return None
    source = _column(flows, "trigger_pos")
    target = _column(flows, "wait_pos")
    both = np.empty(2 * len(source), dtype=np.int64)
    both[0::2], both[1::2] = source, target
    at = np.empty_like(both)
    at[0::2] = ts[source]
    at[1::2] = np.minimum(np.maximum(ts[target], ts[source]), end[target])
    phase = np.tile(np.array([0, 1]), len(source))
    flow_id = np.repeat(np.arange(1, len(source) + 1), 2)
    return (
        Row(len(both))
        .lookup(',\n{"ph":', strings(["s", "f"]), phase)
        .integers(',"id":', flow_id)
        .integers(f',"cat":"{CATEGORY}","name":"{FLOW_NAME}","pid":', pid[both])
        .integers(',"tid":', tid[both])
        .millis(',"ts":', at)
        .optional(phase == 1, Row(len(both)).text(',"bp":"e"'))
        .text("}")
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
    events: pa.Table,
    flows: pa.Table,
    invocations: pa.Table,
    slots: pa.Table,
    processes: pa.Table,
    lane: np.ndarray,
    pid: np.ndarray,
    tid: np.ndarray,
    described: str,
    detailed: bool,
) -> dict[str, Any]:
    """The ``megaKernelCycleTrace`` object: what the trace holds and what to be wary of."""
    per_invocation = np.bincount(_column(events, "inv_index"), minlength=invocations.num_rows)
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
    if lane.any():
        moved = lane > 0
        keys, counts = np.unique(np.stack([pid[moved], tid[moved]]), axis=1, return_counts=True)
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
            f"{int(moved.sum())} records overlapped an earlier record of their core (clock "
            f"granularity) and were moved to {len(sub_tracks)} sub-track(s)"
        )
    without_graph = sum(not e["taskGraph"] for e in entries)
    return {
        "schemaVersion": SCHEMA_VERSION,
        "selection": described,
        "detailedTaskNames": detailed,
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
        "recordCount": events.num_rows,
        "droppedRecordCount": dropped,
        "flowCount": flows.num_rows,
        "invocationsWithoutTaskGraph": without_graph,
        "processes": [
            {"pid": p["pid"], "runId": p["run_id"], "rank": p["rank"], "anchorCycle": p["anchor"]}
            for p in processes.to_pylist()
        ],
        "invocations": entries,
        "subTracks": sub_tracks,
        "warnings": warnings,
    }


def _head_bytes(trace: _Trace) -> bytes:
    """The trace's opening and its metadata events."""
    events = b",\n".join(orjson.dumps(event) for event in trace.head)
    return b'{"schemaVersion":1,"displayTimeUnit":"ns","traceEvents":[\n' + events


def _tail_bytes(trace: _Trace) -> bytes:
    summary = orjson.dumps(trace.metadata)
    return (
        b'\n],"megaKernelCycleTrace":'
        + summary
        + b',"metadata":{"megaKernelCycleTrace":'
        + summary
        + b"}}\n"
    )


def _write(path: Path, trace: _Trace) -> ExportedTrace:
    """Write the trace aside, then rename it into place; no file is left on failure."""
    parts = [trace.events] + ([trace.flows] if trace.flows is not None else [])
    total_rows = sum(len(part) for part in parts)
    with (
        written_aside(path, ExportError, "the trace") as aside,
        tqdm(total=total_rows, desc="export", unit="event", disable=None) as progress,
    ):
        if path.suffix == ".gz":
            _write_gzip(aside, trace, parts, progress)
        else:
            _write_plain(aside, trace, parts, progress)
    return ExportedTrace(
        path=path,
        events=len(trace.head) + total_rows,
        records=len(trace.events),
        flows=trace.metadata["flowCount"],
        metadata=trace.metadata,
    )


def _write_gzip(aside: Path, trace: _Trace, parts: list[Row], progress: tqdm) -> None:
    with gzip.open(aside, "wb", compresslevel=6) as sink:
        sink.write(_head_bytes(trace))
        for part in parts:
            for chunk in part.chunks():
                sink.write(chunk)
                progress.update(len(chunk))
        sink.write(_tail_bytes(trace))


def _write_plain(aside: Path, trace: _Trace, parts: list[Row], progress: tqdm) -> None:
    """Each row's size is known, so each chunk goes to its place in the file from the
    thread that rendered it."""
    head, tail = _head_bytes(trace), _tail_bytes(trace)
    with open(aside, "wb") as sink:
        sink.write(head)
        sink.flush()
        offset = len(head)
        for part in parts:
            for rows in part.write_at(sink.fileno(), offset):
                progress.update(rows)
            offset += len(part) * part.width
        sink.seek(offset)
        sink.write(tail)
