"""Offline fusion: a MegaKernel's AIC/AIV tracks added to a torch.profiler or torch_npu trace.

``merge_chrome_traces`` loads the outer trace into a store (``ingest_trace``; a file
already there is not loaded again), reads the MegaKernel's standalone trace
(schema v1, or exported on the fly from a store selection), aligns them in SQL
(``align``) and writes the fused trace by streaming the outer file's text
through: every outer event is copied as it was written, the added threads and
events go before the events array's end, and the ``megaKernelTraceMerge`` report
goes in at the top (and under ``metadata``). With ``rebase_timestamps`` each
outer ``ts`` is rewritten, exactly, in integer ns.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
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
from tqdm import tqdm

from multicore_profiler.errors import ArgumentError, FuseError, QueryError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.export.files import written_aside
from multicore_profiler.fuse.align import align
from multicore_profiler.ingest.outer_trace import (
    events_table,
    find_source,
    ingest_trace,
    top_level_fields,
)
from multicore_profiler.ingest.trace_scan import BLOCK_BYTES, EventBlock, open_text, read_trace
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
) -> MergedTrace:
    """Fuse a MegaKernel's records into ``framework_trace`` (torch.profiler / kineto or
    torch_npu, ``.json`` or ``.json.gz``); write the result to ``output`` (gzipped if it
    ends in ``.gz``) and return what was written.

    ``mega_kernel_trace`` is a standalone trace from ``export_chrome_trace`` or a
    ``Store``, whose ``run`` (default: latest) narrowed by ``step`` / ``window`` is
    exported first. The outer trace is loaded into ``store`` (default: the store given
    as ``mega_kernel_trace``, else a temporary one). ``rank`` defaults to the outer
    trace's ``distributedInfo.rank``, or the only rank the MegaKernel trace has.

    The i-th invocation aligns to the i-th outer device kernel matching
    ``kernel_pattern`` (default: from the kernel's name) after ``kernel_index`` of them,
    within ``outer_pid`` if given. Raises ``ArgumentError`` for an argument out of range
    (before any work) and ``FuseError`` when the fusion cannot be done safely; no file is
    left behind then.
    """
    COUNT.check(kernel_index, "kernel_index")
    check_given(
        (rank, RANK, "rank"),
        (outer_pid, PID, "outer_pid"),
        (step, STEP, "step"),
        (window, WINDOW, "window"),
    )
    with ExitStack() as stack:
        if store is None and isinstance(mega_kernel_trace, Store):
            store = mega_kernel_trace
        if store is None:
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="mcprof-fuse-"))
            store = stack.enter_context(open_store(Path(scratch) / "store"))
        if isinstance(mega_kernel_trace, Store):
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="mcprof-fuse-"))
            exported = export_chrome_trace(
                mega_kernel_trace,
                Path(scratch) / "mega_kernel.json",
                run=run,
                step=step,
                window=window,
            )
            mk_path = exported.path
        else:
            if any(v is not None for v in (run, step, window)):
                raise FuseError("run, step and window select from a store, not from a trace file")
            mk_path = Path(mega_kernel_trace)
        # The MegaKernel side is read first: a refusal there leaves the store as it was.
        events, invocations, mk_summary = _mega_kernel_trace(mk_path)
        source = ingest_trace(store, framework_trace, rank=rank)
        described = find_source(store, source.source_id)
        # A rank given now wins over the one stored when the trace was first loaded.
        rank = _rank(source.rank if rank is None else rank, invocations, framework_trace)
        kernels = sorted({i["kernel_name"] for i in invocations.to_pylist() if i["rank"] == rank})
        if kernel_pattern is None and len(kernels) > 1:
            raise FuseError(
                f"rank {rank} ran several kernels ({', '.join(kernels)}); give kernel_pattern"
            )
        # json, not orjson: the metadata may hold escaped lone surrogates and integers past 64 bits.
        metadata = json.loads(described["metadata"]) if described["metadata"] else {}
        shift = 0
        if rebase_timestamps and described["first_ts_ns"] is not None:
            shift = described["first_ts_ns"] // 1000 * 1000
        try:
            with store.reading() as con:
                con.register("mk", events)
                con.register("mk_invocations", invocations)
                alignment = align(
                    con,
                    source_id=source.source_id,
                    rank=rank,
                    kernel_name=kernels[0] if kernels else "",
                    kernel_pattern=kernel_pattern,
                    kernel_index=kernel_index,
                    outer_pid=outer_pid,
                    allow_host_alignment=allow_host_alignment,
                    shift_ns=shift,
                    mega_kernel_trace=str(mk_path),
                )
        except duckdb.Error as exc:
            raise QueryError(f"alignment query failed: {exc}") from exc
        report = alignment.report
        report["outerTrace"] = {
            "path": str(Path(framework_trace)),
            "sourceId": source.source_id,
            "form": source.form,
            "events": source.events,
        }
        report["megaKernelTrace"] = {
            "path": str(mk_path) if not isinstance(mega_kernel_trace, Store) else None,
            "selection": mk_summary.get("selection"),
            "cycleFrequencyMHz": mk_summary.get("cycleFrequencyMHz"),
        }
        base_time = metadata.get("baseTimeNanoseconds")
        report["rebase"] = {
            "applied": bool(rebase_timestamps),
            "shiftNs": shift,
            "shiftUs": _us_text(np.array([shift]), np.array([False]))[0].as_py(),
            "baseTimeNanoseconds": (
                {"before": base_time, "after": base_time + shift}
                if isinstance(base_time, int)
                else None
            ),
        }
        layout = orjson.loads(described["layout"])
        _write(
            Path(output),
            Path(framework_trace),
            layout,
            metadata,
            alignment.lines,
            report,
            shift if rebase_timestamps else None,
        )
        return MergedTrace(
            Path(output), source.source_id, alignment.records, len(alignment.lines), report
        )


def _mega_kernel_trace(path: Path) -> tuple[pa.Table, pa.Table, dict[str, Any]]:
    """A standalone MegaKernel trace's events (as ``trace_events`` columns), its
    invocations and its ``megaKernelCycleTrace`` object."""
    with read_trace(path, args_keys=()) as trace:
        tables = [events_table(block) for block in trace.blocks]
        summary = top_level_fields(trace).get("megaKernelCycleTrace")
    if not isinstance(summary, dict) or summary.get("schemaVersion") != 1:
        raise FuseError(
            f"{path} is not a MegaKernel trace of schema v1 (no megaKernelCycleTrace); export "
            "one with mcprof export or export_chrome_trace"
        )
    if not tables:
        raise FuseError(f"{path} holds no event")
    entries = summary.get("invocations") or []
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
    return pa.concat_tables(tables), invocations, summary


def _invocation_values(
    path: Path, entries: list[dict[str, Any]], key: str, kind: Range | type[str], required: bool
) -> list[Any]:
    """Every entry's ``key``, checked against its range or type, so that a hand-edited
    summary is refused naming the entry and the field, never cast into a wrong value."""
    values = []
    for index, entry in enumerate(entries):
        value = entry.get(key)
        where = f"{path}: megaKernelCycleTrace.invocations[{index}].{key}"
        if value is None:
            if required:
                raise FuseError(
                    f"{path}: an invocation of its megaKernelCycleTrace has no {key!r} "
                    f"(invocations[{index}])"
                )
        elif isinstance(kind, Range):
            try:
                value = kind.check(value, where)
            except ArgumentError as exc:
                raise FuseError(str(exc)) from None
        elif not isinstance(value, str):
            raise FuseError(f"{where} must be a string, got {value!r:.60}")
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


def _us_text(ns: np.ndarray, quoted: np.ndarray) -> pa.Array:
    """Microseconds with three decimals from integer ns, as JSON numbers or strings."""
    magnitude = np.abs(ns)
    text = pc.binary_join_element_wise(
        pc.cast(pa.array(magnitude // 1000), pa.string()),
        pc.utf8_lpad(pc.cast(pa.array(magnitude % 1000), pa.string()), 3, "0"),
        ".",
    )
    text = pc.if_else(pa.array(ns < 0), pc.binary_join_element_wise("-", text, ""), text)
    return pc.if_else(pa.array(quoted), pc.binary_join_element_wise('"', text, '"', ""), text)


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
    start, stop = block.span("ts")
    numbers = block.numbers("ts", 3)
    rows = np.flatnonzero(start >= 0)
    values = _us_text(numbers.value[rows] - shift, numbers.quoted[rows])
    return _splice(block.text[: int(block.stops[-1])], start[rows], stop[rows], values)


def _lines(lines: pa.ChunkedArray, leading: bool) -> Iterator[bytes]:
    """The added events' text, straight from the Arrow buffers; without the first
    separator when no outer event precedes them."""
    for chunk in lines.chunks:
        if len(chunk) == 0:
            continue
        chunk = chunk.cast(pa.large_string())
        offsets = np.frombuffer(chunk.buffers()[1], np.int64)
        first, last = offsets[chunk.offset], offsets[chunk.offset + len(chunk)]
        data = memoryview(chunk.buffers()[2])[first:last]
        if not leading:
            data = data[2:]
            leading = True
        yield bytes(data)


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


def _raw_pieces(path: Path, progress: tqdm) -> Iterator[tuple[int, bytes]]:
    offset = 0
    source, _ = open_text(path)
    with source:
        while chunk := source.read(BLOCK_BYTES):
            yield offset, chunk
            offset += len(chunk)
            progress.update(len(chunk))


def _rebased_text(path: Path, shift: int, splicer: _Splicer, progress: tqdm) -> None:
    """The outer text with every event's ``ts`` rewritten; prologue and epilogue edited."""
    with read_trace(path, args_keys=()) as trace:
        wrote_prologue = False
        for block in trace.blocks:
            if not wrote_prologue:
                splicer.write(0, trace.prologue)
                wrote_prologue = True
            splicer.sink.write(_rebased(block, shift))
            progress.update(int(block.stops[-1]))
        if not wrote_prologue:
            splicer.write(0, trace.prologue)
        splicer.write(trace.text_bytes - len(trace.epilogue), trace.epilogue)


def _write(
    output: Path,
    framework_trace: Path,
    layout: dict[str, Any],
    metadata: dict[str, Any],
    lines: pa.ChunkedArray,
    report: dict[str, Any],
    shift: int | None,
) -> None:
    """Write the fused trace aside, then rename it into place; nothing is left on failure."""
    report_bytes = orjson.dumps(report)
    added: Iterable[bytes] = _lines(lines, layout["events"] > 0)
    if layout["form"] == "array":
        entry = (
            b'{"name":"'
            + REPORT_KEY.encode()
            + b'","ph":"M","pid":0,"tid":0,"args":'
            + report_bytes
            + b"}"
        )
        separator = b",\n" if layout["events"] > 0 or len(lines) else b""
        added = _chain(added, [separator + entry])
    edits = _edits(layout, metadata, report_bytes, added, shift)
    with (
        written_aside(output, FuseError, "the fused trace") as aside,
        (
            gzip.open(aside, "wb", compresslevel=6) if output.suffix == ".gz" else open(aside, "wb")
        ) as sink,
        tqdm(
            total=layout["textBytes"], desc="fuse", unit="B", unit_scale=True, disable=None
        ) as progress,
    ):
        splicer = _Splicer(edits, sink)
        if shift is None:
            for offset, data in _raw_pieces(framework_trace, progress):
                splicer.write(offset, data)
        else:
            _rebased_text(framework_trace, shift, splicer, progress)
        splicer.finish()


def _chain(*parts: Iterable[bytes]) -> Iterator[bytes]:
    for part in parts:
        yield from part
