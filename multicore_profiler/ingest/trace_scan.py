"""Structural scan of a Chrome trace's JSON text with numpy, block by block.

A trace can be gigabytes, so it is never parsed into a Python object per event.
Each block of text is classified byte by byte with vectorized lookups: quotes
(those not escaped by a backslash), and outside strings the braces, brackets,
commas and colons with their nesting depth. From those positions come each
event's byte span, the spans of its top-level fields' values and of the fields of
its ``args``, all as numpy arrays over the block. Blocks are cut after the last
complete event, so every scan starts outside any string at a known depth.

The document around ``traceEvents`` (or the bare array) is kept as text: the
``prologue`` up to and including the array's ``[`` and the ``epilogue`` from its
``]`` on.

Every byte of the text is checked to be UTF-8 (an error names the byte's offset), and
every number is read exactly or refused: a value that does not fit int64 once scaled is
``overflow``, found in time that does not grow with an exponent (``1e999999``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import BinaryIO

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.errors import TraceFormatError
from multicore_profiler.prefetch import ahead
from multicore_profiler.storage.location import special_file

BLOCK_BYTES = 4 << 20
"""Text read at once: a few dozen MB of temporaries per block, whatever the file's size;
small enough that the first block's scan, which nothing overlaps, is short."""

_LBRACE, _LBRACKET, _RBRACE, _RBRACKET, _COMMA, _COLON = 1, 2, 3, 4, 5, 6
_QUOTE_MARK, _ESCAPE = 7, 8
_CLASS = np.zeros(256, np.uint8)
for _char, _kind in zip(b'{[}],:"\\', range(1, 9), strict=True):
    _CLASS[_char] = _kind
_CLASS_TABLE = _CLASS.tobytes()
_STEP = np.zeros(9, np.int8)
_STEP[[_LBRACE, _LBRACKET]] = 1
_STEP[[_RBRACE, _RBRACKET]] = -1
_SPACE = np.zeros(256, bool)
_SPACE[list(b" \t\r\n")] = True

EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")
ARGS_KEYS = ("correlation", "External id", "stream", "device", "Task Type", "Stream Id")
"""Fields of ``args`` the store keeps in columns of their own (torch_npu names its
stream ``Stream Id`` and its device tasks' kind ``Task Type``)."""


def _key_codes(keys: tuple[str, ...]) -> dict[str, tuple[int, int, int]]:
    """Each key as (length, first 8 bytes, last 8 bytes) packed into integers; no two keys
    may share their first 8 bytes (``_key_ids`` finds a key by them)."""
    codes = {}
    for key in keys:
        raw = key.encode()
        head = int.from_bytes(raw[:8].ljust(8, b"\0"), "little")
        tail = int.from_bytes(raw[-8:], "little")
        codes[key] = (len(raw), head, tail)
    if len({head for _, head, _ in codes.values()}) < len(codes):
        raise ValueError(f"keys {keys} share their first 8 bytes")
    return codes


_EVENT_CODES = _key_codes(EVENT_KEYS)
_ARGS_CODES = _key_codes(ARGS_KEYS)


@dataclass
class Structure:
    """The marks of a text, in order: unescaped quotes, and outside strings the braces,
    brackets, commas and colons. Inside a key string there is no mark, so a key's quotes
    are the two marks before its colon."""

    pos: np.ndarray
    kind: np.ndarray
    depth: np.ndarray
    """Depth after the mark: inside for an opening one, outside for a closing one."""
    escapes: np.ndarray
    """Positions of backslashes."""
    in_string: bool
    """Whether the text ends inside a string."""


def scan(text: np.ndarray, depth: int = 0) -> Structure:
    """Scan ``text`` (uint8), which starts outside any string at ``depth``."""
    # bytes.translate classifies about twice as fast as indexing _CLASS with the text.
    kind = np.frombuffer(text.tobytes().translate(_CLASS_TABLE), np.uint8)
    backslash = np.flatnonzero(kind == _ESCAPE)
    if backslash.size:
        kind = kind.copy()
        # A character is escaped when an odd run of backslashes precedes it.
        starts = np.ones(backslash.size, bool)
        starts[1:] = np.diff(backslash) != 1
        run_start = np.flatnonzero(starts)
        run_end = np.append(run_start[1:], backslash.size)
        odd = (run_end - run_start) % 2 == 1
        escaped = backslash[run_end[odd] - 1] + 1
        kind[escaped[escaped < text.size]] = 0
        kind[backslash] = 0
    pos = np.flatnonzero(kind != 0)  # on booleans: more than twice as fast
    kind = np.take(kind, pos)
    quote = kind == _QUOTE_MARK
    inside = np.logical_xor.accumulate(quote) if quote.size else quote
    # A quote toggles the state and is kept; any other mark counts only outside strings.
    keep = quote | ~inside
    pos, kind = pos[keep], kind[keep]
    step = np.take(_STEP, kind)
    in_string = bool(inside[-1]) if inside.size else False
    return Structure(pos, kind, depth + np.cumsum(step, dtype=np.int32), backslash, in_string)


@dataclass
class Fields:
    """Value spans ``[start, stop)`` of some keys of each event (start -1: absent)."""

    start: dict[str, np.ndarray]
    stop: dict[str, np.ndarray]


@dataclass
class Numbers:
    """Numbers read exactly from values' text: ``value`` is the number x 10^decimals,
    valid where ``number`` (the value is a number, or a string holding one); ``quoted``
    where the value is a string; ``rounded`` where digits below 10^-decimals were dropped
    (half up); ``overflow`` where it is a number whose scaled value does not fit int64.

    Rows after the first ``overflow`` row may be left unread (``number`` false): a caller
    refuses the block at its first bad row, which is then the first ``overflow`` one or
    one before it."""

    value: np.ndarray
    number: np.ndarray
    quoted: np.ndarray
    rounded: np.ndarray
    overflow: np.ndarray


@dataclass
class _ArgsQuery:
    """What finding the fields of a block's ``args`` objects needs. It runs when they are
    first asked for, on the thread that uses the block, not on the one scanning ahead."""

    structure: Structure
    separators: _Separators
    depth: int
    codes: dict


@dataclass
class EventBlock:
    """Complete events of one block: their spans in ``text`` and their fields."""

    text: np.ndarray
    first_index: int
    """Index of the block's first event in the whole trace."""
    offset: int
    """Offset of ``text`` in the whole JSON text."""
    path: Path
    """The trace file, for messages."""
    starts: np.ndarray
    stops: np.ndarray
    fields: Fields
    args_query: _ArgsQuery = field(repr=False)
    escapes: np.ndarray = field(repr=False)
    """Positions of backslashes in ``text``."""

    @cached_property
    def args(self) -> Fields:
        """Spans of the ``args`` fields asked for (``ARGS_KEYS`` by default)."""
        query = self.args_query
        count = len(self)
        start, stop = self.fields.start["args"], self.fields.stop["args"]
        objects = np.flatnonzero((start >= 0) & (self.text[np.maximum(start, 0)] == ord("{")))
        inner = _fields(
            self.text,
            query.structure,
            query.separators,
            query.depth,
            start[objects],
            stop[objects] - 1,
            query.codes,
        )
        return Fields(
            *(
                {key: _spread(values, objects, count) for key, values in part.items()}
                for part in (inner.start, inner.stop)
            )
        )

    def __len__(self) -> int:
        return int(self.starts.size)

    def span(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Value spans of an event field (``EVENT_KEYS``) or an args field (``ARGS_KEYS``);
        -1 where absent, or not looked for."""
        if key in _EVENT_CODES:
            return self.fields.start[key], self.fields.stop[key]
        if key in self.args_query.codes:
            return self.args.start[key], self.args.stop[key]
        absent = np.full(len(self), -1, np.int64)
        return absent, absent

    def numbers(self, key: str, decimals: int = 0) -> Numbers:
        """The field's numbers, exactly, scaled by 10^decimals (rounded half up below)."""
        start, stop = self.span(key)
        return _numbers(self.text, start, stop, decimals)

    def strings(self, key: str, *, raw: bool = False) -> pa.Array:
        """The field's strings (null where absent or JSON null); with ``raw``, each value's
        JSON text as written. A number becomes its text.

        A string whose escapes do not decode to text UTF-8 can hold (a lone surrogate
        ``\\ud800``, an unknown escape) raises ``TraceFormatError`` naming the event, the
        field and the byte: Arrow, Parquet and DuckDB hold UTF-8 only, so such a value
        could only be stored changed. ``raw`` text keeps it exactly, as written."""
        start, stop = self.span(key)
        try:
            return _strings(self.text, start, stop, self.escapes, raw)
        except _BadString as bad:
            raise self.value_error(key, bad.row, f"is not a string UTF-8 can hold: {bad}") from None

    def value_error(self, key: str, row: int, problem: str) -> TraceFormatError:
        """The error for the value of ``key`` in the block's event ``row``: it names the file,
        the event's index, the field, the value (shortened when long) and its byte."""
        start, stop = self.span(key)
        at, end = int(start[row]), int(stop[row])
        shown = bytes(self.text[at : min(end, at + _SHOWN)]).decode(errors="replace")
        if end - at > _SHOWN:
            shown += f"... ({end - at} bytes)"
        return TraceFormatError(
            f"{self.path}: event {self.first_index + row} has {field_name(key)} {shown}, "
            f"which {problem} (at byte {self.offset + at} of its JSON text)"
        )


_SHOWN = 48
"""Bytes of a bad value that a message shows."""


def field_name(key: str) -> str:
    """How messages name a field: ``ts``, or ``args.correlation`` for a field of ``args``."""
    return key if key in _EVENT_CODES else f"args.{key}"


@dataclass
class TraceText:
    """A trace file opened for scanning: its form and the text around its events."""

    path: Path
    form: str = ""
    """``object`` (``{"traceEvents": [...], ...}``) or ``array`` (a bare array of events)."""
    prologue: bytes = b""
    epilogue: bytes = b""
    events: int = 0
    text_bytes: int = 0
    compressed: bool = False
    blocks: Iterator[EventBlock] = field(default=iter(()), repr=False)
    source: BinaryIO | None = field(default=None, repr=False)
    """The open text, closed by ``close`` (also where ``blocks`` never started)."""

    def close(self) -> None:
        """Stop reading: the scanning thread is joined and the file closed, now rather than
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
        text = np.frombuffer(self.prologue + self.epilogue, np.uint8)
        st = scan(text)
        shift = self.text_bytes - len(self.epilogue) - len(self.prologue)
        colons = np.flatnonzero((st.kind == _COLON) & (st.depth == 1))
        closing = (st.kind == _RBRACE) & (st.depth == 0)
        ends = st.pos[((st.kind == _COMMA) & (st.depth == 1)) | closing]
        spans = {}
        for mark in colons.tolist():
            # json, not orjson: a key may hold an escaped lone surrogate.
            key = json.loads(bytes(text[st.pos[mark - 2] : st.pos[mark - 1] + 1]))
            colon = int(st.pos[mark])
            value = bytes(text[colon + 1 : int(ends[np.searchsorted(ends, colon)])])
            begin = colon + 1 + len(value) - len(value.lstrip())
            end = colon + 1 + len(value.rstrip())
            if key != "traceEvents":
                moved = (p + shift if p >= len(self.prologue) else p for p in (begin, end))
                spans[key] = tuple(moved)
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


def open_text(path: Path) -> tuple[BinaryIO, bool]:
    """A trace file's JSON text to read (gunzipped when its bytes are gzip, whatever its
    name), and whether it was compressed. The caller closes it."""
    regular_file(path)
    with open(path, "rb") as probe:
        compressed = probe.read(2) == b"\x1f\x8b"
    if compressed:
        return gzip.open(path, "rb"), True
    return open(path, "rb"), False


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes as stored (compressed, for a ``.gz``)."""
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(BLOCK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _where(path: Path, offset: int) -> str:
    return f"{path}: at byte {offset} of its JSON text"


def check_utf8(path: Path, data: np.ndarray | bytes, offset: int) -> None:
    """Raise ``TraceFormatError`` naming the file and the byte unless ``data`` (the text
    from byte ``offset`` on) is UTF-8. Arrow validates it (about 25 GB/s); only a failure
    is decoded again, to find the byte."""
    view = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data
    offsets = pa.py_buffer(np.array([0, view.size], np.int64))
    whole = pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(view)])
    try:
        whole.validate(full=True)
    except pa.ArrowInvalid:
        try:
            view.tobytes().decode()
        except UnicodeDecodeError as exc:
            raise TraceFormatError(
                f"{_where(path, offset + exc.start)}: invalid UTF-8 ({exc.reason}, byte "
                f"{view[exc.start]:#04x})"
            ) from None


def _skip_space(text: np.ndarray, at: np.ndarray, limit: np.ndarray, step: int) -> np.ndarray:
    """Move each position in ``at`` past whitespace (forwards or, with step -1, back),
    never past ``limit``; only the positions still on whitespace are looked at again."""
    at = at.copy()
    behind = 0 if step > 0 else 1
    last = text.size - 1

    def on_space(where: np.ndarray, bound: np.ndarray) -> np.ndarray:
        return (where != bound) & _SPACE[text[np.clip(where - behind, 0, last)]]

    # The first look is at every position (no gather); few move on (one space, mostly).
    rows = np.flatnonzero(on_space(at, limit))
    while rows.size:
        at[rows] += step
        rows = rows[on_space(at[rows], limit[rows])]
    return at


_PADDING = 32


def padded(data: bytes) -> np.ndarray:
    """``data`` as a uint8 array followed in memory by zero bytes, for ``_windows``."""
    return np.frombuffer(data + bytes(_PADDING), np.uint8)[: len(data)]


def _windows(text: np.ndarray, width: int = 8) -> np.ndarray:
    """The ``width`` bytes from each position as a row: a strided view, no copy. ``text``
    must come from ``padded`` (rows near its end read the zero padding)."""
    return np.lib.stride_tricks.as_strided(
        text, shape=(text.size, width), strides=(1, 1), writeable=False
    )


_U32 = np.uint64(32)
_BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], np.uint64)


def _low_bytes(words: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``words`` with only their ``keep`` (0 to 8) low bytes kept."""
    return words & _BYTE_MASKS[np.minimum(keep, 8).astype(np.intp)]


def _key_ids(text: np.ndarray, opens: np.ndarray, closes: np.ndarray, codes: dict) -> np.ndarray:
    """The index in ``codes`` of the key each quoted string ``text[opens + 1:closes]`` equals,
    or -1: one lookup of its first 8 bytes among the keys' (distinct, see ``_key_codes``),
    then a check of its length, and of its last 8 bytes for keys longer than 8."""
    if not codes:
        return np.full(opens.size, -1)
    sizes, heads, tails = np.array(list(codes.values()), np.uint64).T
    order = np.argsort(heads)
    length = closes - opens - 1
    windows = _windows(text)
    head = _low_bytes(np.ascontiguousarray(windows[opens + 1]).view("<u8").ravel(), length)
    slot = np.minimum(np.searchsorted(heads[order], head), heads.size - 1)
    key = order[slot]
    found = (heads[key] == head) & (length.astype(np.uint64) == sizes[key])
    long = np.flatnonzero(found & (length > 8))
    if long.size:
        tail = np.ascontiguousarray(windows[closes[long] - 8]).view("<u8").ravel()
        found[long] = tail == tails[key[long]]
    return np.where(found, key, -1)


@dataclass
class _Separators:
    """The colons (as mark indices) and commas (as positions) of a block, with depths."""

    colons: np.ndarray
    colon_depth: np.ndarray
    commas: np.ndarray
    comma_depth: np.ndarray

    @classmethod
    def of(cls, st: Structure) -> _Separators:
        colons = np.flatnonzero(st.kind == _COLON)
        commas = np.flatnonzero(st.kind == _COMMA)
        return cls(colons, st.depth[colons], st.pos[commas], st.depth[commas])


def _fields(
    text: np.ndarray,
    st: Structure,
    separators: _Separators,
    depth: int,
    owner_starts: np.ndarray,
    owner_stops: np.ndarray,
    codes: dict,
) -> Fields:
    """Spans of the values of ``codes``' keys directly inside the objects (at ``depth``)
    whose braces are at ``owner_starts`` and ``owner_stops`` (both sorted)."""
    count = owner_starts.size
    starts = np.full((len(codes), count), -1, np.int64)
    stops = np.full((len(codes), count), -1, np.int64)

    def fields() -> Fields:
        return Fields(dict(zip(codes, starts, strict=True)), dict(zip(codes, stops, strict=True)))

    if count == 0:
        return fields()
    marks = separators.colons[separators.colon_depth == depth]
    colons = st.pos[marks]
    owner = np.searchsorted(owner_starts, colons, side="right") - 1
    inside = (owner >= 0) & (colons < owner_stops[np.maximum(owner, 0)])
    marks, colons, owner = marks[inside], colons[inside], owner[inside]
    if colons.size == 0:
        return fields()
    ids = _key_ids(text, st.pos[marks - 2], st.pos[marks - 1], codes)
    rows = np.flatnonzero(ids >= 0)
    colons, owner, ids = colons[rows], owner[rows], ids[rows]
    ends = np.sort(
        np.concatenate([separators.commas[separators.comma_depth == depth], owner_stops])
    )
    value_stop = ends[np.searchsorted(ends, colons)]
    value_start = _skip_space(text, colons + 1, value_stop, 1)
    value_stop = _skip_space(text, value_stop, value_start, -1)
    starts[ids, owner] = value_start
    stops[ids, owner] = value_stop
    return fields()


def _solid_bytes(text: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """How many bytes of each span ``[start, stop)`` are not whitespace: spans of up to 8
    bytes (the gaps between events, nearly always) at once, longer ones one by one."""
    length = stops - starts
    if text.size == 0:
        return np.zeros(starts.size, np.int64)
    windows = _windows(text)[np.minimum(starts, text.size - 1)]
    solid = ((~_SPACE[windows]) & (np.arange(8) < length[:, None])).sum(axis=1)
    for row in np.flatnonzero(length > 8).tolist():
        solid[row] = int((~_SPACE[text[starts[row] : stops[row]]]).sum())
    return solid


_WIDTH = 24
_POW10 = 10 ** np.arange(19, dtype=np.uint64)
_DIGIT_LIMIT = 19
_INT64_MAX = np.uint64((1 << 63) - 1)
_CAST_CHARS = 38
"""Longest value Arrow's cast reads here: its string -> decimal128 cast wraps round (or
gives 0) for literals of more than about 105 digits instead of failing."""


def _numbers(text: np.ndarray, start: np.ndarray, stop: np.ndarray, decimals: int) -> Numbers:
    """Numbers parsed by Arrow where it can read them all exactly (``_cast_numbers``); else
    decimal numbers of up to 24 characters read with numpy, and the others (exponents,
    more digits) one by one (``_exact``). Never through a float."""
    cast = _cast_numbers(text, start, stop, decimals)
    return cast if cast is not None else _digit_numbers(text, start, stop, decimals)


def _cast_numbers(
    text: np.ndarray, start: np.ndarray, stop: np.ndarray, decimals: int
) -> Numbers | None:
    """Every present value read by Arrow's cast of its text (C++, a few times faster than
    reading digits with numpy): to int64, or to a decimal with ``decimals`` places whose
    unscaled integer is the value x 10^decimals. ``None`` when any value is not such a
    number (a word, more places, out of range, longer than ``_CAST_CHARS``): then none is
    taken from here."""
    present = start >= 0
    if text.size == 0 or not present.any():
        return None
    quoted = present & (text[np.maximum(start, 0)] == ord('"'))
    begin = start + quoted
    length = np.where(present, stop - quoted - begin, 0)
    if int(length.max()) > _CAST_CHARS:
        return None
    if decimals == 0:  # Arrow's int64 cast also reads hex (0x10), which JSON does not have
        after = np.minimum(begin[:, None] + (1, 2), text.size - 1)
        if (present[:, None] & ((text[after] | 0x20) == ord("x"))).any():
            return None
    views = _string_views(text, begin, length, present)
    try:
        if decimals == 0:
            # Nulls filled first: an int64 array with nulls would come out as float64.
            value = pc.fill_null(pc.cast(views, pa.int64()), 0).to_numpy()
        else:
            scaled = pc.cast(views, pa.decimal128(38, decimals))
            pairs = np.frombuffer(scaled.buffers()[1], np.int64).reshape(-1, 2)
            pairs = pairs[scaled.offset : scaled.offset + start.size]
            low, high = pairs[:, 0], pairs[:, 1]
            if not (high == (low >> 63))[present].all():
                return None
            value = np.where(present, low, 0)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    none = np.zeros(start.size, bool)
    return Numbers(value.astype(np.int64), present, quoted, none, none)


def _digit_numbers(text: np.ndarray, start: np.ndarray, stop: np.ndarray, decimals: int) -> Numbers:
    """Decimal numbers of up to 24 characters read with numpy; others (exponents, more
    digits) one by one with ``_exact``, up to the first that overflows."""
    count = start.size
    value = np.zeros(count, np.int64)
    number, quoted, rounded, overflow = (np.zeros(count, bool) for _ in range(4))
    rows = np.flatnonzero(start >= 0)
    if rows.size == 0 or text.size == 0:
        return Numbers(value, number, quoted, rounded, overflow)
    begin, end = start[rows], stop[rows]
    is_string = text[begin] == ord('"')
    begin, end = begin + is_string, end - is_string
    negative = text[np.minimum(begin, text.size - 1)] == ord("-")
    begin = begin + negative
    length = end - begin
    width = int(min(_WIDTH, max(int(length.max()), 1)))
    columns = np.arange(width)
    inside = columns < length[:, None]
    chars = _windows(text, width)[np.minimum(begin, text.size - 1)]
    digit = inside & (chars >= ord("0")) & (chars <= ord("9"))
    dot = inside & (chars == ord("."))
    dots = dot.sum(axis=1)
    point = np.where(dots == 1, dot.argmax(axis=1), length)
    simple = (length > 0) & (length <= width) & ((digit | dot) == inside).all(axis=1)
    simple &= (dots <= 1) & digit.any(axis=1) & (point <= _DIGIT_LIMIT - decimals)
    power = point[:, None] + decimals - 1 - columns + (columns > point[:, None])
    kept = digit & (power >= 0)
    digits = np.where(kept, chars - ord("0"), 0).astype(np.uint64)
    magnitude = (digits * _POW10[np.clip(power, 0, 18)]).sum(axis=1, dtype=np.uint64)
    simple &= magnitude < _INT64_MAX
    dropped = digit & (power < 0)
    round_up = (dropped & (power == -1) & (chars >= ord("5"))).any(axis=1)
    signed = (magnitude.astype(np.int64) + round_up) * np.where(negative, -1, 1)
    value[rows] = np.where(simple, signed, 0)
    number[rows] = simple
    quoted[rows] = is_string
    rounded[rows] = simple & (dropped & (chars != ord("0"))).any(axis=1)
    for row in rows[~simple].tolist():
        try:
            parsed = _exact(bytes(text[start[row] : stop[row]]), decimals)
        except OverflowError:
            overflow[row] = True
            break
        if parsed is not None:
            value[row], rounded[row] = parsed
            number[row] = True
    return Numbers(value, number, quoted, rounded, overflow)


_NUMBER = re.compile(rb"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?")
_INT64_DIGITS = 19
"""Digits of 2^63: a magnitude of more digits does not fit int64."""
_EXPONENT_DIGITS = 18
"""An exponent of more digits is beyond any text's digit count: its sign alone decides."""


def _exact(raw: bytes, decimals: int) -> tuple[int, bool] | None:
    """One number (or a string holding one) x 10^decimals, exactly, with whether digits
    below 1 were dropped (rounded half up, away from zero); ``None`` when it is not a
    number. Raises ``OverflowError`` when the scaled value does not fit int64.

    The cost follows the count of written digits, never the exponent's value: the
    exponent moves the decimal point, it is not applied by arithmetic."""
    if raw[:1] == b'"':
        raw = raw[1:-1].strip()
    match = _NUMBER.fullmatch(raw)
    if match is None or not (match[2] or match[3]):
        return None
    sign, whole, fraction, exponent = match[1], match[2], match[3] or b"", match[4] or b"0"
    significant = (whole + fraction).lstrip(b"0")
    digits = significant.rstrip(b"0")
    if not digits:
        return 0, False
    written = exponent.lstrip(b"+-").lstrip(b"0")
    if len(written) > _EXPONENT_DIGITS:
        power = -(10**_EXPONENT_DIGITS) if exponent[:1] == b"-" else 10**_EXPONENT_DIGITS
    else:
        power = int(exponent)
    # The value is int(digits) x 10^shift.
    shift = len(significant) - len(digits) - len(fraction) + power + decimals
    if len(digits) + shift > _INT64_DIGITS:
        raise OverflowError
    if shift >= 0:
        magnitude, dropped = int(digits) * 10**shift, False
    else:
        # Digits ends in a digit other than 0, and at least that one is dropped.
        keep = len(digits) + shift
        magnitude = 0 if keep < 0 else int(digits[:keep] or b"0") + (digits[keep] >= ord("5"))
        dropped = True
    signed = -magnitude if sign == b"-" else magnitude
    if not -(1 << 63) <= signed < 1 << 63:
        raise OverflowError
    return signed, dropped


def _string_views(
    text: np.ndarray, begin: np.ndarray, length: np.ndarray, valid: np.ndarray
) -> pa.Array:
    """The spans ``[begin, begin + length)`` of ``text`` as an Arrow string view array over
    the text itself: one 16-byte view per value, built with numpy as two 64-bit words, and
    no byte copied until Arrow casts it to a plain string array.

    A view is the length (4 bytes), then either the value itself (up to 12 bytes, the rest
    zero) or its first 4 bytes, buffer 0 and its offset in ``text``."""
    count = begin.size
    at = np.minimum(begin, max(text.size - 1, 0))
    if text.size:
        data = np.ascontiguousarray(_windows(text, 16)[at]).view("<u8")
    else:
        data = np.zeros((count, 2), np.uint64)
    size = length.astype(np.uint64)
    first = size | (_low_bytes(data[:, 0], np.minimum(size, 4)) << _U32)
    inline = _low_bytes((data[:, 0] >> _U32) | (data[:, 1] << _U32), np.maximum(size, 4) - 4)
    second = np.where(length <= 12, inline, begin.astype(np.uint64) << _U32)
    validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    views = pa.py_buffer(np.stack([first, second], axis=1))
    return pa.Array.from_buffers(pa.string_view(), count, [validity, views, pa.py_buffer(text)])


class _BadString(ValueError):
    """A string value whose escapes cannot be decoded: ``row`` is its row in the block."""

    def __init__(self, message: str, row: int) -> None:
        super().__init__(message)
        self.row = row


def _decoded(raw: bytes, row: int) -> str:
    """One JSON string with escapes, decoded; ``_BadString`` when it cannot be."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        reason = str(exc).split(":", 1)[0]
        if re.search(rb"\\u[dD][89a-fA-F]", raw):
            reason = f"{reason} (a lone UTF-16 surrogate escape)"
        raise _BadString(reason, row) from None


def _strings(
    text: np.ndarray, start: np.ndarray, stop: np.ndarray, escapes: np.ndarray, raw: bool
) -> pa.Array:
    """Values' text gathered into one Arrow string array; JSON strings unquoted and, where
    they hold escapes, decoded. The text is known to be UTF-8 (``check_utf8``), and every
    span starts and stops at an ASCII mark, so no value is validated again."""
    present = start >= 0
    first = text[np.maximum(start, 0)]
    null = present & (first == ord("n")) & (stop - start == 4)
    quoted = present & (first == ord('"')) & ~np.bool_(raw)
    valid = present & (raw | ~null)
    begin = np.where(quoted, start + 1, start)
    length = np.where(valid, np.where(quoted, stop - 1, stop) - begin, 0)
    array = _string_views(text, begin, length, valid).cast(pa.string())
    if not raw and escapes.size:
        escaped = quoted & (
            np.searchsorted(escapes, stop) > np.searchsorted(escapes, np.maximum(start, 0))
        )
        rows = np.flatnonzero(escaped)
        if rows.size:
            decoded = [_decoded(bytes(text[start[r] : stop[r]]), r) for r in rows.tolist()]
            mask = np.zeros(start.size, bool)
            mask[rows] = True
            array = pc.replace_with_mask(array, pa.array(mask), pa.array(decoded, pa.string()))
    return array


def _spread(values: np.ndarray, rows: np.ndarray, count: int) -> np.ndarray:
    """``values`` of ``rows`` placed among ``count`` rows; -1 elsewhere."""
    out = np.full(count, -1, np.int64)
    out[rows] = values
    return out


class _Reader:
    """Reads a trace's text and yields its complete events block by block."""

    def __init__(self, trace: TraceText, source: BinaryIO, args_codes: dict) -> None:
        self.trace = trace
        self.source = source
        self.args_codes = args_codes
        self.offset = 0
        """Offset in the whole text of ``pending``'s first byte."""
        self.pending = b""

    def _more(self, size: int | None = None) -> bool:
        chunk = self.source.read(size or BLOCK_BYTES)
        self.trace.text_bytes += len(chunk)
        self.pending += chunk
        return bool(chunk)

    def prologue(self) -> int:
        """Read up to the events array's ``[``; return the depth of the events' objects."""
        path = self.trace.path
        size = min(1 << 16, BLOCK_BYTES)
        while True:
            more = self._more(size)
            size = min(2 * size, BLOCK_BYTES)
            text = np.frombuffer(self.pending, np.uint8)
            first = np.flatnonzero(~_SPACE[text])
            if first.size:
                opener = text[first[0]]
                if opener not in b"{[":
                    raise TraceFormatError(
                        f"{path} is not a Chrome trace: it starts with "
                        f"{bytes([opener])!r}, not an object or an array"
                    )
                if opener == ord("["):
                    self.trace.form = "array"
                    return self._cut_prologue(int(first[0]) + 1, 2)
                found = self._find_events_key(text)
                if found is not None:
                    self.trace.form = "object"
                    return self._cut_prologue(found + 1, 3)
            if not more:
                raise TraceFormatError(
                    f"{path} is not a Chrome trace: no top-level traceEvents array"
                    if first.size
                    else f"{path} is empty"
                )

    def _find_events_key(self, text: np.ndarray) -> int | None:
        """Position of the ``[`` of the top-level ``traceEvents``, if already read."""
        st = scan(text)
        arrays = st.pos[(st.kind == _LBRACKET) & (st.depth == 2)]
        colons = np.flatnonzero((st.kind == _COLON) & (st.depth == 1))
        for bracket in arrays.tolist():
            before = int(np.searchsorted(st.pos[colons], bracket)) - 1
            colon = int(colons[before]) if before >= 0 else 0
            if colon < 2 or not (st.kind[colon - 2] == st.kind[colon - 1] == _QUOTE_MARK):
                continue
            if bytes(text[st.pos[colon - 2] + 1 : st.pos[colon - 1]]) == b"traceEvents":
                return bracket
        return None

    def _cut_prologue(self, end: int, depth: int) -> int:
        check_utf8(self.trace.path, self.pending[:end], 0)
        self.trace.prologue = self.pending[:end]
        self.pending = self.pending[end:]
        self.offset = end
        return depth

    def blocks(self, depth: int) -> Iterator[EventBlock]:
        """Complete events, block by block; at the array's end, the epilogue is read."""
        path = self.trace.path
        array_depth = depth - 1
        index = 0
        first_block = True
        while True:
            more = self._more()
            text = padded(self.pending)
            st = scan(text, array_depth)
            closes_array = st.pos[(st.kind == _RBRACKET) & (st.depth == array_depth - 1)]
            end = int(closes_array[0]) if closes_array.size else None
            within = st.pos < (end if end is not None else text.size)
            starts = st.pos[within & (st.kind == _LBRACE) & (st.depth == depth)]
            stops = st.pos[within & (st.kind == _RBRACE) & (st.depth == array_depth)] + 1
            complete = min(starts.size, stops.size)
            starts, stops = starts[:complete], stops[:complete]
            cut = int(stops[-1]) if complete else 0
            if end is not None:
                cut = end
            check_utf8(path, text[:cut], self.offset)
            self._check_between(text, st, starts, stops, cut, array_depth, first_block)
            if complete:
                first_block = False
                separators = _Separators.of(st)
                fields = _fields(text, st, separators, depth, starts, stops - 1, _EVENT_CODES)
                found = _ArgsQuery(st, separators, depth + 1, self.args_codes)
                yield EventBlock(
                    text, index, self.offset, path, starts, stops, fields, found, st.escapes
                )
                index += complete
            if end is not None:
                self.trace.events = index
                self._epilogue(end)
                return
            if not more:
                raise TraceFormatError(
                    f"{path} ends inside its events array after {index} complete events "
                    "(a truncated file?)"
                )
            self.offset += cut
            self.pending = self.pending[cut:]

    def _check_between(
        self,
        text: np.ndarray,
        st: Structure,
        starts: np.ndarray,
        stops: np.ndarray,
        cut: int,
        array_depth: int,
        first_block: bool,
    ) -> None:
        """Between events only whitespace and one comma each: every element an object."""
        gaps_from = np.concatenate([[0], stops])
        gaps_to = np.concatenate([starts, [cut]])
        seen = _solid_bytes(text, gaps_from, gaps_to)
        expected = np.ones(seen.size, np.int64)
        expected[-1] = 0
        if first_block:
            expected[0] = 0
        commas = st.pos[(st.kind == _COMMA) & (st.depth == array_depth) & (st.pos < cut)]
        wrong = np.flatnonzero(seen != expected)
        if wrong.size == 0 and commas.size == int(expected.sum()):
            return
        gap = int(wrong[0]) if wrong.size else int(np.searchsorted(gaps_to, commas[0]))
        raise TraceFormatError(
            f"{_where(self.trace.path, self.offset + int(gaps_from[gap]))}: the events array "
            "holds something other than comma-separated objects there"
        )

    def _epilogue(self, end: int) -> None:
        while self._more():
            pass
        self.trace.epilogue = self.pending[end:]
        check_utf8(self.trace.path, self.trace.epilogue, self.offset + end)
        tail = np.frombuffer(self.trace.epilogue, np.uint8)
        st = scan(tail, 1 if self.trace.form == "array" else 2)
        closed = np.flatnonzero((st.depth == 0) & (st.kind != _QUOTE_MARK))
        if closed.size == 0:
            raise TraceFormatError(
                f"{self.trace.path}: the text after the events array does not close the "
                "document (a truncated file?)"
            )
        trailing = tail[int(st.pos[closed[0]]) + 1 :]
        if (~_SPACE[trailing]).any():
            raise TraceFormatError(f"{self.trace.path}: text follows the end of the document")


def read_trace(path: Path | str, *, args_keys: tuple[str, ...] = ARGS_KEYS) -> TraceText:
    """Open a trace (``.json`` or gzipped) for scanning: ``blocks`` yields its events, each
    block scanned on a thread while the one before is used; ``prologue``, ``epilogue``
    and ``events`` are known once the blocks are exhausted. ``args_keys`` are the fields
    of ``args`` to find (the others read as absent).

    Raises ``TraceFormatError`` when the file is not a regular file or not a Chrome trace,
    is truncated, is not UTF-8, or holds something other than objects in its events
    array. Use it as a context manager (or ``close`` it) so that a reader stopped early
    releases its thread and file at once.
    """
    path = Path(path)
    try:
        source, compressed = open_text(path)
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}") from exc
    trace = TraceText(path, compressed=compressed, source=source)
    codes = {key: _ARGS_CODES[key] for key in args_keys}

    def generate() -> Generator[EventBlock, None, None]:
        with source:
            reader = _Reader(trace, source, codes)
            try:
                depth = reader.prologue()
                yield from reader.blocks(depth)
            except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
                raise TraceFormatError(f"cannot read {path}: {exc}") from exc

    trace.blocks = ahead(generate(), "mcprof-trace-scan")
    return trace
