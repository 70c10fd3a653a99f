"""Exact values from spans of JSON text: numbers as scaled int64, strings as Arrow arrays.

The trace reader (``trace_reader``) finds where each value's text is; this module reads
those texts, all of a column at once. Every number is read exactly or refused (a value
that does not fit int64 once scaled is ``overflow``), never through a float, in time that
does not grow with an exponent (``1e999999``). Strings are unquoted and their escapes
decoded; one that UTF-8 cannot hold (a lone surrogate escape) is refused.

A compiled JSON parser would give floats (inexact past 2^53) or Python objects per value;
these read a column's spans with Arrow's casts and numpy instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.errors import TraceFormatError


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


def where(path: Path, offset: int) -> str:
    """How messages name a byte of a trace's JSON text."""
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
                f"{where(path, offset + exc.start)}: invalid UTF-8 ({exc.reason}, byte "
                f"{view[exc.start]:#04x})"
            ) from None


PADDING = 32


def padded(data: bytes) -> np.ndarray:
    """``data`` as a uint8 array followed in memory by zero bytes, for ``windows``."""
    return np.frombuffer(data + bytes(PADDING), np.uint8)[: len(data)]


def windows(text: np.ndarray, width: int = 8) -> np.ndarray:
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


_WIDTH = 24
_POW10 = 10 ** np.arange(19, dtype=np.uint64)
_DIGIT_LIMIT = 19
_INT64_MAX = np.uint64((1 << 63) - 1)
_CAST_CHARS = 38
"""Longest value Arrow's cast reads here: its string -> decimal128 cast wraps round (or
gives 0) for literals of more than about 105 digits instead of failing."""


def numbers(text: np.ndarray, start: np.ndarray, stop: np.ndarray, decimals: int) -> Numbers:
    """Numbers parsed by Arrow where it can read them all exactly (``_cast_numbers``); else
    decimal numbers of up to 24 characters read with numpy, and the others (exponents,
    more digits) one by one (``_exact``). Never through a float."""
    cast = _cast_numbers(text, start, stop, decimals)
    return cast if cast is not None else _digit_numbers(text, start, stop, decimals)


def _cast_numbers(
    text: np.ndarray, start: np.ndarray, stop: np.ndarray, decimals: int
) -> Numbers | None:
    """Every present value read by Arrow's cast of its text (C++, a few times faster than
    reading digits with numpy): to int64 (scaled by 10^decimals), or else to a decimal
    with ``decimals`` places whose unscaled integer is the value x 10^decimals. ``None``
    when any value is not such a number (a word, more places, out of range, longer than
    ``_CAST_CHARS``): then none is taken from here."""
    present = start >= 0
    if text.size == 0 or not present.any():
        return None
    quoted = present & (text[np.maximum(start, 0)] == ord('"'))
    begin = start + quoted
    length = np.where(present, stop - quoted - begin, 0)
    if int(length.max()) > _CAST_CHARS:
        return None
    # Arrow's int64 cast also reads hex (0x10), which JSON does not have.
    after = np.minimum(begin[:, None] + (1, 2), text.size - 1)
    hexadecimal = (present[:, None] & ((text[after] | 0x20) == ord("x"))).any()
    if decimals == 0 and hexadecimal:
        return None
    views = string_views(text, begin, length, present)
    none = np.zeros(start.size, bool)
    if not hexadecimal:
        integers = _integer_cast(views)
        if integers is not None:
            limit = ((1 << 63) - 1) // 10**decimals
            if not ((integers >= -limit) & (integers <= limit)).all():
                return None
            return Numbers(integers * 10**decimals, present, quoted, none, none)
    if decimals == 0:
        return None
    # Arrow's decimal cast wraps a far negative exponent around instead of refusing it
    # (pyarrow 26: "486864e-71" reads as 7.056): exponents are read by _exact.
    if pc.any(pc.match_substring(views.cast(pa.string()), "e", ignore_case=True)).as_py():
        return None
    try:
        scaled = pc.cast(views, pa.decimal128(38, decimals))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    pairs = np.frombuffer(scaled.buffers()[1], np.int64).reshape(-1, 2)
    pairs = pairs[scaled.offset : scaled.offset + start.size]
    low, high = pairs[:, 0], pairs[:, 1]
    if not (high == (low >> 63))[present].all():
        return None
    return Numbers(np.where(present, low, 0), present, quoted, none, none)


def _integer_cast(views: pa.Array) -> np.ndarray | None:
    """The values as int64 (0 where null), or ``None`` unless every one is an integer:
    Arrow's int64 cast is about 3 times faster than its decimal one, and kineto writes
    its times as integer microseconds."""
    try:
        # Nulls filled first: an int64 array with nulls would come out as float64.
        return pc.fill_null(pc.cast(views, pa.int64()), 0).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


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
    chars = windows(text, width)[np.minimum(begin, text.size - 1)]
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


def string_views(
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
        head, tail = np.ascontiguousarray(windows(text, 16)[at]).view("<u8").T
    else:
        head = tail = np.zeros(count, np.uint64)
    size = length.astype(np.uint64)
    first = size | (_low_bytes(head, np.minimum(size, 4)) << _U32)
    inline = _low_bytes((head >> _U32) | (tail << _U32), np.maximum(size, 4) - 4)
    second = np.where(length <= 12, inline, begin.astype(np.uint64) << _U32)
    validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    views = pa.py_buffer(np.stack([first, second], axis=1))
    return pa.Array.from_buffers(pa.string_view(), count, [validity, views, pa.py_buffer(text)])


class BadString(ValueError):
    """A string value whose escapes cannot be decoded: ``row`` is its row in the block."""

    def __init__(self, message: str, row: int) -> None:
        super().__init__(message)
        self.row = row


def _decoded(raw: bytes, row: int) -> str:
    """One JSON string with escapes, decoded; ``BadString`` when it cannot be."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        reason = str(exc).split(":", 1)[0]
        if re.search(rb"\\u[dD][89a-fA-F]", raw):
            reason = f"{reason} (a lone UTF-16 surrogate escape)"
        raise BadString(reason, row) from None


def strings(
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
    array = string_views(text, begin, length, valid).cast(pa.string())
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
