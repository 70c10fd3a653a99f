"""Alignment of MegaKernel invocations to the kernels of an outer trace, in SQL.

Candidates are the outer trace's complete events whose name matches the kernel
pattern, on a device (category kernel / npu / ascend / aicore, or a torch_npu
``Task Type`` naming AI Core, AIC, AIV or MIX). Each kernel of the rank (a forward and a
backward one) has a pattern inferred from its name, and an outer event that several match
belongs to the one whose pattern matches the longest part of its name; an explicit pattern
stands for every kernel. The i-th invocation of a kernel (of all, for an explicit pattern),
in launch order, goes to the i-th candidate after ``kernel_index``; its records keep their
relative times and are shifted so the earliest starts with the kernel. Where no outer event
matches any inferred pattern, every invocation goes, in order, to the run of device kernels
(after the first ``kernel_index``) whose durations best match their spans.
Invocations of one kernel that overlap once aligned (a wrong kernel or frequency makes
them longer than the gaps between their kernels) go to lanes: threads of their own, so
that every thread's slices still nest or follow one another. Each choice that needs a
second look (a duration fallback, host alignment, an invocation longer than its kernel,
a lane) is written down for the report.

The MegaKernel side (``MegaKernelSide``) gives the slices as the ``internal`` table and
renders the added events: a standalone trace's events read from its text
(``TraceSide``, which copies each slice's ``args``), or a store selection's ``Timeline``
(``fuse.merge.TimelineSide``, rendered by the exporter's own renderer).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Protocol

import duckdb
import numpy as np
import pyarrow as pa

from multicore_profiler.abi import ASCEND_CORE_NAMES
from multicore_profiler.errors import ArgumentError, FuseError
from multicore_profiler.export.timeline import CORE_NAMES, LANE_TID_STEP, US_TEXT_MACRO
from multicore_profiler.limits import COUNT
from multicore_profiler.storage.connection import arrow_cursor
from multicore_profiler.storage.sql_text import sql_strings

DEVICE_CATEGORIES = ("kernel", "npu", "ascend", "aicore")
DEVICE_TASK_TYPES = r"(?i)(ai_?core|aic|aiv|mix|vector_?core)"
RATIO_SPREAD = 1.1
"""Span / duration ratios within this factor of each other share one cause."""
FITTING_RATIO = (0.8, 1.02)
"""Span / duration medians a right frequency gives: records cover most of the kernel,
and never (beyond timestamp rounding) more than all of it."""
COMMON_FREQUENCIES_MHZ = (19.2, 24.0, 25.0, 50.0, 100.0, 200.0, 1000.0)
"""System counter frequencies of real chips and hosts, which a suggestion snaps to."""
SNAP_TOLERANCE = 0.15
"""How far (relative) an estimate may lie from the common frequency it suggests: spans
stop a little short of their kernel, so estimates run low."""


def kernel_pattern_for(kernel_name: str) -> str:
    """The default pattern of a kernel: its CamelCase words joined by an optional ``_``,
    case-insensitive (``HyperMegaMoe`` finds ``aclnnHyperMegaMoe_...`` and
    ``hyper_mega_moe``)."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+", kernel_name)
    if not words:
        raise FuseError(f"kernel name {kernel_name!r} has no word to build a pattern from")
    return "(?i)" + "_?".join(re.escape(word.lower()) for word in words)


@dataclass(frozen=True)
class AddedEvents:
    """The added events' JSON text (thread metadata, slices, arrows): chunks of whole
    events, each event preceded by ``,\\n``, made as they are written (once); and how
    many events there are."""

    chunks: Iterable[bytes]
    count: int


@dataclass
class Alignment:
    """What the writer needs: the added events, how many records they carry, and the
    ``megaKernelTraceMerge`` report."""

    added: AddedEvents
    records: int
    report: dict[str, Any]


class MegaKernelSide(Protocol):
    """Where the MegaKernel's slices and arrows come from: a standalone trace (``TraceSide``)
    or a store selection's ``Timeline`` (``fuse.merge``)."""

    def install(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create ``internal`` (one row per slice: rank, invocation_id, core_type, block_id,
        track (its tid), ts_ns, dur_ns) and ``spans`` (``_SPANS``) on ``con``."""

    def flow_rows(self, con: duckdb.DuckDBPyConnection) -> int:
        """The arrows' events (two an arrow) of the invocations in ``pairs``."""

    def events(
        self, con: duckdb.DuckDBPyConnection, shift_ns: int, flow_offset: int
    ) -> AddedEvents:
        """The added events: ``tracks``' thread names and sort indexes, then the slices of
        the invocations in ``pairs`` on their threads by time, then their arrows by time
        (ids raised by ``flow_offset``); every time shifted back by ``shift_ns``."""


_INTERNAL = """
CREATE TEMP TABLE internal AS
SELECT
    -- A single capture's slices may lack a rank, and lack an invocation id: the capture's.
    CASE WHEN ids[1] IS NULL THEN $rank::INTEGER ELSE TRY_CAST(ids[1] AS INTEGER) END AS rank,
    CASE WHEN ids[2] IS NULL THEN $invocation::BIGINT ELSE TRY_CAST(ids[2] AS BIGINT) END
        AS invocation_id,
    -- The core type as a number (mcprof) or its name (hyper-parallel's "AIC" / "AIV").
    coalesce(TRY_CAST(ids[3] AS INTEGER), CASE ids[3] {core_codes} END) AS core_type,
    TRY_CAST(ids[4] AS BIGINT) AS block_id, track, name, ts_ns, dur_ns, args, event_index
FROM (
    -- One parse of each args object for the four ids.
    SELECT
        json_extract_string(args, ['$.rank', '$.invocation_id', '$.core_type', '$.block_id'])
            AS ids,
        tid AS track, name, ts_ns, dur_ns, rtrim(args) AS args, event_index
    FROM mk
    WHERE ph = 'X' AND cat = 'MegaKernelInternal'
)
"""

_SPANS = """
CREATE TEMP TABLE spans AS
SELECT rank, invocation_id, min(ts_ns) AS first_ns, max(ts_ns + dur_ns) AS last_ns,
       count(*) AS events
FROM internal GROUP BY ALL
"""

_FLOWS = """
CREATE TEMP TABLE internal_flows AS
SELECT f.ph, TRY_CAST(f.flow_id AS HUGEINT) AS flow_id, f.tid AS track, f.ts_ns,
       f.event_index, s.rank, s.invocation_id
FROM mk f
JOIN spans s ON s.rank = f.pid AND f.ts_ns BETWEEN s.first_ns AND s.last_ns
WHERE f.ph IN ('s', 'f') AND f.cat = 'MegaKernelInternal'
"""

_INVOCATIONS = """
CREATE TEMP TABLE inv_all AS
SELECT
    i.*, s.first_ns, s.last_ns, s.events,
    (row_number() OVER (ORDER BY i.invocation_id) - 1)::BIGINT AS run_position
FROM mk_invocations i JOIN spans s USING (rank, invocation_id)
WHERE i.rank = $rank
"""

_GROUPED = """
CREATE TEMP TABLE inv AS
SELECT
    i.* EXCLUDE (run_position), g.grp,
    (row_number() OVER (PARTITION BY g.grp ORDER BY i.invocation_id) - 1)::BIGINT AS position,
    i.run_position
FROM inv_all i JOIN kernel_groups g ON g.kernel_name IS NULL OR g.kernel_name = i.kernel_name
"""

_OUTER = """
CREATE TEMP TABLE outer_x AS
SELECT * FROM (
    SELECT
        event_index, name, pid, pid_name, tid, tid_name, ts_ns, dur_ns, cat, task_type,
        CASE
            WHEN lower(cat) IN ({categories}) THEN 'cat=' || cat
            WHEN regexp_matches(coalesce(task_type, ''), '{task_types}')
                THEN 'Task Type=' || task_type
        END AS evidence,
        coalesce(pid::VARCHAR, to_json(pid_name)::VARCHAR) || '/'
            || coalesce(tid::VARCHAR, to_json(tid_name)::VARCHAR) AS track
    FROM trace_events
    WHERE source_id = $source AND ph = 'X' AND ts_ns IS NOT NULL AND dur_ns IS NOT NULL
        AND ($pid IS NULL OR pid = $pid)
)
-- Only what can be a candidate: device kernels (the duration fallback needs them all)
-- and events of a kernel's name.
WHERE evidence IS NOT NULL OR {any_match}
"""

_OWNERS = """
CREATE TEMP TABLE owners AS
SELECT event_index, grp, count(*) OVER (PARTITION BY event_index) AS claimants
FROM (
    SELECT *, max(length) OVER (PARTITION BY event_index) AS longest FROM ({matches})
)
WHERE length = longest
"""
"""Which group each outer event of a kernel's name belongs to: the one whose pattern matches
the longest part of its name (``HyperMegaMoeGrad`` over ``HyperMegaMoe``); ``claimants``
counts the groups tied for it."""

_BY_NAME = """
CREATE TEMP TABLE cand AS
SELECT
    o.*, w.grp,
    (row_number() OVER (PARTITION BY w.grp ORDER BY o.ts_ns, o.event_index) - 1 - $skip)::BIGINT
        AS position
FROM outer_x o JOIN owners w USING (event_index)
WHERE (o.evidence IS NOT NULL) = list_contains($device_groups, w.grp)
"""

_BY_DURATION = """
CREATE TEMP TABLE cand AS
WITH ordered AS (
    SELECT *, row_number() OVER (ORDER BY ts_ns, event_index) - 1 AS overall
    FROM outer_x WHERE evidence IS NOT NULL
),
device AS (
    -- The first $skip device kernels (kernel_index), in time order, are no candidates.
    SELECT * EXCLUDE (overall),
        (row_number() OVER (PARTITION BY track ORDER BY ts_ns, event_index) - 1)::BIGINT AS k
    FROM ordered WHERE overall >= $skip
),
fits AS (
    SELECT
        d.track, d.k - i.position AS first_k,
        sum(abs(d.dur_ns - (i.last_ns - i.first_ns))
            / greatest(d.dur_ns, i.last_ns - i.first_ns, 1)) AS cost,
        count(*) AS matched
    FROM device d JOIN inv i ON d.k >= i.position
    GROUP BY ALL
    HAVING count(*) = (SELECT count(*) FROM inv)
),
best AS (
    SELECT f.track, f.first_k, f.cost
    FROM fits f JOIN device d ON d.track = f.track AND d.k = f.first_k
    ORDER BY f.cost, d.ts_ns, f.track
    LIMIT 1
)
SELECT d.* EXCLUDE (k), 0 AS grp, d.k - b.first_k AS position, b.cost
FROM device d JOIN best b ON d.track = b.track
WHERE d.k >= b.first_k
"""

_PAIRS = """
CREATE TEMP TABLE pairs AS
SELECT
    i.invocation_id, i.direction, i.kernel_name, i.rank, i.device, i.events, i.first_ns,
    i.last_ns - i.first_ns AS span_ns, i.frequency_mhz, i.frequency_source,
    c.name AS outer_name, c.pid AS outer_pid, c.pid_name AS outer_pid_name,
    c.tid AS outer_tid, c.tid_name AS outer_tid_name, c.ts_ns AS outer_ts_ns,
    c.dur_ns AS outer_dur_ns, c.evidence, c.event_index AS outer_event_index,
    us_text(c.ts_ns - $shift) AS outer_ts_text, us_text(c.dur_ns) AS outer_dur_text,
    coalesce(c.pid::VARCHAR, to_json(c.pid_name)::VARCHAR) AS pid_text
FROM inv i JOIN cand c USING (grp, position)
"""

_TRACKS = """
CREATE TEMP TABLE tracks AS
WITH used AS (
    SELECT DISTINCT p.pid_text, p.outer_pid, p.outer_pid_name, p.kernel_name, e.core_type,
           e.block_id, e.track, p.lane
    FROM internal e JOIN pairs p ON e.rank = p.rank AND e.invocation_id = p.invocation_id
),
threads AS (
    SELECT pid, pid_name, max(tid) AS max_tid, min(tid) AS min_tid
    FROM trace_events WHERE source_id = $source GROUP BY ALL
),
sorted AS (
    SELECT pid, pid_name, min(TRY_CAST(args->>'$.sort_index' AS BIGINT)) AS min_sort
    FROM trace_events
    WHERE source_id = $source AND ph = 'M' AND name = 'thread_sort_index'
    GROUP BY ALL
),
numbered AS (
    SELECT u.*, (row_number() OVER (
        PARTITION BY u.pid_text
        ORDER BY u.kernel_name, u.core_type, u.block_id, u.track, u.lane
    ) - 1)::BIGINT AS ordinal,
    count(*) OVER (PARTITION BY u.pid_text) AS tracks
    FROM used u
)
SELECT
    n.*,
    coalesce(t.max_tid, 0) + 1 + n.ordinal AS tid,
    least(coalesce(s.min_sort, t.min_tid, 0), coalesce(t.min_tid, s.min_sort, 0))
        - n.tracks + n.ordinal AS sort_index,
    n.kernel_name || '/' || coalesce({core_names}, n.core_type::VARCHAR) || '/'
        || n.block_id::VARCHAR
        || CASE WHEN n.track >= {lane} THEN ' overlap ' || (n.track // {lane})::VARCHAR ELSE ''
           END
        || CASE WHEN n.lane > 0 THEN ' lane ' || n.lane::VARCHAR ELSE '' END AS thread_name
FROM numbered n
LEFT JOIN threads t
    ON t.pid IS NOT DISTINCT FROM n.outer_pid AND t.pid_name IS NOT DISTINCT FROM n.outer_pid_name
LEFT JOIN sorted s
    ON s.pid IS NOT DISTINCT FROM n.outer_pid AND s.pid_name IS NOT DISTINCT FROM n.outer_pid_name
"""

_LINES = """
SELECT line FROM (
    SELECT 0 AS part, tid, 0 AS ts_ns, 0 AS event_index,
        ',\n{"name":"thread_name","ph":"M","pid":' || pid_text || ',"tid":' || tid::VARCHAR
        || ',"args":{"name":' || to_json(thread_name)::VARCHAR || '}}' AS line
    FROM tracks
    UNION ALL
    SELECT 1, tid, 0, 0,
        ',\n{"name":"thread_sort_index","ph":"M","pid":' || pid_text || ',"tid":'
        || tid::VARCHAR || ',"args":{"sort_index":' || sort_index::VARCHAR || '}}'
    FROM tracks
    UNION ALL
    SELECT 3, t.tid, p.outer_ts_ns + f.ts_ns - p.first_ns, f.event_index,
        ',\n{"ph":"' || f.ph || '","id":' || (f.flow_id + $flow_offset)::VARCHAR
        || ',"cat":"MegaKernelInternal","name":"dependency","pid":' || p.pid_text
        || ',"tid":' || t.tid::VARCHAR
        || ',"ts":' || us_text(p.outer_ts_ns + f.ts_ns - p.first_ns - $shift)
        || CASE WHEN f.ph = 'f' THEN ',"bp":"e"}' ELSE '}' END
    FROM internal_flows f
    JOIN pairs p ON f.rank = p.rank AND f.invocation_id = p.invocation_id
    JOIN tracks t
        ON t.pid_text = p.pid_text AND t.kernel_name = p.kernel_name AND t.lane = p.lane
        AND t.track = f.track
    UNION ALL
    SELECT 2, t.tid, p.outer_ts_ns + e.ts_ns - p.first_ns, e.event_index,
        ',\n{"name":' || to_json(e.name)::VARCHAR || ',"ph":"X","cat":"MegaKernelInternal","pid":'
        || p.pid_text || ',"tid":' || t.tid::VARCHAR
        || ',"ts":' || us_text(p.outer_ts_ns + e.ts_ns - p.first_ns - $shift)
        || ',"dur":' || us_text(e.dur_ns)
        || ',"args":' || rtrim(substr(e.args, 1, length(e.args) - 1))
        || ',"parent_kernel":' || to_json(p.outer_name)::VARCHAR
        || ',"parent_kernel_ts":' || us_text(p.outer_ts_ns - $shift)
        || ',"parent_kernel_dur":' || us_text(p.outer_dur_ns) || '}}'
    FROM internal e
    JOIN pairs p ON e.rank = p.rank AND e.invocation_id = p.invocation_id
    JOIN tracks t
        ON t.pid_text = p.pid_text AND t.kernel_name = p.kernel_name AND t.lane = p.lane
        AND t.track = e.track
)
-- Slices by thread, then time; arrows by time only, so that an arrow's start is written
-- before its end whatever their threads' tids.
ORDER BY part, CASE WHEN part = 3 THEN 0 ELSE tid END, ts_ns, event_index
"""


def _count(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any] | None = None) -> int:
    return int(con.execute(sql, params or {}).fetchall()[0][0])


@dataclass(frozen=True)
class TraceSide:
    """The MegaKernel side read from a standalone trace, whose events (as ``trace_events``
    columns) are registered on the cursor as ``mk``: the slices' ids come from their
    ``args``, and the added events copy each slice's ``args`` text."""

    name: str
    """The trace, as messages name it."""
    rank: int | None = None
    """A single capture's rank, for its slices without ``args.rank``."""
    invocation_id: int | None = None
    """A single capture's invocation id: its slices carry none."""

    def install(self, con: duckdb.DuckDBPyConnection) -> None:
        codes = " ".join(f"WHEN '{name}' THEN {code}" for code, name in ASCEND_CORE_NAMES.items())
        con.execute(
            _INTERNAL.format(core_codes=codes),
            {"rank": self.rank, "invocation": self.invocation_id},
        )
        unreadable = con.execute(
            "SELECT event_index FROM internal WHERE rank IS NULL OR invocation_id IS NULL "
            "OR core_type IS NULL OR block_id IS NULL OR track IS NULL OR ts_ns IS NULL "
            "OR dur_ns IS NULL ORDER BY event_index LIMIT 1"
        ).fetchall()
        if unreadable:
            raise FuseError(
                f"{self.name}: event {unreadable[0][0]}, a MegaKernelInternal slice, lacks "
                "an integer tid, ts, dur or args.rank, invocation_id, core_type (or its name, "
                "AIC or AIV) or block_id in range; export the trace again (mcprof export)"
            )
        con.execute(_SPANS)
        con.execute(_FLOWS)

    def flow_rows(self, con: duckdb.DuckDBPyConnection) -> int:
        return _count(
            con,
            "SELECT count(*) FROM internal_flows f SEMI JOIN pairs p "
            "ON f.rank = p.rank AND f.invocation_id = p.invocation_id",
        )

    def events(
        self, con: duckdb.DuckDBPyConnection, shift_ns: int, flow_offset: int
    ) -> AddedEvents:
        lines = con.sql(_LINES, params={"shift": shift_ns, "flow_offset": flow_offset})
        column = lines.to_arrow_table()["line"]
        return AddedEvents(_text_chunks(column), len(column) - column.null_count)


def install_slices(con: duckdb.DuckDBPyConnection, internal: pa.Table) -> None:
    """``internal`` (columns as ``MegaKernelSide.install`` says) and its ``spans`` on
    ``con``, from the slices of a side that has them at hand."""
    con.register("mcprof_internal", internal)
    try:
        con.execute("CREATE TEMP TABLE internal AS SELECT * FROM mcprof_internal")
    finally:
        con.unregister("mcprof_internal")
    con.execute(_SPANS)


def _text_chunks(lines: pa.ChunkedArray) -> Iterator[bytes]:
    """The text of ``lines``, a chunk of it per Arrow chunk, straight from the buffers (one
    copy at a time, as the writer asks for it)."""
    for chunk in lines.chunks:
        if len(chunk) == 0:
            continue
        chunk = chunk.cast(pa.large_string())
        offsets = np.frombuffer(chunk.buffers()[1], np.int64)
        first, last = offsets[chunk.offset], offsets[chunk.offset + len(chunk)]
        yield bytes(memoryview(chunk.buffers()[2])[first:last])


def check_kernel_pattern(pattern: str, con: duckdb.DuckDBPyConnection | None = None) -> None:
    """Refuse a ``kernel_pattern`` that cannot select outer kernels: one that matches an empty
    name (``''``, ``.*``, ``(?i)``) matches every outer event (``ArgumentError``), one that is
    no regular expression DuckDB (RE2) runs cannot match any (``FuseError``). ``con`` runs the
    check (default: a cursor of the process's database for Arrow statements)."""
    with ExitStack() as stack:
        if con is None:
            con = stack.enter_context(arrow_cursor())
        try:
            matches_empty = con.execute(
                "SELECT regexp_matches('', $pattern)", {"pattern": pattern}
            ).fetchall()[0][0]
        except duckdb.Error as exc:
            raise FuseError(
                f"kernel pattern {pattern!r} is not a regular expression DuckDB (RE2 syntax) "
                f"accepts: {exc}"
            ) from exc
    if matches_empty:
        raise ArgumentError(
            f"kernel_pattern {pattern!r} matches an empty name, so it matches every outer event: "
            "give a pattern of the outer kernel's name, or none to infer one from the kernel's"
        )


@dataclass(frozen=True)
class _Group:
    """Invocations aligned together, in order, to the outer events of one pattern: those of
    one kernel (an inferred pattern each) or all of them (an explicit ``kernel_pattern``)."""

    kernel_name: str | None
    pattern: str
    invocations: int = 0
    device: int = 0
    host: int = 0

    def entry(self, alignment: str) -> dict[str, Any]:
        return {
            "kernelName": self.kernel_name,
            "pattern": self.pattern,
            "invocations": self.invocations,
            "deviceCandidates": self.device,
            "hostCandidates": self.host,
            "alignment": alignment,
        }


def align(
    con: duckdb.DuckDBPyConnection,
    side: MegaKernelSide,
    *,
    source_id: str,
    rank: int,
    kernel_pattern: str | None,
    kernel_index: int,
    outer_pid: int | None,
    allow_host_alignment: bool,
    shift_ns: int,
) -> Alignment:
    """Align the invocations of ``rank`` in ``mk_invocations`` (registered on ``con``),
    whose slices ``side`` gives, to the kernels of trace ``source_id``; raise ``FuseError``
    where that cannot be done safely.

    Without ``kernel_pattern`` each kernel's invocations go, in order, to the outer kernels
    of its own name (a forward and a backward kernel each to theirs); with one, every
    invocation goes, in order, to the outer kernels it matches."""
    COUNT.check(kernel_index, "kernel_index")
    inferred = kernel_pattern is None
    if kernel_pattern is not None:
        check_kernel_pattern(kernel_pattern, con)
    con.execute(US_TEXT_MACRO)
    side.install(con)
    con.execute(_INVOCATIONS, {"rank": rank})
    invocations = _count(con, "SELECT count(*) FROM inv_all")
    if invocations == 0:
        raise FuseError(f"the MegaKernel trace has no invocation with records on rank {rank}")
    groups = _kernel_groups(con, kernel_pattern, source_id, outer_pid)
    where = f" (pid {outer_pid})" if outer_pid is not None else ""
    alignments, warnings = _candidates(
        con, groups, inferred, kernel_index, allow_host_alignment, where, invocations
    )
    fallback = "duration" in alignments
    host_aligned = "host" in alignments
    _refuse_shortfall(con, groups, rank, kernel_index, fallback, where)
    con.execute(_PAIRS, {"shift": shift_ns})
    _refuse_unnamed_processes(con)
    overlapped = _place_on_lanes(con)
    con.execute(_TRACKS.format(lane=LANE_TID_STEP, core_names=_core_case()), {"source": source_id})
    # Arrows keep the standalone trace's ids, above those of an earlier fusion's arrows.
    flow_offset = _count(
        con,
        "SELECT coalesce(max(TRY_CAST(flow_id AS HUGEINT)), 0) FROM trace_events "
        "WHERE source_id = $source AND cat = 'MegaKernelInternal'",
        {"source": source_id},
    )
    added = side.events(con, shift_ns, flow_offset)
    flows = side.flow_rows(con)
    pairs = con.sql("SELECT * FROM pairs ORDER BY first_ns").to_arrow_table().to_pylist()
    tracks = con.sql("SELECT * FROM tracks ORDER BY pid_text, tid").to_arrow_table()
    expected = 2 * tracks.num_rows + sum(p["events"] for p in pairs) + flows
    if added.count != expected:
        raise FuseError(
            f"only {added.count} of the {expected} events to add (thread "
            "metadata, slices, arrows) could be placed in the outer trace; nothing was written"
        )
    overlaps = _overlap_entries(con, overlapped)
    entries = [_entry(pair, shift_ns) for pair in pairs]
    longer = [e for e in entries if e["exceedsOuterKernelUs"] > 0]
    if longer:
        warnings.append(
            f"{len(longer)} invocation(s) last longer than their outer kernel (first: "
            f"invocation {longer[0]['invocationId']}, by {longer[0]['exceedsOuterKernelUs']} us):"
            " the kernel may not be the one that ran them, or the cycle frequency is off"
        )
    if overlaps:
        first = overlaps[0]
        lane_threads = int((tracks["lane"].to_numpy() > 0).sum())
        warnings.append(
            f"{len(overlaps)} invocation(s) overlap an earlier invocation of their kernel once "
            f"aligned (first: invocation {first['invocationId']}, over invocation(s) "
            f"{', '.join(map(str, first['overlapsInvocations']))}): they are on "
            f"{lane_threads} lane thread(s) of their own ('... lane <n>'), listed under overlaps"
        )
    frequency = frequency_check(pairs)
    if frequency["suggestedMHz"] is not None:
        warnings.append(
            f"every invocation's span is {frequency['spanToKernel']['median']:.2f}x its outer "
            f"kernel's duration at {frequency['cycleFrequencyMHz']:g} MHz (from "
            f"{frequency['source'] or 'an unknown source'}): the cycle counter would fit "
            f"{frequency['suggestedMHz']:g} MHz; capture with that frequency_hz"
        )
    events = sum(e["internalEventCount"] for e in entries)
    report = {
        "schemaVersion": 1,
        "kernelPattern": groups[0].pattern if len(groups) == 1 else None,
        "kernelPatternInferred": inferred,
        "kernels": [g.entry(a) for g, a in zip(groups, alignments, strict=True)],
        "kernelIndex": kernel_index,
        "outerPid": outer_pid,
        "durationFallbackUsed": fallback,
        "hostAlignmentAllowed": allow_host_alignment,
        "hostAligned": host_aligned,
        "rank": rank,
        "counts": {
            "invocations": len(entries),
            "deviceCandidates": sum(g.device for g in groups),
            "hostCandidates": sum(g.host for g in groups),
            "internalEvents": events,
            "dependencyArrows": flows // 2,
            "addedThreads": tracks.num_rows,
        },
        "threads": [
            {"pid": _pid(t), "tid": t["tid"], "name": t["thread_name"]} for t in tracks.to_pylist()
        ],
        "invocations": entries,
        "overlaps": overlaps,
        "frequencyCheck": frequency,
        "warnings": warnings,
    }
    return Alignment(added, events, report)


def _kernel_groups(
    con: duckdb.DuckDBPyConnection,
    kernel_pattern: str | None,
    source_id: str,
    outer_pid: int | None,
) -> list[_Group]:
    """The groups of ``inv_all``'s invocations (one per kernel, or one for an explicit
    pattern), with ``kernel_groups``, ``inv`` (each invocation's group and position in it),
    ``outer_x`` (what can be a candidate) and ``owners`` (each matching outer event's group)
    made on ``con``, and what each group's pattern matches counted."""
    if kernel_pattern is None:
        names = con.execute(
            "SELECT kernel_name FROM inv_all GROUP BY ALL ORDER BY min(invocation_id)"
        ).fetchall()
        groups = [_Group(name, kernel_pattern_for(name)) for (name,) in names]
    else:
        groups = [_Group(None, kernel_pattern)]
    con.register(
        "mcprof_groups",
        pa.table(
            {
                "grp": pa.array(range(len(groups)), pa.int64()),
                "kernel_name": pa.array([g.kernel_name for g in groups], pa.string()),
            }
        ),
    )
    try:
        con.execute("CREATE TEMP TABLE kernel_groups AS SELECT * FROM mcprof_groups")
    finally:
        con.unregister("mcprof_groups")
    con.execute(_GROUPED)
    patterns = {f"p{number}": group.pattern for number, group in enumerate(groups)}
    con.execute(
        _OUTER.format(
            categories=sql_strings(DEVICE_CATEGORIES),
            task_types=DEVICE_TASK_TYPES,
            any_match=" OR ".join(f"regexp_matches(name, ${key})" for key in patterns),
        ),
        {"source": source_id, "pid": outer_pid, **patterns},
    )
    matches = " UNION ALL ".join(
        f"SELECT event_index, {number} AS grp, length(regexp_extract(name, ${key})) AS length "
        f"FROM outer_x WHERE regexp_matches(name, ${key})"
        for number, key in enumerate(patterns)
    )
    con.execute(_OWNERS.format(matches=matches), patterns)
    _refuse_shared_outer_events(con, groups)
    counted = {
        grp: (needed, device, host)
        for grp, needed, device, host in con.execute(
            """
            SELECT g.grp, (SELECT count(*) FROM inv i WHERE i.grp = g.grp),
                count(o.event_index) FILTER (WHERE o.evidence IS NOT NULL),
                count(o.event_index) FILTER (WHERE o.evidence IS NULL)
            FROM kernel_groups g
            LEFT JOIN owners w ON w.grp = g.grp
            LEFT JOIN outer_x o ON o.event_index = w.event_index
            GROUP BY g.grp
            """
        ).fetchall()
    }
    return [_Group(g.kernel_name, g.pattern, *counted[number]) for number, g in enumerate(groups)]


def _candidates(
    con: duckdb.DuckDBPyConnection,
    groups: list[_Group],
    inferred: bool,
    kernel_index: int,
    allow_host_alignment: bool,
    where: str,
    invocations: int,
) -> tuple[list[str], list[str]]:
    """Make ``cand``, each group's candidates numbered by ``position`` from ``kernel_index``
    on: device kernels of its pattern, else host events (if allowed), else, where no inferred
    pattern matches anything, the run of device kernels whose durations fit every invocation
    (all in one group). Return each group's alignment (``device``, ``host``, ``duration``)
    and the warnings of the choice."""
    if inferred and not any(g.device or g.host for g in groups):
        con.execute("UPDATE inv SET grp = 0, position = run_position")
        con.execute(_BY_DURATION, {"skip": kernel_index})
        inferred_from = " or ".join(
            f"{g.pattern!r} (inferred from {g.kernel_name!r})" for g in groups
        )
        skipped = f" after the first {kernel_index} (kernel_index)" if kernel_index else ""
        if _count(con, "SELECT count(*) FROM cand") == 0:
            raise FuseError(
                f"no outer event{where} matches the kernel pattern {inferred_from}, and no run "
                f"of {invocations} device kernel(s){skipped} is there to fall back to; give "
                "kernel_pattern (--kernel-pattern)"
            )
        return ["duration"] * len(groups), [
            f"no outer event matches {inferred_from}: aligned to the run of {invocations} "
            f"device kernel(s){skipped} whose durations best match the invocations' spans "
            "instead"
        ]
    alignments, warnings = [], []
    for group in groups:
        if group.device:
            alignments.append("device")
        elif group.host:
            if not allow_host_alignment:
                raise FuseError(
                    f"kernel pattern {group.pattern!r} matches {group.host} host event(s)"
                    f"{where} but no device kernel: aligning device records to host-side "
                    "events (CPU ops, launches) would misplace them; pass "
                    "allow_host_alignment=True (--allow-host-alignment) to do it anyway"
                )
            alignments.append("host")
            warnings.append(
                f"aligned to {group.host} host-side event(s) matching {group.pattern!r}: no "
                "device kernel matches, so the records sit on host events' times, not the "
                "device's"
            )
        elif inferred:
            matched = next(g for g in groups if g.device or g.host)
            raise FuseError(
                f"no outer event{where} matches the kernel pattern {group.pattern!r} inferred "
                f"from {group.kernel_name!r}, though {matched.kernel_name!r}'s pattern "
                f"{matched.pattern!r} matches {matched.device + matched.host}: its "
                f"{group.invocations} invocation(s) have nothing to align to; give "
                "kernel_pattern (--kernel-pattern)"
            )
        else:
            raise FuseError(f"no outer event{where} matches the kernel pattern {group.pattern!r}")
    device_groups = [number for number, a in enumerate(alignments) if a == "device"]
    con.execute(_BY_NAME, {"skip": kernel_index, "device_groups": device_groups})
    return alignments, warnings


def _refuse_shortfall(
    con: duckdb.DuckDBPyConnection,
    groups: list[_Group],
    rank: int,
    kernel_index: int,
    fallback: bool,
    where: str,
) -> None:
    """Refuse a group with fewer candidates (after ``kernel_index``) than invocations."""
    shortfall = con.execute(
        "SELECT grp, count(*) AS needed, (SELECT count(*) FROM cand c "
        "WHERE c.grp = i.grp AND c.position >= 0) AS available "
        "FROM inv i GROUP BY grp HAVING available < needed ORDER BY grp LIMIT 1"
    ).fetchall()
    if not shortfall:
        return
    grp, needed, available = shortfall[0]
    group = groups[grp]
    total = available + (0 if fallback else kernel_index)
    of = f" of {group.kernel_name!r}" if len(groups) > 1 else ""
    raise FuseError(
        f"too few candidates: {needed} invocation(s){of} of rank {rank} to align, but "
        f"{total} outer kernel(s) match {group.pattern!r}{where}"
        + (f" and {kernel_index} are skipped (kernel_index)" if kernel_index else "")
        + "; fuse fewer invocations (a capture window or step of the run) or check the "
        "pattern"
    )


def _refuse_shared_outer_events(con: duckdb.DuckDBPyConnection, groups: list[_Group]) -> None:
    """Refuse an outer event that the patterns of two kernels match alike (``owners``): which
    kernel's invocation it ran is unknown."""
    shared = con.execute(
        "SELECT o.event_index, o.name, list_sort(list(w.grp)) FROM owners w "
        "JOIN outer_x o USING (event_index) WHERE w.claimants > 1 "
        "GROUP BY ALL ORDER BY o.event_index LIMIT 1"
    ).fetchall()
    if shared:
        index, name, claimants = shared[0]
        kernels = " and ".join(
            f"{groups[g].kernel_name!r} ({groups[g].pattern!r})" for g in claimants
        )
        raise FuseError(
            f"outer event {index} ({name!r}) matches the patterns of kernels {kernels} alike: "
            "which kernel ran in it is unknown; give kernel_pattern (--kernel-pattern)"
        )


def _refuse_unnamed_processes(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse an outer kernel with neither an integer nor a string pid: the added threads
    could not name their process, and every added event would be lost."""
    unnamed = con.execute(
        "SELECT invocation_id, outer_name, outer_event_index FROM pairs WHERE pid_text IS NULL "
        "ORDER BY first_ns LIMIT 1"
    ).fetchall()
    if unnamed:
        invocation, name, index = unnamed[0]
        raise FuseError(
            f"outer kernel {name!r} (event {index} of the outer trace), which invocation "
            f"{invocation} aligns to, has no pid (an integer or a string): no thread can be "
            "added to its process"
        )


def invocation_lanes(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The lane of each invocation, sorted by group, then start: the lowest lane on which
    every earlier invocation of its group has ended by its start.

    Unlike a record's sub-track (``export.tracks.assign_lanes``), an invocation may not nest
    in another on one lane: their slices would interleave on each core's thread. A group
    whose invocations follow one another (the usual case) stays on lane 0 without a look at
    each invocation.
    """
    lanes = np.zeros(len(start), np.int64)
    edges = np.concatenate([[0], np.flatnonzero(group[1:] != group[:-1]) + 1, [len(group)]])
    for first, last in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        starts, ends = start[first:last], end[first:last]
        if not (starts[1:] < np.maximum.accumulate(ends)[:-1]).any():
            continue
        free: list[int] = []
        running: list[tuple[int, int]] = []
        for offset, (begin, finish) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            while running and running[0][0] <= begin:
                heapq.heappush(free, heapq.heappop(running)[1])
            lane = heapq.heappop(free) if free else len(running)
            lanes[first + offset] = lane
            heapq.heappush(running, (finish, lane))
    return lanes


def _place_on_lanes(con: duckdb.DuckDBPyConnection) -> dict[int, list[int]]:
    """Give ``pairs`` a ``lane`` column (``invocation_lanes`` over the aligned spans of each
    kernel in each outer process); return, for each invocation off lane 0, the invocations
    of its kernel still running when it starts."""
    spans = con.sql(
        "SELECT invocation_id, dense_rank() OVER (ORDER BY pid_text, kernel_name) AS grp, "
        "outer_ts_ns AS start_ns, outer_ts_ns + span_ns AS end_ns FROM pairs "
        "ORDER BY grp, start_ns, invocation_id"
    ).to_arrow_table()
    ids, group, start, end = (spans[name].to_numpy() for name in spans.column_names)
    lanes = invocation_lanes(group, start, end)
    con.execute("ALTER TABLE pairs ADD COLUMN lane BIGINT DEFAULT 0")
    moved = np.flatnonzero(lanes > 0)
    if moved.size == 0:
        return {}
    con.register("pair_lanes", pa.table({"invocation_id": ids[moved], "lane": lanes[moved]}))
    con.execute(
        "UPDATE pairs SET lane = l.lane FROM pair_lanes l "
        "WHERE pairs.invocation_id = l.invocation_id"
    )
    con.unregister("pair_lanes")
    return {
        int(ids[i]): ids[:i][(group[:i] == group[i]) & (end[:i] > start[i])].tolist()
        for i in moved.tolist()
    }


def _overlap_entries(
    con: duckdb.DuckDBPyConnection, overlapped: dict[int, list[int]]
) -> list[dict[str, Any]]:
    """The report's ``overlaps``: each invocation off lane 0, in aligned time order, with the
    invocations it overlaps and the lane threads its slices are on."""
    if not overlapped:
        return []
    rows = con.sql(
        """
        SELECT p.invocation_id, p.kernel_name, p.lane, p.outer_pid, p.outer_pid_name,
               list_sort(list(DISTINCT t.tid)) AS tids
        FROM pairs p
        JOIN (SELECT DISTINCT rank, invocation_id, track FROM internal) e
            USING (rank, invocation_id)
        JOIN tracks t
            ON t.pid_text = p.pid_text AND t.kernel_name = p.kernel_name AND t.lane = p.lane
            AND t.track = e.track
        WHERE p.lane > 0
        GROUP BY ALL
        ORDER BY min(p.outer_ts_ns), p.invocation_id
        """
    ).to_arrow_table()
    return [
        {
            "invocationId": row["invocation_id"],
            "kernelName": row["kernel_name"],
            "overlapsInvocations": overlapped[row["invocation_id"]],
            "lane": row["lane"],
            "pid": _pid(row),
            "tids": row["tids"],
        }
        for row in rows.to_pylist()
    ]


def frequency_check(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the invocations' cycle frequency fits their outer kernels' durations.

    With the right frequency an invocation's span (first record start to last record
    end) is a little under its kernel's duration. A wrong one scales every span by the
    same factor: when all span / duration ratios agree within ``RATIO_SPREAD`` and their
    median lies outside ``FITTING_RATIO``, the frequency that would make spans fit is
    ``used x median``. It is suggested only where a ``COMMON_FREQUENCIES_MHZ`` value lies
    within ``SNAP_TOLERANCE`` of it: a span a hundredth of its kernel is no counter's
    fault but a mismatched kernel or capture.
    """
    usable = [p for p in pairs if p["span_ns"] > 0 and p["outer_dur_ns"] > 0]
    frequencies = {p["frequency_mhz"] for p in usable}
    sources = {p["frequency_source"] for p in usable}
    used = next(iter(frequencies)) if len(frequencies) == 1 else None
    ratios = np.array([p["span_ns"] / p["outer_dur_ns"] for p in usable])
    check: dict[str, Any] = {
        "cycleFrequencyMHz": used,
        "source": next(iter(sources)) if len(sources) == 1 else None,
        "invocations": len(usable),
        "spanToKernel": None,
        "consistent": False,
        "fits": None,
        "estimatedMHz": None,
        "suggestedMHz": None,
    }
    if len(usable) < 2 or used is None:
        return check
    median = float(np.median(ratios))
    check["spanToKernel"] = {
        "min": round(float(ratios.min()), 4),
        "median": round(median, 4),
        "max": round(float(ratios.max()), 4),
    }
    check["consistent"] = bool(ratios.max() <= ratios.min() * RATIO_SPREAD)
    check["fits"] = FITTING_RATIO[0] <= median <= FITTING_RATIO[1]
    if check["consistent"] and not check["fits"]:
        estimate = used * median
        common = min(COMMON_FREQUENCIES_MHZ, key=lambda mhz: abs(mhz / estimate - 1))
        check["estimatedMHz"] = round(estimate, 3)
        if abs(common / estimate - 1) <= SNAP_TOLERANCE:
            check["suggestedMHz"] = common
    return check


def _core_case() -> str:
    arms = " ".join(f"WHEN {code} THEN '{name}'" for code, name in CORE_NAMES.items())
    return f"CASE n.core_type {arms} END"


def _pid(row: dict[str, Any]) -> Any:
    return row["outer_pid"] if row["outer_pid"] is not None else row["outer_pid_name"]


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def _entry(pair: dict[str, Any], shift_ns: int) -> dict[str, Any]:
    excess = max(pair["span_ns"] - pair["outer_dur_ns"], 0)
    return {
        "invocationId": pair["invocation_id"],
        "direction": pair["direction"],
        "kernelName": pair["kernel_name"],
        "rank": pair["rank"],
        "deviceId": pair["device"],
        "outerKernel": {
            "name": pair["outer_name"],
            "pid": _pid(pair),
            "tid": pair["outer_tid"] if pair["outer_tid"] is not None else pair["outer_tid_name"],
            "ts": pair["outer_ts_text"],
            "tsNs": pair["outer_ts_ns"] - shift_ns,
            "dur": pair["outer_dur_text"],
            "durNs": pair["outer_dur_ns"],
            "deviceEvidence": pair["evidence"],
        },
        "internalEventCount": pair["events"],
        "spanUs": _us(pair["span_ns"]),
        "exceedsOuterKernelUs": _us(excess),
    }
