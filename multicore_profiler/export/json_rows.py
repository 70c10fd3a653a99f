"""JSON text for many rows at once, built with numpy: one object per row, no Python per row.

A ``Row`` is a template over whole columns: literals, integers, fixed-point
decimals, and fragments looked up by code in a small table (JSON strings from
``strings``, or rows rendered by another ``Row``). Each part has one width for
all rows, taken from its widest value and rounded up to whole 4-byte words, so a
row of text is a row of a matrix of words and every part is written a word
column at a time. Numbers are right-aligned and strings left-aligned, padded with
spaces outside every string, which JSON reads as whitespace. Rendering goes chunk
by chunk, small enough to stay in cache; numpy releases the GIL, so chunks render
on several threads.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import orjson

_WORD = 4
_GROUP = 10_000
_BLANK = np.frombuffer(b"    ", "<u4")[0]
_DIGITS = np.array(
    [f"{i:04d}".encode() for i in range(_GROUP)] + [f"{i:4d}".encode() for i in range(_GROUP)]
).view("<u4")
"""Four ASCII digits of each number below 10000 as one word; from index 10000 on, the same
with leading zeros blank (the most significant group of a number)."""
_MILLIS = np.array(
    [("." + f"{i:03d}".rstrip("0")).ljust(2, "0").ljust(4).encode() for i in range(1000)]
).view("<u4")
"""A point and three decimals of each fraction of 1000, trailing zeros blank, one kept."""

T = TypeVar("T")

CHUNK_ROWS = 8192
"""Rows rendered at once: a few MB of text, which stays in cache while it is assembled."""


def _words(width: int) -> int:
    return -(-width // _WORD)


Span = tuple[int, int]
"""The smallest and largest value a column can take: what fixes a part's width."""


def span_of(values: np.ndarray) -> Span:
    """The span of ``values`` (``(0, 0)`` when there are none)."""
    if values.size == 0:
        return 0, 0
    return int(values.min()), int(values.max())


def joined(spans: Sequence[Span]) -> Span:
    """The span covering every span of ``spans`` (of the chunks of one column)."""
    return min(lo for lo, _ in spans), max(hi for _, hi in spans)


def _digits(span: Span) -> int:
    """Characters of the widest integer in ``span`` (minus sign included; at least 1)."""
    return max(len(str(span[0])), len(str(span[1])))


def _within(values: np.ndarray, span: Span | None) -> Span:
    """``span``, else the span of ``values``; a value outside a given span is refused (it
    would not fit the width the other chunks of its column are rendered at)."""
    if span is None:
        return span_of(values)
    if values.size and (int(values.min()) < span[0] or int(values.max()) > span[1]):
        raise ValueError(f"values outside their span {span}: {span_of(values)}")
    return span


def _render_integers(values: np.ndarray, out: np.ndarray) -> None:
    """Write integers right-aligned into the word columns ``out`` (rows, words)."""
    words = out.shape[1]
    negative = values < 0 if values.dtype.kind == "i" else None
    if negative is not None and negative.any():
        magnitude = np.abs(values.astype(np.int64)).astype(np.uint64)
    else:
        negative = None
        magnitude = values.astype(np.uint32 if words <= 2 else np.uint64, copy=False)
    group = magnitude.dtype.type(_GROUP)
    parts = []
    rest = magnitude
    for _ in range(words - 1):
        higher = rest // group
        parts.append(rest - higher * group)
        rest = higher
    parts.append(rest)
    leading = np.ones(len(magnitude), dtype=bool)
    for column, part in enumerate(reversed(parts)):
        index = part.astype(np.intp)
        index[leading] += _GROUP
        out[:, column] = _DIGITS[index]
        leading &= part == 0
    if words > 1:
        # A zero group below zero groups is blank: "   0" only stands last.
        head = out[:, :-1]
        head[head == _DIGITS[_GROUP]] = _BLANK
    if negative is not None:
        _place_minus(out, np.flatnonzero(negative))


def _place_minus(out: np.ndarray, rows: np.ndarray) -> None:
    """Put a minus sign before the first digit of the right-aligned numbers in ``rows``."""
    text = out[rows].view(np.uint8)
    first = (text != ord(" ")).argmax(axis=1)
    text[np.arange(len(rows)), first - 1] = ord("-")
    out[rows] = text.view("<u4")


def strings(values: Sequence[str]) -> np.ndarray:
    """A table of JSON strings, one row each, padded with spaces after the closing quote;
    for ``Row.lookup``."""
    return texts([orjson.dumps(value) for value in values])


def texts(encoded: Sequence[bytes]) -> np.ndarray:
    """A table of JSON texts given encoded (a number, a string with its quotes), one row
    each, padded with spaces after it; for ``Row.lookup``."""
    table = np.full((len(encoded), max(map(len, encoded), default=0)), ord(" "), np.uint8)
    for row, text in enumerate(encoded):
        table[row, : len(text)] = np.frombuffer(text, np.uint8)
    return table


@dataclass(frozen=True)
class _Part:
    """A part of a row: ``head`` words of constant text (a key), then the value's words.

    ``spill`` bytes of the key that do not fill a whole word start the value's first word,
    where the right-aligned value leaves room for them.
    """

    kind: str
    words: int
    head: np.ndarray
    spill: bytes = b""
    data: np.ndarray | None = None
    codes: np.ndarray | None = None


def _keyed(kind: str, key: str, value_chars: int, value_words: int, **fields: Any) -> _Part:
    """A part of ``key`` then a right-aligned value of ``value_chars`` characters that takes
    ``value_words`` words: the key's last bytes share the value's first word when they fit."""
    key_bytes = key.encode()
    words = max(_words(len(key_bytes) + value_chars), value_words)
    head_words = words - value_words
    spill = key_bytes[head_words * _WORD :]
    head = np.frombuffer(key_bytes[: head_words * _WORD].ljust(head_words * _WORD), "<u4")
    return _Part(kind, words, head, spill, **fields)


class Row:
    """A template of one JSON text per row over whole columns; see the module docstring."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._parts: list[_Part] = []
        self._optional: list[tuple[int, int, np.ndarray]] = []

    def __len__(self) -> int:
        return self._count

    @property
    def width(self) -> int:
        """Bytes per row."""
        return _WORD * sum(part.words for part in self._parts)

    def _column(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        if values.shape != (self._count,):
            raise ValueError(f"a column of {self._count} rows expected, got shape {values.shape}")
        return values

    def text(self, literal: str) -> Row:
        """The same text in every row; it must end where JSON allows whitespace."""
        self._parts.append(_keyed("text", literal, 0, 0))
        return self

    def integers(self, key: str, values: np.ndarray, span: Span | None = None) -> Row:
        """``key`` (e.g. ``',"task_id":'``), then integers of any numpy integer type, as wide
        as the widest of ``span`` (default: of ``values``): chunks of one column rendered with
        its whole span line up."""
        values = self._column(values)
        if values.dtype.kind not in "iu":
            raise TypeError(f"integers expected, got {values.dtype}")
        chars = _digits(_within(values, span))
        self._parts.append(_keyed("int", key, chars, _words(chars), data=values))
        return self

    def millis(self, key: str, units: np.ndarray, span: Span | None = None) -> Row:
        """``key``, then fixed-point numbers of three decimals from integer thousandths
        (``1500`` is ``1.5``): at least one decimal, trailing zeros written as spaces; as wide
        as the widest of ``span`` (default: of ``units``)."""
        units = self._column(units).astype(np.int64, copy=False)
        lo, hi = _within(units, span)
        chars = len(str(max(abs(lo), abs(hi)) // 1000)) + (1 if lo < 0 else 0)
        self._parts.append(_keyed("millis", key, chars + 4, _words(chars) + 1, data=units))
        return self

    def lookup(self, key: str, table: np.ndarray, codes: np.ndarray) -> Row:
        """``key``, then row ``codes[i]`` of a byte table (from ``strings`` or ``render``)."""
        if table.ndim != 2:
            raise ValueError(f"a 2-D byte table expected, got shape {table.shape}")
        codes = self._column(codes).astype(np.intp, copy=False)
        key_bytes = np.frombuffer(key.encode(), np.uint8)
        width = _WORD * _words(len(key_bytes) + table.shape[1])
        joined = np.full((len(table), width), ord(" "), np.uint8)
        joined[:, : len(key_bytes)] = key_bytes
        joined[:, len(key_bytes) : len(key_bytes) + table.shape[1]] = table
        self._parts.append(
            _Part(
                "lookup", width // _WORD, np.empty(0, "<u4"), data=joined.view("<u4"), codes=codes
            )
        )
        return self

    def optional(self, present: np.ndarray, build: Row) -> Row:
        """The parts of ``build`` (a ``Row`` of as many rows) where ``present``, spaces
        elsewhere: a key left out of the rows that have no value for it."""
        if len(build) != self._count:
            raise ValueError(f"an optional part of {self._count} rows expected, got {len(build)}")
        first = len(self._parts)
        self._parts.extend(build._parts)
        self._optional.append((first, len(self._parts), self._column(present).astype(bool)))
        return self

    def render(self, start: int = 0, stop: int | None = None, out: np.ndarray | None = None):
        """Rows ``start:stop`` as a (rows, width) byte matrix: into ``out`` (a C-contiguous
        byte matrix of that shape, at a 4-byte aligned address) if given, else a new one."""
        stop = self._count if stop is None else min(stop, self._count)
        shape = (max(stop - start, 0), self.width)
        if out is None:
            out = np.empty(shape, dtype=np.uint8)
        elif out.shape != shape:
            raise ValueError(f"out must have shape {shape}, got {out.shape}")
        words = out.view("<u4")
        edges = np.cumsum([0] + [part.words for part in self._parts])
        for part, left, right in zip(self._parts, edges[:-1], edges[1:], strict=False):
            head = len(part.head)
            if head:
                words[:, left : left + head] = part.head
            value = words[:, left + head : right]
            if part.kind == "int":
                _render_integers(part.data[start:stop], value)
            elif part.kind == "millis":
                _render_millis(part.data[start:stop], value)
            elif part.kind == "lookup":
                value[...] = part.data[part.codes[start:stop]]
            if part.spill:
                _spill(value[:, 0], part.spill)
        for first, last, present in self._optional:
            absent = ~present[start:stop]
            if absent.any():
                words[absent, edges[first] : edges[last]] = _BLANK
        return out

    def _rendered(self, task: Callable[[int], T], threads: int | None) -> Iterator[T]:
        """``task(start)`` for each chunk's first row, in row order, on ``threads`` threads
        (default: one per CPU) with a bounded number of chunks in flight."""
        starts = range(0, self._count, CHUNK_ROWS)
        workers = max(1, threads or os.cpu_count() or 1)
        if workers == 1 or len(starts) <= 1:
            yield from map(task, starts)
            return
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending: deque[Future[T]] = deque()
            for start in starts:
                pending.append(pool.submit(task, start))
                if len(pending) > 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()

    def chunks(self, threads: int | None = None) -> Iterator[np.ndarray]:
        """The text, chunk after chunk, as (rows, width) byte matrices."""
        return self._rendered(lambda start: self.render(start, start + CHUNK_ROWS), threads)

    def write_at(self, fd: int, offset: int, threads: int | None = None) -> Iterator[int]:
        """Write every row to the file ``fd`` from byte ``offset`` on, each chunk by the
        thread that rendered it, one thread writing at a time; yield the rows of each chunk
        once written. The file system takes one write to a file at a time anyway (ext4's
        inode lock), and a thread that waits there spins on a core the others render on:
        about a twentieth of an export's CPU on 2 cores. A thread waiting here sleeps."""
        writing = threading.Lock()

        def task(start: int) -> int:
            text = self.render(start, start + CHUNK_ROWS)
            view, at = memoryview(text).cast("B"), offset + start * self.width
            with writing:
                while view:
                    written = os.pwrite(fd, view, at)
                    view, at = view[written:], at + written
            return len(text)

        return self._rendered(task, threads)


def _spill(first: np.ndarray, key_tail: bytes) -> None:
    """Put the last bytes of a key at the start of a value's first word (blank there)."""
    shift = 8 * len(key_tail)
    bits = np.frombuffer(key_tail.ljust(_WORD, b"\0"), "<u4")[0]
    first &= np.uint32((0xFFFFFFFF >> shift) << shift)
    first |= bits


def _render_millis(units: np.ndarray, out: np.ndarray) -> None:
    """Write thousandths into ``out``: the whole part right-aligned, then a point and
    three decimals in the last word."""
    magnitude = np.abs(units)
    whole = magnitude // 1000
    out[:, -1] = _MILLIS[(magnitude - whole * 1000).astype(np.intp)]
    negative = units < 0
    if negative.any():
        head = out[:, :-1]
        _render_integers(whole, head)
        _place_minus(head, np.flatnonzero(negative))
    else:
        _render_integers(whole, out[:, :-1])
