"""The ``trace_events`` columns of a block of an outer trace's events, exact or refused.

Times become integer ns (``ts``, ``dur``: microseconds with three decimals), integer
fields int64; a value that cannot be held exactly is refused naming its event, field and
byte. Imports no store, so that the trace reader's worker processes stay light.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.ingest.trace_reader import EventBlock
from multicore_profiler.limits import INT64

_NS_DECIMALS = 3
"""Trace Event Format times are microseconds: three decimals make integer ns."""


@dataclass
class TimeStats:
    """What the ``trace_sources`` row says of a trace's times: the first ``ts`` and the last
    end (``ts + dur``), in ns, and how many times were rounded to ns."""

    first_ts: int | None = None
    last_ts: int | None = None
    rounded: int = 0

    def add(self, other: TimeStats) -> None:
        """Take in the stats of more events."""
        if other.first_ts is not None and other.last_ts is not None:
            self.span(other.first_ts, other.last_ts)
        self.rounded += other.rounded

    def span(self, low: int, high: int) -> None:
        """Widen the times to ``[low, high]``."""
        self.first_ts = low if self.first_ts is None else min(self.first_ts, low)
        self.last_ts = high if self.last_ts is None else max(self.last_ts, high)


_INT64 = INT64.bounds()


def _integers(block: EventBlock, key: str) -> pa.Array:
    """An integer field: the value where the text holds an integer number; null where it
    is absent, a string (a ``pid`` or ``tid`` name) or not a number (``true``, an object).
    A number that is not an integer, or does not fit int64, is refused."""
    numbers = block.numbers(key, strings=False)
    written = (block.span(key)[0] >= 0) & ~numbers.quoted
    wrong = written & (numbers.overflow | (numbers.number & numbers.rounded))
    if wrong.any():
        row = int(np.argmax(wrong))
        problem = "is out of range" if numbers.overflow[row] else "is not an integer"
        raise block.value_error(key, row, f"{problem}: it must be an integer in {_INT64}")
    return pa.array(numbers.value, pa.int64(), mask=~(written & numbers.number))


def _times(block: EventBlock, key: str, stats: TimeStats) -> pa.Array:
    """A time field in integer ns; a value that is not a number, or whose ns do not fit
    int64, is refused."""
    start, _ = block.span(key)
    numbers = block.numbers(key, _NS_DECIMALS)
    bad = (start >= 0) & ~numbers.number
    if bad.any():
        row = int(np.argmax(bad))
        if numbers.overflow[row]:
            problem = f"is out of range: {key} in ns must fit int64 {_INT64}"
        else:
            problem = "is not a number"
        raise block.value_error(key, row, problem)
    stats.rounded += int(numbers.rounded.sum())
    return pa.array(numbers.value, pa.int64(), mask=start < 0)


def _check_ends(block: EventBlock, ts: np.ndarray, dur: np.ndarray, has: np.ndarray) -> None:
    """Refuse an event whose end (``ts + dur`` in ns) does not fit int64: the views add them."""
    ends = ts + dur  # int64 arithmetic wraps round: an overflow flips the sign of the step
    wrapped = has & (((dur > 0) & (ends < ts)) | ((dur < 0) & (ends > ts)))
    if wrapped.any():
        row = int(np.argmax(wrapped))
        raise block.value_error(
            "dur", row, f"ends past int64 ns: ts + dur must fit int64 {_INT64} in ns"
        )


def events_table(block: EventBlock, stats: TimeStats | None = None) -> pa.Table:
    """The ``trace_events`` columns (but ``write_id``) of one block of events (its messages
    name the block's file, ``block.path``)."""
    stats = stats if stats is not None else TimeStats()
    count = len(block)
    ts = _times(block, "ts", stats)
    dur = _times(block, "dur", stats)
    if ts.null_count < count:
        ts_values = ts.fill_null(0).to_numpy()
        has_ts = ~np.asarray(ts.is_null())
        dur_values = dur.fill_null(0).to_numpy()
        _check_ends(block, ts_values, dur_values, has_ts)
        ends = ts_values + dur_values
        low, high = int(ts_values[has_ts].min()), int(ends[has_ts].max())
        stats.span(low, high)
    columns: dict[str, pa.Array] = {
        "event_index": pa.array(np.arange(block.first_index, block.first_index + count)),
        "ph": block.strings("ph"),
        "cat": block.strings("cat"),
        "name": block.strings("name"),
    }
    for key in ("pid", "tid"):
        columns[key] = _integers(block, key)
        is_string = block.quoted(key)
        names = block.strings(key) if is_string.any() else pa.nulls(count, pa.string())
        columns[f"{key}_name"] = pc.if_else(pa.array(is_string), names, None)
    columns["ts_ns"] = ts
    columns["dur_ns"] = dur
    columns["flow_id"] = block.strings("id")
    for column, key in (("correlation", "correlation"), ("external_id", "External id")):
        columns[column] = _integers(block, key)
    for column, keys in (("stream", ("stream", "Stream Id")), ("device", ("device",))):
        values = None
        for key in keys:
            found = _integers(block, key)
            values = found if values is None else pc.coalesce(values, found)
        columns[column] = values
    columns["task_type"] = block.strings("Task Type")
    columns["args"] = block.strings("args", raw=True)
    return pa.table(columns)
