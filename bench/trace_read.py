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
  an ingest.

Each is the median of ``--repeat`` runs with its min-max; ratios are of medians.

    .venv/bin/python bench/trace_read.py [--repeat 7] [--trace PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fuse import FIXTURE

from multicore_profiler.ingest import trace_reader
from multicore_profiler.ingest.outer_trace import events_table


def timed(work: Callable[[], Any], repeat: int) -> list[float]:
    """Wall seconds of each of ``repeat`` runs of ``work``."""
    seconds = []
    for _ in range(repeat):
        began = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - began)
    return seconds


def line(name: str, seconds: list[float], size: int) -> str:
    median = statistics.median(seconds)
    return (
        f"{name:<46} {median * 1e3:8.1f} ms [{min(seconds) * 1e3:.1f}-{max(seconds) * 1e3:.1f}]"
        f" {size / 1e6 / median:8.1f} MB/s"
    )


def whole_read(path: Path) -> int:
    """Every block of ``path`` read and turned into columns; the event count."""
    with trace_reader.read_trace(path) as trace:
        return sum(events_table(block).num_rows for block in trace.blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--trace", type=Path, default=FIXTURE)
    args = parser.parse_args()

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
    rows = [
        line("gunzip / read the text", timed(text, args.repeat), size),
        line("msgspec decode", timed(lambda: trace_reader._decoded(guess), args.repeat), size),
        line("field spans: encode + numpy split", split, size),
        line("  baseline: spans value by value (_addressed)", addressed, size),
        line("  baseline: a b''.join + len per field", join, size),
        line("args fields (decode + split)", args_seconds, size),
        line("columns (events_table)", timed(lambda: events_table(prepared), args.repeat), size),
        line(
            "reader end to end (chunked, threaded)",
            timed(lambda: whole_read(args.trace), args.repeat),
            size,
        ),
    ]
    print(f"trace {args.trace.name}: {size / 1e6:.1f} MB of JSON, {len(structs):,} events")
    print(f"{'stage':<46} {'median':>11} [min-max] {'MB/s':>13}")
    for row in rows:
        print(row)
    fastest = statistics.median(split)
    print(
        f"ratio: field spans by the split vs value by value = "
        f"{statistics.median(addressed) / fastest:.1f}x, vs b''.join per field = "
        f"{statistics.median(join) / fastest:.1f}x (medians)"
    )


if __name__ == "__main__":
    main()
