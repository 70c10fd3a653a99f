"""What a timeline shows, and the timeline itself: the records a ``RecordSelection`` picks
from the store, laid out on processes and tracks as slices and flows, in Arrow tables.

A ``RecordSelection`` (``analysis/selection.py``, re-exported here) is the one value the
selection arguments make: the analyses, export, fusion, the capture session and the CLI
all build one.

A ``Timeline`` is built from it in SQL, and knows nothing of any output format (the
Chrome JSON writer, ``chrome_trace``, renders one; fusion adds one to an outer trace):

- ``processes``: one per (run, rank): pid, name, sort index, anchor cycle;
- ``tracks``: one per thread: pid, tid (core type x 1000 + block id, plus
  ``LANE_TID_STEP`` x lane for a sub-track), name (``AIC/3``, ``AIC/3 overlap 1``), sort
  index within its process;
- ``cores``: one per core of an invocation on a lane, with what it fixes of its slices
  (rank, device, core, entry cycle, invocation, step, direction);
- the slices (one per record: pid, tid, its ``cores`` row, ts and end in exact ns from
  the process's anchor, name, the raw ids and cycles) and flows (a trigger to the wait
  it released, from ``task_edges``), group by group (``groups``), in the order they are
  shown: by process, core, then time;
- with ``critical_path``, each slice's ``critical`` mark (its record is on its
  invocation's critical path, the ``critical_path`` view) and a second kind of flow, the
  path's chain: from each critical record to the next one along the path;
- with ``flow_ids``, each slice's ``flows_out`` and ``flows_in``: the ids of the flows
  (arrows and chain) that leave it and enter it, unique in the timeline (a flow whose
  wait ends before its trigger begins has none: no format that binds flows to slices can
  draw it);
- ``names``, ``spans`` (each slice column's range over the whole selection) and
  ``metadata``, the ``megaKernelCycleTrace`` object describing the selection;
- ``clock_correction``: where the cores' clocks were corrected first
  (``open_timeline(clock_correction=True)``), the cores of its invocations that the
  correction moved (``clock_correction.APPLIED_COLUMNS``), which ``metadata`` carries as
  ``clockCorrection`` (``_correction_metadata``); None without.

It streams: the selected records go once, compactly, to a scratch Parquet file, and
from there to Arrow files by group of whole tracks (about ``group_rows`` records a group,
at most ``OPEN_GROUP_FILES`` files open at once, whatever the number of groups); the
flows are found a few invocations at a time and filed by their wait's group too (the
critical path's chain by its later record's group), so memory does not grow with the
selection. Where a record overlaps an earlier one of its
core (clock granularity) it goes to a sub-track: the first pass over the groups assumes
none does (the usual case); finding one, it finds every lane and raises
``LayoutChanged``, and the next pass yields the slices on the tracks that include them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.abi import (
    CORE_NAMES,
    DESC_COMPUTE_FALLBACK,
    DESC_TRIGGER_EVENT,
    DESC_WAIT_DEPENDENCY,
    GENERATIONS,
    MAX_CAPACITY,
    BufferLayout,
)
from multicore_profiler.analysis.clock_correction import corrected_clocks
from multicore_profiler.analysis.selection import RecordSelection, SelectedRecords
from multicore_profiler.errors import ExportError, QueryError
from multicore_profiler.export.tracks import assign_lanes
from multicore_profiler.scratch import ScratchDirectory
from multicore_profiler.storage.sql_text import sql_string
from multicore_profiler.storage.store import Store

SCHEMA_VERSION = 1
"""Of the ``megaKernelCycleTrace`` object (and of the Chrome trace that carries it)."""
LANE_TID_STEP = 10_000
"""A sub-track's tid: the core's tid + 10000 x lane (lane 0 is the core's own track)."""
CORE_TID_STEP = 1000
"""A core's tid: core type x 1000 + block id."""
RUN_PID_STEP = 100_000
"""A process's pid: its rank when the timeline holds one run; with several runs, the run's
position (from 1, oldest first) x 100000 + rank while every rank is below 100000 and every
such pid is at most ``PID_MAX``; otherwise the processes' positions (from 1) in (run, rank)
order. Each scheme gives every process its own pid, whatever the ranks and the runs."""
PID_MAX = (1 << 31) - 1
"""The largest pid: Perfetto reads a JSON pid as 32 bits, and a sort index as int32."""
GROUP_ROWS = 1 << 17
"""Records of a group by default (whole tracks, so one track can make a group larger)."""
OPEN_GROUP_FILES = 64
"""Scratch files a timeline keeps open at once while it files rows by group: a selection of
100 M records has about 760 groups, each filed into its own files."""
DEPENDENCY_FLOW = "dependency"
"""A flow's ``kind``: a trigger to the wait it released."""
CRITICAL_FLOW = "critical_path"
"""A flow's ``kind``: a critical record to the next one along its invocation's path."""

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
"""What a query's rows must carry to be shown (``records`` and ``records_ns`` have all)."""

_MODULES = ("units", "records.names", "records.aligned_records", "records.task_edges")
"""The SQL modules a timeline's queries use (with ``records.critical_path`` for its mark):
its cursor installs these alone, not every module a cursor for any statement would get."""

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


def task_types(slices: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Which slices carry ``args.task_type``, and its value (desc id - 0x20000, uint32):
    every desc id from 0x20000 on, as hyper-parallel's exporter writes them in both ABI
    generations (a compute fallback its task type, a graph stage 0x30000 + k 65536 + k)."""
    desc = numpy_column(slices, "desc_id")
    shown = desc >= DESC_COMPUTE_FALLBACK
    return shown, np.where(shown, desc - DESC_COMPUTE_FALLBACK, 0).astype(np.uint32)


def track_tid(core_type: Any, block_id: Any, lane: Any = 0) -> Any:
    """The tid of a core's track (lane 0) or sub-track: core type x 1000 + block id +
    ``LANE_TID_STEP`` x lane; for ints or numpy arrays."""
    return core_type * CORE_TID_STEP + block_id + LANE_TID_STEP * lane


def track_name(core_type: int, block_id: int, lane: int = 0) -> str:
    """``AIC/3``, or ``AIC/3 overlap 1`` for its first sub-track."""
    core = f"{CORE_NAMES.get(core_type, core_type)}/{block_id}"
    return core if lane == 0 else f"{core} overlap {lane}"


def us_text(ns: np.ndarray, quoted: np.ndarray | None = None) -> pa.Array:
    """Microseconds with three decimals from integer ns, exactly (``-1.500``), as JSON
    numbers, or strings where ``quoted``."""
    ns = np.asarray(ns, dtype=np.int64)
    magnitude = np.abs(ns)
    text = pc.binary_join_element_wise(
        pc.cast(pa.array(magnitude // 1000), pa.string()),
        pc.utf8_lpad(pc.cast(pa.array(magnitude % 1000), pa.string()), 3, "0"),
        ".",
    )
    text = pc.if_else(pa.array(ns < 0), pc.binary_join_element_wise("-", text, ""), text)
    if quoted is None:
        return text
    return pc.if_else(pa.array(quoted), pc.binary_join_element_wise('"', text, '"', ""), text)


US_TEXT_MACRO = """
CREATE OR REPLACE TEMP MACRO us_text(ns) AS
    CASE WHEN ns < 0 THEN '-' ELSE '' END || (abs(ns) // 1000)::VARCHAR || '.'
    || lpad((abs(ns) % 1000)::VARCHAR, 3, '0')
"""
"""``us_text`` as a DuckDB macro, for text made in SQL (a standalone trace's fusion)."""


def numpy_column(table: pa.Table, name: str) -> np.ndarray:
    """One column of ``table`` as a numpy array."""
    return table[name].to_numpy()


class ExportQueryError(ExportError, QueryError):
    """SQL of a timeline that DuckDB cannot run (a missing table, a value that does not
    convert, a cycle difference no time can hold): the message names what was being
    shown and DuckDB's reason, in one line."""


@contextmanager
def query_errors(described: str) -> Iterator[None]:
    """DuckDB's errors as ``ExportQueryError`` naming the selection and the first line of
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
    """Rows filed by group, in Arrow IPC files under ``scratch`` named
    ``<kind><group>-<part>.arrow``, as DuckDB streams them: a group then reads its own
    files only, and no more than a batch of the rows is in memory meanwhile. At most
    ``open_limit`` files are open at once: filing into a group whose file was closed to
    make room starts its next part, and a group reads its parts in order."""

    def __init__(self, scratch: Path, kind: str, open_limit: int = OPEN_GROUP_FILES) -> None:
        self.scratch = scratch
        self.kind = kind
        self._open_limit = open_limit
        self._writers: OrderedDict[int, pa.ipc.RecordBatchFileWriter] = OrderedDict()
        self._parts: dict[int, int] = {}

    def path(self, group: int, part: int) -> Path:
        return self.scratch / f"{self.kind}{int(group)}-{int(part)}.arrow"

    def add(
        self, con: duckdb.DuckDBPyConnection, sql: str, departures: _GroupFiles | None = None
    ) -> None:
        """File the rows of ``sql`` (a ``grp`` column says each row's group) by group, and
        with ``departures`` there too by their ``source_grp`` (the group a flow leaves)."""
        for batch in con.sql(sql).to_arrow_reader(1 << 16):
            self._file(batch, "grp")
            if departures is not None:
                departures._file(batch, "source_grp")

    def _file(self, batch: pa.RecordBatch, column: str) -> None:
        group = batch.column(column).to_numpy()
        order = np.argsort(group, kind="stable")
        group = group[order]
        placed = [c for c in ("grp", "source_grp") if c in batch.column_names]
        rows = batch.drop_columns(placed).take(pa.array(order))
        edges = np.flatnonzero(np.diff(group)) + 1
        for first, stop in zip([0, *edges.tolist()], [*edges.tolist(), len(group)], strict=True):
            self._writer(int(group[first]), rows.schema).write_batch(
                rows.slice(first, stop - first)
            )

    def _writer(self, group: int, schema: pa.Schema) -> pa.ipc.RecordBatchFileWriter:
        """The open file of ``group``: the least recently used one is closed when
        ``open_limit`` are open, and a group whose file was closed starts its next part."""
        writer = self._writers.get(group)
        if writer is not None:
            self._writers.move_to_end(group)
            return writer
        if len(self._writers) >= self._open_limit:
            self._writers.popitem(last=False)[1].close()
        part = self._parts.get(group, 0)
        self._parts[group] = part + 1
        writer = self._writers[group] = pa.ipc.new_file(self.path(group, part), schema)
        return writer

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def read(self, group: int) -> pa.Table | None:
        """The rows of ``group``, its parts in order (``None`` when it has none)."""
        tables = []
        while (path := self.path(group, len(tables))).exists():
            with pa.OSFile(str(path)) as source:
                tables.append(pa.ipc.open_file(source).read_all())
        return pa.concat_tables(tables) if tables else None


def _select(
    con: duckdb.DuckDBPyConnection,
    selection: str,
    described: str,
    scratch: Path,
    *,
    from_records: bool,
) -> tuple[int, int]:
    """Keep the selected records as ``sel`` (``_SELECTED``), each once; check they can make a
    trace; return how many there are, and how many rows of the selection repeated one.

    A selection of the store's ``records`` names each once; a query's rows may repeat one
    (``UNION ALL`` of overlapping conditions), and a record drawn twice would double its
    invocation's count and its slices: a repeated row is kept once, as it shows nothing the
    first did not (every column the timeline reads is the same)."""
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
    if from_records:
        columns += ", q.record_index::UINTEGER AS record_index"
    kept = sql_string(str(scratch / "selected.parquet"))
    con.execute(_SELECTED.format(columns=columns, selection=selection, path=kept))
    repeated = 0
    if not from_records:
        rows, distinct = _one(
            con,
            f"SELECT count(*), (SELECT count(*) FROM (SELECT DISTINCT * FROM read_parquet({kept})))"
            f" FROM read_parquet({kept})",
        )
        repeated = rows - distinct
        if repeated:
            once = sql_string(str(scratch / "selected-once.parquet"))
            con.execute(
                f"COPY (SELECT DISTINCT * FROM read_parquet({kept})) TO {once} (FORMAT parquet)"
            )
            kept = once
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
    return counts[0], repeated


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
    p.* REPLACE (
        CASE WHEN p.producer IS NULL THEN coalesce(p.abi_generation, 'a') END AS abi_generation
    ),
    r.label, r.commit,
    dense_rank() OVER (ORDER BY r.start_time, p.run_id) AS run_order,
    dense_rank() OVER (ORDER BY p.stage_names::VARCHAR, p.owner_label) AS naming,
    has_task_graph(p.run_id, p.rank, p.config_id) AS has_graph,
    dense_rank() OVER (ORDER BY p.run_id, p.rank, p.config_id)::INTEGER AS graph_key,
    {from_records} AND p.selected = p.record_count AS whole,
    (row_number() OVER (ORDER BY r.start_time, p.run_id, p.rank, p.invocation_id) - 1)::INTEGER
        AS inv_index
FROM picked p LEFT JOIN runs r USING (run_id)
"""
"""The selected invocations, each with its stored row (a row written before
``abi_generation`` existed is generation ``a``; an imported one has none), its order,
naming (of its stage names and owner label), task graph and an integer key of it
(``graph_key``: one per run, rank and config, for ``graph``), and whether the selection
holds all of its records (``whole``: only a selection of the store's ``records``, never a
query's rows, which need not be the stored ones)."""

_SLOTS = """
CREATE TEMP TABLE slot AS
SELECT
    i.inv_index, c.core_type, c.block_id,
    aligned_cycle(c.entry_cycle, o.clock_offset_cycles) AS entry_cycle, c.record_count,
    c.dropped_count, c.record_capacity,
    (row_number() OVER (ORDER BY i.inv_index, c.core_type, c.block_id) - 1)::INTEGER AS slot_code
FROM cores c
JOIN inv i
    ON c.run_id = i.run_id AND c.rank = i.rank AND c.invocation_id = i.invocation_id
    AND c.write_id = i.write_id
LEFT JOIN _core_clock_offsets o
    ON o.run_id = c.run_id AND o.rank = c.rank AND o.invocation_id = c.invocation_id
    AND o.write_id = c.write_id AND o.core_type = c.core_type AND o.block_id = c.block_id
"""
"""Each core of the selected invocations, its entry cycle on the invocation's common clock
(an anchor's offset and an applied clock correction's added, as its records' are)."""

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
),
placed AS (
    SELECT
        s.*, (SELECT any_value(run_order) FROM inv i WHERE i.run_id = s.run_id) AS run_order
    FROM starts s
),
scheme AS (
    SELECT
        count(DISTINCT run_id) = 1 AS one_run,
        max(rank) < {run_step} AND max(run_order) * {run_step} + max(rank) <= {pid_max}
            AS stepped
    FROM placed
)
SELECT
    run_id, rank, coalesce(e.anchor, s.first_start) AS anchor,
    CASE WHEN m.one_run THEN rank
         WHEN m.stepped THEN run_order * {run_step} + rank
         ELSE row_number() OVER (ORDER BY run_order, rank)
    END AS pid
FROM placed s LEFT JOIN entries e USING (run_id, rank) CROSS JOIN scheme m
"""
"""Each (run, rank)'s process, its anchor and its pid (``RUN_PID_STEP``)."""

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

_GRAPHS = """
CREATE TEMP TABLE graph AS
SELECT i.graph_key, g.task_id, g.desc_id, g.wait_event, g.wait_count, g.trigger_event
FROM tasks g
JOIN (SELECT DISTINCT graph_key, run_id, rank, config_id FROM inv) i
    ON g.run_id = i.run_id AND g.rank = i.rank AND g.config_id = i.config_id
"""
"""The tasks of the selected invocations' graphs, what the events and the arrows read of
them, by the integer ``graph_key`` of their invocations (``inv``) instead of run id, rank
and config id: read and deduplicated (the ``tasks`` view) once, not once a group and a
part, and joined on integers."""

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
    cycle_ns(s.start_cycle, p.anchor, i.frequency_hz) AS ts_ns,
    cycle_ns(s.end_cycle, p.anchor, i.frequency_hz) AS end_ns,
    s.task_id, s.desc_id, s.stage_task_index, s.owner_id, s.start_cycle, s.end_cycle,
    CASE WHEN s.desc_id IN ({wait}, {trigger}) THEN coalesce(g.desc_id, t.stage_desc_id) END
        AS task_stage
FROM {source} s
JOIN inv i USING (cand)
JOIN proc p ON p.run_id = i.run_id AND p.rank = i.rank
LEFT JOIN slot sl
    ON sl.inv_index = i.inv_index AND sl.core_type = s.core_type AND sl.block_id = s.block_id
LEFT JOIN graph g
    ON s.desc_id IN ({wait}, {trigger}) AND i.has_graph AND g.graph_key = i.graph_key
    AND g.task_id = s.task_id
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
    min(CASE WHEN {shown} THEN desc_id - {base} ELSE 0 END),
    max(CASE WHEN {shown} THEN desc_id - {base} ELSE 0 END)
FROM keyed
"""
"""The span of every value of the events; ``shown`` is whether a key's records carry a
``task_type`` (``task_types``)."""

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
"""The name of each key of the events (``event_name`` of the ``names`` SQL module)."""

_ORDERED = """
SELECT
    e.pid, e.core_type, e.block_id, e.inv_index, e.slot_code, e.ts_ns, e.end_ns,
    e.task_id, e.desc_id, e.stage_task_index, e.owner_id, e.start_cycle, e.end_cycle,
    n.name_code{marks}
FROM ({events}) e
JOIN names n
    ON n.naming = e.naming AND n.desc_id = e.desc_id
    AND n.task_stage IS NOT DISTINCT FROM e.task_stage{detail_join}
{mark_joins}
"""
"""One group's events with their names and marks, in no order (``_shown_order``)."""


def _shown_order(rows: pa.Table, pid: str, ts: str, end: str) -> pa.Array:
    """The order of ``rows`` (events, or flows by the event they enter) as shown: by
    process ``pid``, core type, block, start ``ts``, longest first (``end``), desc id, task
    id. numpy's ``lexsort``, then a ``take``: a third of the time of DuckDB's ``ORDER BY``
    of a group's events, which sorts every column they carry."""
    keys = ["task_id", "desc_id", end, ts, "block_id", "core_type", pid]
    columns = [numpy_column(rows, key) for key in keys]
    columns[2] = -columns[2]
    return pa.array(np.lexsort(columns))


_MOVED = """
CREATE TEMP TABLE moved (
    inv_index INTEGER, core_type UTINYINT, block_id UINTEGER, start_cycle UBIGINT,
    end_cycle UBIGINT, desc_id UINTEGER, task_id UINTEGER, lane BIGINT
)
"""
"""Records on a sub-track (lane > 0) by identity, for the arrows' ends; identical
records always share a lane."""

_IDENTITY = ["inv_index", "core_type", "block_id", "start_cycle", "end_cycle", "desc_id", "task_id"]
"""What identifies a record in a timeline: its invocation, core, cycles, desc and task id."""


def _record(alias: str, **given: str) -> dict[str, str]:
    """A record's identity columns as SQL: ``alias``'s columns of those names, or the
    expressions ``given`` for some of them."""
    return {column: given.get(column, f"{alias}.{column}") for column in _IDENTITY}


def _edge_end(edge: str, end: str) -> dict[str, str]:
    """The identity of the record at one end (``src`` or ``dst``) of an arrow's edge row
    ``edge`` (``task_edges``' columns, with each end's ``desc_id`` as ``_ARROWS`` adds it)."""
    return _record(
        edge,
        **{
            c: f"{edge}.{end}_{c}"
            for c in ("core_type", "block_id", "start_cycle", "end_cycle", "desc_id")
        },
        task_id=f"{edge}.{end}_task_id",
    )


def _same(alias: str, record: dict[str, str]) -> str:
    """The SQL condition that row ``alias`` is ``record`` (``_record``), column by column."""
    return " AND ".join(f"{alias}.{column} = {record[column]}" for column in _IDENTITY)


_STORED_EDGES = """
WITH released AS MATERIALIZED (
    SELECT
        i.inv_index, i.whole, e.*,
        coalesce(gs.desc_id, {trigger}) AS src_desc_id,
        coalesce(gd.desc_id, {wait}) AS dst_desc_id,
        row_number() OVER (
            PARTITION BY i.inv_index, e.kind
            ORDER BY e.dst_core_type, e.dst_block_id, e.dst_record_index, e.src_core_type,
                e.src_block_id, e.src_record_index
        ) AS nth
    FROM task_edges e
    JOIN inv i
        ON e.run_id = i.run_id AND e.rank = i.rank AND e.invocation_id = i.invocation_id
        AND e.write_id = i.write_id
    LEFT JOIN tasks gs
        ON e.kind = 'dependency' AND gs.run_id = e.run_id AND gs.rank = e.rank
        AND gs.config_id = i.config_id AND gs.task_id = e.src_task_id
    LEFT JOIN tasks gd
        ON e.kind = 'dependency' AND gd.run_id = e.run_id AND gd.rank = e.rank
        AND gd.config_id = i.config_id AND gd.task_id = e.dst_task_id
    WHERE e.kind IN ({kinds}) AND ({scope})
        AND i.inv_index BETWEEN {first} AND {last}
),
timed AS MATERIALIZED (
    SELECT s.inv_index, s.core_type, s.block_id, s.task_id, s.desc_id, s.start_cycle, s.end_cycle
    FROM (SELECT s.*, i.inv_index FROM sel s JOIN inv i USING (cand)
          WHERE i.has_graph AND NOT i.whole AND i.inv_index BETWEEN {first} AND {last}) s
    WHERE s.desc_id IN ({wait}, {trigger})
),
kept AS (
    SELECT * FROM released WHERE whole
    UNION ALL
    SELECT * FROM released e
    WHERE NOT e.whole AND {source_selected} AND {target_selected}
)
"""
"""The edges of ``kinds`` of invocations ``first`` to ``last`` from ``task_edges``, as
``kept`` for ``_ARROWS``: every edge of an invocation the selection holds whole
(``whole``); of another, those whose two ends are both selected records (matched by core,
task and cycles). A dependency edge is numbered (``nth``) within its invocation. ``scope``
bounds the edges' runs, ranks, steps and invocations by constants, which DuckDB pushes down
to the waits; the triggers they are ranked among are every trigger of the runs."""

_SELECTED_RELEASES = """
WITH graphed AS MATERIALIZED (
    SELECT
        i.inv_index, s.core_type, s.block_id, s.record_index, s.task_id, s.desc_id,
        s.start_cycle, s.end_cycle, g.wait_event, g.wait_count, g.trigger_event
    FROM sel s
    JOIN inv i USING (cand)
    JOIN graph g ON g.graph_key = i.graph_key AND g.task_id = s.task_id
    WHERE s.desc_id IN ({wait}, {trigger}) AND i.whole AND i.inv_index BETWEEN {first} AND {last}
),
triggers AS (
    SELECT
        inv_index, trigger_event, core_type, block_id, task_id, start_cycle, end_cycle,
        row_number() OVER (
            PARTITION BY inv_index, trigger_event ORDER BY end_cycle, start_cycle, task_id
        ) AS nth
    FROM graphed
    WHERE desc_id = {trigger} AND trigger_event >= 0
),
kept AS (
    SELECT
        w.inv_index, 'release' AS kind, NULL::BIGINT AS nth,
        t.core_type AS src_core_type, t.block_id AS src_block_id,
        t.task_id AS src_task_id, t.start_cycle AS src_start_cycle,
        t.end_cycle AS src_end_cycle, {trigger} AS src_desc_id,
        w.core_type AS dst_core_type, w.block_id AS dst_block_id,
        w.record_index AS dst_record_index, w.task_id AS dst_task_id,
        w.start_cycle AS dst_start_cycle, w.end_cycle AS dst_end_cycle, {wait} AS dst_desc_id
    FROM graphed w
    JOIN triggers t
        ON t.inv_index = w.inv_index AND t.trigger_event = w.wait_event AND t.nth = w.wait_count
    WHERE w.desc_id = {wait} AND w.wait_event >= 0
)
"""
"""``task_releases``' rule (a wait is released by the wait_count-th trigger of its
wait_event, by end cycle, start cycle, task id, among its invocation's records) applied to
the selected records of invocations ``first`` to ``last`` that the selection holds whole, as
``kept`` for ``_ARROWS``: those records are every record of their invocation, on the same
clock as the view's, so the edges are the view's. Ranked by the integer ``inv_index`` and
reading the selection's compact scratch file, a part reads its own invocations' triggers
only, where the view ranks every trigger of the runs for each part."""

_ARROWS = """
SELECT
    gr.grp, k.inv_index, p.pid AS source_pid,
    k.src_core_type * {core_step} + k.src_block_id + {lane_step} * coalesce(msrc.lane, 0)
        AS source_tid,
    cycle_ns(k.src_start_cycle, p.anchor, i.frequency_hz) AS source_ts,
    p.pid AS target_pid,
    k.dst_core_type * {core_step} + k.dst_block_id + {lane_step} * coalesce(mdst.lane, 0)
        AS target_tid,
    cycle_ns(k.dst_start_cycle, p.anchor, i.frequency_hz) AS target_ts,
    cycle_ns(k.dst_end_cycle, p.anchor, i.frequency_hz) AS target_end,
    k.dst_core_type AS core_type, k.dst_block_id AS block_id, k.dst_desc_id::UINTEGER AS desc_id,
    k.dst_task_id AS task_id, k.dst_start_cycle AS start_cycle, k.dst_end_cycle AS end_cycle,
    CASE WHEN k.kind = 'dependency'
        THEN (1::UBIGINT << 62) | (k.inv_index::UBIGINT << 32) | k.nth::UBIGINT
        ELSE (sw.slot_code::UBIGINT << {index_bits}) | k.dst_record_index::UBIGINT
    END AS flow_id,
    gs.grp AS source_grp, k.src_core_type AS source_core_type,
    k.src_block_id AS source_block_id, k.src_start_cycle AS source_start_cycle,
    k.src_end_cycle AS source_end_cycle, k.src_desc_id::UINTEGER AS source_desc_id,
    k.src_task_id AS source_task_id
FROM kept k
JOIN inv i USING (inv_index)
JOIN proc p ON p.run_id = i.run_id AND p.rank = i.rank
{source_moved}
{target_moved}
JOIN slot sw
    ON sw.inv_index = k.inv_index AND sw.core_type = k.dst_core_type
    AND sw.block_id = k.dst_block_id
JOIN grp gr
    ON gr.inv_index = k.inv_index AND gr.core_type = k.dst_core_type
    AND gr.block_id = k.dst_block_id
JOIN grp gs
    ON gs.inv_index = k.inv_index AND gs.core_type = k.src_core_type
    AND gs.block_id = k.src_block_id
"""
"""The arrows of the edges ``kept`` (``_STORED_EDGES`` or ``_SELECTED_RELEASES``), with
their wait's group: from the trigger that released the wait (a release edge) or from a
predecessor's compute record (a dependency edge), on the tracks and lanes of both, timed
from the edge's own cycles. Each carries its ``flow_id`` (a release: the wait's slot code
above its record index, which a slot's capacity bounds: unique in the timeline, as a wait
has one releasing trigger) and its source's group and identity, which ``flow_ids`` files
the arrow under too."""

_LISTED_DEPENDENCIES = """
SELECT count(*) > 0 FROM tasks g
SEMI JOIN inv i ON g.run_id = i.run_id AND g.rank = i.rank AND g.config_id = i.config_id
WHERE len(g.depends_on) > 0
"""
"""Whether a graph of the selected invocations lists its tasks' predecessors (the
dependency edges of ``task_edges``)."""

_FLOW_COLUMNS = (
    "inv_index",
    "source_pid",
    "source_tid",
    "source_ts",
    "target_pid",
    "target_tid",
    "target_ts",
    "target_end",
)
"""What a group's flows carry (``TimelineGroup.flows``), besides the chain's ``kind``."""

_CRITICAL = """
CREATE TEMP TABLE crit AS
WITH path AS (
    SELECT
        i.inv_index, r.core_type, r.block_id, r.start_cycle, r.end_cycle, r.desc_id, r.task_id,
        e.seq
    FROM critical_path e
    JOIN inv i
        ON e.run_id = i.run_id AND e.rank = i.rank AND e.invocation_id = i.invocation_id
        AND e.write_id = i.write_id
    JOIN aligned_records r
        ON r.run_id = e.run_id AND r.rank = e.rank AND r.invocation_id = e.invocation_id
        AND r.write_id = e.write_id AND r.core_type = e.core_type AND r.block_id = e.block_id
        AND r.record_index = e.record_index
    -- (the data_wait before a compute record a dependency held names that record too)
    WHERE e.record_index IS NOT NULL AND NOT (e.kind = 'data_wait' AND r.phase = 'compute')
        AND ({scope})
)
SELECT DISTINCT p.*
FROM sel s
JOIN inv i USING (cand)
JOIN path p ON {same}
"""
"""The selected records on their invocation's critical path, by identity (invocation, core,
cycles, desc and task id, as the arrows' ends), with their piece's ``seq``: a few hundred
rows an invocation. ``scope`` bounds the path's invocations by constants."""

_CRITICAL_MARKS = f"""
LEFT JOIN (SELECT DISTINCT {", ".join(_IDENTITY)} FROM crit) c
    ON {_same("c", _record("e"))}"""
"""What marks an event ``critical`` in ``_ORDERED``: its record is in ``crit``."""

_FLOW_LISTS = (
    """
LEFT JOIN (
    SELECT {identity}, list(flow_id ORDER BY flow_id) AS flows_in
    FROM ({{arriving}}) WHERE target_end > source_ts
    GROUP BY ALL
) fi ON {same_in}
LEFT JOIN (
    SELECT inv_index, {source}, list(flow_id ORDER BY flow_id) AS flows_out
    FROM ({{leaving}}) WHERE target_end > source_ts
    GROUP BY ALL
) fo ON {same_out}"""
).format(
    identity=", ".join(_IDENTITY),
    source=", ".join(f"source_{c} AS {c}" for c in _IDENTITY[1:]),
    same_in=_same("fi", _record("e")),
    same_out=_same("fo", _record("e")),
)
"""What gives each event of ``_ORDERED`` the ids of the flows that enter it (``fi``) and
leave it (``fo``), matched by record identity: only flows that end after they begin, the
ones a format that binds a flow to its slices' begin and end can draw."""

_FLOW_LIST_COLUMNS = """,
    coalesce(fi.flows_in, []::UBIGINT[]) AS flows_in,
    coalesce(fo.flows_out, []::UBIGINT[]) AS flows_out"""

_NO_FLOWS = """SELECT
    NULL::INTEGER AS inv_index, NULL::UTINYINT AS core_type, NULL::UINTEGER AS block_id,
    NULL::UBIGINT AS start_cycle, NULL::UBIGINT AS end_cycle, NULL::UINTEGER AS desc_id,
    NULL::UINTEGER AS task_id, NULL::UTINYINT AS source_core_type,
    NULL::UINTEGER AS source_block_id, NULL::UBIGINT AS source_start_cycle,
    NULL::UBIGINT AS source_end_cycle, NULL::UINTEGER AS source_desc_id,
    NULL::UINTEGER AS source_task_id, NULL::UBIGINT AS flow_id, NULL::BIGINT AS source_ts,
    NULL::BIGINT AS target_end
WHERE false"""
"""A group's flows when it has none, with the columns ``_FLOW_LISTS`` reads."""

_CHAIN = """
WITH timed AS MATERIALIZED (
    SELECT
        c.*, p.pid,
        cycle_ns(c.start_cycle, p.anchor, i.frequency_hz) AS ts_ns,
        cycle_ns(c.end_cycle, p.anchor, i.frequency_hz) AS end_ns,
        c.core_type * {core_step} + c.block_id + {lane_step} * coalesce(mc.lane, 0) AS tid,
        row_number() OVER (PARTITION BY c.inv_index ORDER BY c.seq) AS nth
    FROM crit c
    JOIN inv i USING (inv_index)
    JOIN proc p ON p.run_id = i.run_id AND p.rank = i.rank
    {moved}
)
SELECT
    gr.grp, w.inv_index, x.pid AS source_pid, x.tid AS source_tid, x.ts_ns AS source_ts,
    w.pid AS target_pid, w.tid AS target_tid, w.ts_ns AS target_ts, w.end_ns AS target_end,
    w.core_type, w.block_id, w.desc_id, w.task_id, w.start_cycle, w.end_cycle,
    (1::UBIGINT << 63) | (w.inv_index::UBIGINT << 32) | w.nth::UBIGINT AS flow_id,
    gs.grp AS source_grp, x.core_type AS source_core_type, x.block_id AS source_block_id,
    x.start_cycle AS source_start_cycle, x.end_cycle AS source_end_cycle,
    x.desc_id AS source_desc_id, x.task_id AS source_task_id
FROM timed w
JOIN timed x ON x.inv_index = w.inv_index AND x.nth + 1 = w.nth
JOIN grp gr
    ON gr.inv_index = w.inv_index AND gr.core_type = w.core_type AND gr.block_id = w.block_id
JOIN grp gs
    ON gs.inv_index = x.inv_index AND gs.core_type = x.core_type AND gs.block_id = x.block_id
"""
"""The critical path's chain: one flow from each critical record to the next one in ``seq``
order, on the tracks and lanes of both, with the later record's group (rows as
``_ARROWS``'s, so ``Timeline._flows`` orders them by their later record); its ``flow_id`` has the
top bit set, so it is never an arrow's."""


@dataclass(frozen=True)
class Spans:
    """The range (smallest, largest) of every value of the slices over the whole selection:
    what a writer of fixed-width rows sizes each column by before any slice is written."""

    ts: tuple[int, int]
    dur: tuple[int, int]
    task: tuple[int, int]
    index: tuple[int, int]
    owner: tuple[int, int]
    start: tuple[int, int]
    end: tuple[int, int]
    desc: tuple[int, int]
    task_type: tuple[int, int]


@dataclass(frozen=True)
class TimelineGroup:
    """One group of whole tracks: its slices, in the order shown, and the flows into its
    waits, in their waits' order (``None``: none). With ``critical_path``, the slices have a
    ``critical`` column and the flows a ``kind`` (``DEPENDENCY_FLOW``, then
    ``CRITICAL_FLOW``: the chain's flows into the group's slices, in their order)."""

    slices: pa.Table
    flows: pa.Table | None


class LayoutChanged(Exception):
    """A pass over the groups found records on sub-tracks: ``tracks`` and ``cores`` now hold
    every lane, and the next pass over ``groups()`` yields the slices on them."""


class Timeline:
    """The records of a selection on processes and tracks; see the module docstring.

    Built on a cursor of the store (``open_timeline`` holds one, and the scratch
    directory, while the timeline is read); ``metadata`` is complete once a pass over
    ``groups()`` has run to its end. ``critical_path`` marks the records on their
    invocation's critical path and adds the path's chain of flows (the cursor must have the
    ``records.critical_path`` module installed). ``flow_ids`` gives each slice the ids of
    the flows that leave it (``flows_out``) and enter it (``flows_in``), for formats that
    bind a flow to its slices rather than draw it from its own events. ``clock_correction``
    is the ``corrected_clocks`` table the cursor's records were corrected by (None: none).
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        selected: SelectedRecords,
        scratch: Path,
        *,
        detailed_task_names: bool = False,
        group_rows: int = GROUP_ROWS,
        critical_path: bool = False,
        flow_ids: bool = False,
        clock_correction: pa.Table | None = None,
    ) -> None:
        self._con = con
        self._scratch = scratch
        self.described = selected.described
        self.detailed = detailed_task_names
        self.critical_path = critical_path
        self.flow_ids = flow_ids
        self._group_rows = group_rows
        # Opening the store's files leaves freed Arrow buffers in the pool: give them back.
        pa.default_memory_pool().release_unused()
        self.records, self.repeated = _select(
            con, selected.sql, selected.described, scratch, from_records=selected.runs is not None
        )
        """The records shown, and the rows of the selection that repeated one (kept once)."""
        con.execute(_INVOCATIONS.format(from_records=selected.runs is not None))
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
        con.execute(_PROCESSES.format(run_step=RUN_PID_STEP, pid_max=PID_MAX))
        con.execute(_TASK_STAGES)
        con.execute(_GRAPHS)
        con.execute(_GROUPS.format(rows=group_rows))
        filed = _GroupFiles(scratch, "records")
        try:
            filed.add(con, _GROUPED)
        finally:
            filed.close()
        detail = ", owner_id, stage_task_index" if self.detailed else ""
        con.execute(_KEYS.format(detail=detail, events=_events("sel")))
        shown = f"desc_id >= {DESC_COMPUTE_FALLBACK}"
        values = _one(con, _SPANS.format(shown=shown, base=DESC_COMPUTE_FALLBACK))
        self.spans = Spans(*(tuple(int(v) for v in values[i : i + 2]) for i in range(0, 18, 2)))
        con.execute(
            _NAMES.format(
                detail_keys=", k.owner_id, k.stage_task_index" if self.detailed else "",
                owner="k.owner_id" if self.detailed else "NULL",
                index="k.stage_task_index" if self.detailed else "NULL",
                detailed="true" if self.detailed else "false",
            ),
        )
        con.execute(_MOVED)
        names = _fetch(con, "SELECT DISTINCT name_code, name FROM names ORDER BY name_code")
        self.names: list[str] = names["name"].to_pylist()
        """The slices' names; a slice's ``name`` is its index here (names sorted)."""
        self.invocations = _fetch(con, "SELECT * EXCLUDE (stage_names) FROM inv ORDER BY inv_index")
        self.processes = _processes(
            _fetch(con, "SELECT * FROM proc ORDER BY pid"), self.invocations
        )
        self.clock_correction = (
            None if clock_correction is None else _moved_cores(con, clock_correction)
        )
        """The cores of the timeline's invocations a clock correction moved (None: none
        applied)."""
        if critical_path:
            con.execute(
                _CRITICAL.format(
                    scope=_scope(self.invocations),
                    same=_same("p", _record("s", inv_index="i.inv_index")),
                )
            )
        self.group_count: int = _one(con, "SELECT count(DISTINCT grp) FROM grp")[0]
        self._slots = _fetch(con, "SELECT * FROM slot ORDER BY slot_code")
        self._invocation_pids = _invocation_pids(self.invocations, self.processes)
        slots = self._slots
        partial = numpy_column(slots, "record_count") < numpy_column(slots, "record_capacity")
        self.partial_dropped = np.bincount(
            numpy_column(slots, "inv_index")[partial],
            numpy_column(slots, "dropped_count")[partial],
            minlength=self.invocations.num_rows,
        ).astype(np.int64)
        """Per invocation (by ``inv_index``), the records dropped by slots that were not full
        (a recorder that reserves a task's records together drops them all when they do not
        fit); the rest of its ``dropped_count`` came from full slots."""
        self._radix = max(
            MAX_CAPACITY,
            *numpy_column(self.invocations, "aic_capacity").tolist(),
            *numpy_column(self.invocations, "aiv_capacity").tolist(),
        )
        """More than a slot's records, so more than its lanes: a (slot, lane) pair is
        ``slot_code`` x radix + lane, a flow's id the wait's slot code above its record index
        (256, generation a's cap, unless a generation b slot holds more)."""
        self._pairs: np.ndarray | None = None
        self._lay_out()
        self.metadata: dict[str, Any] | None = None

    def _lay_out(self) -> None:
        """``cores`` and ``tracks`` for the (slot, lane) pairs known (none: every slot on its
        own track)."""
        slots, pairs = self._slots, self._pairs
        if pairs is None:
            rows, lanes = np.arange(slots.num_rows), np.zeros(slots.num_rows, np.int64)
        else:
            rows, lanes = np.divmod(pairs, self._radix)
        inv = numpy_column(slots, "inv_index")[rows]
        core_type = numpy_column(slots, "core_type")[rows]
        block_id = numpy_column(slots, "block_id")[rows]
        invocations = self.invocations
        pid = self._invocation_pids[inv]
        tid = track_tid(core_type.astype(np.int64), block_id, lanes)
        self.cores = pa.table(
            {
                "pid": pid,
                "tid": tid,
                "lane": lanes,
                "inv_index": inv,
                "rank": numpy_column(invocations, "rank")[inv],
                "device": numpy_column(invocations, "device")[inv],
                "core_type": core_type,
                "block_id": block_id,
                "entry_cycle": numpy_column(slots, "entry_cycle")[rows],
                "invocation_id": numpy_column(invocations, "invocation_id")[inv],
                "step": numpy_column(invocations, "step")[inv],
                "direction": invocations["direction"].take(pa.array(inv)),
            }
        )
        """One row per core of an invocation on a lane; a slice's ``core`` is its row."""
        self.tracks = _tracks(pid, tid)

    def groups(self) -> Iterator[TimelineGroup]:
        """The slices and flows, group by group. A pass that finds records on sub-tracks it
        did not know of finds every lane, then raises ``LayoutChanged``."""
        pairs, slots = self._pairs, self._slots
        files = _FlowFiles(self._scratch, "" if pairs is None else "-on-lanes")
        self._file_arrows(files.arrows, files.departures if self.flow_ids else None)
        if self.critical_path:
            self._file_chain(files.chain, files.chain_departures if self.flow_ids else None)
        used = np.zeros(slots.num_rows, dtype=bool)
        found: list[np.ndarray] = []
        identities: list[pa.Table] = []
        moved_pid: list[np.ndarray] = []
        moved_tid: list[np.ndarray] = []
        flows = critical = chained = 0
        for group in range(self.group_count):
            arriving, chained_in = files.arrows.read(group), files.chain.read(group)
            events = self._events(
                group,
                (_present(arriving, chained_in), files.leaving(group)) if self.flow_ids else None,
            )
            pid = numpy_column(events, "pid").astype(np.int64)
            tid = track_tid(
                numpy_column(events, "core_type").astype(np.int64),
                numpy_column(events, "block_id"),
            )
            ts, end = numpy_column(events, "ts_ns"), numpy_column(events, "end_ns")
            lane = assign_lanes(pid * (1 << 32) + tid, ts, end)
            slot_code = numpy_column(events, "slot_code").astype(np.int64)
            if pairs is None:
                used[slot_code[lane == 0]] = True
            if lane.any():
                moved = np.flatnonzero(lane)
                moved_pid.append(pid[moved])
                moved_tid.append(tid[moved] + LANE_TID_STEP * lane[moved])
                if pairs is None:
                    found.append(slot_code[moved] * self._radix + lane[moved])
                    identities.append(
                        events.take(pa.array(moved))
                        .select(_IDENTITY)
                        .append_column("lane", pa.array(lane[moved]))
                    )
            if found:
                continue  # the layout changes: only the lanes matter now
            core = (
                slot_code
                if pairs is None
                else np.searchsorted(pairs, slot_code * self._radix + lane)
            )
            slices = pa.table(
                {
                    "pid": pid,
                    "tid": tid + LANE_TID_STEP * lane,
                    "core": core,
                    "ts_ns": ts,
                    "end_ns": end,
                    "name": events["name_code"],
                    **{c: events[c] for c in _SLICE_RECORD_COLUMNS},
                }
            )
            if self.flow_ids:
                slices = slices.append_column("flows_out", events["flows_out"])
                slices = slices.append_column("flows_in", events["flows_in"])
            group_flows = self._flows(arriving)
            flows += 0 if group_flows is None else group_flows.num_rows
            if self.critical_path:
                slices = slices.append_column("critical", events["critical"])
                critical += int(np.count_nonzero(numpy_column(events, "critical")))
                chain_flows = self._flows(chained_in)
                chained += 0 if chain_flows is None else chain_flows.num_rows
                group_flows = _kinds(group_flows, chain_flows)
            yield TimelineGroup(slices, group_flows)
        if found:
            _note_moved(self._con, identities)
            self._pairs = np.unique(np.concatenate([np.flatnonzero(used) * self._radix, *found]))
            self._lay_out()
            raise LayoutChanged()
        moved_keys = (np.concatenate(moved_pid), np.concatenate(moved_tid)) if moved_pid else None
        self.metadata = _summary(self, flows, moved_keys)
        if self.critical_path:
            self.metadata["criticalRecordCount"] = critical
            self.metadata["criticalFlowCount"] = chained

    def _events(self, group: int, flows: tuple[list[pa.Table], list[pa.Table]] | None) -> pa.Table:
        """One group's records as events, in their order, from the group's own file; with
        ``flows`` (the flows into the group's records, and out of them), each with the ids
        of the flows that leave it and that enter it."""
        registered = {"mcprof_group": _GroupFiles(self._scratch, "records").read(group)}
        marks = ", c.inv_index IS NOT NULL AS critical" if self.critical_path else ""
        joins = _CRITICAL_MARKS if self.critical_path else ""
        if flows is not None:
            arriving = _registered(registered, "mcprof_in", flows[0])
            leaving = _registered(registered, "mcprof_out", flows[1])
            marks += _FLOW_LIST_COLUMNS
            joins += _FLOW_LISTS.format(arriving=arriving, leaving=leaving)
        for name, table in registered.items():
            self._con.register(name, table)
        try:
            events = _fetch(
                self._con,
                _ORDERED.format(
                    events=_events("mcprof_group"),
                    detail_join=_detail_join(self.detailed),
                    marks=marks,
                    mark_joins=joins,
                ),
            )
        finally:
            for name in registered:
                self._con.unregister(name)
        return events.take(_shown_order(events, "pid", "ts_ns", "end_ns"))

    def _flows(self, filed: pa.Table | None) -> pa.Table | None:
        """The flows filed (arrows, or the chain) into one group's records, in those
        records' order (``None``: none)."""
        if filed is None:
            return None
        order = _shown_order(filed, "target_pid", "target_ts", "target_end")
        return filed.select(_FLOW_COLUMNS).take(order)

    def _file_arrows(self, arrows: _GroupFiles, departures: _GroupFiles | None) -> None:
        """File every arrow by its wait's group (and with ``departures`` by its trigger's),
        invocations of about 4 groups' records at a time: triggers are ranked within their
        invocation, so each part is exact on its own, and ranking them all at once would hold
        every trigger of the selection. A part the selection holds whole takes its release
        edges from its selected records (``_SELECTED_RELEASES``), and from ``task_edges``
        only its dependency edges, where its graphs list any; another part takes them all
        from ``task_edges``."""
        selected = np.cumsum(numpy_column(self.invocations, "selected"))
        whole = numpy_column(self.invocations, "whole").astype(bool)
        part = np.concatenate([[0], selected[:-1]]) // (4 * self._group_rows)
        edges = np.flatnonzero(np.diff(part, prepend=-1, append=part[-1] + 1))
        dependencies = _one(self._con, _LISTED_DEPENDENCIES)[0]
        try:
            for first, stop in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
                kept = [_STORED_EDGES.replace("{kinds}", "'release', 'dependency'")]
                if whole[first:stop].all():
                    kept = [_SELECTED_RELEASES]
                    if dependencies:
                        kept.append(_STORED_EDGES.replace("{kinds}", "'dependency'"))
                for edge_sql in kept:
                    sql = (edge_sql + _ARROWS).format(
                        scope=_scope(self.invocations.slice(first, stop - first)),
                        trigger=DESC_TRIGGER_EVENT,
                        wait=DESC_WAIT_DEPENDENCY,
                        source_selected=_selected(_edge_end("e", "src")),
                        target_selected=_selected(_edge_end("e", "dst")),
                        source_moved=_moved("msrc", _edge_end("k", "src")),
                        target_moved=_moved("mdst", _edge_end("k", "dst")),
                        lane_step=LANE_TID_STEP,
                        core_step=CORE_TID_STEP,
                        index_bits=(self._radix - 1).bit_length(),
                        first=first,
                        last=stop - 1,
                    )
                    arrows.add(self._con, sql, departures)
        finally:
            arrows.close()
            if departures is not None:
                departures.close()

    def _file_chain(self, chain: _GroupFiles, departures: _GroupFiles | None) -> None:
        """File the critical path's chain by its later record's group (and with
        ``departures`` by its earlier record's); ``crit`` holds a few hundred records an
        invocation, so the whole selection's chain goes at once."""
        try:
            chain.add(
                self._con,
                _CHAIN.format(
                    core_step=CORE_TID_STEP,
                    lane_step=LANE_TID_STEP,
                    moved=_moved("mc", _record("c")),
                ),
                departures,
            )
        finally:
            chain.close()
            if departures is not None:
                departures.close()


class _FlowFiles:
    """One pass's flows filed by group: the arrows and the critical path's chain by the group
    they enter and (for ``flow_ids``) by the group they leave; ``suffix`` names the pass."""

    def __init__(self, scratch: Path, suffix: str) -> None:
        self.arrows = _GroupFiles(scratch, "arrows" + suffix)
        self.departures = _GroupFiles(scratch, "departures" + suffix)
        self.chain = _GroupFiles(scratch, "chain" + suffix)
        self.chain_departures = _GroupFiles(scratch, "chain-departures" + suffix)

    def leaving(self, group: int) -> list[pa.Table]:
        """The flows (arrows, then chain) out of ``group``'s records."""
        return _present(self.departures.read(group), self.chain_departures.read(group))


def _present(*tables: pa.Table | None) -> list[pa.Table]:
    return [t for t in tables if t is not None]


def _registered(registered: dict[str, pa.Table], prefix: str, tables: list[pa.Table]) -> str:
    """The SQL of the rows of ``tables`` (``_NO_FLOWS`` when there are none), each added to
    ``registered`` under ``prefix`` and its position."""
    names = []
    for number, table in enumerate(tables):
        name = f"{prefix}{number}"
        registered[name] = table
        names.append(f"SELECT * FROM {name}")
    return "\nUNION ALL BY NAME\n".join(names) or _NO_FLOWS


def _selected(record: dict[str, str]) -> str:
    """The SQL condition that ``record`` is one of the selected waits and triggers of an
    arrows part (``timed``)."""
    return f"EXISTS (SELECT 1 FROM timed t WHERE {_same('t', record)})"


def _moved(alias: str, record: dict[str, str]) -> str:
    """The join that finds ``record``'s sub-track, ``<alias>.lane`` (NULL: lane 0)."""
    return f"LEFT JOIN moved {alias} ON {_same(alias, record)}"


def _kinds(dependencies: pa.Table | None, chain: pa.Table | None) -> pa.Table | None:
    """One group's arrows, then its chain flows, each with its ``kind`` (``None``: none)."""
    parts = [
        flows.append_column("kind", pa.array([kind] * flows.num_rows, pa.string()))
        for flows, kind in ((dependencies, DEPENDENCY_FLOW), (chain, CRITICAL_FLOW))
        if flows is not None
    ]
    return pa.concat_tables(parts) if parts else None


def _scope(invocations: pa.Table) -> str:
    """Constant bounds of the runs, ranks, steps and invocation ids of ``invocations``: one
    term per (run, rank). (A row per invocation, a few: grouped in Python, where Arrow's
    ``group_by`` would import its query engine, a twentieth of a second.)"""
    columns = invocations.select(["run_id", "rank", "step", "invocation_id"]).to_pydict()
    bounds: dict[tuple[str, int], tuple[int, int, int, int]] = {}
    for run_id, rank, step, invocation in zip(*columns.values(), strict=True):
        low_step, high_step, low_id, high_id = bounds.get(
            (run_id, rank), (step, step, invocation, invocation)
        )
        bounds[run_id, rank] = (
            min(low_step, step),
            max(high_step, step),
            min(low_id, invocation),
            max(high_id, invocation),
        )
    return " OR ".join(
        f"(e.run_id = {sql_string(run_id)} AND e.rank = {rank} "
        f"AND e.step BETWEEN {low_step} AND {high_step} "
        f"AND e.invocation_id BETWEEN {low_id} AND {high_id})"
        for (run_id, rank), (low_step, high_step, low_id, high_id) in bounds.items()
    )


_SLICE_RECORD_COLUMNS = (
    "task_id",
    "desc_id",
    "stage_task_index",
    "owner_id",
    "start_cycle",
    "end_cycle",
)


def _events(source: str) -> str:
    """The SQL of the events of the records in ``source`` (``sel`` or a group's file)."""
    marks = {"wait": DESC_WAIT_DEPENDENCY, "trigger": DESC_TRIGGER_EVENT}
    return _EVENTS.format(source=source, **marks)


def _detail_join(detailed: bool) -> str:
    if not detailed:
        return ""
    return " AND n.owner_id = e.owner_id AND n.stage_task_index = e.stage_task_index"


def _processes(processes: pa.Table, invocations: pa.Table) -> pa.Table:
    """``proc`` with each process's name and sort index: its kernels, rank and devices, and
    with several runs the run's label or commit."""
    several_runs = len(set(processes["run_id"].to_pylist())) > 1
    inv = invocations.to_pylist()
    names = []
    for process in processes.to_pylist():
        mine = [i for i in inv if i["run_id"] == process["run_id"] and i["rank"] == process["rank"]]
        kernels = ", ".join(dict.fromkeys(i["kernel_name"] for i in mine))
        devices = ", ".join(str(d) for d in dict.fromkeys(i["device"] for i in mine))
        name = f"{kernels} rank {process['rank']} device {devices}"
        if several_runs:
            first = mine[0]
            name += f" ({first['label'] or first['commit'] or process['run_id']})"
        names.append(name)
    return processes.append_column("name", pa.array(names, pa.string())).append_column(
        "sort_index", processes["pid"]
    )


def _tracks(pid: np.ndarray, tid: np.ndarray) -> pa.Table:
    """One row per distinct (pid, tid), by process, then core type, block, lane, with its
    name and its position in its process."""
    keys = np.unique(np.stack([pid, tid % LANE_TID_STEP, tid // LANE_TID_STEP], 1), axis=0)
    track_pid, core_tid, lane = keys.T
    first = np.concatenate([[0], np.flatnonzero(np.diff(track_pid)) + 1]) if len(keys) else lane
    starts = np.repeat(first, np.diff(np.append(first, len(keys))))
    return pa.table(
        {
            "pid": track_pid,
            "tid": core_tid + LANE_TID_STEP * lane,
            "parent_tid": core_tid,
            "lane": lane,
            "name": [
                track_name(int(c) // CORE_TID_STEP, int(c) % CORE_TID_STEP, int(n))
                for c, n in zip(core_tid.tolist(), lane.tolist(), strict=True)
            ],
            "sort_index": np.arange(len(keys)) - starts,
        }
    )


def _note_moved(con: duckdb.DuckDBPyConnection, identities: list[pa.Table]) -> None:
    """Keep the records off lane 0 in ``moved``, for the arrows that end on them."""
    con.register("mcprof_moved_rows", pa.concat_tables(identities))
    try:
        con.execute("INSERT INTO moved SELECT DISTINCT * FROM mcprof_moved_rows")
    finally:
        con.unregister("mcprof_moved_rows")


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


def _only(values: Iterable[Any]) -> Any:
    distinct = list(dict.fromkeys(values))
    return distinct[0] if len(distinct) == 1 else None


def _dropped_warnings(dropped: np.ndarray, partial: np.ndarray) -> list[str]:
    """The warnings for the records invocations' devices dropped (``dropped`` in all, of
    which ``partial`` on slots that were not full), per case: a full slot ran out of
    places, a slot that was not full dropped a task whose records did not all fit."""
    full = dropped - partial
    warnings = []
    if full.any():
        warnings.append(
            f"device dropped {int(full.sum())} records in {int(np.count_nonzero(full))} "
            "invocation(s) (full slots; raise the capacity): the timeline misses their last "
            "tasks"
        )
    if partial.any():
        warnings.append(
            f"device dropped {int(partial.sum())} records in {int(np.count_nonzero(partial))} "
            "invocation(s) on slots that were not full (the recorder drops a task's records "
            "together when they do not all fit): the timeline misses those tasks"
        )
    return warnings


def _moved_cores(con: duckdb.DuckDBPyConnection, correction: pa.Table) -> pa.Table:
    """The rows of ``correction`` (``APPLIED_COLUMNS``) of the timeline's invocations."""
    con.register("_applied_correction", correction)
    try:
        return _fetch(
            con,
            "SELECT * FROM _applied_correction SEMI JOIN inv USING (run_id, rank, invocation_id) "
            "ORDER BY run_id, rank, invocation_id, core, block_id",
        )
    finally:
        con.unregister("_applied_correction")


def _correction_metadata(moved: pa.Table) -> dict[str, Any]:
    """A clock correction as the ``megaKernelCycleTrace`` object's ``clockCorrection``
    says it: applied, and each moved core with its offset (cycles, ns) and the interval
    (ns, relative to its invocation's reference core; null: open) causality allows."""
    keys = {
        "run_id": "runId",
        "rank": "rank",
        "invocation_id": "invocationId",
        "core": "core",
        "block_id": "blockId",
        "offset_cycles": "offsetCycles",
        "offset_ns": "offsetNs",
        "low_ns": "lowNs",
        "high_ns": "highNs",
    }
    cores = [{keys[k]: v for k, v in row.items()} for row in moved.to_pylist()]
    return {"applied": True, "cores": cores}


def _summary(
    timeline: Timeline, flows: int, moved: tuple[np.ndarray, np.ndarray] | None
) -> dict[str, Any]:
    """The ``megaKernelCycleTrace`` object: what the trace holds and what to be wary of;
    ``moved`` holds the pid and tid of each record on a sub-track."""
    invocations, processes = timeline.invocations, timeline.processes
    per_invocation = numpy_column(invocations, "selected")
    procs = {(p["run_id"], p["rank"]): p for p in processes.to_pylist()}
    entries = []
    for row, exported in zip(invocations.to_pylist(), per_invocation.tolist(), strict=True):
        process = procs[row["run_id"], row["rank"]]
        buffer_bytes = (
            None
            if row["producer"] is not None
            else BufferLayout(
                row["aic_slots"], row["aiv_slots"], row["aic_capacity"], row["aiv_capacity"]
            ).total_bytes
        )
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
                "abiGeneration": row["abi_generation"],
                "profileBufferBytes": buffer_bytes,
            }
        )
        if row["producer"] is not None:  # another profiler's launch, imported
            entries[-1]["imported"] = {
                "producer": row["producer"],
                "format": row["producer_format"],
                "clockDomain": row["clock_domain"],
            }
    dropped = sum(e["droppedRecordCount"] for e in entries)
    warnings = _dropped_warnings(
        numpy_column(invocations, "dropped_count"), timeline.partial_dropped
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
            "granularity, or spans another profiler records concurrently on one core: warps, "
            f"units) and were moved to {len(sub_tracks)} sub-track(s)"
        )
    if timeline.repeated:
        warnings.append(
            f"{timeline.repeated} row(s) of {timeline.described} repeat a record it selects "
            "already: each record is shown once"
        )
    without_graph = sum(not e["taskGraph"] for e in entries)
    corrected = (
        {}
        if timeline.clock_correction is None
        else {"clockCorrection": _correction_metadata(timeline.clock_correction)}
    )
    return {
        "schemaVersion": SCHEMA_VERSION,
        "selection": timeline.described,
        "detailedTaskNames": timeline.detailed,
        "rank": _only(p["rank"] for p in procs.values()),
        "deviceId": _only(e["deviceId"] for e in entries),
        "socName": _only(e["socName"] for e in entries),
        "windowIndex": _only(e["windowIndex"] for e in entries),
        "cycleFrequencyMHz": _only(e["cycleFrequencyMHz"] for e in entries),
        "cycleFrequencySource": _only(e["cycleFrequencySource"] for e in entries),
        "anchorCycle": _only(p["anchor"] for p in procs.values()),
        "recordCapacityPerCore": {
            core: max(
                (e["recordCapacityPerCore"][core] for e in entries if e["abiGeneration"]),
                default=None,
            )
            for core in ("AIC", "AIV")
        },
        "maxRecordCapacityPerCore": max(
            (GENERATIONS[e["abiGeneration"]] for e in entries if e["abiGeneration"]), default=None
        ),
        "abiGeneration": _only(e["abiGeneration"] for e in entries),
        "profileBufferBytes": _only(e["profileBufferBytes"] for e in entries),
        "invocationCount": len(entries),
        "recordCount": timeline.records,
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
        **corrected,
    }


@contextmanager
def open_timeline(
    store: Store,
    selection: RecordSelection | SelectedRecords,
    *,
    detailed_task_names: bool = False,
    scratch_dir: Path | None = None,
    group_rows: int = GROUP_ROWS,
    critical_path: bool = False,
    flow_ids: bool = False,
    clock_correction: bool = False,
) -> Iterator[Timeline]:
    """The ``Timeline`` of ``selection`` in ``store``, readable until the block ends (it
    holds a cursor of the store and a scratch directory, made in ``scratch_dir``, default
    the system's); with ``critical_path``, its records on the critical path marked and
    chained, and with ``flow_ids`` each slice's flow ids (``Timeline``). With
    ``clock_correction``, the cores' clocks of the selection's runs are corrected from
    their records' causality first (``corrected_clocks``: ``ClockError`` where they cannot
    be), for the block. DuckDB's errors become ``ExportQueryError``."""
    selected = selection.resolve(store) if isinstance(selection, RecordSelection) else selection
    modules = _MODULES + (("records.critical_path",) if critical_path else ())
    with (
        ScratchDirectory(".mcprof-export-", scratch_dir) as scratch,
        corrected_clocks(store, selected.runs, clock_correction) as correction,
        store.reading(modules=modules, query=selected.sql, runs=selected.runs) as con,
        query_errors(selected.described),
    ):
        yield Timeline(
            con,
            selected,
            scratch,
            detailed_task_names=detailed_task_names,
            group_rows=group_rows,
            critical_path=critical_path,
            flow_ids=flow_ids,
            clock_correction=correction,
        )
