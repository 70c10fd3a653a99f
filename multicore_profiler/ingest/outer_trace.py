"""Outer traces (torch.profiler / kineto, torch_npu) into the store, streamed.

``ingest_trace`` reads a Chrome trace block by block (``trace_scan``), turns each
block's events into Arrow columns with exact integer-ns times, and writes them as
one file of the ``trace_events`` table; the ``trace_sources`` row, written last,
commits it. A file already in the store (same SHA-256) is not loaded again.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from multicore_profiler.errors import TraceFormatError
from multicore_profiler.ingest.trace_scan import (
    EventBlock,
    Numbers,
    TraceText,
    file_sha256,
    read_trace,
)
from multicore_profiler.storage.partitions import write_partition
from multicore_profiler.storage.schema import TRACE_EVENTS, TRACE_SOURCES
from multicore_profiler.storage.store import Store

_NS_DECIMALS = 3
"""Trace Event Format times are microseconds: three decimals make integer ns."""


@dataclass(frozen=True)
class TraceSource:
    """An outer trace in the store: its id, file, event count and rank; ``new`` tells
    whether this call loaded it (else it was already there)."""

    source_id: str
    path: Path
    events: int
    rank: int | None
    form: str
    new: bool


def source_id_of(sha256: str) -> str:
    """A trace's id in the store: the first 16 hex digits of its file's SHA-256."""
    return sha256[:16]


@dataclass
class _Stats:
    first_ts: int | None = None
    last_ts: int | None = None
    rounded: int = 0


def _integers(numbers: Numbers, keep: np.ndarray) -> pa.Array:
    """Integer values where the text holds an exact integer number (not a string)."""
    valid = keep & numbers.number & ~numbers.quoted & ~numbers.rounded
    return pa.array(numbers.value, pa.int64(), mask=~valid)


def _times(block: EventBlock, key: str, path: Path, stats: _Stats) -> pa.Array:
    start, stop = block.span(key)
    numbers = block.numbers(key, _NS_DECIMALS)
    bad = np.flatnonzero((start >= 0) & ~numbers.number)
    if bad.size:
        row = int(bad[0])
        raw = bytes(block.text[start[row] : stop[row]])
        raise TraceFormatError(
            f"{path}: event {block.first_index + row} has {key} {raw.decode(errors='replace')},"
            " which is not a number"
        )
    stats.rounded += int(numbers.rounded.sum())
    return pa.array(numbers.value, pa.int64(), mask=start < 0)


def events_table(block: EventBlock, path: Path, stats: _Stats | None = None) -> pa.Table:
    """The ``trace_events`` columns (but ``write_id``) of one block of events."""
    stats = stats if stats is not None else _Stats()
    count = len(block)
    ts = _times(block, "ts", path, stats)
    dur = _times(block, "dur", path, stats)
    if ts.null_count < count:
        ts_values = ts.to_numpy(zero_copy_only=False)
        has_ts = ~np.asarray(ts.is_null())
        ends = ts_values + np.where(np.asarray(dur.is_null()), 0, dur.fill_null(0).to_numpy())
        low, high = int(ts_values[has_ts].min()), int(ends[has_ts].max())
        stats.first_ts = low if stats.first_ts is None else min(stats.first_ts, low)
        stats.last_ts = high if stats.last_ts is None else max(stats.last_ts, high)
    columns: dict[str, pa.Array] = {
        "event_index": pa.array(np.arange(block.first_index, block.first_index + count)),
        "ph": block.strings("ph"),
        "cat": block.strings("cat"),
        "name": block.strings("name"),
    }
    for key in ("pid", "tid"):
        start, _ = block.span(key)
        columns[key] = _integers(block.numbers(key), start >= 0)
        is_string = (start >= 0) & (block.text[np.maximum(start, 0)] == ord('"'))
        names = block.strings(key) if is_string.any() else pa.nulls(count, pa.string())
        columns[f"{key}_name"] = pc.if_else(pa.array(is_string), names, None)
    columns["ts_ns"] = ts
    columns["dur_ns"] = dur
    columns["flow_id"] = block.strings("id")
    for column, key in (("correlation", "correlation"), ("external_id", "External id")):
        start, _ = block.span(key)
        columns[column] = _integers(block.numbers(key), start >= 0)
    for column, keys in (("stream", ("stream", "Stream Id")), ("device", ("device",))):
        values = None
        for key in keys:
            start, _ = block.span(key)
            found = _integers(block.numbers(key), start >= 0)
            values = found if values is None else pc.coalesce(values, found)
        columns[column] = values
    columns["task_type"] = block.strings("Task Type")
    columns["args"] = block.strings("args", raw=True)
    return pa.table(columns)


def top_level_fields(trace: TraceText) -> dict[str, Any]:
    """The top-level fields other than ``traceEvents`` (none for a bare array)."""
    if trace.form != "object":
        return {}
    document = trace.prologue + trace.epilogue
    try:
        fields = orjson.loads(document)
    except orjson.JSONDecodeError:
        try:
            fields = json.loads(document)
        except ValueError as exc:
            raise TraceFormatError(
                f"{trace.path}: its top-level fields are not JSON: {exc}"
            ) from exc
    fields.pop("traceEvents", None)
    return fields


def text_layout(trace: TraceText) -> dict[str, Any]:
    """Where fusion finds things in the text: the events array's brackets, the top-level
    object's brace and the value spans of ``metadata`` and ``baseTimeNanoseconds``."""
    spans = trace.top_level_spans()
    return {
        "form": trace.form,
        "documentOpen": len(trace.prologue) - len(trace.prologue.lstrip()),
        "eventsOpen": len(trace.prologue) - 1,
        "eventsClose": trace.text_bytes - len(trace.epilogue),
        "textBytes": trace.text_bytes,
        "events": trace.events,
        "fields": {key: list(span) for key, span in spans.items()},
    }


def _rank(given: int | None, metadata: Mapping[str, Any]) -> int | None:
    if given is not None:
        return int(given)
    info = metadata.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def find_source(store: Store, source_id: str) -> dict[str, Any] | None:
    """The ``trace_sources`` row of a source id, or ``None``."""
    rows = store.sql("SELECT * FROM trace_sources WHERE source_id = $1", [source_id]).to_pylist()
    return rows[0] if rows else None


def ingest_trace(
    store: Store,
    path: str | os.PathLike[str],
    *,
    rank: int | None = None,
    label: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> TraceSource:
    """Load a Chrome trace (``.json`` or gzipped; an object with ``traceEvents`` or a bare
    array) into the store's ``trace_events`` and ``trace_sources``; return its source.

    The file is streamed: memory holds one block of text and its columns at a time.
    Times are exact integer ns (a string ``ts`` holding epoch microseconds included).
    ``rank`` defaults to the trace's ``distributedInfo.rank``. A file already in the
    store (same SHA-256) is not loaded again. Raises ``TraceFormatError`` for a file
    that is not a Chrome trace; nothing of it is then visible in the store.
    """
    path = Path(path)
    try:
        sha256 = file_sha256(path)
        file_bytes = path.stat().st_size
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}") from exc
    source_id = source_id_of(sha256)
    known = find_source(store, source_id)
    if known is not None:
        return TraceSource(
            source_id,
            Path(known["path"]),
            known["event_count"],
            known["rank"],
            known["form"],
            False,
        )
    trace = read_trace(path)
    write_id = secrets.randbits(63)
    stats = _Stats()

    def tables() -> Iterator[pa.Table]:
        with tqdm(desc=f"ingest {path.name}", unit="event", disable=None) as progress:
            for block in trace.blocks:
                table = events_table(block, path, stats)
                yield table.add_column(0, "write_id", pa.repeat(pa.scalar(write_id), len(block)))
                progress.update(len(block))

    write_partition(store.location, TRACE_EVENTS, {"source_id": source_id}, tables())
    metadata = top_level_fields(trace)
    rank = _rank(rank, metadata)
    base_time = metadata.get("baseTimeNanoseconds")
    row = {
        "write_id": [write_id],
        "ingested_at": [datetime.now(timezone.utc)],
        "path": [str(path.absolute())],
        "sha256": [sha256],
        "file_bytes": [file_bytes],
        "text_bytes": [trace.text_bytes],
        "compressed": [trace.compressed],
        "form": [trace.form],
        "event_count": [trace.events],
        "rank": [rank],
        "label": [label],
        "tags": [list((tags or {}).items())],
        "metadata": [orjson.dumps(metadata).decode() if trace.form == "object" else None],
        "base_time_ns": [base_time if isinstance(base_time, int) else None],
        "first_ts_ns": [stats.first_ts],
        "last_ts_ns": [stats.last_ts],
        "rounded_count": [stats.rounded],
        "layout": [orjson.dumps(text_layout(trace)).decode()],
    }
    write_partition(
        store.location, TRACE_SOURCES, {"source_id": source_id}, pa.table(row, TRACE_SOURCES.schema)
    )
    return TraceSource(source_id, path, trace.events, rank, trace.form, True)
