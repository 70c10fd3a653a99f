"""A Chrome trace's JSON read in chunks by msgspec, a compiled parser that validates it.

A trace can be gigabytes, so it is never held whole, nor as an object per event for
long: its events array is read a chunk at a time (``CHUNK_BYTES``), cut after the last
``}`` that a comma follows. That cut is a guess msgspec checks: the chunk decodes as a
JSON array only if the cut is between two events (a cut inside a string or an object
leaves it unterminated). A guess that fails at the end of the chunk is checked against
the text's exact structure (``_Structure``: strings and nesting, found with numpy), which
cuts after the chunk's last whole event, else reads as much text again, up to
``EVENT_BYTES_MAX`` for one event; a failure before it is the text's own error, or the
events array's end. Whitespace between events is skipped as it is read, never held.

``read_guessed`` leaves the decoding of each guess to other processes (``trace_workers``):
its cut also needs an object's first key after the comma (``},{"``, which in a string takes
one ending in ``}, {``), and where a guess fails this reader reads that chunk itself, as
above, so its refusals are ``read_trace``'s.

msgspec decodes each event into a struct whose fields (``EVENT_KEYS``) are ``Raw``: the
value's JSON text, a view of the chunk. Encoding those structs again writes every event
in one known layout (``{"ph":...,"cat":...}``, an absent field empty), where each field's
values are found with numpy in a few vectorized steps (``_split``); their text is then
read, exactly, a column at a time by ``json_values``. A ``Raw``'s address in the chunk
gives a value's byte in the file for messages, and the ``ts`` spans that fusion rewrites.
Escapes msgspec refuses (a lone UTF-16 surrogate, an unknown escape) are made decodable in
a copy of the same length, whose values are read back from the original text.

The document around the events is kept as text (``FIELDS_BYTES_MAX`` each): the
``prologue`` up to and including the array's ``[`` and the ``epilogue`` from its ``]``
on; its top-level fields are read by ``json``, which keeps integers past 64 bits and
lone surrogates exactly. The top-level ``traceEvents`` key is found by the same
structure, each byte looked at once; a second one is refused (JSON readers keep the
last, so which events the trace holds would depend on who reads it).
"""

from __future__ import annotations

import gc
import gzip
import json
import os
import re
import zlib
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence, Sized
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from operator import attrgetter
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

import msgspec
import numpy as np
import pyarrow as pa

from multicore_profiler.errors import TraceFormatError
from multicore_profiler.ingest import json_values
from multicore_profiler.ingest.json_values import BadString, check_utf8, padded, where
from multicore_profiler.prefetch import ahead
from multicore_profiler.storage.location import special_file

CHUNK_BYTES = 4 << 20
"""Text decoded at once: its events' structs take a few times its size, whatever the
file's size. Reading the A100 fixture (26 MB) took 265 ms in 1 MiB chunks, 299 ms in 4 MiB
and 367 ms in 8 MiB (the columns of a smaller chunk stay in the CPU's caches); a 1 GB
trace 11.1 s in 1 MiB, 9.1 s in 2 MiB, 8.7 s in 4 MiB and 8.8 s in 8 MiB."""

EVENT_BYTES_MAX = 64 << 20
"""The most JSON text one event may hold, from its ``{`` to its ``}`` (more than
``CHUNK_BYTES``): an event is held whole while it is read, and decoded a few times, so a
longer one (a 2 GiB string in a crafted or corrupt trace) is refused, naming its byte,
rather than read into memory. Real events hold kilobytes."""

FIELDS_BYTES_MAX = 64 << 20
"""The most text before the events array (up to its ``[``), and again after it (from its
``]``), whitespace included: the top-level fields are held whole and read by ``json``."""

EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")
ARGS_KEYS = ("correlation", "External id", "stream", "device", "Task Type", "Stream Id")
"""Fields of ``args`` the store keeps in columns of their own (torch_npu names its
stream ``Stream Id`` and its device tasks' kind ``Task Type``)."""

_ABSENT = msgspec.Raw()
"""An absent field's value: empty, which no decoded value is."""


@cache
def _raw_struct(keys: tuple[str, ...]) -> type:
    """A struct of one ``Raw`` field per key, in that order, named ``k0``, ``k1``... (keys
    need not be identifiers); not tracked by the garbage collector, which would otherwise
    walk every event of a chunk."""
    fields = [
        (f"k{number}", msgspec.Raw, msgspec.field(default=_ABSENT, name=key))
        for number, key in enumerate(keys)
    ]
    return msgspec.defstruct("Values", fields, gc=False)


@cache
def _decoder(keys: tuple[str, ...]) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(list[_raw_struct(keys)])


_ENCODER = msgspec.json.Encoder()
_DECODE_ERRORS = (msgspec.DecodeError, RecursionError)
_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,")
_GUESS = re.compile(rb'\}[ \t\r\n]*,(?=[ \t\r\n]*\{[ \t\r\n]*")')
"""Where ``guess`` cuts: after a ``}`` that a comma and an object's first key follow,
which in a string takes one ending in ``}, {`` (C++ names hold ``{lambda()#1}, ``)."""
_CLOSE = re.compile(rb"\}[ \t\r\n]*\]")
_EVENTS_NAME = re.compile(rb'"traceEvents"')
_WHITE = b" \t\r\n"
_SPACES = re.compile(rb"[ \t\r\n]*")
_BYTE = re.compile(r" \(byte (\d+)\)$")
_ELEMENT = re.compile(r" - at `\$\[(\d+)\]`")
"""Where msgspec says an element is: in the chunk, which the message turns into the event's
index in the trace."""
_ESCAPE = re.compile(
    rb'\\(?:(u[dD][89a-fA-F][0-9a-fA-F]{2})|(u(?![0-9a-fA-F]{4})|[^"\\/bfnrtu])|[\s\S])'
)


def _fixed_escape(match: re.Match[bytes]) -> bytes:
    if match[1]:
        return b"\\u0020"
    if match[2]:
        return b"\\\\"
    return match[0]


def _decodable(text: bytes) -> bytes:
    """``text`` with each escape msgspec refuses (a UTF-16 surrogate, an unknown one)
    replaced by a valid escape of the same length."""
    return _ESCAPE.sub(_fixed_escape, text)


def _address(buffer: Any) -> int:
    return pa.py_buffer(buffer).address


_NESTING = np.zeros(256, np.int8)
_NESTING[[ord("{"), ord("[")]] = 1
_NESTING[[ord("}"), ord("]")]] = -1
_SCAN_BYTES = 1 << 20
"""Text ``_Structure`` looks at in one step: its arrays stay a few times this size."""


@dataclass
class _Structure:
    """Where a JSON text's strings and nesting are, found with numpy a window at a time
    (``_SCAN_BYTES``), each window from the state the one before left: the depth, whether
    a string is open and whether the next byte is escaped. The reader's guesses at ``},``
    are fast but blind to strings; this is exact, and used where a guess failed and in
    the text around the events array."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    position: int = 0
    """Bytes scanned so far."""
    closed_at: int | None = None
    """Where the depth first fell below 0 (the events array's ``]``, for text that starts
    in it), if it did."""

    def step(self, piece: np.ndarray, marks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether each of ``marks`` (sorted positions in ``piece``) is inside a string,
        and the depth before it; the state moves on to the piece's end."""
        carried = self.escaped
        """Whether the piece's first byte is escaped."""
        quotes = np.flatnonzero(piece == ord('"'))
        slashes = np.flatnonzero(piece == ord("\\"))
        if slashes.size:
            runs = slashes[np.append(True, np.diff(slashes) != 1)]
            """The first backslash of each run of them."""
            if quotes.size:
                before = quotes - 1
                found = np.minimum(np.searchsorted(slashes, before), slashes.size - 1)
                run = runs[np.maximum(np.searchsorted(runs, before, side="right") - 1, 0)]
                length = before - run + 1 - (carried & (run == 0))
                quotes = quotes[~((slashes[found] == before) & (length % 2 == 1))]
            last = int(runs[-1])
            length = piece.size - last - (carried and last == 0)
            self.escaped = int(slashes[-1]) == piece.size - 1 and length % 2 == 1
        else:
            self.escaped = carried and piece.size == 0
        if carried and quotes.size and quotes[0] == 0:
            quotes = quotes[1:]
        nesting = np.flatnonzero(_NESTING[piece])
        outside = (np.searchsorted(quotes, nesting) % 2 == 1) == self.in_string
        nesting = nesting[outside]
        steps = np.cumsum(_NESTING[piece[nesting]], dtype=np.int64)
        if self.closed_at is None:
            below = np.flatnonzero(self.depth + steps < 0)
            if below.size:
                self.closed_at = self.position + int(nesting[below[0]])
        inside = (np.searchsorted(quotes, marks) % 2 == 1) != self.in_string
        level = np.searchsorted(nesting, marks)
        depth = self.depth + np.append(0, steps)[level]
        self.depth += int(steps[-1]) if steps.size else 0
        self.in_string ^= quotes.size % 2 == 1
        self.position += piece.size
        return inside, depth

    def scan(
        self, text: bytes | bytearray, begin: int, end: int, marks: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``step`` over ``text[begin:end]`` (which follows what was scanned before) a
        window at a time; ``marks`` are sorted positions in it."""
        inside, depth = [np.zeros(0, bool)], [np.zeros(0, np.int64)]
        for start in range(begin, end, _SCAN_BYTES):
            stop = min(start + _SCAN_BYTES, end)
            piece = np.frombuffer(text, np.uint8, stop - start, start)
            chosen = marks[np.searchsorted(marks, start) : np.searchsorted(marks, stop)]
            within, level = self.step(piece, chosen - start)
            inside.append(within)
            depth.append(level)
        return np.concatenate(inside), np.concatenate(depth)


def _events_structure(text: bytes) -> tuple[int, bool, int | None]:
    """For ``text`` that starts between two events of the events array: its last comma
    between two events (-1: none), whether it ends between two events (after a whole
    one, whitespace aside) and where the array's ``]`` is, if there."""
    structure = _Structure()
    last = -1
    for start in range(0, len(text), _SCAN_BYTES):
        piece = np.frombuffer(text, np.uint8, min(_SCAN_BYTES, len(text) - start), start)
        commas = np.flatnonzero(piece == ord(","))
        inside, depth = structure.step(piece, commas)
        separators = commas[~inside & (depth == 0)] + start
        if structure.closed_at is not None:
            separators = separators[separators < structure.closed_at]
        if separators.size:
            last = int(separators[-1])
        if structure.closed_at is not None:
            return last, False, structure.closed_at
    between = structure.depth == 0 and not structure.in_string
    return last, between and bool(text[last + 1 :].strip(_WHITE)), None


@dataclass
class _Values:
    """Value spans ``[start, stop)`` in ``text`` of some fields of each event (-1: absent)."""

    text: np.ndarray
    start: dict[str, np.ndarray]
    stop: dict[str, np.ndarray]

    @cached_property
    def escapes(self) -> np.ndarray:
        """Positions of backslashes in ``text``."""
        return np.flatnonzero(self.text == ord("\\"))


def _absent_as(start: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The spans with empty ones (absent values) as -1, in place."""
    absent = start == stop
    start[absent] = -1
    stop[absent] = -1
    return start, stop


def _written_at(text: np.ndarray, positions: np.ndarray, marker: bytes) -> np.ndarray:
    """The positions of ``text`` (padded) where ``marker`` is written: a byte at a time,
    each on the positions left (a few gathers of shrinking size)."""
    for shift, byte in enumerate(marker):
        positions = positions[text[positions + shift] == byte]
    return positions


_OPENING = np.zeros(256, bool)
_OPENING[[ord("{"), ord("[")]] = True
_CLOSING = np.zeros(256, bool)
_CLOSING[[ord(","), ord("}")]] = True


def _split(text: np.ndarray, size: int, count: int, keys: tuple[str, ...]) -> _Values | None:
    """The value spans of msgspec's encoding (``text[:size]``, padded) of ``count`` structs
    of ``_raw_struct(keys)``: ``[{"k0":V,"k1":V,...},...]``.

    In a scalar value ``,"`` can only be a string's last comma and its closing quote (a
    quote inside is escaped), which a comma or a brace follows, never a key's letter; nor
    can a key's marker ``,"key":`` hold one but at its start. So where every value but the
    last key's is a scalar, as in real traces, the i-th ``,"`` that a letter follows after
    an element's ``{"k0":`` starts key i's marker. ``None`` where a value is an object or
    an array, or where ``{"k0":`` is not found exactly ``count`` times (the last key's
    value may hold one)."""
    if count == 0:
        empty = {key: np.zeros(0, np.int64) for key in keys}
        return _Values(text, empty, dict(empty))
    body = text[:size]
    first = b'{"' + keys[0].encode() + b'":'
    opens = _written_at(text, np.flatnonzero(body == ord("{")), first)
    if opens.size != count:
        return None
    commas = np.flatnonzero(body == ord(","))
    # A string's content may end in a comma: its closing quote is then followed by the
    # next marker's comma or the element's brace, where a key's first letter follows a
    # marker's quote.
    commas = commas[text[commas + 1] == ord('"')]
    commas = commas[~_CLOSING[text[commas + 2]]]
    after = np.searchsorted(commas, opens)
    ends = np.append(opens[1:] - 2, size - 2)
    """Each element's closing brace."""
    framed = (text[ends] == ord("}")).all() and (text[opens[1:] - 1] == ord(",")).all()
    if opens[0] != 1 or not framed or int(after[-1]) + len(keys) - 1 > commas.size:
        return None
    start = np.empty((len(keys), count), np.int64)
    stop = np.empty((len(keys), count), np.int64)
    start[0] = opens + len(first)
    for number in range(1, len(keys)):
        at = commas[after + number - 1]
        stop[number - 1] = at
        start[number] = at + len(keys[number].encode()) + 4
    stop[-1] = ends
    # An empty (absent) value's first byte is the next marker's comma.
    nested = _OPENING[text[start[:-1]]].any()
    if nested or not ((start[-1] <= ends).all() and (text[start[1:] - 1] == ord(":")).all()):
        return None
    _absent_as(start, stop)
    return _Values(text, dict(zip(keys, start, strict=True)), dict(zip(keys, stop, strict=True)))


def _encoded(structs: list[Any], keys: tuple[str, ...], text_bytes: int) -> _Values | None:
    """The structs' value spans in their msgspec encoding, or ``None`` (see ``_split``).
    The buffer is sized from the decoded text's ``text_bytes`` (and the keys an absent
    value still writes), so that neither the encoding nor its padding copies it."""
    buffer = bytearray(text_bytes + len(structs) * (sum(map(len, keys)) + 4 * len(keys)))
    _ENCODER.encode_into(structs, buffer)
    size = len(buffer)
    buffer.extend(bytes(json_values.PADDING))
    return _split(np.frombuffer(buffer, np.uint8), size, len(structs), keys)


def _raws(structs: Sequence[Any], number: int) -> list[msgspec.Raw]:
    return list(map(attrgetter(f"k{number}"), structs))


def _spans_of(raws: list[msgspec.Raw], base: int) -> tuple[np.ndarray, np.ndarray]:
    """The spans of ``raws`` from their addresses, ``base`` being that of the text's first
    byte in the buffer they view (the general path: a Python step per value)."""
    begin = np.fromiter(map(_address, raws), np.int64, len(raws)) - base
    length = np.fromiter(map(len, raws), np.int64, len(raws))
    return _absent_as(begin, begin + length)


def _addressed(
    text: np.ndarray, structs: Sequence[Any], keys: tuple[str, ...], base: int
) -> _Values:
    """Every key's value spans in ``text`` from the structs' ``Raw`` addresses."""
    starts, stops = {}, {}
    for number, key in enumerate(keys):
        starts[key], stops[key] = _spans_of(_raws(structs, number), base)
    return _Values(text, starts, stops)


_SHOWN = 48
"""Bytes of a bad value that a message shows."""


def field_name(key: str) -> str:
    """How messages name a field: ``ts``, or ``args.correlation`` for a field of ``args``."""
    return key if key in EVENT_KEYS else f"args.{key}"


@dataclass
class _ArgsFields:
    """The fields of a block's ``args`` objects: their spans, the rows holding an object,
    those objects' structs, where each object starts in the decoded text of them all, and
    that text's address."""

    values: _Values
    rows: np.ndarray
    structs: list[Any]
    piece_starts: np.ndarray
    address: int


class EventBlock:
    """Complete events of one chunk: their text, and where each event's fields are."""

    def __init__(
        self,
        path: Path,
        first_index: int,
        offset: int,
        text: bytes,
        decoded: tuple[list[Any], bytes, bool],
        args_keys: tuple[str, ...],
    ) -> None:
        self.path = path
        """The trace file, for messages."""
        self.first_index = first_index
        """Index of the block's first event in the whole trace."""
        self.offset = offset
        """Offset of ``text`` in the whole JSON text."""
        self._text = text
        self._events, buffer, self._exact = decoded
        self._base = _address(buffer) + 1
        """Address of ``text``'s first byte in the decoded buffer (after its ``[``)."""
        self._args_keys = args_keys

    def __len__(self) -> int:
        return len(self._events)

    @cached_property
    def text(self) -> np.ndarray:
        """The events' JSON text as written, from the end of the text before (the array's
        ``[`` or the comma the chunk before was cut at, or whitespace after them that was
        skipped) to the last event's ``}``."""
        return padded(self._text)

    def prepare(self) -> None:
        """Find every field's values now (on the reading thread), not when first asked."""
        _ = self._args if self._args_keys else self._fields

    @cached_property
    def _fields(self) -> _Values:
        if self._exact:
            encoded = _encoded(self._events, EVENT_KEYS, len(self._text))
            if encoded is not None:
                return encoded
        return _addressed(self.text, self._events, EVENT_KEYS, self._base)

    @cached_property
    def _args(self) -> _ArgsFields:
        """The fields of the ``args`` objects, decoded from the text of them all."""
        values = self._fields
        start = values.start["args"]
        rows = np.flatnonzero((start >= 0) & (values.text[np.maximum(start, 0)] == ord("{")))
        raws = _raws(self._events, EVENT_KEYS.index("args"))
        pieces = raws if rows.size == len(raws) else [raws[row] for row in rows.tolist()]
        joined = b"[" + b",".join(pieces) + b"]"
        sizes = np.fromiter(map(len, pieces), np.int64, len(pieces))
        piece_starts = np.cumsum(sizes + 1) - sizes
        structs = _decoder(self._args_keys).decode(joined)
        found = _encoded(structs, self._args_keys, len(joined)) if self._exact else None
        if found is None:
            text = padded(joined) if self._exact else self.text
            found = _addressed(text, structs, self._args_keys, _address(joined))
            if not self._exact:  # from the decoded copy's objects back onto the text
                for key in self._args_keys:
                    piece = np.searchsorted(piece_starts, found.start[key], side="right") - 1
                    moved = start[rows[piece]] - piece_starts[piece]
                    present = found.start[key] >= 0
                    found.start[key] = np.where(present, found.start[key] + moved, -1)
                    found.stop[key] = np.where(present, found.stop[key] + moved, -1)
        count = len(self)
        for spans in (found.start, found.stop):
            for key, within in spans.items():
                spread = np.full(count, -1, np.int64)
                spread[rows] = within
                spans[key] = spread
        return _ArgsFields(found, rows, structs, piece_starts, _address(joined))

    def _values(self, key: str) -> _Values | None:
        if key in EVENT_KEYS:
            return self._fields
        if key in self._args_keys:
            return self._args.values
        return None

    def span(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Value spans of a field (``EVENT_KEYS``, or an ``args`` field read) in the text
        its values are read from; -1 where absent or not read."""
        values = self._values(key)
        if values is None:
            absent = np.full(len(self), -1, np.int64)
            return absent, absent
        return values.start[key], values.stop[key]

    def quoted(self, key: str) -> np.ndarray:
        """Where the field's value is a JSON string."""
        start, _ = self.span(key)
        values = self._values(key)
        if values is None:
            return np.zeros(len(self), bool)
        return (start >= 0) & (values.text[np.maximum(start, 0)] == ord('"'))

    def numbers(self, key: str, decimals: int = 0, *, strings: bool = True) -> json_values.Numbers:
        """The field's numbers, exactly, scaled by 10^decimals (rounded half up below);
        without ``strings``, strings holding a number are not read (``quoted`` still
        says where the strings are)."""
        start, stop = self.span(key)
        values = self._values(key)
        text = values.text if values is not None else padded(b"")
        if strings:
            return json_values.numbers(text, start, stop, decimals)
        quoted = self.quoted(key)
        found = json_values.numbers(text, np.where(quoted, -1, start), stop, decimals)
        return replace(found, quoted=quoted)

    def strings(self, key: str, *, raw: bool = False) -> pa.Array:
        """The field's strings (null where absent or JSON null); with ``raw``, each value's
        JSON text as written. A number becomes its text.

        A string whose escapes do not decode to text UTF-8 can hold (a lone surrogate
        ``\\ud800``, an unknown escape) raises ``TraceFormatError`` naming the event, the
        field and the byte: Arrow, Parquet and DuckDB hold UTF-8 only, so such a value
        could only be stored changed. ``raw`` text keeps it exactly, as written."""
        start, stop = self.span(key)
        values = self._values(key)
        if values is None:
            return pa.nulls(len(self), pa.string())
        try:
            return json_values.strings(values.text, start, stop, values.escapes, raw)
        except BadString as bad:
            raise self.value_error(key, bad.row, f"is not a string UTF-8 can hold: {bad}") from None

    def _position(self, key: str, row: int) -> int:
        """Where the value of ``key`` in event ``row`` starts in ``text``."""
        if key in EVENT_KEYS:
            raw = getattr(self._events[row], f"k{EVENT_KEYS.index(key)}")
            return _address(raw) - self._base
        found = self._args
        piece = int(np.searchsorted(found.rows, row))
        raw = getattr(found.structs[piece], f"k{self._args_keys.index(key)}")
        within = _address(raw) - found.address - int(found.piece_starts[piece])
        return self._position("args", row) + within

    def text_spans(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """The spans of an event field's values in ``text`` (-1 where absent): what fusion
        rewrites there."""
        return _spans_of(_raws(self._events, EVENT_KEYS.index(key)), self._base)

    def value_error(self, key: str, row: int, problem: str) -> TraceFormatError:
        """The error for the value of ``key`` in the block's event ``row``: it names the file,
        the event's index, the field, the value (shortened when long) and its byte."""
        start, stop = self.span(key)
        values = self._values(key)
        assert values is not None
        at, end = int(start[row]), int(stop[row])
        shown = bytes(values.text[at : min(end, at + _SHOWN)]).decode(errors="replace")
        if end - at > _SHOWN:
            shown += f"... ({end - at} bytes)"
        return TraceFormatError(
            f"{self.path}: event {self.first_index + row} has {field_name(key)} {shown}, "
            f"which {problem} (at byte {self.offset + self._position(key, row)} of its JSON text)"
        )


@dataclass
class TraceText:
    """A trace file opened for reading: its form and the text around its events."""

    path: Path
    form: str = ""
    """``object`` (``{"traceEvents": [...], ...}``) or ``array`` (a bare array of events)."""
    prologue: bytes = b""
    epilogue: bytes = b""
    events: int = 0
    text_bytes: int = 0
    compressed: bool = False
    fields: dict[str, Any] = field(default_factory=dict)
    """The top-level fields but ``traceEvents`` (none for a bare array), read by ``json``:
    every integer exactly, an escaped lone surrogate kept; known once the blocks are
    exhausted."""
    blocks: Iterator[EventBlock] = field(default=iter(()), repr=False)
    source: BinaryIO | None = field(default=None, repr=False)
    """The open text, closed by ``close`` (also where ``blocks`` never started)."""

    @classmethod
    def opened(cls, path: Path) -> TraceText:
        """``path`` opened (``open_text``), its blocks not yet read; a file that cannot be
        read is a ``TraceFormatError``."""
        try:
            source, compressed = open_text(path)
        except OSError as exc:
            raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}") from exc
        return cls(path, compressed=compressed, source=source)

    def close(self) -> None:
        """Stop reading: the reading thread is joined and the file closed, now rather than
        whenever the garbage collector gets to them (on whatever thread it runs)."""
        close = getattr(self.blocks, "close", None)
        if close is not None:
            close()
        if self.source is not None:
            self.source.close()

    def __enter__(self) -> TraceText:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def top_level_spans(self) -> dict[str, tuple[int, int]]:
        """Spans (offsets in the whole text) of the top-level fields' values of an object
        trace, ``traceEvents`` excepted; known once the blocks are exhausted."""
        if self.form != "object":
            return {}
        document = _decodable(self.prologue + self.epilogue)
        try:
            with _collection_paused():
                values = msgspec.json.decode(document, type=dict[str, msgspec.Raw])
        except (msgspec.DecodeError, RecursionError) as exc:
            raise _fields_refused(self.path, exc) from None
        base = _address(document)
        shift = self.text_bytes - len(self.epilogue) - len(self.prologue)
        spans = {}
        for key, raw in values.items():
            begin = _address(raw) - base
            if key != "traceEvents":
                spans[key] = tuple(
                    p + shift if p >= len(self.prologue) else p for p in (begin, begin + len(raw))
                )
        return spans


def regular_file(path: Path) -> os.stat_result:
    """The file's status; ``TraceFormatError`` unless it is a regular file (a FIFO with no
    writer would block the reader forever, a directory cannot be read)."""
    try:
        status = path.stat()
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}") from exc
    kind = special_file(status.st_mode)
    if kind is not None:
        raise TraceFormatError(f"cannot read {path}: it is {kind}, not a regular file")
    return status


_GZIP_MAGIC = b"\x1f\x8b"
"""The first bytes of a gzip file."""


def open_text(path: Path) -> tuple[BinaryIO, bool]:
    """A trace file's JSON text to read (gunzipped when its bytes are gzip, whatever its
    name), and whether it was compressed. The caller closes it."""
    regular_file(path)
    with open(path, "rb") as probe:
        compressed = probe.read(2) == _GZIP_MAGIC
    if compressed:
        return gzip.open(path, "rb"), True
    return open(path, "rb"), False


def text_size(path: Path) -> int:
    """About how many bytes of JSON text ``path`` holds, without reading it: for a gzip
    file what its trailer says (ISIZE: its last member's text size modulo 2^32), at least
    the file's own size; for another file its size."""
    size = path.stat().st_size
    with open(path, "rb") as probe:
        if probe.read(2) != _GZIP_MAGIC or size < 20:
            return size
        probe.seek(-4, os.SEEK_END)
        return max(size, int.from_bytes(probe.read(4), "little"))


@contextmanager
def _collection_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a recursive decoder (msgspec's, or
    json's for the top-level fields) reads text that may nest thousands deep: a
    collection that started there, near the interpreter's recursion limit, would run
    other objects' finalizers with no stack left, and their failure would print
    "Exception ignored ..." beside the refusal. The decoders make no cycles and no
    objects with finalizers, so nothing waits for the collector meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON value")


def _fields_refused(path: Path, exc: BaseException) -> TraceFormatError:
    return TraceFormatError(f"{path}: its top-level fields are not JSON: {exc}")


def _guessed(
    events: bytes,
) -> tuple[tuple[list[Any], bytes, bool] | None, BaseException | None, int]:
    """``events`` (text guessed to end after a whole event) decoded as an array
    (``_decoded``), else the failure; and the length of the array's text."""
    guess = b"[" + events + b"]"
    try:
        return _decoded(guess), None, len(guess)
    except _DECODE_ERRORS as exc:
        return None, exc, len(guess)


def _decoded(guess: bytes) -> tuple[list[Any], bytes, bool]:
    """The event structs of ``guess`` (a JSON array of objects), the buffer their values
    are views of, and whether that is ``guess`` itself rather than a copy with escapes
    made decodable (whose values are then read from the original text)."""
    decoder = _decoder(EVENT_KEYS)
    with _collection_paused():
        try:
            return decoder.decode(guess), guess, True
        except msgspec.DecodeError:
            safe = _decodable(guess)
            if safe == guess:
                raise
        return decoder.decode(safe), safe, False


def _failure_byte(failure: BaseException) -> int | None:
    """The byte of the decoded text a decode error names, if any."""
    found = _BYTE.search(str(failure))
    return int(found[1]) if found else None


def _at_end(failure: BaseException, size: int) -> bool:
    """Whether a decode error of a text of ``size`` bytes is at its end (the text stops
    inside a value: cut too early, or truncated), not an error of the text before (nor
    text after a complete array: msgspec names the byte after the first one of it)."""
    if (
        not isinstance(failure, msgspec.DecodeError)
        or isinstance(failure, msgspec.ValidationError)
        or "trailing characters" in str(failure)
    ):
        return False
    byte = _failure_byte(failure)
    return byte is None or byte >= size - 1


class _Reader:
    """Reads a trace's text and yields its complete events chunk by chunk."""

    def __init__(self, trace: TraceText, source: BinaryIO, args_keys: tuple[str, ...]) -> None:
        self.trace = trace
        self.path = trace.path
        self.source = source
        self.args_keys = args_keys
        self.offset = 0
        """Offset in the whole text of ``pending``'s first byte."""
        self.pending = b""
        self.index = 0
        """Events read so far."""
        self.comma = False
        """Whether ``pending`` follows an events' comma (an event must come next)."""
        self.after_event = False
        """Whether ``pending`` follows an event (a comma or the array's end comes next)."""
        self.structure = _Structure()
        """The prologue's structure up to ``scanned``, where the search for the events
        array's key goes on when more text is read."""
        self.scanned = 0
        self.keys: list[int] = []
        """Where the top-level ``traceEvents`` key is (a second one is refused)."""
        self.closing = False
        """Whether the events array's end is found: ``blocks`` yields its last events,
        then reads the epilogue."""
        self.unread = b""
        self.unread_at = 0
        """Text read again from ``unread_at`` on before the source's (``rewind``)."""

    def _read(self, size: int | None = None) -> bytes:
        """The next text (empty at the end): what ``rewind`` gave back first, then the
        source's, counted in ``text_bytes``."""
        size = size or CHUNK_BYTES
        if self.unread_at < len(self.unread):
            chunk = self.unread[self.unread_at : self.unread_at + size]
            self.unread_at += len(chunk)
            return chunk
        chunk = self.source.read(size)
        self.trace.text_bytes += len(chunk)
        return chunk

    def _more(self, size: int | None = None) -> bool:
        chunk = self._read(size)
        self.pending += chunk
        return bool(chunk)

    def prologue(self) -> None:
        """Read up to and including the events array's ``[`` (``FIELDS_BYTES_MAX`` at most),
        into a ``bytearray``, which grows without copying what it holds."""
        size = min(1 << 16, CHUNK_BYTES)
        text = bytearray()
        opened = False
        while True:
            chunk = self._read(size)
            text += chunk
            size = min(2 * size, CHUNK_BYTES)
            if not opened:
                stripped = text.lstrip()
                opener = bytes(stripped[:1])
                if opener and opener not in b"{[":
                    raise TraceFormatError(
                        f"{self.path} is not a Chrome trace: it starts with {opener!r}, "
                        "not an object or an array"
                    )
                if opener == b"[":
                    self.trace.form = "array"
                    self._cut_prologue(bytes(text), len(text) - len(stripped) + 1)
                    return
                opened = bool(opener)
            end = self._events_array(text) if opened else None
            if end is not None and end <= FIELDS_BYTES_MAX:
                self._check_prologue(bytes(text[:end]))
                self.trace.form = "object"
                self._cut_prologue(bytes(text), end)
                return
            if end is not None or len(text) > FIELDS_BYTES_MAX:
                raise TraceFormatError(
                    f"{where(self.path, FIELDS_BYTES_MAX)}: no top-level traceEvents array "
                    f"begins before it: the text before the events array may hold at most "
                    f"{FIELDS_BYTES_MAX} bytes"
                )
            if not chunk:
                raise TraceFormatError(
                    f"{self.path} is not a Chrome trace: no top-level traceEvents array"
                    if opened
                    else f"{self.path} is empty"
                )

    def _events_array(self, text: bytearray) -> int | None:
        """Where the top-level ``"traceEvents": [`` ends in ``text`` (the prologue read so
        far), if it is there. Each byte is looked at once: the search goes on from
        ``scanned``, with the structure found up to there."""
        begin = self.scanned
        end = max(begin, len(text) - len(_EVENTS_NAME.pattern) + 1)
        """Past it a key may still be cut short."""
        found = _EVENTS_NAME.finditer(text, begin, len(text))
        marks = np.fromiter((match.start() for match in found), np.int64)
        marks = marks[marks < end]
        probe = replace(self.structure)
        inside, depth = probe.scan(text, begin, end, marks)
        for mark in marks[~inside & (depth == 1)].tolist():
            colon = _SPACES.match(text, mark + len(_EVENTS_NAME.pattern)).end()
            value = _SPACES.match(text, colon + 1).end()
            if colon == len(text) or (text[colon : colon + 1] == b":" and value == len(text)):
                self.structure.scan(text, begin, mark, marks[:0])
                self.scanned = mark
                return None  # what follows the key is not read yet
            if text[colon : colon + 1] == b":":  # a key, not a string value
                self._key(mark)
                if text[value : value + 1] == b"[":
                    return value + 1
        self.structure = probe
        self.scanned = end
        return None

    def _key(self, at: int) -> None:
        """A top-level ``traceEvents`` key at byte ``at``; a second one is refused: JSON
        readers keep the last value, this reader the first array, so which events the
        trace holds would depend on who reads it."""
        self.keys.append(at)
        if len(self.keys) > 1:
            raise TraceFormatError(
                f"{where(self.path, at)}: traceEvents is a top-level key a second time (first "
                f"at byte {self.keys[0]}): which events the trace holds is ambiguous"
            )

    def _check_prologue(self, prologue: bytes) -> None:
        """The prologue (ending in the top-level ``"traceEvents": [``) must be JSON once the
        array and the object are closed."""
        check_utf8(self.path, prologue, 0)
        try:
            with _collection_paused():
                json.loads(prologue.decode() + "]}", parse_constant=_not_json)
        except (ValueError, RecursionError) as exc:
            raise _fields_refused(self.path, exc) from None

    def _cut_prologue(self, text: bytes, end: int) -> None:
        self.trace.prologue = text[:end]
        self.pending = text[end:]
        self.offset = end

    def _block(self, text: bytes, decoded: tuple[list[Any], bytes, bool]) -> EventBlock:
        check_utf8(self.path, text, self.offset)
        block = EventBlock(self.path, self.index, self.offset, text, decoded, self.args_keys)
        block.prepare()
        self.index += len(block)
        return block

    def _skip(self, count: int) -> None:
        """Drop the first ``count`` bytes of ``pending``."""
        self.offset += count
        self.pending = self.pending[count:]

    def blocks(self) -> Iterator[EventBlock]:
        """Complete events, chunk by chunk; at the array's end, the epilogue is read.
        Whitespace between events is skipped, never held; an event is held whole, up to
        ``EVENT_BYTES_MAX``."""
        grow = 0
        while True:
            # Fill the chunk; past a cut that failed (or none), read ``grow`` bytes more.
            size = grow or CHUNK_BYTES - len(self.pending)
            final = size > 0 and not self._more(size)
            grow = 0
            if _SPACES.match(self.pending).end() == len(self.pending):
                self._skip(len(self.pending))
            if self.after_event:
                lead = _SPACES.match(self.pending).end()
                follows = self.pending[lead : lead + 1]
                if follows == b",":
                    self._skip(lead + 1)
                    self.after_event, self.comma = False, True
                elif follows == b"]":
                    yield from self._closed(self.pending, lead, ([], b"[]", True))
                    return
                elif follows:
                    raise TraceFormatError(
                        f"{where(self.path, self.offset + lead)}: the events array holds "
                        f"something other than comma-separated objects there ({follows!r} "
                        "follows an event)"
                    )
                elif final:
                    raise self._error(None, 2)
                continue
            pending = self.pending
            failure: BaseException | None = None
            exact: int | None = None
            size = len(pending) + 2
            found = _last(_BOUNDARY, pending)
            if found is not None:
                cut = found.start() + 1
                decoded, failure, size = _guessed(pending[:cut])
                if decoded is not None:
                    block = self._block(pending[:cut], decoded)
                    self._skip(found.end())
                    self.comma = True
                    yield block
                    continue
            if not final and (failure is None or _at_end(failure, size)):
                # No cut yet, or one inside an event: find the events' ends exactly.
                last, between, exact = _events_structure(pending)
                if exact is None and (last >= 0 or between):
                    events_end = len(pending[: None if between else last].rstrip(_WHITE))
                    decoded, failure, size = _guessed(pending[:events_end])
                    if decoded is not None:
                        block = self._block(pending[:events_end], decoded)
                        self._skip(events_end if between else last + 1)
                        self.comma, self.after_event = not between, between
                        yield block
                        continue
                elif exact is None:
                    grow = self._room(pending)
                    continue
            limit = len(pending) if exact is None else exact + 1
            if failure is not None and not _at_end(failure, size):
                limit = min(limit, (_failure_byte(failure) or 1) - 1)
            closed = self._close(pending, limit, exact)
            if closed is not None:
                yield from closed
                return
            raise self._error(failure, size)

    def guess(self) -> Guess | None:
        """The next chunk, filled and cut as ``blocks`` cuts it first but not decoded, the
        reader moved past it as if it had decoded; ``None`` where ``blocks`` must take the
        next step (after an event, at the array's end, or with no ``},`` in the chunk).
        Chunks of whitespace alone are skipped."""
        if self.after_event or self.closing:
            return None
        while True:
            size = CHUNK_BYTES - len(self.pending)
            ended = size > 0 and not self._more(size)
            if _SPACES.match(self.pending).end() < len(self.pending):
                break
            self._skip(len(self.pending))
            if ended:
                return None
        found = _last(_GUESS, self.pending)
        if found is None:
            return None
        cut = found.start() + 1
        guess = Guess(self.offset, self.pending[:cut], self.pending[cut : found.end()], self.comma)
        self._skip(found.end())
        self.comma = True
        return guess

    def rewind(self, guesses: Sequence[Guess]) -> None:
        """Move the reader back to the first of ``guesses``, the last ones it made (in
        order) and took no events from, so that ``blocks`` reads their text again: the
        first chunk's as its next chunk, the others' as text read again (``unread``)."""
        first, later = guesses[0], guesses[1:]
        taken = [part for guess in later for part in (guess.text, guess.separator)]
        self.unread = b"".join([*taken, self.pending, self.unread[self.unread_at :]])
        self.unread_at = 0
        self.pending = first.text + first.separator
        self.offset = first.offset
        self.comma = first.comma

    def _room(self, pending: bytes) -> int:
        """How much more to read for the one event in ``pending``, whose end is not there:
        as much again (so that an event is decoded a few times at most), up to
        ``EVENT_BYTES_MAX``; an event already that long is refused."""
        lead = _SPACES.match(pending).end()
        held = len(pending) - lead
        if held >= EVENT_BYTES_MAX:
            raise TraceFormatError(
                f"{where(self.path, self.offset + lead)}: event {self.index} holds more than "
                f"{EVENT_BYTES_MAX} bytes of JSON text, the most one event may hold"
            )
        return min(max(CHUNK_BYTES, len(pending)), EVENT_BYTES_MAX - held)

    def _close(
        self, pending: bytes, limit: int, exact: int | None = None
    ) -> Iterator[EventBlock] | None:
        """The last events and the epilogue, if the events array closes in ``pending``
        before ``limit``: at ``exact`` where the array's ``]`` is known, else at the first
        ``]`` there that a ``}`` precedes (or, with no event in between, the array's
        ``[``) and up to which the text decodes as an array."""
        empty = pending.lstrip()
        if exact is not None:
            candidates = [exact] if pending[:exact].strip() or not self.comma else []
        else:
            candidates = [len(pending) - len(empty)] if empty[:1] == b"]" and not self.comma else []
            candidates += [match.end() - 1 for match in _CLOSE.finditer(pending, 0, limit)]
        for close in candidates:
            guess = b"[" + pending[:close] + b"]"
            try:
                decoded = _decoded(guess)
            except _DECODE_ERRORS:
                continue
            return self._closed(pending, close, decoded)
        return None

    def _closed(
        self, pending: bytes, close: int, decoded: tuple[list[Any], bytes, bool]
    ) -> Iterator[EventBlock]:
        self.closing = True
        if decoded[0]:
            events_end = len(pending[:close].rstrip())
            yield self._block(pending[:events_end], decoded)
        epilogue_at = self.offset + close
        rest = [pending[close:]]
        held = len(rest[0])
        while held <= FIELDS_BYTES_MAX and (chunk := self._read()):
            rest.append(chunk)
            held += len(chunk)
        if held > FIELDS_BYTES_MAX:
            raise TraceFormatError(
                f"{where(self.path, epilogue_at)}: the text from the events array's end holds "
                f"more than {FIELDS_BYTES_MAX} bytes, the most the text after it may hold"
            )
        self.trace.events = self.index
        self.trace.epilogue = b"".join(rest)
        check_utf8(self.path, self.trace.epilogue, epilogue_at)
        self._check_epilogue(epilogue_at)

    def _check_epilogue(self, epilogue_at: int) -> None:
        """The text after the events array must close the document, and nothing follow;
        nor may it hold the top-level ``traceEvents`` key again."""
        trace = self.trace
        if trace.form == "array":
            if trace.epilogue[1:].strip():
                raise TraceFormatError(f"{self.path}: text follows the end of the document")
            return
        document = (trace.prologue + trace.epilogue).decode()
        try:
            with _collection_paused():
                fields = json.loads(document, parse_constant=_not_json)
        except json.JSONDecodeError as exc:
            if exc.msg == "Extra data":
                raise TraceFormatError(
                    f"{self.path}: text follows the end of the document"
                ) from None
            if exc.pos >= len(document.rstrip()):
                raise TraceFormatError(
                    f"{self.path}: the text after the events array does not close the "
                    "document (a truncated file?)"
                ) from None
            raise _fields_refused(self.path, exc) from None
        except (ValueError, RecursionError) as exc:
            raise _fields_refused(self.path, exc) from None
        epilogue = trace.epilogue
        found = _EVENTS_NAME.finditer(epilogue)
        marks = np.fromiter((match.start() for match in found), np.int64)
        inside, depth = _Structure(depth=2).scan(epilogue, 0, len(epilogue), marks)
        for mark in marks[~inside & (depth == 1)].tolist():
            colon = _SPACES.match(epilogue, mark + len(_EVENTS_NAME.pattern)).end()
            if epilogue[colon : colon + 1] == b":":
                self._key(epilogue_at + mark)
        fields.pop("traceEvents", None)
        trace.fields = fields

    def _error(self, failure: BaseException | None, size: int) -> TraceFormatError:
        """Why the events array reads no further: the decode error that stopped it, or
        the text's end inside it (``size``: that of the decoded guess)."""
        if failure is None or _at_end(failure, size):
            whole = b"[" + self.pending + b"]"
            try:
                complete = len(_decoded(whole)[0])
            except _DECODE_ERRORS as exc:
                if not _at_end(exc, len(whole)):
                    return self._refusal(exc)
                complete = 0
            return TraceFormatError(
                f"{self.path} ends inside its events array after {self.index + complete} "
                "complete events (a truncated file?)"
            )
        return self._refusal(failure)

    def _refusal(self, failure: BaseException) -> TraceFormatError:
        """The error for a decode error in the events array (of ``[`` + ``pending``...)."""
        if isinstance(failure, RecursionError):
            return TraceFormatError(
                f"{self.path}: an event after byte {self.offset} of its JSON text nests "
                "too deeply to read"
            )
        message = str(failure)
        element = _ELEMENT.search(message)
        if isinstance(failure, msgspec.ValidationError) and element:
            return TraceFormatError(
                f"{self.path}: the events array holds something other than comma-separated "
                f"objects: event {self.index + int(element[1])} is not an object "
                f"({_ELEMENT.sub('', message)})"
            )
        within = max((_failure_byte(failure) or 1) - 1, 0)
        check_utf8(self.path, self.pending[:within], self.offset)
        return TraceFormatError(
            f"{where(self.path, self.offset + within)}: the events array holds something "
            f"other than comma-separated objects there ({_BYTE.sub('', message)})"
        )


def _last(pattern: re.Pattern[bytes], text: bytes) -> re.Match[bytes] | None:
    """The last match of ``pattern`` in ``text``, looked for from the end in growing windows."""
    window = 1 << 16
    while True:
        found = deque(pattern.finditer(text, max(0, len(text) - window)), maxlen=1)
        if found or window >= len(text):
            return found[0] if found else None
        window *= 4


@dataclass(frozen=True)
class Guess:
    """A chunk of the events array cut after its last ``}`` that a comma follows, not yet
    decoded: ``text`` is guessed to hold whole events (``guessed_block`` checks it)."""

    offset: int
    """Where ``text`` starts in the whole JSON text."""
    text: bytes
    separator: bytes
    """The text after it up to and including the comma it was cut at."""
    comma: bool
    """Whether the text before it ended in an events' comma (an event must come first)."""


def guessed_block(path: Path, guess: Guess, args_keys: tuple[str, ...]) -> EventBlock | None:
    """The events of ``guess`` (numbered from 0) with their fields found, where its text
    decodes as whole events and is UTF-8; else ``None``, and ``read_guessed`` reads it
    again itself, raising what ``read_trace`` raises."""
    decoded, _, _ = _guessed(guess.text)
    if decoded is None:
        return None
    try:
        check_utf8(path, guess.text, guess.offset)
    except TraceFormatError:
        return None
    block = EventBlock(path, 0, guess.offset, guess.text, decoded, args_keys)
    block.prepare()
    return block


Decoded = TypeVar("Decoded", bound=Sized, covariant=True)


class Pending(Protocol[Decoded]):
    """A guess's decoding under way elsewhere."""

    def result(self) -> Decoded | None:
        """Its result, once there: ``None`` where the guess failed or could not be decoded."""
        ...


def read_guessed(
    path: Path | str,
    decode: Callable[[Guess], Pending[Decoded]],
    depth: int,
    ready: Callable[[], bool],
    *,
    args_keys: tuple[str, ...] = ARGS_KEYS,
) -> tuple[TraceText, Generator[Decoded | EventBlock, None, None]]:
    """Open a trace as ``read_trace`` does, its chunks decoded elsewhere once ``ready`` says
    so (until then this reader reads them): each chunk's ``Guess`` goes to ``decode`` (work
    for another process), up to ``depth`` ahead, and its result (whose length is its event
    count) is taken in order. Where a result is
    ``None``, the reader reads on itself from that chunk (the results of the guesses after
    it taken and dropped), yielding ``EventBlock``s until it can guess again; so every
    refusal is the one ``read_trace`` raises. Close the generator and the ``TraceText``
    when done; what is still under way elsewhere is the caller's to stop."""
    trace = TraceText.opened(Path(path))

    def generate() -> Generator[Decoded | EventBlock, None, None]:
        flying: deque[tuple[Guess, Pending[Decoded]]] = deque()
        with _reading(trace, args_keys) as reader:
            while True:
                while (
                    len(flying) < depth
                    and (flying or ready())
                    and (guess := reader.guess()) is not None
                ):
                    flying.append((guess, decode(guess)))
                if flying:
                    guess, pending = flying.popleft()
                    result = pending.result()
                    if result is not None:
                        reader.index += len(result)
                        yield result
                        continue
                    reader.rewind([guess, *(later for later, _ in flying)])
                    while flying:
                        flying.popleft()[1].result()
                steps = reader.blocks()
                for block in steps:
                    yield block
                    if not reader.closing:
                        break
                else:
                    return
                steps.close()

    return trace, generate()


@contextmanager
def _reading(trace: TraceText, args_keys: Iterable[str]) -> Iterator[_Reader]:
    """A reader of ``trace``'s open text, past its prologue; the text is closed after, and
    a failed read of it (a truncated gzip, a disk error) is a ``TraceFormatError``."""
    assert trace.source is not None  # TraceText.opened
    with trace.source as source:
        try:
            reader = _Reader(trace, source, tuple(args_keys))
            reader.prologue()
            yield reader
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise TraceFormatError(f"cannot read {trace.path}: {exc}") from exc


def read_trace(path: Path | str, *, args_keys: tuple[str, ...] = ARGS_KEYS) -> TraceText:
    """Open a trace (``.json`` or gzipped) for reading: ``blocks`` yields its events, each
    chunk decoded on a thread while the one before is used; ``prologue``, ``epilogue``,
    ``fields`` and ``events`` are known once the blocks are exhausted. ``args_keys`` are
    the fields of ``args`` to find (the others read as absent).

    Raises ``TraceFormatError`` when the file is not a regular file or not a Chrome trace,
    is truncated, is not UTF-8, or holds something other than objects in its events
    array. Use it as a context manager (or ``close`` it) so that a reader stopped early
    releases its thread and file at once.
    """
    trace = TraceText.opened(Path(path))

    def generate() -> Generator[EventBlock, None, None]:
        with _reading(trace, args_keys) as reader:
            yield from reader.blocks()

    trace.blocks = ahead(generate(), "mcprof-trace-read")
    return trace
