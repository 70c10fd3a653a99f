"""The Chrome Trace (schema v1) writer: a ``Timeline`` of records of the store as JSON.

Format: complete events (``cat`` ``MegaKernelInternal``) with every raw id and cycle in
``args``, ``pid`` = rank, ``tid`` = core type x 1000 + block id, ``ts`` / ``dur`` in
microseconds from the process's anchor (its smallest core entry cycle), flow arrows from
triggers to the waits they released, and ``megaKernelCycleTrace`` (also under
``metadata``) describing the selection. With ``critical_path``, the records on their
invocation's critical path carry ``args.critical = 1`` and the path is a chain of flows of
their own category (``critical_path``), as HTA's critical path overlay draws it.

The timeline hands out its slices and flows group by group; ``json_rows`` renders each
group's events straight to their place in the file, and the flows' rows are spooled
until every event is written, so memory does not grow with the run. Every width of the
fixed-width rows comes from the whole selection's value spans (``Timeline.spans``), so
each group is rendered on its own. ``core_fragments`` and ``event_args`` render every
slice's ``args``: fusion writes the same text into an outer trace.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.abi import NO_OWNER
from multicore_profiler.errors import ExportError
from multicore_profiler.export.files import ExportedTrace, aside_sink, gzipped, written_aside
from multicore_profiler.export.json_rows import Row, Span, joined, span_of, strings
from multicore_profiler.export.timeline import (
    CORE_NAMES,
    CRITICAL_FLOW,
    DEPENDENCY_FLOW,
    GROUP_ROWS,
    LANE_TID_STEP,
    RECORD_COLUMNS,
    RUN_PID_STEP,
    SCHEMA_VERSION,
    ExportQueryError,
    LayoutChanged,
    RecordSelection,
    Spans,
    Timeline,
    numpy_column,
    open_timeline,
    task_types,
)
from multicore_profiler.prefetch import ahead
from multicore_profiler.progress import Bar, progress
from multicore_profiler.storage.store import Store

CATEGORY = "MegaKernelInternal"
FLOW_NAME = DEPENDENCY_FLOW
CRITICAL_CATEGORY = CRITICAL_FLOW
"""The category and name of the critical path's chain of flows."""

__all__ = [
    "CATEGORY",
    "CORE_NAMES",
    "CRITICAL_CATEGORY",
    "FLOW_NAME",
    "GROUP_ROWS",
    "LANE_TID_STEP",
    "RECORD_COLUMNS",
    "RUN_PID_STEP",
    "SCHEMA_VERSION",
    "ExportQueryError",
    "ExportedTrace",
    "core_fragments",
    "event_args",
    "export_chrome_trace",
    "flow_end_ts",
    "metadata_event",
]
"""The timeline's constants stay importable from here, where they were first defined."""


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
    selection: RecordSelection | None = None,
    critical_path: bool = False,
    clock_correction: bool = False,
) -> ExportedTrace:
    """Write the Chrome Trace of records of the store to ``path`` (gzipped if it ends in
    ``.gz``); return what was written.

    The records are those of ``run`` (default: the latest run) narrowed by ``step``,
    ``invocation``, ``rank``, capture ``window`` and ``where`` (one SQL expression over
    the columns of ``records_ns``), or the rows of ``query``, one read-only SQL statement
    whose rows carry the record columns (``RECORD_COLUMNS``). ``detailed_task_names``
    names each event ``<owner_label><owner>_<stage>_task<n>`` instead of by its stage only.
    ``selection`` gives the records as one ``RecordSelection`` instead (then give none of
    the other selection arguments). ``critical_path`` marks each record on its invocation's
    critical path (the ``critical_path`` view) with ``args.critical = 1`` and chains them in
    path order with flows of category ``critical_path``; without it the trace is as before.
    ``clock_correction`` corrects the cores' clocks of the selection's runs from their
    records' causality first (``ClockError`` where they cannot be) and says which offsets
    were applied in ``megaKernelCycleTrace.clockCorrection``; without it the trace is as
    before.

    Raises ``StatementError`` for a ``where`` or ``query`` the read-only policy refuses and
    ``ArgumentError`` for a number out of range, before anything runs; ``ExportError``
    when the path cannot be written (checked before the query runs), nothing matches, a
    query lacks record columns or holds NULLs there, an invocation has no positive
    frequency, or DuckDB cannot run the SQL (``ExportQueryError``). No file is left behind
    then (the trace is written aside and renamed into place).
    """
    selection = RecordSelection.given(selection, run, step, invocation, rank, window, where, query)
    selected = selection.resolve(store)
    path = Path(path)
    with (
        written_aside(path, ExportError, "the trace") as aside,
        open_timeline(
            store,
            selected,
            detailed_task_names=detailed_task_names,
            scratch_dir=aside.parent,
            group_rows=GROUP_ROWS,
            critical_path=critical_path,
            clock_correction=clock_correction,
        ) as timeline,
    ):
        written = _write(timeline, aside, gzipped(path))
    return ExportedTrace(
        path=path,
        events=written.metadata_events + timeline.records + written.flow_rows,
        records=timeline.records,
        flows=written.metadata["flowCount"],
        metadata=written.metadata,
        critical_flows=written.metadata.get("criticalFlowCount", 0),
    )


@dataclass(frozen=True)
class _Written:
    metadata: dict[str, Any]
    metadata_events: int
    flow_rows: int


def _write(timeline: Timeline, aside: Path, gz: bool) -> _Written:
    """Write the trace to ``aside``. A pass that finds sub-tracks changes the layout of
    every event (``LayoutChanged``): the next pass, which knows every lane, writes it."""
    try:
        return _pass(timeline, aside, gz)
    except LayoutChanged:
        return _pass(timeline, aside, gz)


def _pass(timeline: Timeline, aside: Path, gz: bool) -> _Written:
    """One pass over the timeline's groups: render each group's events and flows into the
    file, after the metadata events of the layout the timeline knows."""
    fragments = core_fragments(timeline.cores, with_track=True)
    meta = _metadata_events(timeline)
    head = _head_bytes(meta)
    flows = _FlowSpool(aside.parent)
    chain = _FlowSpool(aside.parent, category=CRITICAL_CATEGORY, name=CRITICAL_CATEGORY)
    with (
        flows,
        chain,
        aside_sink(aside, gz) as sink,
        progress(total=timeline.records, desc="export", unit="event") as bar,
    ):
        sink.write(head)
        sink.flush()
        at = len(head)
        names = strings(timeline.names)
        for group in ahead(timeline.groups(), "mcprof-timeline"):
            slices = group.slices
            rows = Row(slices.num_rows).lookup(',\n{"name":', names, numpy_column(slices, "name"))
            rows = rows.millis(',"ts":', numpy_column(slices, "ts_ns"), timeline.spans.ts)
            rows = rows.millis(
                ',"dur":',
                numpy_column(slices, "end_ns") - numpy_column(slices, "ts_ns"),
                timeline.spans.dur,
            )
            rows = event_args(rows, slices, timeline.spans, fragments).text("}}")
            at = _put(sink, gz, rows, at, bar)
            _spool(group.flows, flows, chain)
        assert timeline.metadata is not None
        bar.total += flows.rows + chain.rows
        bar.refresh()
        for rows in flows.rendered():
            at = _put(sink, gz, rows, at, bar)
        for rows in chain.rendered(first_id=flows.count + 1):
            at = _put(sink, gz, rows, at, bar)
        if not gz:
            sink.seek(at)
        metadata = _with_undrawn(timeline.metadata, flows.undrawn + chain.undrawn)
        sink.write(_tail_bytes(metadata))
    return _Written(metadata, len(meta), flows.rows + chain.rows)


def _with_undrawn(metadata: dict[str, Any], undrawn: int) -> dict[str, Any]:
    """The timeline's ``megaKernelCycleTrace`` object, with a warning for the flows the
    trace leaves out (``_FlowSpool.add``), if any."""
    if not undrawn:
        return metadata
    warning = undrawn_flows_warning(undrawn, "JSON trace")
    return metadata | {"warnings": [*metadata["warnings"], warning]}


def _spool(group_flows: pa.Table | None, flows: _FlowSpool, chain: _FlowSpool) -> None:
    """Spool one group's flows: the arrows to ``flows``, the critical path's chain (flows of
    ``kind`` ``CRITICAL_FLOW``, where the timeline has kinds) to ``chain``."""
    if group_flows is None or "kind" not in group_flows.column_names:
        flows.add(group_flows)
        return
    critical = pc.equal(group_flows["kind"], CRITICAL_FLOW)
    flows.add(group_flows.filter(pc.invert(critical)))
    chain.add(group_flows.filter(critical))


def _put(sink: BinaryIO, gz: bool, rows: Row, at: int, bar: Bar) -> int:
    """Write ``rows`` at byte ``at`` of the file (gzip: after what is written); return where
    they end. A plain file gets each chunk at its place from the thread that rendered it."""
    if gz:
        for chunk in rows.chunks():
            sink.write(chunk)
            bar.update(len(chunk))
    else:
        for count in rows.write_at(sink.fileno(), at):
            bar.update(count)
    return at + len(rows) * rows.width


def event_args(rows: Row, slices: pa.Table, spans: Spans, fragments: np.ndarray) -> Row:
    """``rows`` (a ``Row`` of ``slices``) followed by the events' ``args``, from their
    core's fragment (``core_fragments``) to the end cycle, at the widths of the whole
    selection (``spans``), and ``critical`` 1 where the slices mark their record critical:
    the object is left open for more keys."""
    count = slices.num_rows
    desc = numpy_column(slices, "desc_id")
    owner = numpy_column(slices, "owner_id")
    index = numpy_column(slices, "stage_task_index")
    shown, task_type = task_types(slices)
    number = (spans.index[0] + 1, spans.index[1] + 1)
    rows = (
        rows.lookup("", fragments, numpy_column(slices, "core"))
        .integers(',"task_id":', numpy_column(slices, "task_id"), spans.task)
        .integers(',"desc_id":', desc, spans.desc)
        .optional(shown, Row(count).integers(',"task_type":', task_type, spans.task_type))
        .integers(',"stage_task_index":', index, spans.index)
        .integers(',"task_number":', index.astype(np.uint64) + 1, number)
        .optional(owner != NO_OWNER, Row(count).integers(',"owner_id":', owner, spans.owner))
        .integers(',"start_cycle":', numpy_column(slices, "start_cycle"), spans.start)
        .integers(',"end_cycle":', numpy_column(slices, "end_cycle"), spans.end)
    )
    if "critical" not in slices.column_names:
        return rows
    return rows.optional(numpy_column(slices, "critical"), Row(count).text(',"critical":1'))


def flow_end_ts(source_ts: np.ndarray, target_ts: np.ndarray, target_end: np.ndarray) -> np.ndarray:
    """Where an arrow ends (``f``, bound to the enclosing slice): inside the wait, at the
    trigger's start or the wait's, whichever is later."""
    return np.minimum(np.maximum(target_ts, source_ts), target_end)


def undrawn_flows_warning(undrawn: int, trace: str) -> str:
    """The warning for ``undrawn`` arrows that ``trace`` leaves out, since each would end
    before it begins (``flow_end_ts`` before its ``s``): a wait that ended before its
    trigger started."""
    return (
        f"{undrawn} flow(s) end before they begin (a wait that ended before its trigger "
        f"started): the {trace} cannot draw them"
    )


class _FlowSpool:
    """The rows (pid, tid, ts) of flows of one ``category`` and ``name``, two per flow,
    spooled to an unnamed scratch file beside the trace as the groups make them, with their
    spans: their widths are known only once every group is done, and they follow every
    event in the file. ``undrawn`` counts the flows left out: those that end before they
    begin."""

    def __init__(self, directory: Path, *, category: str = CATEGORY, name: str = FLOW_NAME) -> None:
        self._directory = directory
        self._category = category
        self._name = name
        self._file: BinaryIO | None = None
        self.rows = 0
        self.undrawn = 0
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
        """Spool the arrows of one group: ``s`` at the trigger's start, ``f`` where
        ``flow_end_ts`` puts it. A flow whose target ends before its source begins (a wait
        that ended before its trigger started) is counted and left out: its ``f`` would
        come before its ``s``, which both viewers drop, and no ``f`` after the ``s`` binds
        to the wait, as the Perfetto trace cannot draw it either."""
        if flows is None or flows.num_rows == 0:
            return
        assert self._file is not None
        source_ts = numpy_column(flows, "source_ts")
        end_ts = flow_end_ts(
            source_ts, numpy_column(flows, "target_ts"), numpy_column(flows, "target_end")
        )
        drawn = end_ts >= source_ts
        self.undrawn += int(np.count_nonzero(~drawn))
        if not drawn.all():
            flows = flows.filter(pa.array(drawn))
            source_ts, end_ts = source_ts[drawn], end_ts[drawn]
            if flows.num_rows == 0:
                return
        rows = np.empty((2 * flows.num_rows, 3), dtype=np.int64)
        rows[0::2, 0] = numpy_column(flows, "source_pid")
        rows[1::2, 0] = numpy_column(flows, "target_pid")
        rows[0::2, 1] = numpy_column(flows, "source_tid")
        rows[1::2, 1] = numpy_column(flows, "target_tid")
        rows[0::2, 2] = source_ts
        rows[1::2, 2] = end_ts
        self._file.write(rows.tobytes())
        self._spans.append((span_of(rows[:, 0]), span_of(rows[:, 1]), span_of(rows[:, 2])))
        self.rows += len(rows)

    def rendered(self, first_id: int = 1) -> Iterator[Row]:
        """The spooled rows, ``GROUP_ROWS`` at a time, at the widths of them all; the flows'
        ids count from ``first_id`` (after another spool's, so that none collide)."""
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
                .integers(',"id":', number // 2 + first_id, (first_id, first_id + self.count - 1))
                .integers(
                    f',"cat":"{self._category}","name":"{self._name}","pid":', rows[:, 0], pid_span
                )
                .integers(',"tid":', rows[:, 1], tid_span)
                .millis(',"ts":', rows[:, 2], ts_span)
                .optional(phase == 1, Row(len(rows)).text(',"bp":"e"'))
                .text("}")
            )


def core_fragments(cores: pa.Table, *, with_track: bool) -> np.ndarray:
    """The part of an event its core and invocation fix, one row per ``cores`` row: from
    ``ph`` (with its pid and tid, ``with_track``) or from ``args`` on, to ``direction``."""
    directions = cores["direction"].combine_chunks().dictionary_encode()
    rows = Row(cores.num_rows)
    if with_track:
        rows = rows.integers(f',"ph":"X","cat":"{CATEGORY}","pid":', numpy_column(cores, "pid"))
        rows = rows.integers(',"tid":', numpy_column(cores, "tid"))
    return (
        rows.integers(',"args":{"rank":', numpy_column(cores, "rank"))
        .integers(',"device_id":', numpy_column(cores, "device"))
        .integers(',"core_type":', numpy_column(cores, "core_type"))
        .integers(',"block_id":', numpy_column(cores, "block_id"))
        .integers(',"core_entry_cycle":', numpy_column(cores, "entry_cycle"))
        .integers(',"invocation_id":', numpy_column(cores, "invocation_id"))
        .integers(',"step":', numpy_column(cores, "step"))
        .lookup(
            ',"direction":',
            strings(directions.dictionary.to_pylist()),
            directions.indices.to_numpy(),
        )
        .render()
    )


def _metadata_events(timeline: Timeline) -> list[dict[str, Any]]:
    """Process and thread names and sort order: one of each per process and track."""
    head: list[dict[str, Any]] = []
    for process in timeline.processes.select(["pid", "name", "sort_index"]).to_pylist():
        pid = process["pid"]
        head.append(metadata_event("process_name", pid, 0, {"name": process["name"]}))
        head.append(
            metadata_event("process_sort_index", pid, 0, {"sort_index": process["sort_index"]})
        )
    for track in timeline.tracks.select(["pid", "tid", "name", "sort_index"]).to_pylist():
        pid, tid = track["pid"], track["tid"]
        head.append(metadata_event("thread_name", pid, tid, {"name": track["name"]}))
        head.append(
            metadata_event("thread_sort_index", pid, tid, {"sort_index": track["sort_index"]})
        )
    return head


def metadata_event(name: str, pid: Any, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    """A metadata event (``ph`` ``M``): a process's or thread's name or sort index."""
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


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
