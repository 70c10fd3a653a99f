"""Trace reading benchmark: where the time of reading an outer trace goes, stage by stage.

On one trace (default: the A100 training fixture, 25.8 MB of JSON, 108,936 events), each
stage of ``read_trace`` + ``events_table`` is timed on its own over the whole events array
as one chunk, and the whole reader end to end, in MB/s of JSON text:

- ``gunzip``: the file's text read (``open_text``);
- ``msgspec decode``: the events array decoded into structs of ``Raw`` values;
- ``field spans``: where each field's values are, found by encoding the structs again and
  splitting that text with numpy (``_encoded``), against the baseline measured beside it:
  the same spans taken value by value in Python (``_addressed``, what the reader falls
  back to), and a plain per-field ``b"".join`` of the values, the least a Python loop
  over the structs can do;
- ``args fields``: the ``args`` objects decoded again for their id fields;
- ``columns``: ``events_table`` (exact numbers and strings, a column at a time);
- ``reader end to end``: ``read_trace`` + ``events_table`` of every block, chunked as in
  an ingest, in this process (two threads), and ``read_tables`` on 2 worker processes up
  to one a core (``trace_workers``), the workers' start included, interleaved run by run
  with the one-process reader: their ratio is taken run by run.

Each is the median of ``--repeat`` runs with its min-max; each stage's ``x msgspec`` is its
speed over that of msgspec decoding the same bytes (ratio of medians).
``--repetitions K`` reads a trace of the fixture's events K times over (``fuse.write_trace``)
in place of ``--trace``: where the workers start to pay (``PARALLEL_BYTES_MIN``).

    .venv/bin/python bench/trace_read.py [--repeat 7] [--trace PATH | --repetitions K]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from fuse import FIXTURE, KERNEL_PATTERN, load_template, write_trace

from multicore_profiler.ingest import trace_reader
from multicore_profiler.ingest.event_columns import TimeStats
from multicore_profiler.ingest.outer_trace import events_table
from multicore_profiler.ingest.trace_workers import cores, read_tables


def timed(work: Callable[[], Any], repeat: int) -> list[float]:
    """Wall seconds of each of ``repeat`` runs of ``work``."""
    seconds = []
    for _ in range(repeat):
        began = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - began)
    return seconds


def line(name: str, seconds: list[float], size: int, decode: list[float]) -> str:
    median = statistics.median(seconds)
    return (
        f"{name:<46} {median * 1e3:8.1f} ms [{min(seconds) * 1e3:.1f}-{max(seconds) * 1e3:.1f}]"
        f" {size / 1e6 / median:8.1f} MB/s {statistics.median(decode) / median:6.2f}"
    )


def whole_read(path: Path) -> int:
    """Every block of ``path`` read and turned into columns; the event count."""
    with trace_reader.read_trace(path) as trace:
        return sum(events_table(block).num_rows for block in trace.blocks)


def worker_read(path: Path, workers: int) -> int:
    """``path``'s tables made by ``workers`` processes; the event count."""
    trace, tables = read_tables(path, TimeStats(), workers=workers)
    with trace, closing(tables):
        return sum(table.num_rows for table in tables)


def interleaved(works: list[Callable[[], Any]], repeat: int) -> list[list[float]]:
    """Wall seconds of each of ``works``, run one after the other ``repeat`` times over."""
    seconds: list[list[float]] = [[] for _ in works]
    for _ in range(repeat):
        for work, taken in zip(works, seconds, strict=True):
            taken.extend(timed(work, 1))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--trace", type=Path, default=FIXTURE)
    parser.add_argument("--repetitions", type=int, help="read the fixture's events K times over")
    args = parser.parse_args()
    if args.repetitions:
        with tempfile.TemporaryDirectory(prefix="mcprof-trace-read-") as folder:
            args.trace = Path(folder) / "trace.json"
            template = load_template(FIXTURE, KERNEL_PATTERN)
            write_trace(template, args.trace, args.repetitions)
            bench(args)
    else:
        bench(args)


def bench(args: argparse.Namespace) -> None:
    """Time each stage on ``args.trace``."""
    load = os.getloadavg()[0]

    def text() -> bytes:
        source, _ = trace_reader.open_text(args.trace)
        with source:
            return source.read()

    data = text()
    start = data.index(b"[", data.index(b'"traceEvents"')) + 1 if data[:1] == b"{" else 1
    events = data[start : data.rindex(b"]")].rstrip()
    guess = b"[" + events + b"]"
    size = len(data)
    decoded = trace_reader._decoded(guess)
    structs = decoded[0]
    keys = trace_reader.EVENT_KEYS

    def block() -> trace_reader.EventBlock:
        return trace_reader.EventBlock(
            args.trace, 0, start, events, decoded, trace_reader.ARGS_KEYS
        )

    def args_fields() -> None:
        prepared = block()
        _ = prepared._fields
        began = time.perf_counter()
        _ = prepared._args
        args_seconds.append(time.perf_counter() - began)

    def joined() -> None:
        for number in range(len(keys)):
            raws = trace_reader._raws(structs, number)
            b"\0".join(raws)
            [len(raw) for raw in raws]

    prepared = block()
    prepared.prepare()
    args_seconds: list[float] = []
    timed(args_fields, args.repeat)
    split = timed(lambda: trace_reader._encoded(structs, keys, len(events)), args.repeat)
    addressed = timed(
        lambda: trace_reader._addressed(prepared.text, structs, keys, prepared._base),
        args.repeat,
    )
    join = timed(joined, args.repeat)
    decode = timed(lambda: trace_reader._decoded(guess), args.repeat)
    counts = range(2, max(2, cores()) + 1)
    reads = interleaved(
        [
            lambda: whole_read(args.trace),
            *(lambda count=count: worker_read(args.trace, count) for count in counts),
        ],
        args.repeat,
    )
    rows = [
        line("gunzip / read the text", timed(text, args.repeat), size, decode),
        line("msgspec decode", decode, size, decode),
        line("field spans: encode + numpy split", split, size, decode),
        line("  baseline: spans value by value (_addressed)", addressed, size, decode),
        line("  baseline: a b''.join + len per field", join, size, decode),
        line("args fields (decode + split)", args_seconds, size, decode),
        line(
            "columns (events_table)",
            timed(lambda: events_table(prepared), args.repeat),
            size,
            decode,
        ),
        line("reader end to end, 1 process (two threads)", reads[0], size, decode),
        *(
            line(f"reader end to end, {count} worker processes", seconds, size, decode)
            for count, seconds in zip(counts, reads[1:], strict=True)
        ),
    ]
    print(
        f"trace {args.trace.name}: {size / 1e6:.1f} MB of JSON, {len(structs):,} events; "
        f"{cores()} cores, load average {load:.2f} at the start"
    )
    print(f"{'stage':<46} {'median':>11} [min-max] {'MB/s':>13} {'x msgspec':>9}")
    for row in rows:
        print(row)
    for count, seconds in zip(counts, reads[1:], strict=True):
        speedups = [one / many for one, many in zip(reads[0], seconds, strict=True)]
        print(
            f"ratio: {count} worker processes vs 1 process = {statistics.median(speedups):.2f}x "
            f"[{min(speedups):.2f}-{max(speedups):.2f}] (run by run)"
        )
    fastest = statistics.median(split)
    print(
        f"ratio: field spans by the split vs value by value = "
        f"{statistics.median(addressed) / fastest:.1f}x, vs b''.join per field = "
        f"{statistics.median(join) / fastest:.1f}x (medians)"
    )


if __name__ == "__main__":
    main()
