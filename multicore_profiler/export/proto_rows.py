"""Protobuf messages for many rows at once, built with numpy: one message per row, no Python
per row.

A ``Messages`` is a list of parts over whole columns (varints, fixed64s, repeated fixed64s,
nested ``Messages``, pre-encoded bytes looked up by code or the same on every row). Each part
knows the size it takes in each row, so a row's size is the sum of its parts and each part's
bytes start where the previous part's end. A part is written a byte position at a time over all
its rows (a varint of at most 10 bytes takes at most 10 passes, and only the rows still long
enough take part in the later ones), chunk of rows by chunk of rows, so that the bytes a chunk
writes stay in cache; chunks are written on several threads (numpy releases the GIL while it
scatters). Wire format: https://protobuf.dev/programming-guides/encoding/ (tag =
field << 3 | wire type; varints little-endian base 128; int64 negatives as their 64-bit two's
complement, 10 bytes).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

CHUNK_ROWS = 65536
"""Rows written at once: their bytes (a few MB) stay in cache across the passes of every part."""

_MAX_FIELD = (1 << 29) - 1
_VARINT, _FIXED64, _LENGTH = 0, 1, 2
_VARINT_LIMITS = [1 << (7 * k) for k in range(1, 10)]
"""The smallest value of each varint length from 2 bytes on."""
_SEVEN = np.uint64(7)
_HIGH = np.uint8(0x80)
_LOW = np.uint8(0x7F)

Rows = slice | np.ndarray
"""The rows a write covers: a slice (a chunk of all rows) or an index array (present ones)."""


def _varint_bytes(value: int) -> bytes:
    """The varint of ``value`` (0 <= value < 2**64)."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    if isinstance(field, bool) or not isinstance(field, int | np.integer):
        raise ValueError(f"field number must be an integer, got {field!r}")
    if not 1 <= field <= _MAX_FIELD:
        raise ValueError(f"field number {field} outside 1..{_MAX_FIELD}")
    return _varint_bytes(int(field) << 3 | wire)


def _unsigned(value: int) -> int:
    """``value`` as the 64 bits protobuf encodes (negatives as two's complement)."""
    if isinstance(value, bool | np.bool_):
        return int(value)
    if not isinstance(value, int | np.integer):
        raise ValueError(f"an integer value expected, got {value!r}")
    if not -(1 << 63) <= int(value) < 1 << 64:
        raise ValueError(f"value {value} does not fit 64 bits")
    return int(value) & ((1 << 64) - 1)


def encode_field(field: int, value: int | str | bytes, *, fixed64: bool = False) -> bytes:
    """One field, tag included: a varint for an int (fixed64 when asked), a length-delimited
    payload for bytes or a UTF-8 str. For constants and ``lookup`` tables built in Python."""
    if isinstance(value, str | bytes):
        if fixed64:
            raise ValueError(f"fixed64 needs an integer, got {type(value).__name__}")
        data = value.encode() if isinstance(value, str) else value
        return _tag(field, _LENGTH) + _varint_bytes(len(data)) + data
    bits = _unsigned(value)
    if fixed64:
        return _tag(field, _FIXED64) + bits.to_bytes(8, "little")
    return _tag(field, _VARINT) + _varint_bytes(bits)


def _varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each of ``values`` (uint64; as uint8), from comparisons with the
    smallest value of each length, up to the largest length present."""
    lengths = np.ones(len(values), np.uint8)
    top = int(values.max()) if values.size else 0
    for limit in _VARINT_LIMITS:
        if top < limit:
            break
        lengths += values >= np.uint64(limit)
    return lengths


def _put_constant(out: np.ndarray, pos: np.ndarray, data: bytes) -> None:
    """Write ``data`` at each of ``pos``."""
    if not pos.size:
        return
    at = pos.copy()
    for byte in data:
        out[at] = byte
        at += 1


def _put_varint(
    out: np.ndarray, pos: np.ndarray, values: np.ndarray, lengths: np.ndarray, prefix: bytes
) -> None:
    """Write ``prefix`` then the varint of each of ``values`` (``lengths`` bytes) at ``pos``."""
    if not pos.size:
        return
    at = pos + 0
    for byte in prefix:
        out[at] = byte
        at += 1
    short, long = int(lengths.min()), int(lengths.max())
    values = values.copy()
    for k in range(long):
        if k >= short:
            keep = lengths > k
            at, values, lengths = at[keep], values[keep], lengths[keep]
        low = values.astype(np.uint8)
        if k + 1 < short:
            low |= _HIGH
        elif k + 1 < long:
            low &= _LOW
            low |= (lengths > k + 1).view(np.uint8) << np.uint8(7)
        out[at] = low
        at += 1
        values >>= _SEVEN


def _put_fixed64(out: np.ndarray, pos: np.ndarray, values: np.ndarray, prefix: bytes) -> None:
    """Write ``prefix`` then each of ``values`` (uint64) as 8 bytes little-endian at ``pos``."""
    if not pos.size:
        return
    at = pos + 0
    for byte in prefix:
        out[at] = byte
        at += 1
    octets = np.ascontiguousarray(values, "<u8").view(np.uint8).reshape(-1, 8)
    for k in range(8):
        out[at] = octets[:, k]
        at += 1


def _put_gathered(
    out: np.ndarray, pos: np.ndarray, flat: np.ndarray, src: np.ndarray, lengths: np.ndarray
) -> None:
    """Write ``flat[src[i]:src[i] + lengths[i]]`` at each ``pos[i]``."""
    if not pos.size:
        return
    short, long = int(lengths.min()), int(lengths.max())
    at = pos + 0
    for k in range(long):
        if k >= short:
            keep = lengths > k
            at, src, lengths = at[keep], src[keep], lengths[keep]
        out[at] = flat[src]
        at += 1
        src += 1


def _chosen(present: np.ndarray | None, pos: np.ndarray, rows: Rows) -> tuple[np.ndarray, Rows]:
    """The positions and rows among ``rows`` where ``present``."""
    if present is None:
        return pos, rows
    mask = present[rows]
    if isinstance(rows, slice):
        return pos[mask], np.flatnonzero(mask) + rows.start
    return pos[mask], rows[mask]


def _sized(unit: int | np.ndarray, present: np.ndarray | None) -> int | np.ndarray:
    """Sizes of a part taking ``unit`` bytes in each row where ``present``."""
    if present is None:
        return unit
    return np.where(present, unit, 0)


@dataclass(frozen=True)
class _Constant:
    """The same bytes on every (present) row."""

    data: bytes
    present: np.ndarray | None
    sizes: int | np.ndarray

    def write(self, out: np.ndarray, pos: np.ndarray, rows: Rows) -> None:
        _put_constant(out, _chosen(self.present, pos, rows)[0], self.data)


@dataclass(frozen=True)
class _Varint:
    """A varint field: tag, then each row's value (uint64 bits) in ``lengths`` bytes."""

    tag: bytes
    values: np.ndarray
    lengths: np.ndarray
    present: np.ndarray | None
    sizes: np.ndarray

    def write(self, out: np.ndarray, pos: np.ndarray, rows: Rows) -> None:
        pos, rows = _chosen(self.present, pos, rows)
        _put_varint(out, pos, self.values[rows], self.lengths[rows], self.tag)


@dataclass(frozen=True)
class _Fixed64:
    """A fixed64 field: tag, then each row's 8 bytes."""

    tag: bytes
    values: np.ndarray
    present: np.ndarray | None
    sizes: int | np.ndarray

    def write(self, out: np.ndarray, pos: np.ndarray, rows: Rows) -> None:
        pos, rows = _chosen(self.present, pos, rows)
        _put_fixed64(out, pos, self.values[rows], self.tag)


@dataclass(frozen=True)
class _Repeated:
    """One fixed64 field per value of each row's list: ``flat[starts[i]:][:counts[i]]``."""

    tag: bytes
    flat: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    sizes: np.ndarray

    def write(self, out: np.ndarray, pos: np.ndarray, rows: Rows) -> None:
        counts = self.counts[rows]
        total = int(counts.sum())
        if not total:
            return
        step = len(self.tag) + 8
        before = np.cumsum(counts) - counts
        serial = np.arange(total, dtype=np.int64)
        src = np.repeat(self.starts[rows] - before, counts) + serial
        at = np.repeat(pos - before * step, counts) + serial * step
        _put_fixed64(out, at, self.flat[src], self.tag)


@dataclass(frozen=True)
class Fragments:
    """A table of pre-encoded byte strings for ``Messages.lookup``, flattened once into one
    buffer with each entry's start and length."""

    flat: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    uniform: bool
    """Whether every entry has the same length."""

    @classmethod
    def of(cls, entries: Sequence[bytes]) -> Fragments:
        """The table of ``entries`` (``ValueError`` for one that is not bytes)."""
        if not all(isinstance(entry, bytes) for entry in entries):
            raise ValueError("table: bytes entries expected")
        lengths = np.array([len(entry) for entry in entries], np.int64)
        return cls(
            np.frombuffer(b"".join(entries), np.uint8),
            np.cumsum(lengths) - lengths,
            lengths,
            len(set(lengths.tolist())) == 1,
        )

    def __len__(self) -> int:
        return len(self.lengths)


@dataclass(frozen=True)
class _Lookup:
    """Each row's table entry: ``flat[starts[c]:][:lengths[c]]`` for its code ``c``."""

    flat: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    codes: np.ndarray
    present: np.ndarray | None
    sizes: int | np.ndarray

    def write(self, out: np.ndarray, pos: np.ndarray, rows: Rows) -> None:
        pos, rows = _chosen(self.present, pos, rows)
        codes = self.codes[rows]
        _put_gathered(out, pos, self.flat, self.starts[codes], self.lengths[codes])


@dataclass(frozen=True)
class _Nested:
    """A length-delimited field whose payload is row i of ``sub`` (``payload`` bytes)."""

    tag: bytes
    sub: Messages
    payload: np.ndarray
    lengths: np.ndarray
    present: np.ndarray | None
    sizes: np.ndarray

    def write(self, out: np.ndarray, pos: np.ndarray, rows: Rows) -> None:
        pos, rows = _chosen(self.present, pos, rows)
        lengths = self.lengths[rows]
        _put_varint(out, pos, self.payload[rows], lengths, self.tag)
        self.sub._write(out, pos + len(self.tag) + lengths, rows)


_Part = _Constant | _Varint | _Fixed64 | _Repeated | _Lookup | _Nested


class Messages:
    """``rows`` messages of one type, built field by field over whole columns; fields are
    written in the order they are added (add them in field-number order to get the bytes the
    official serializer writes)."""

    def __init__(self, rows: int) -> None:
        if isinstance(rows, bool) or not isinstance(rows, int | np.integer) or rows < 0:
            raise ValueError(f"rows must be a non-negative integer, got {rows!r}")
        self.rows = int(rows)
        self._parts: list[_Part] = []
        self._sizes: np.ndarray | None = None
        self._nested = False

    def _add(self, part: _Part) -> Messages:
        if self._nested:
            raise ValueError("fields added to a Messages already nested in another one")
        last = self._parts[-1] if self._parts else None
        if (
            isinstance(part, _Constant)
            and isinstance(last, _Constant)
            and part.present is None
            and last.present is None
        ):
            part = _Constant(last.data + part.data, None, len(last.data) + len(part.data))
            self._parts.pop()
        self._parts.append(part)
        self._sizes = None
        return self

    def _column(self, name: str, values: np.ndarray, kinds: str = "iub") -> np.ndarray:
        values = np.asarray(values)
        if values.shape != (self.rows,):
            raise ValueError(f"{name}: a column of {self.rows} rows expected, got {values.shape}")
        if values.dtype.kind not in kinds:
            raise ValueError(f"{name}: an integer column expected, got {values.dtype}")
        return values

    def _present(self, present: np.ndarray | None) -> np.ndarray | None:
        if present is None:
            return None
        return self._column("present", present, "b")

    def _bits(self, values: np.ndarray | int) -> np.ndarray | int:
        """``values`` as the 64 bits protobuf encodes: a uint64 column, or one int."""
        if isinstance(values, np.ndarray):
            values = self._column("values", values)
            if values.dtype.kind == "i":
                return values.astype(np.int64, copy=False).view(np.uint64)
            return values.astype(np.uint64, copy=False)
        return _unsigned(values)

    def varint(
        self, field: int, values: np.ndarray | int, present: np.ndarray | None = None
    ) -> Messages:
        """Wire type 0. ``values``: one integer for every row, or an integer array of ``rows``
        (any int dtype incl. uint64; negative int64 values are encoded as protobuf int64, 10
        bytes). ``present`` (bool array): rows without it get no field at all."""
        tag, bits, present = _tag(field, _VARINT), self._bits(values), self._present(present)
        if isinstance(bits, int):
            data = tag + _varint_bytes(bits)
            return self._add(_Constant(data, present, _sized(len(data), present)))
        lengths = _varint_lengths(bits)
        return self._add(_Varint(tag, bits, lengths, present, _sized(lengths + len(tag), present)))

    def fixed64(
        self, field: int, values: np.ndarray | int, present: np.ndarray | None = None
    ) -> Messages:
        """Wire type 1, 8 bytes little-endian."""
        tag, bits, present = _tag(field, _FIXED64), self._bits(values), self._present(present)
        if isinstance(bits, int):
            data = tag + bits.to_bytes(8, "little")
            return self._add(_Constant(data, present, _sized(len(data), present)))
        return self._add(_Fixed64(tag, bits, present, _sized(len(tag) + 8, present)))

    def repeated_fixed64(self, field: int, flat: np.ndarray, offsets: np.ndarray) -> Messages:
        """Row i gets one wire-type-1 field per value flat[offsets[i]:offsets[i+1]] (not packed:
        proto2 `repeated fixed64` as Perfetto declares flow_ids). ``offsets`` has rows + 1
        entries (an Arrow list array's offsets)."""
        tag = _tag(field, _FIXED64)
        flat, offsets = np.asarray(flat), np.asarray(offsets)
        if flat.ndim != 1 or flat.dtype.kind not in "iub":
            raise ValueError(f"flat: a 1-D integer array expected, got {flat.dtype} {flat.shape}")
        if offsets.shape != (self.rows + 1,) or offsets.dtype.kind not in "iu":
            raise ValueError(
                f"offsets: {self.rows + 1} integer offsets expected, got "
                f"{offsets.dtype} {offsets.shape}"
            )
        offsets = offsets.astype(np.int64)
        counts = np.diff(offsets)
        if (counts < 0).any() or offsets[0] < 0 or offsets[-1] > len(flat):
            raise ValueError(
                f"offsets must be non-decreasing within the {len(flat)} values of flat"
            )
        bits = flat.astype(np.int64).view(np.uint64) if flat.dtype.kind == "i" else flat
        return self._add(
            _Repeated(tag, bits.astype(np.uint64), offsets[:-1], counts, counts * (len(tag) + 8))
        )

    def message(self, field: int, sub: Messages, present: np.ndarray | None = None) -> Messages:
        """Wire type 2 with ``sub``'s row i as the payload of row i (``sub.rows == rows``);
        ``present``: rows without it get no field. Nesting to any depth. ``sub`` is complete
        then: fields added to it later are refused."""
        tag, present = _tag(field, _LENGTH), self._present(present)
        if not isinstance(sub, Messages) or sub is self:
            raise ValueError(f"sub must be another Messages, got {sub!r}")
        if sub.rows != self.rows:
            raise ValueError(f"sub: {self.rows} rows expected, got {sub.rows}")
        payload = sub.sizes()
        sub._nested = True
        lengths = _varint_lengths(payload.view(np.uint64))
        sizes = _sized(len(tag) + lengths + payload, present)
        return self._add(_Nested(tag, sub, payload.view(np.uint64), lengths, present, sizes))

    def lookup(
        self,
        table: Fragments | Sequence[bytes],
        codes: np.ndarray,
        present: np.ndarray | None = None,
    ) -> Messages:
        """Pre-encoded bytes (whole fields, tags included, any length, may be b"") chosen per row
        by ``codes`` (int array of rows) from a small table: per-core annotations, interned
        strings. Codes of rows not ``present`` are not read. A table looked up many times is
        best flattened once (``Fragments``)."""
        table = table if isinstance(table, Fragments) else Fragments.of(table)
        codes, present = self._column("codes", codes, "iu"), self._present(present)
        chosen = codes if present is None else codes[present]
        if chosen.size and (int(chosen.min()) < 0 or int(chosen.max()) >= len(table)):
            raise ValueError(
                f"codes outside the table of {len(table)}: {int(chosen.min())}..{int(chosen.max())}"
            )
        codes = codes.astype(np.intp) if present is None else np.where(present, codes, 0)
        lengths = table.lengths
        same = table.uniform and present is None
        sizes = int(lengths[0]) if same else _sized(lengths[codes], present)
        return self._add(_Lookup(table.flat, table.starts, lengths, codes, present, sizes))

    def raw(self, data: bytes, present: np.ndarray | None = None) -> Messages:
        """The same pre-encoded bytes on every (present) row."""
        if not isinstance(data, bytes):
            raise ValueError(f"data: bytes expected, got {type(data).__name__}")
        present = self._present(present)
        return self._add(_Constant(data, present, _sized(len(data), present)))

    def sizes(self) -> np.ndarray:
        """Encoded size of each row (int64), nested lengths included; computed once (read-only)."""
        if self._sizes is None:
            total = np.zeros(self.rows, np.int64)
            for part in self._parts:
                total += part.sizes
            total.flags.writeable = False
            self._sizes = total
        return self._sizes

    def _write(self, out: np.ndarray, pos: np.ndarray, rows: Rows) -> None:
        """Write ``rows`` at ``pos`` (one position per row of ``rows``)."""
        pos = pos.copy()
        for index, part in enumerate(self._parts):
            part.write(out, pos, rows)
            if index + 1 < len(self._parts):
                pos += part.sizes if isinstance(part.sizes, int) else part.sizes[rows]

    def write_into(self, out: np.ndarray, at: np.ndarray, threads: int | None = None) -> None:
        """Write row i's bytes to ``out`` (a uint8 array) at ``out[at[i]:at[i] + sizes[i]]``;
        rows may be written in any order and at any offsets (the writer interleaves the rows of
        several Messages, e.g. BEGIN and END packets, into one buffer in its own order).

        Chunks of rows are written on ``threads`` threads (default: one per CPU): numpy
        releases the GIL while it scatters, and the chunks' bytes do not overlap."""
        if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.ndim != 1:
            raise ValueError("out: a 1-D uint8 array expected")
        at = self._column("at", at, "iu").astype(np.int64)
        sizes = self.sizes()
        if self.rows and (int(at.min()) < 0 or int((at + sizes).max()) > len(out)):
            raise ValueError(f"at: rows outside out's {len(out)} bytes")

        def chunk(start: int) -> None:
            stop = min(start + CHUNK_ROWS, self.rows)
            self._write(out, at[start:stop], slice(start, stop))

        starts = range(0, self.rows, CHUNK_ROWS)
        workers = min(max(1, threads or os.cpu_count() or 1), len(starts))
        if workers <= 1:
            for start in starts:
                chunk(start)
            return
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for _ in pool.map(chunk, starts):
                pass

    def encode(self) -> bytes:
        """All rows back to back in row order (for tests and small messages)."""
        sizes = self.sizes()
        out = np.empty(int(sizes.sum()), np.uint8)
        self.write_into(out, np.cumsum(sizes) - sizes)
        return out.tobytes()
