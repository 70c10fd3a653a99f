"""Offline fusion: a MegaKernel's AIC/AIV tracks added to a torch.profiler or torch_npu trace.

``merge_chrome_traces`` loads the outer trace into a store (``ingest_trace``; a file
already there is not loaded again), takes the MegaKernel's side from a store selection's
``Timeline`` (or reads a standalone trace of schema v1: mcprof's, or hyper-parallel's, whose
single capture is one invocation), aligns them in SQL (``align``)
and writes the fused trace by streaming the outer file's text through: every outer
event is copied as it was written, the added threads and events go before the events
array's end, and the ``megaKernelTraceMerge`` report goes in at the top (and under
``metadata``). A timeline's slices are written by the exporter's own renderer
(``chrome_trace.core_fragments`` / ``event_args``), shifted onto their outer kernels.
With ``rebase_timestamps`` each outer ``ts`` is rewritten, exactly, in integer ns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.abi import ASCEND_CORE_NAMES
from multicore_profiler.errors import ArgumentError, FuseError, QueryError
from multicore_profiler.export.chrome_trace import (
    CATEGORY,
    FLOW_NAME,
    core_fragments,
    event_args,
    flow_end_ts,
    metadata_event,
    undrawn_flows_warning,
)
from multicore_profiler.export.files import aside_sink, check_output, written_aside
from multicore_profiler.export.json_rows import Row, strings, texts
from multicore_profiler.export.timeline import (
    LayoutChanged,
    RecordSelection,
    Spans,
    Timeline,
    numpy_column,
    open_timeline,
    us_text,
)
from multicore_profiler.fuse.align import (
    AddedEvents,
    MegaKernelSide,
    TraceSide,
    align,
    check_kernel_pattern,
    install_slices,
)
from multicore_profiler.ingest.outer_trace import events_table, find_source, ingest_trace
from multicore_profiler.ingest.trace_reader import CHUNK_BYTES, EventBlock, open_text, read_trace
from multicore_profiler.limits import (
    COUNT,
    DEVICE,
    FREQUENCY_MHZ,
    INVOCATION_ID,
    PID,
    RANK,
    STEP,
    WINDOW,
    Range,
    check_given,
)
from multicore_profiler.progress import Bar, progress
from multicore_profiler.scratch import ScratchDirectory
from multicore_profiler.storage.connection import arrow_cursor
from multicore_profiler.storage.sql_text import sql_strings
from multicore_profiler.storage.store import Store, open_store

REPORT_KEY = "megaKernelTraceMerge"
INVOCATION_FIELDS: tuple[tuple[str, str, pa.DataType, Range | type[str], bool], ...] = (
    ("rank", "rank", pa.int32(), RANK, True),
    ("invocationId", "invocation_id", pa.int64(), INVOCATION_ID, True),
    ("deviceId", "device", pa.int32(), DEVICE, False),
    ("direction", "direction", pa.string(), str, False),
    ("kernelName", "kernel_name", pa.string(), str, True),
    ("step", "step", pa.int64(), STEP, False),
    ("cycleFrequencyMHz", "frequency_mhz", pa.float64(), FREQUENCY_MHZ, False),
    ("cycleFrequencySource", "frequency_source", pa.string(), str, False),
)
"""What fusion reads of each ``megaKernelCycleTrace.invocations`` entry: key, column, type,
range of a number (else a string), whether it is required."""


@dataclass(frozen=True)
class MergedTrace:
    """What ``merge_chrome_traces`` wrote: where, the outer trace's source id in the store,
    how many records (slices) and events in all (thread metadata and arrows too) it
    added, and the ``megaKernelTraceMerge`` report."""

    path: Path
    source_id: str
    records: int
    added_events: int
    report: dict[str, Any] = field(repr=False)


def merge_chrome_traces(
    framework_trace: str | os.PathLike[str],
    mega_kernel_trace: str | os.PathLike[str] | Store,
    output: str | os.PathLike[str],
    *,
    store: Store | None = None,
    run: str | None = None,
    step: int | None = None,
    window: int | None = None,
    rank: int | None = None,
    kernel_pattern: str | None = None,
    kernel_index: int = 0,
    outer_pid: int | None = None,
    allow_host_alignment: bool = False,
    rebase_timestamps: bool = False,
    clock_correction: bool = False,
) -> MergedTrace:
    """Fuse a MegaKernel's records into ``framework_trace`` (torch.profiler / kineto or
    torch_npu, ``.json`` or ``.json.gz``); write the result to ``output`` (gzipped if it
    ends in ``.gz``) and return what was written.

    ``mega_kernel_trace`` is a standalone trace (from ``export_chrome_trace``, or
    hyper-parallel's, a single capture or a capture window) or a ``Store``, whose ``run``
    (default: latest) narrowed by ``step`` / ``window`` is read from it as a ``Timeline``.
    The outer trace is loaded into ``store`` (default: the store given as
    ``mega_kernel_trace``, else a temporary one). ``rank`` defaults to the outer trace's
    ``distributedInfo.rank``, or the only rank the MegaKernel trace has.

    The i-th invocation of each kernel (forward and backward ones each to their own) aligns
    to the i-th outer device kernel matching its pattern, inferred from its name, after
    ``kernel_index`` of them, within ``outer_pid`` if given; an explicit ``kernel_pattern``
    aligns the i-th invocation of all to the i-th outer kernel it matches. Raises
    ``ArgumentError`` for an argument out of range or a ``kernel_pattern`` that matches every
    name (before any work) and ``FuseError`` when the fusion cannot be done safely (an
    ``output`` inside a store or that is one of the input traces: before any work); no file
    is left behind then.

    ``clock_correction`` (a store's run only) corrects the cores' clocks from their records'
    causality first (``ClockError`` where they cannot be); the report's ``clockCorrection``
    says which offsets were applied, here or by the export of a ``mega_kernel_trace`` file,
    and is absent where none was.
    """
    COUNT.check(kernel_index, "kernel_index")
    check_given(
        (rank, RANK, "rank"),
        (outer_pid, PID, "outer_pid"),
        (step, STEP, "step"),
        (window, WINDOW, "window"),
    )
    from_store = isinstance(mega_kernel_trace, Store)
    if not from_store and any(v is not None for v in (run, step, window)):
        raise FuseError("run, step and window select from a store, not from a trace file")
    if not from_store and clock_correction:
        raise FuseError(
            "the clock correction reads a store's records; a trace file is fused as it was "
            "exported (export it with the correction instead)"
        )
    inputs = [Path(framework_trace)] + ([] if from_store else [Path(mega_kernel_trace)])
    try:  # before the outer trace goes into the store
        check_output(Path(output), inputs)
    except ValueError as exc:
        raise FuseError(f"cannot write the fused trace to {output}: {exc}") from None
    with ExitStack() as stack:
        # What is checked before any work runs here: the pattern, a trace file's slices.
        scratch = stack.enter_context(arrow_cursor())
        if kernel_pattern is not None:
            check_kernel_pattern(kernel_pattern, scratch)
        if store is None and isinstance(mega_kernel_trace, Store):
            store = mega_kernel_trace
        if store is None:
            folder = stack.enter_context(ScratchDirectory("mcprof-fuse-"))
            store = stack.enter_context(open_store(folder / "store"))
        # The MegaKernel side is read first: a refusal there leaves the store as it was.
        side: MegaKernelSide
        events: pa.Table | None = None
        mk_path: Path | None = None
        trace_file: _TraceFile | None = None
        if isinstance(mega_kernel_trace, Store):
            selection = RecordSelection(run=run, step=step, window=window)
            side = TimelineSide.read(mega_kernel_trace, selection, clock_correction)
            invocations, mk_summary = side.invocation_table(), side.metadata
        else:
            mk_path = Path(mega_kernel_trace)
            trace_file = _mega_kernel_trace(mk_path, scratch)
            events, invocations, mk_summary = (
                trace_file.events,
                trace_file.invocations,
                trace_file.summary,
            )
            side = trace_file.side
        source = ingest_trace(store, framework_trace, rank=rank)
        described = find_source(store, source.source_id)
        # A rank given now wins over the one stored when the trace was first loaded.
        rank = _rank(source.rank if rank is None else rank, invocations, framework_trace)
        # json, not orjson: the metadata may hold escaped lone surrogates and integers past 64 bits.
        metadata = json.loads(described["metadata"]) if described["metadata"] else {}
        shift = 0
        if rebase_timestamps and described["first_ts_ns"] is not None:
            shift = described["first_ts_ns"] // 1000 * 1000
        try:
            with store.reading() as con:
                if events is not None:
                    con.register("mk", events)
                con.register("mk_invocations", invocations)
                alignment = align(
                    con,
                    side,
                    source_id=source.source_id,
                    rank=rank,
                    kernel_pattern=kernel_pattern,
                    kernel_index=kernel_index,
                    outer_pid=outer_pid,
                    allow_host_alignment=allow_host_alignment,
                    shift_ns=shift,
                )
        except duckdb.Error as exc:
            raise QueryError(f"alignment query failed: {exc}") from exc
        report = alignment.report
        if isinstance(side, TimelineSide):
            undrawn = side.undrawn_of(report["invocations"])
            if undrawn:
                report["warnings"].append(undrawn_flows_warning(undrawn, "fused trace"))
        report["outerTrace"] = {
            "path": str(Path(framework_trace)),
            "sourceId": source.source_id,
            "form": source.form,
            "events": source.events,
        }
        report["megaKernelTrace"] = {
            "path": None if from_store else str(mk_path),
            "selection": mk_summary.get("selection"),
            "cycleFrequencyMHz": mk_summary.get("cycleFrequencyMHz"),
            "singleCapture": trace_file is not None and trace_file.single_capture,
            "inferred": [] if trace_file is None else trace_file.inferred,
        }
        base_time = metadata.get("baseTimeNanoseconds")
        report["rebase"] = {
            "applied": bool(rebase_timestamps),
            "shiftNs": shift,
            "shiftUs": us_text(np.array([shift]))[0].as_py(),
            "baseTimeNanoseconds": (
                {"before": base_time, "after": base_time + shift}
                if isinstance(base_time, int)
                else None
            ),
        }
        if "clockCorrection" in mk_summary:
            report["clockCorrection"] = mk_summary["clockCorrection"]
        layout = orjson.loads(described["layout"])
        _write(
            Path(output),
            Path(framework_trace),
            layout,
            metadata,
            alignment.added,
            report,
            shift if rebase_timestamps else None,
        )
        return MergedTrace(
            Path(output), source.source_id, alignment.records, alignment.added.count, report
        )


@dataclass(frozen=True)
class _TraceFile:
    """A standalone MegaKernel trace read for fusion: its events (as ``trace_events``
    columns), its invocations (``INVOCATION_FIELDS`` columns), its ``megaKernelCycleTrace``
    object, the side that gives its slices, and what was inferred of a single capture."""

    events: pa.Table
    invocations: pa.Table
    summary: dict[str, Any]
    side: TraceSide
    single_capture: bool
    inferred: list[dict[str, Any]]


SINGLE_CAPTURE_ID = 0
"""The invocation id a single capture (hyper-parallel's standalone trace of one buffer) takes:
it lists no invocation and its slices carry no ``args.invocation_id``."""


def _mega_kernel_trace(path: Path, con: duckdb.DuckDBPyConnection) -> _TraceFile:
    """A standalone MegaKernel trace of schema v1: an ``mcprof export`` (or a hyper-parallel
    capture window), which lists its invocations in ``megaKernelCycleTrace.invocations``, or a
    hyper-parallel single capture, which lists none and is one invocation."""
    with read_trace(path, args_keys=()) as trace:
        tables = [events_table(block) for block in trace.blocks]
        summary = trace.fields.get("megaKernelCycleTrace")
    if not isinstance(summary, dict) or summary.get("schemaVersion") != 1:
        raise FuseError(
            f"{path} is not a MegaKernel trace of schema v1 (no megaKernelCycleTrace); export "
            "one with mcprof export or export_chrome_trace"
        )
    if not tables:
        raise FuseError(f"{path} holds no event")
    events = pa.concat_tables(tables)
    slices = _slice_facts(events, con)
    inferred = []
    if slices["named"]:
        inferred.append(
            {
                "field": "coreType",
                "value": {name: code for code, name in ASCEND_CORE_NAMES.items()},
                "from": "args.core_type names",
            }
        )
    entries = summary.get("invocations")
    if entries is None:
        invocations, side, found = _single_capture(path, summary, slices)
        return _TraceFile(events, invocations, summary, side, True, found + inferred)
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise FuseError(f"{path}: megaKernelCycleTrace.invocations is not a list of objects")
    runs = sorted({str(e.get("runId")) for e in entries})
    if len(runs) > 1:
        raise FuseError(f"{path} holds {len(runs)} runs ({', '.join(runs)}); fuse one at a time")
    invocations = pa.table(
        {
            column: pa.array(_invocation_values(path, entries, key, kind, required), dtype)
            for key, column, dtype, kind, required in INVOCATION_FIELDS
        }
    )
    return _TraceFile(events, invocations, summary, TraceSide(str(path)), False, inferred)


def _slice_facts(events: pa.Table, con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """What a trace's MegaKernelInternal slices say of their ids (read on ``con``): their
    distinct pids, the first one with an ``args.invocation_id``, each ``args.rank``
    (distinct), and how many name their core type (``AIC`` / ``AIV``) rather than number it."""
    names = sql_strings(ASCEND_CORE_NAMES.values())
    con.register("mk", events)
    try:
        row = con.execute(
            f"""
            SELECT
                list_sort(list(DISTINCT pid) FILTER (WHERE pid IS NOT NULL)),
                count(*) FILTER (WHERE pid IS NULL),
                min(event_index) FILTER (WHERE ids[1] IS NOT NULL),
                list_sort(list(DISTINCT ids[2]) FILTER (WHERE ids[2] IS NOT NULL)),
                count(*) FILTER (WHERE ids[3] IN ({names}))
            FROM (
                SELECT pid, event_index,
                    json_extract_string(args, ['$.invocation_id', '$.rank', '$.core_type']) AS ids
                FROM mk WHERE ph = 'X' AND cat = 'MegaKernelInternal'
            )
            """
        ).fetchall()[0]
    finally:
        con.unregister("mk")
    pids, without_pid, with_id, ranks, named = row
    return {
        "pids": pids or [],
        "withoutPid": without_pid,
        "firstWithId": with_id,
        "ranks": ranks or [],
        "named": named,
    }


def _single_capture(
    path: Path, summary: dict[str, Any], slices: dict[str, Any]
) -> tuple[pa.Table, TraceSide, list[dict[str, Any]]]:
    """A single capture's one invocation: its kernel, device and frequency from
    ``megaKernelCycleTrace``, its rank from there (``rank``) or else its slices' one pid."""
    kernel = summary.get("kernelName")
    if not isinstance(kernel, str) or not kernel:
        raise FuseError(
            f"{path}: its megaKernelCycleTrace has neither invocations (as mcprof export writes) "
            "nor a kernelName (as hyper-parallel writes for a single capture): which kernel ran "
            "is unknown"
        )
    if slices["firstWithId"] is not None:
        raise FuseError(
            f"{path}: event {slices['firstWithId']} carries args.invocation_id, but its "
            "megaKernelCycleTrace lists no invocations: which invocation it belongs to is unknown"
        )
    rank, source = summary.get("rank"), "megaKernelCycleTrace.rank"
    if rank is None:
        if len(slices["pids"]) != 1 or slices["withoutPid"]:
            raise FuseError(
                f"{path}: its megaKernelCycleTrace has no rank, and its slices are on "
                f"{len(slices['pids'])} integer pid(s) {slices['pids']}"
                + (f" ({slices['withoutPid']} without one)" if slices["withoutPid"] else "")
                + ": which rank ran them is unknown"
            )
        rank, source = slices["pids"][0], "the slices' pid"
    rank = _checked(path, "megaKernelCycleTrace.rank", rank, RANK)
    others = [r for r in slices["ranks"] if r != str(rank)]
    if others:
        raise FuseError(
            f"{path}: a slice has args.rank {others[0]}, but the single capture is rank {rank} "
            f"(from {source})"
        )
    values = {
        "rank": rank,
        "invocation_id": SINGLE_CAPTURE_ID,
        "device": summary.get("deviceId"),
        "direction": None,
        "kernel_name": kernel,
        "step": None,
        "frequency_mhz": summary.get("cycleFrequencyMHz"),
        "frequency_source": None,
    }
    for key, column, _, kind, _ in INVOCATION_FIELDS:
        if values[column] is not None and isinstance(kind, Range):
            values[column] = _checked(path, f"megaKernelCycleTrace.{key}", values[column], kind)
    invocations = pa.table(
        {column: pa.array([values[column]], dtype) for _, column, dtype, _, _ in INVOCATION_FIELDS}
    )
    inferred = [
        {
            "field": "invocationId",
            "value": SINGLE_CAPTURE_ID,
            "from": "a single capture (no megaKernelCycleTrace.invocations)",
        },
        {"field": "rank", "value": rank, "from": source},
    ]
    return invocations, TraceSide(str(path), rank, SINGLE_CAPTURE_ID), inferred


def _checked(path: Path, where: str, value: Any, kind: Range) -> Any:
    """``value`` of ``where`` in the trace, in ``kind``'s range, or a ``FuseError`` naming it."""
    try:
        return kind.check(value, f"{path}: {where}")
    except ArgumentError as exc:
        raise FuseError(str(exc)) from None


def _invocation_values(
    path: Path, entries: list[dict[str, Any]], key: str, kind: Range | type[str], required: bool
) -> list[Any]:
    """Every entry's ``key``, checked against its range or type, so that a hand-edited
    summary is refused naming the entry and the field, never cast into a wrong value."""
    values = []
    for index, entry in enumerate(entries):
        value = entry.get(key)
        where = f"megaKernelCycleTrace.invocations[{index}].{key}"
        if value is None:
            if required:
                raise FuseError(
                    f"{path}: an invocation of its megaKernelCycleTrace has no {key!r} "
                    f"(invocations[{index}])"
                )
        elif isinstance(kind, Range):
            value = _checked(path, where, value, kind)
        elif not isinstance(value, str):
            raise FuseError(f"{path}: {where} must be a string, got {value!r:.60}")
        values.append(value)
    return values


def _rank(outer_rank: int | None, invocations: pa.Table, framework_trace: Any) -> int:
    ranks = sorted(set(invocations["rank"].to_pylist()))
    if outer_rank is None:
        if len(ranks) != 1:
            raise FuseError(
                f"{framework_trace} names no rank (no distributedInfo) and the MegaKernel trace "
                f"has ranks {ranks}; give rank (--rank)"
            )
        return ranks[0]
    if outer_rank not in ranks:
        raise FuseError(
            f"the outer trace is rank {outer_rank} but the MegaKernel trace has ranks {ranks}"
        )
    return outer_rank


@dataclass
class TimelineSide:
    """The MegaKernel side as a store selection's ``Timeline``, read whole: its slices and
    arrows by value (no trace text to read), written into the outer trace by the
    exporter's renderer at the widths the standalone export of the selection has."""

    slices: pa.Table
    flows: dict[str, np.ndarray]
    """Every arrow the trace can draw, in the export's order: its wait's invocation
    (``inv_index``), source tid and ts, target tid, ts and end."""
    undrawn: np.ndarray
    """Per invocation, how many of its arrows are left out: each would end before it begins
    (a wait that ended before its trigger started), as the standalone export leaves it out."""
    cores: pa.Table
    names: np.ndarray
    spans: Spans
    invocations: pa.Table
    metadata: dict[str, Any]

    @classmethod
    def read(
        cls, store: Store, selection: RecordSelection, clock_correction: bool = False
    ) -> TimelineSide:
        """The timeline of ``selection`` in ``store``, read to its end (its clocks corrected
        first with ``clock_correction``)."""
        with open_timeline(store, selection, clock_correction=clock_correction) as timeline:
            try:
                slices, flows = _collected(timeline)
            except LayoutChanged:
                slices, flows = _collected(timeline)
            assert timeline.metadata is not None
            source_ts = flows["source_ts"]
            drawn = flow_end_ts(source_ts, flows["target_ts"], flows["target_end"]) >= source_ts
            undrawn = np.bincount(
                flows["inv_index"][~drawn], minlength=timeline.invocations.num_rows
            )
            return cls(
                slices,
                {column: values[drawn] for column, values in flows.items()},
                undrawn,
                timeline.cores,
                strings(timeline.names),
                timeline.spans,
                timeline.invocations,
                timeline.metadata,
            )

    def undrawn_of(self, entries: list[dict[str, Any]]) -> int:
        """How many arrows of the aligned invocations (the report's ``entries``) are left
        out (``undrawn``)."""
        aligned = {(e["rank"], e["invocationId"]) for e in entries}
        keys = zip(
            self.invocations["rank"].to_pylist(),
            self.invocations["invocation_id"].to_pylist(),
            strict=True,
        )
        return int(
            sum(n for key, n in zip(keys, self.undrawn.tolist(), strict=True) if key in aligned)
        )

    def invocation_table(self) -> pa.Table:
        """The invocations as ``INVOCATION_FIELDS`` columns, as a standalone trace has them."""
        inv = self.invocations
        values = {
            "rank": inv["rank"],
            "invocation_id": inv["invocation_id"],
            "device": inv["device"],
            "direction": inv["direction"],
            "kernel_name": inv["kernel_name"],
            "step": inv["step"],
            "frequency_mhz": pc.divide(inv["frequency_hz"], 1e6),
            "frequency_source": inv["frequency_source"],
        }
        return pa.table(
            {column: values[column].cast(dtype) for _, column, dtype, _, _ in INVOCATION_FIELDS}
        )

    def install(self, con: duckdb.DuckDBPyConnection) -> None:
        core = numpy_column(self.slices, "core")
        ts = numpy_column(self.slices, "ts_ns")

        def of_core(name: str, dtype: type) -> np.ndarray:
            return numpy_column(self.cores, name)[core].astype(dtype)

        internal = pa.table(
            {
                "rank": of_core("rank", np.int32),
                "invocation_id": of_core("invocation_id", np.int64),
                "core_type": of_core("core_type", np.int32),
                "block_id": of_core("block_id", np.int64),
                "track": numpy_column(self.slices, "tid").astype(np.int64),
                "ts_ns": ts,
                "dur_ns": numpy_column(self.slices, "end_ns") - ts,
            }
        )
        install_slices(con, internal)

    def flow_rows(self, con: duckdb.DuckDBPyConnection) -> int:
        pair_of_invocation = self._pair_of_invocation(_pairs(con))
        return 2 * int((pair_of_invocation[self.flows["inv_index"]] >= 0).sum())

    def _pair_of_invocation(self, pairs: pa.Table) -> np.ndarray:
        """The row of ``pairs`` each invocation aligns to, -1 if none."""
        row = {
            key: number
            for number, key in enumerate(
                zip(pairs["rank"].to_pylist(), pairs["invocation_id"].to_pylist(), strict=True)
            )
        }
        keys = zip(
            self.invocations["rank"].to_pylist(),
            self.invocations["invocation_id"].to_pylist(),
            strict=True,
        )
        return np.array([row.get(key, -1) for key in keys], dtype=np.int64)

    def events(
        self, con: duckdb.DuckDBPyConnection, shift_ns: int, flow_offset: int
    ) -> AddedEvents:
        pairs = _pairs(con)
        tracks = con.sql(
            "SELECT pid_text, kernel_name, lane, track, tid, sort_index, thread_name "
            "FROM tracks ORDER BY tid, pid_text"
        ).to_arrow_table()
        threads = _ThreadsOf(pairs, tracks)
        pair_of_invocation = self._pair_of_invocation(pairs)
        slices = self._slice_rows(threads, pair_of_invocation, pairs, shift_ns)
        flows = self._flow_rows(threads, pair_of_invocation, pairs, shift_ns, flow_offset)
        chunks = _chain(
            [threads.metadata_text()],
            (chunk.tobytes() for rows in (slices, flows) for chunk in rows.chunks()),
        )
        return AddedEvents(chunks, 2 * tracks.num_rows + len(slices) + len(flows))

    def _slice_rows(
        self,
        threads: _ThreadsOf,
        pair_of_invocation: np.ndarray,
        pairs: pa.Table,
        shift_ns: int,
    ) -> Row:
        """The aligned invocations' slices on their threads, by thread, time, then their
        order in the export."""
        core = numpy_column(self.slices, "core")
        pair = pair_of_invocation[numpy_column(self.cores, "inv_index")[core]]
        index = np.flatnonzero(pair >= 0)
        pair = pair[index]
        tid, found = threads.tid(pair, numpy_column(self.slices, "tid")[index])
        index, pair, tid = index[found], pair[found], tid[found]
        outer_ts = numpy_column(pairs, "outer_ts_ns")
        first = numpy_column(pairs, "first_ns")
        ts = outer_ts[pair] + numpy_column(self.slices, "ts_ns")[index] - first[pair]
        order = np.lexsort((index, ts, tid))
        index, pair, tid, ts = index[order], pair[order], tid[order], ts[order]
        slices = self.slices.take(pa.array(index))
        dur = numpy_column(slices, "end_ns") - numpy_column(slices, "ts_ns")
        rows = (
            Row(len(index))
            .lookup(',\n{"name":', self.names, numpy_column(slices, "name"))
            .lookup(f',"ph":"X","cat":"{CATEGORY}","pid":', threads.pid_texts, pair)
            .integers(',"tid":', tid)
            .millis(',"ts":', ts - shift_ns)
            .millis(',"dur":', dur)
        )
        return (
            event_args(rows, slices, self.spans, core_fragments(self.cores, with_track=False))
            .lookup(',"parent_kernel":', strings(pairs["outer_name"].to_pylist()), pair)
            .millis(',"parent_kernel_ts":', outer_ts[pair] - shift_ns)
            .millis(',"parent_kernel_dur":', numpy_column(pairs, "outer_dur_ns")[pair])
            .text("}}")
        )

    def _flow_rows(
        self,
        threads: _ThreadsOf,
        pair_of_invocation: np.ndarray,
        pairs: pa.Table,
        shift_ns: int,
        flow_offset: int,
    ) -> Row:
        """The aligned invocations' arrows (``s`` then ``f``), by time, then their order in
        the export."""
        flows = self.flows
        arrows = np.flatnonzero(pair_of_invocation[flows["inv_index"]] >= 0)
        number = np.repeat(arrows, 2)
        phase = np.tile(np.array([0, 1]), len(arrows))
        pair = pair_of_invocation[flows["inv_index"]][number]
        source_ts = flows["source_ts"][arrows]
        end_ts = flow_end_ts(source_ts, flows["target_ts"][arrows], flows["target_end"][arrows])
        track = np.empty(len(number), np.int64)
        track[0::2], track[1::2] = flows["source_tid"][arrows], flows["target_tid"][arrows]
        at = np.empty(len(number), np.int64)
        at[0::2], at[1::2] = source_ts, end_ts
        tid, found = threads.tid(pair, track)
        number, phase, pair, tid, at = (a[found] for a in (number, phase, pair, tid, at))
        ts = numpy_column(pairs, "outer_ts_ns")[pair] + at - numpy_column(pairs, "first_ns")[pair]
        order = np.lexsort((2 * number + phase, ts))
        number, phase, pair, tid, ts = (a[order] for a in (number, phase, pair, tid, ts))
        return (
            Row(len(number))
            .lookup(',\n{"ph":', strings(["s", "f"]), phase)
            .integers(',"id":', number + 1 + flow_offset)
            .lookup(f',"cat":"{CATEGORY}","name":"{FLOW_NAME}","pid":', threads.pid_texts, pair)
            .integers(',"tid":', tid)
            .millis(',"ts":', ts - shift_ns)
            .optional(phase == 1, Row(len(number)).text(',"bp":"e"'))
            .text("}")
        )


class _ThreadsOf:
    """The added threads (``tracks``) of the aligned invocations (``pairs``): which thread a
    slice of a pair's invocation goes to, by its MegaKernel track."""

    def __init__(self, pairs: pa.Table, tracks: pa.Table) -> None:
        self.tracks = tracks
        groups: dict[tuple[Any, ...], int] = {}

        def group(table: pa.Table) -> np.ndarray:
            keys = zip(
                table["pid_text"].to_pylist(),
                table["kernel_name"].to_pylist(),
                table["lane"].to_pylist(),
                strict=True,
            )
            return np.array([groups.setdefault(key, len(groups)) for key in keys], np.int64)

        self._pair_group = group(pairs)
        keys = group(tracks) << 32 | numpy_column(tracks, "track").astype(np.int64)
        order = np.argsort(keys, kind="stable")
        self._keys = keys[order]
        self._tids = numpy_column(tracks, "tid").astype(np.int64)[order]
        self.pid_texts = texts([text.encode() for text in pairs["pid_text"].to_pylist()])
        """Each pair's pid as JSON text, for ``Row.lookup``."""

    def tid(self, pair: np.ndarray, track: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The added thread of each (pair, MegaKernel track), and whether there is one."""
        keys = self._pair_group[pair] << 32 | track.astype(np.int64)
        if len(self._keys) == 0:
            return np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
        at = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
        return self._tids[at], self._keys[at] == keys

    def metadata_text(self) -> bytes:
        """The threads' names, then their sort indexes, by tid."""
        tracks = self.tracks.to_pylist()
        events = [
            metadata_event(
                kind, orjson.Fragment(t["pid_text"].encode()), t["tid"], {key: t[column]}
            )
            for kind, key, column in (
                ("thread_name", "name", "thread_name"),
                ("thread_sort_index", "sort_index", "sort_index"),
            )
            for t in tracks
        ]
        return b"".join(b",\n" + orjson.dumps(event) for event in events)


def _pairs(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """The aligned invocations (``align``'s ``pairs``), by invocation id."""
    return con.sql(
        "SELECT rank, invocation_id, pid_text, kernel_name, lane, outer_ts_ns, first_ns, "
        "outer_name, outer_dur_ns FROM pairs ORDER BY invocation_id"
    ).to_arrow_table()


def _collected(timeline: Timeline) -> tuple[pa.Table, dict[str, np.ndarray]]:
    """One pass over ``timeline``'s groups: every slice, and every arrow (``TimelineSide``)."""
    slices, flows = [], []
    for group in timeline.groups():
        slices.append(group.slices)
        if group.flows is not None:
            flows.append(group.flows)
    columns = ("inv_index", "source_tid", "source_ts", "target_tid", "target_ts", "target_end")
    return pa.concat_tables(slices), {
        c: np.concatenate([numpy_column(f, c) for f in flows]).astype(np.int64)
        if flows
        else np.zeros(0, np.int64)
        for c in columns
    }


def _segments(
    out: np.ndarray,
    out_starts: np.ndarray,
    src: np.ndarray,
    src_starts: np.ndarray,
    lengths: np.ndarray,
) -> None:
    """Copy ``src[src_starts[i]:+lengths[i]]`` to ``out[out_starts[i]:]`` for every i."""
    total = int(lengths.sum())
    if total == 0:
        return
    first = np.zeros(lengths.size, np.int64)
    np.cumsum(lengths[:-1], out=first[1:])
    within = np.arange(total) - np.repeat(first, lengths)
    out[np.repeat(out_starts, lengths) + within] = src[np.repeat(src_starts, lengths) + within]


def _splice(text: np.ndarray, starts: np.ndarray, stops: np.ndarray, values: pa.Array) -> bytes:
    """``text`` with each span ``[starts[i], stops[i])`` replaced by ``values[i]``."""
    values = values.cast(pa.large_string())
    offsets = np.frombuffer(values.buffers()[1], np.int64)[
        values.offset : values.offset + len(values) + 1
    ]
    data = np.frombuffer(values.buffers()[2], np.uint8)
    value_lengths = np.diff(offsets)
    keep_from = np.concatenate([[0], stops])
    keep_lengths = np.concatenate([starts, [text.size]]) - keep_from
    pieces = np.empty(2 * starts.size + 1, np.int64)
    pieces[0::2], pieces[1::2] = keep_lengths, value_lengths
    out_starts = np.zeros(pieces.size, np.int64)
    np.cumsum(pieces[:-1], out=out_starts[1:])
    out = np.empty(int(pieces.sum()), np.uint8)
    _segments(out, out_starts[0::2], text, keep_from, keep_lengths)
    _segments(out, out_starts[1::2], data, offsets[:-1], value_lengths)
    return out.tobytes()


def _rebased(block: EventBlock, shift: int) -> bytes:
    """The block's events with every ``ts`` moved back by ``shift`` ns, exactly."""
    start, stop = block.text_spans("ts")
    numbers = block.numbers("ts", 3)
    rows = np.flatnonzero(start >= 0)
    values = us_text(numbers.value[rows] - shift, numbers.quoted[rows])
    return _splice(block.text, start[rows], stop[rows], values)


def _added_text(chunks: Iterable[bytes], leading: bool) -> Iterator[bytes]:
    """The added events' text; without the first separator when no outer event precedes
    them."""
    for chunk in chunks:
        if not chunk:
            continue
        if not leading:
            chunk = chunk[2:]
            leading = True
        yield chunk


def _edits(
    layout: dict[str, Any],
    metadata: dict[str, Any],
    report: bytes,
    added: Iterable[bytes],
    shift: int | None,
) -> list[tuple[int, int, Iterable[bytes]]]:
    """Changes to the outer text as (offset, end of replaced text, new text), in order."""
    edits: list[tuple[int, int, Iterable[bytes]]] = []
    fields = layout["fields"]
    if layout["form"] == "object":
        # A trace fused before already has a report: it is replaced, never duplicated.
        opening = layout["documentOpen"] + 1
        entry = b'"' + REPORT_KEY.encode() + b'":' + report
        if REPORT_KEY in fields:
            begin, end = fields[REPORT_KEY]
            edits.append((begin, end, [report]))
        else:
            edits.append((opening, opening, [entry + b","]))
        existing = metadata.get("metadata")
        if "metadata" not in fields:
            edits.append((opening, opening, [b'"metadata":{' + entry + b"},"]))
        elif isinstance(existing, dict) and REPORT_KEY in existing:
            begin, end = fields["metadata"]
            edits.append(
                (begin, end, [orjson.dumps(existing | {REPORT_KEY: orjson.loads(report)})])
            )
        elif isinstance(existing, dict):
            inside = fields["metadata"][0] + 1
            edits.append((inside, inside, [entry + (b"," if existing else b"")]))
        base = metadata.get("baseTimeNanoseconds")
        if shift and isinstance(base, int) and "baseTimeNanoseconds" in fields:
            begin, end = fields["baseTimeNanoseconds"]
            edits.append((begin, end, [str(base + shift).encode()]))
    edits.append((layout["eventsClose"], layout["eventsClose"], added))
    return sorted(edits, key=lambda edit: edit[0])


class _Splicer:
    """Writes consecutive pieces of the outer text (offset, bytes), applying the edits
    that fall in them; ``finish`` writes those at the very end."""

    def __init__(self, edits: list[tuple[int, int, Iterable[bytes]]], sink: BinaryIO) -> None:
        self.pending = list(edits)
        self.sink = sink
        self.replaced_until = 0
        """Text before this offset is replaced already (a replacement may span pieces)."""

    def write(self, offset: int, data: bytes) -> None:
        end = offset + len(data)
        position = max(offset, self.replaced_until)
        while self.pending and self.pending[0][0] < end:
            at, until, text = self.pending.pop(0)
            self.sink.write(data[position - offset : at - offset])
            for part in text:
                self.sink.write(part)
            position = max(until, at)
        self.replaced_until = position
        self.sink.write(data[position - offset :])

    def finish(self) -> None:
        for _, _, text in self.pending:
            for part in text:
                self.sink.write(part)
        self.pending = []


def _raw_pieces(path: Path, bar: Bar) -> Iterator[tuple[int, bytes]]:
    offset = 0
    source, _ = open_text(path)
    with source:
        while chunk := source.read(CHUNK_BYTES):
            yield offset, chunk
            offset += len(chunk)
            bar.update(len(chunk))


def _rebased_text(path: Path, shift: int, splicer: _Splicer, bar: Bar) -> None:
    """The outer text with every event's ``ts`` rewritten; prologue and epilogue edited.
    Blocks are cut at commas between events, which go back in between them."""
    with read_trace(path, args_keys=()) as trace:
        wrote_prologue = False
        for block in trace.blocks:
            if not wrote_prologue:
                splicer.write(0, trace.prologue)
                wrote_prologue = True
            elif block.first_index:
                splicer.sink.write(b",")
            splicer.sink.write(_rebased(block, shift))
            bar.update(block.text.size)
        if not wrote_prologue:
            splicer.write(0, trace.prologue)
        splicer.write(trace.text_bytes - len(trace.epilogue), trace.epilogue)


def _write(
    output: Path,
    framework_trace: Path,
    layout: dict[str, Any],
    metadata: dict[str, Any],
    added_events: AddedEvents,
    report: dict[str, Any],
    shift: int | None,
) -> None:
    """Write the fused trace aside, then rename it into place; nothing is left on failure."""
    report_bytes = orjson.dumps(report)
    added: Iterable[bytes] = _added_text(added_events.chunks, layout["events"] > 0)
    if layout["form"] == "array":
        entry = (
            b'{"name":"'
            + REPORT_KEY.encode()
            + b'","ph":"M","pid":0,"tid":0,"args":'
            + report_bytes
            + b"}"
        )
        separator = b",\n" if layout["events"] > 0 or added_events.count else b""
        added = _chain(added, [separator + entry])
    edits = _edits(layout, metadata, report_bytes, added, shift)
    with (
        written_aside(output, FuseError, "the fused trace") as aside,
        aside_sink(aside, output.suffix == ".gz") as sink,
        progress(total=layout["textBytes"], desc="fuse", unit="B", unit_scale=True) as bar,
    ):
        splicer = _Splicer(edits, sink)
        if shift is None:
            for offset, data in _raw_pieces(framework_trace, bar):
                splicer.write(offset, data)
        else:
            _rebased_text(framework_trace, shift, splicer, bar)
        splicer.finish()


def _chain(*parts: Iterable[bytes]) -> Iterator[bytes]:
    for part in parts:
        yield from part
