"""Outer traces (torch.profiler / kineto, torch_npu) into the store, streamed.

``ingest_trace`` reads a Chrome trace block by block (``trace_reader``), turns each
block's events into Arrow columns with exact integer-ns times, and writes them as
one file of the ``trace_events`` table; the ``trace_sources`` row, written last,
commits it. A file already in the store (same SHA-256) is not loaded again.
``resolve_trace`` takes what a user names a trace by: a file, or a source id (or a unique
prefix of one) already in the store.

Every number is kept exactly or refused: times must fit int64 ns, integer fields
(``pid``, ``tid``, ``args.correlation``, ...) int64. Arguments are checked before anything
is written, and a refused trace leaves no file in the store.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from numbers import Integral
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from multicore_profiler.errors import ArgumentError, TraceFormatError
from multicore_profiler.ingest.event_columns import TimeStats
from multicore_profiler.ingest.event_columns import events_table as events_table  # fusion's
from multicore_profiler.ingest.trace_reader import TraceText, regular_file
from multicore_profiler.ingest.trace_workers import read_tables
from multicore_profiler.limits import INT64, RANK
from multicore_profiler.progress import progress
from multicore_profiler.storage.file_digest import file_sha256
from multicore_profiler.storage.partitions import partition_dir
from multicore_profiler.storage.schema import TRACE_EVENTS, TRACE_SOURCES
from multicore_profiler.storage.store import Store
from multicore_profiler.storage.writes import new_write_id


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
    job_id: str | None = None


@dataclass(frozen=True)
class RankContext:
    """What a profiler's output folder says of a rank beside its trace: its device, the
    job's parallel layout (``distributed_args``, ``parallel_group_info``) and the
    profiler's own per-rank tables (``step_trace_time``, ``communication``), each as the
    profiler wrote it."""

    device: int | None = None
    parallel: Mapping[str, Any] | None = None
    outputs: Mapping[str, Any] | None = None


def source_id_of(sha256: str) -> str:
    """A trace's id in the store: the first 16 hex digits of its file's SHA-256."""
    return sha256[:16]


def _json_text(fields: dict[str, Any]) -> str:
    """``fields`` as JSON text, exactly: ``json`` writes what orjson cannot (integers past
    64 bits, lone surrogates as escapes)."""
    try:
        return orjson.dumps(fields).decode()
    except orjson.JSONEncodeError:
        return json.dumps(fields)


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


def _rank(given: int | None, metadata: Mapping[str, Any], path: Path) -> int | None:
    """The rank given, else the trace's ``distributedInfo.rank`` (refused when it is an
    integer that is not a rank), else ``None``."""
    if given is not None:
        return given
    info = metadata.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    if not isinstance(rank, int) or isinstance(rank, bool):
        return None
    try:
        return int(RANK.check(rank, "its distributedInfo.rank"))
    except ArgumentError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None


def _base_time(metadata: Mapping[str, Any], path: Path) -> int | None:
    """The trace's ``baseTimeNanoseconds`` where it is an integer; refused past int64."""
    base = metadata.get("baseTimeNanoseconds")
    if not isinstance(base, int) or isinstance(base, bool):
        return None
    if not INT64.low <= base <= INT64.high:
        raise TraceFormatError(
            f"{path}: its baseTimeNanoseconds {base} is out of range: it must fit int64 "
            f"{INT64.bounds()}"
        )
    return base


def _checked_arguments(
    path: Path, rank: object, label: object, tags: object, job: object = None
) -> tuple[int | None, list[tuple[str, str]]]:
    """The rank (an integer in ``limits.RANK``) and the tags as pairs, after checking every
    argument the ``trace_sources`` row will hold: before anything is written, so that a
    bad one leaves nothing behind."""
    if rank is not None:
        if isinstance(rank, Integral) and not isinstance(rank, bool):
            rank = int(rank)
        rank = int(RANK.check(rank, "rank"))
    if tags is not None and not isinstance(tags, Mapping):
        raise ArgumentError(f"tags must be a mapping of strings to strings, got {tags!r}")
    pairs = list((tags or {}).items())
    texts = [("label", label)] if label is not None else []
    texts += [("job", job)] if job is not None else []
    texts += [(f"tag {key!r}", value) for key, value in pairs]
    texts += [("a tag name", key) for key, _ in pairs]
    texts.append(("the trace's path", str(path.absolute())))
    for name, text in texts:
        if not isinstance(text, str):
            raise ArgumentError(f"{name} must be a string, got {text!r}")
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise ArgumentError(
                f"{name} {text!r} is not text the store can hold (UTF-8): {exc.reason}"
            ) from None
    if job == "":
        raise ArgumentError("job must name a job, got an empty string")
    return rank, pairs


def _remove(store: Store, written: str | None, source_id: str) -> None:
    """Remove what a refused ingest wrote: its events file, and the partition directory
    it created if that is now empty (a local store's)."""
    # Never raised over the refusal: a file that cannot go is an orphan the vacuum removes.
    if written is not None:
        with suppress(OSError):
            store.location.filesystem.delete_file(written)
    if store.location.is_local:
        folder = store.location.directory / partition_dir(TRACE_EVENTS, {"source_id": source_id})
        with suppress(OSError):  # not empty (another ingest's file), or not there
            folder.rmdir()


def trace_digest(path: Path) -> str:
    """The SHA-256 of a trace file, read only if it is a regular file (a FIFO would block
    the read); ``TraceFormatError`` naming the file where it cannot be read."""
    regular_file(path)
    try:
        return file_sha256(path)[1]
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}") from exc


def find_source(store: Store, source_id: str) -> dict[str, Any] | None:
    """The ``trace_sources`` row of a source id, or ``None``."""
    rows = store.sql("SELECT * FROM trace_sources WHERE source_id = $1", [source_id]).to_pylist()
    return rows[0] if rows else None


def _known_source(row: Mapping[str, Any]) -> TraceSource:
    """The ``TraceSource`` of a ``trace_sources`` row: a trace already in the store."""
    return TraceSource(
        row["source_id"],
        Path(row["path"]),
        row["event_count"],
        row["rank"],
        row["form"],
        False,
        row["job_id"],
    )


def _known_in_job(row: Mapping[str, Any], job: str | None, path: Path) -> TraceSource:
    """A source already in the store, asked for again: refused when the call names
    another job than the one it is a rank of (a trace belongs to one job)."""
    if job is not None and row["job_id"] != job:
        raise ArgumentError(
            f"{path} is already in the store as source {row['source_id']} of job "
            f"{row['job_id']!r}, not {job!r}: a trace is a rank of one job (name that job, "
            "or remove the source first)"
        )
    return _known_source(row)


def _check_ranks_free(
    store: Store, job: str, claims: Sequence[tuple[int | None, str, Path]]
) -> None:
    """Refuse a source claiming a rank its job already has (in the store or among
    ``claims``, each a rank, source id and path), and a rank-less source in a named job
    (its ranks are what the cross-rank views compare)."""
    for rank, source_id, path in claims:
        if rank is None and job != source_id:
            raise ArgumentError(
                f"{path}: no rank for it in job {job!r}: the trace does not say it "
                "(distributedInfo.rank); give its rank, load its profiler output folder, or load "
                "traces of different jobs in separate calls"
            )
    taken = {
        row["rank"]: (row["source_id"], row["path"])
        for row in store.sql(
            "SELECT rank, source_id, path FROM trace_sources "
            "WHERE job_id = $1 AND rank IS NOT NULL",
            [job],
        ).to_pylist()
    }
    for rank, source_id, path in claims:
        other = taken.setdefault(rank, (source_id, str(path))) if rank is not None else None
        if other is not None and other[0] != source_id:
            raise ArgumentError(
                f"{path}: rank {rank} of job {job!r} is already source {other[0]} ({other[1]}); "
                "two traces cannot claim one rank of a job"
            )


def _write_source(
    store: Store,
    source_id: str,
    *,
    path: Path,
    sha256: str,
    rank: int | None,
    label: str | None,
    pairs: list[tuple[str, str]],
    job_id: str,
    context: RankContext | None,
    **columns: Any,
) -> None:
    """Commit a source: write its ``trace_sources`` row, of the columns every source has
    (its identity, rank, job and the rank's context), ``columns`` (those of its form) and
    NULL for the rest."""
    context = context or RankContext()
    row = {
        "ingested_at": datetime.now(timezone.utc),
        "path": str(path.absolute()),
        "sha256": sha256,
        "rank": rank,
        "label": label,
        "tags": pairs,
        "job_id": job_id,
        "device": context.device,
        "parallel": _json_text(context.parallel) if context.parallel else None,
        "profiler_outputs": _json_text(context.outputs) if context.outputs else None,
        **columns,
    }
    schema = TRACE_SOURCES.schema
    table = pa.table({name: [row.get(name)] for name in schema.names}, schema)
    store.write_file(TRACE_SOURCES, {"source_id": source_id}, table)


def ingest_trace(
    store: Store,
    path: str | os.PathLike[str],
    *,
    rank: int | None = None,
    label: str | None = None,
    tags: Mapping[str, str] | None = None,
    job: str | None = None,
    context: RankContext | None = None,
    sha256: str | None = None,
    workers: int | None = None,
) -> TraceSource:
    """Load a Chrome trace (``.json`` or gzipped; an object with ``traceEvents`` or a bare
    array) into the store's ``trace_events`` and ``trace_sources``; return its source.

    The file is streamed: memory holds one block of text and its columns at a time.
    Times are exact integer ns (a string ``ts`` holding epoch microseconds included).
    ``rank`` defaults to the trace's ``distributedInfo.rank``. ``job`` names the job the
    trace is a rank of (default: a job of its own, named by its source id); ``context``
    is what the profiler's output folder adds (see ``ingest/jobs.py``); ``sha256`` the
    file's ``trace_digest`` where the caller has it already; ``workers`` how many processes
    read it (``trace_workers.worker_count``: by default every core for a large file, 1 for a
    small one, or ``MCPROF_TRACE_WORKERS``). A file already in
    the store (same SHA-256) is not loaded again. Raises ``ArgumentError`` for a rank
    outside ``limits.RANK``, a label, tag or job that is not a string, a rank its job
    already has from another trace, or a trace already in the store under another job,
    before anything is committed, and ``TraceFormatError`` for a file that is not a Chrome
    trace the store can hold exactly; nothing of a refused trace is then left in the store.
    """
    path = Path(path)
    rank, pairs = _checked_arguments(path, rank, label, tags, job)
    file_bytes = regular_file(path).st_size
    sha256 = sha256 or trace_digest(path)
    source_id = source_id_of(sha256)
    known = find_source(store, source_id)
    if known is not None:
        return _known_in_job(known, job, path)
    job_id = job or source_id
    write_id = new_write_id()
    stats = TimeStats()
    written = None
    try:
        trace, read = read_tables(path, stats, workers=workers)
        with trace, closing(read), closing(_tables(read, path, write_id)) as tables:
            written = store.write_file(TRACE_EVENTS, {"source_id": source_id}, tables)
        metadata = trace.fields
        rank = _rank(rank, metadata, path)
        _check_ranks_free(store, job_id, [(rank, source_id, path)])
        _write_source(
            store,
            source_id,
            path=path,
            sha256=sha256,
            rank=rank,
            label=label,
            pairs=pairs,
            job_id=job_id,
            context=context,
            write_id=write_id,
            file_bytes=file_bytes,
            text_bytes=trace.text_bytes,
            compressed=trace.compressed,
            form=trace.form,
            event_count=trace.events,
            metadata=_json_text(metadata) if trace.form == "object" else None,
            base_time_ns=_base_time(metadata, path),
            first_ts_ns=stats.first_ts,
            last_ts_ns=stats.last_ts,
            rounded_count=stats.rounded,
            layout=orjson.dumps(text_layout(trace)).decode(),
        )
    except BaseException:
        _remove(store, written, source_id)
        raise
    return TraceSource(source_id, path, trace.events, rank, trace.form, True, job_id)


def ingest_outputs(
    store: Store,
    ranks: Sequence[tuple[str | os.PathLike[str], int, RankContext]],
    *,
    label: str | None = None,
    tags: Mapping[str, str] | None = None,
    job: str | None = None,
) -> list[TraceSource]:
    """Record ranks whose profiler output holds its own tables but no trace (msprof's
    simplified export), each given as its folder, rank and context: a ``trace_sources``
    row of form ``outputs`` with no events, its id from the SHA-256 of the tables. Checked
    and refused as ``ingest_trace``, all before any is written; the store is asked once for
    the whole batch (a job of many ranks loads in one pass)."""
    rows, ids, sources, claims = [], [], [], []
    for folder, rank, context in ranks:
        folder = Path(folder)
        rank_checked, pairs = _checked_arguments(folder, rank, label, tags, job)
        text = _json_text(context.outputs or {}).encode()
        sha256 = hashlib.sha256(text).hexdigest()
        ids.append(source_id_of(sha256))
        rows.append((folder, rank_checked, pairs, context, text, sha256))
    known = {
        row["source_id"]: row
        for row in store.sql(
            "SELECT * FROM trace_sources WHERE list_contains($1, source_id)", [ids]
        ).to_pylist()
    }
    for source_id, (folder, rank, _pairs, _context, _text, _sha) in zip(ids, rows, strict=True):
        if source_id in known:
            sources.append(_known_in_job(known[source_id], job, folder))
        else:
            claims.append((rank, source_id, folder))
            sources.append(
                TraceSource(source_id, folder, 0, rank, "outputs", True, job or source_id)
            )
    if job is not None:
        _check_ranks_free(store, job, claims)
    for source, (folder, rank, pairs, context, text, sha256) in zip(sources, rows, strict=True):
        if not source.new:
            continue
        _write_source(
            store,
            source.source_id,
            path=folder,
            sha256=sha256,
            rank=rank,
            label=label,
            pairs=pairs,
            job_id=source.job_id,
            context=context,
            write_id=new_write_id(),
            file_bytes=len(text),
            text_bytes=len(text),
            compressed=False,
            form="outputs",
            event_count=0,
        )
    return sources


SOURCE_PREFIX_MIN = 4
"""The fewest characters of a source id that name a trace already in the store."""


def resolve_trace(
    store: Store,
    item: str | os.PathLike[str],
    *,
    rank: int | None = None,
    label: str | None = None,
) -> TraceSource:
    """The trace ``item`` names: a trace file (loaded into the store by ``ingest_trace``,
    with ``rank`` and ``label``, if it is not there yet) or the source id, or a unique
    prefix of at least ``SOURCE_PREFIX_MIN`` characters of one, of a trace already in the
    store. ``new`` tells whether this call loaded it.

    Raises ``ArgumentError`` when ``item`` is neither, or is a prefix of several source
    ids (or too short to be one), and what ``ingest_trace`` raises for a file.
    """
    if Path(item).is_file():
        return ingest_trace(store, item, rank=rank, label=label)
    prefix = os.fspath(item)
    found = store.sql(
        "SELECT * FROM trace_sources WHERE starts_with(source_id, $1) ORDER BY source_id",
        [prefix.lower()],
    ).to_pylist()
    if len(found) != 1 or len(prefix) < SOURCE_PREFIX_MIN:
        problem = "names several" if len(found) > 1 else "is neither a trace file nor"
        raise ArgumentError(f"{prefix!r} {problem} the source id of a trace in {store.uri}")
    return _known_source(found[0])


def _tables(tables: Iterator[pa.Table], path: Path, write_id: int) -> Iterator[pa.Table]:
    """The ``trace_events`` tables with their ``write_id``, with a progress bar on a terminal."""
    with progress(desc=f"ingest {path.name}", unit="event") as bar:
        for table in tables:
            count = table.num_rows
            yield table.add_column(0, "write_id", pa.repeat(pa.scalar(write_id), count))
            bar.update(count)
