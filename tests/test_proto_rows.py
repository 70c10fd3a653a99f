"""``proto_rows``: numpy-encoded protobuf messages are the bytes the official runtime writes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from multicore_profiler.export import proto_rows
from multicore_profiler.export.proto_rows import Fragments, Messages, encode_field

MASK = (1 << 64) - 1
INTEGER_TYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
ROWS = st.integers(0, 12)


def rows_of(messages: Messages) -> list[bytes]:
    """Each row's bytes, cut from ``encode`` at ``sizes``."""
    data, sizes = messages.encode(), messages.sizes()
    ends = np.cumsum(sizes).tolist()
    assert len(data) == (ends[-1] if ends else 0)
    return [data[end - size : end] for end, size in zip(ends, sizes.tolist(), strict=True)]


@pytest.mark.parametrize(
    ("value", "dtype", "expected"),
    [
        (0, np.uint8, "0800"),
        (1, np.int64, "0801"),
        (127, np.uint64, "087f"),
        (128, np.int16, "088001"),
        (300, np.uint32, "08ac02"),
        (2**63 - 1, np.int64, "08ffffffffffffffff7f"),
        (2**64 - 1, np.uint64, "08ffffffffffffffffff01"),
        (-1, np.int64, "08ffffffffffffffffff01"),
        (-1, np.int8, "08ffffffffffffffffff01"),
        (-(2**63), np.int64, "0880808080808080808001"),
    ],
)
def test_varint_bytes(value: int, dtype: type, expected: str) -> None:
    column = Messages(1).varint(1, np.array([value], dtype))
    scalar = Messages(1).varint(1, value)
    assert column.encode().hex() == scalar.encode().hex() == expected
    assert encode_field(1, value).hex() == expected
    assert column.sizes().tolist() == [len(expected) // 2]


def test_mixed_lengths_and_absent_rows() -> None:
    values = np.array([300, 0, 2**35, 5, 128], np.uint64)
    present = np.array([True, False, True, True, False])
    messages = Messages(5).varint(3, values, present).varint(2**29 - 1, 1)
    assert [row.hex() for row in rows_of(messages)] == [
        "18ac02f8ffffff0f01",
        "f8ffffff0f01",
        "18808080808001f8ffffff0f01",
        "1805f8ffffff0f01",
        "f8ffffff0f01",
    ]


def test_fixed64_and_repeated_with_empty_rows() -> None:
    fixed = Messages(2).fixed64(5, np.array([0x0102030405060708, -2], np.int64))
    assert [row.hex() for row in rows_of(fixed)] == ["290807060504030201", "29feffffffffffffff"]
    assert encode_field(5, -2, fixed64=True).hex() == "29feffffffffffffff"
    flat = np.array([9, 1, 2**64 - 1, 9], np.uint64)
    repeated = Messages(3).repeated_fixed64(47, flat, np.array([1, 1, 3, 3]))
    assert [row.hex() for row in rows_of(repeated)] == [
        "",
        "f9020100000000000000f902ffffffffffffffff",
        "",
    ]


def test_nested_absent_and_raw() -> None:
    inner = Messages(3).varint(1, np.array([150, 1, 2], np.int32))
    middle = Messages(3).message(11, inner, np.array([True, True, False]))
    outer = Messages(3).raw(b"\x10\x07").message(1, middle).raw(b"\xaa", np.array([0, 1, 1], bool))
    assert [row.hex() for row in rows_of(outer)] == [
        "10070a055a03089601",
        "10070a045a020801aa",
        "10070a00aa",
    ]


def test_lookup_entries_of_any_length() -> None:
    table = [b"", b"\x10\x01", encode_field(23, "ab")]
    assert table[2].hex() == "ba01026162"
    codes = np.array([2, 0, 1, 2, -5], np.int64)
    present = np.array([True, True, True, True, False])
    messages = Messages(5).raw(b"\x08\x01").lookup(table, codes, present)
    assert [row.hex() for row in rows_of(messages)] == [
        "0801ba01026162",
        "0801",
        "08011001",
        "0801ba01026162",
        "0801",
    ]


def test_encode_field_kinds() -> None:
    assert encode_field(23, "é").hex() == "ba0102c3a9"
    assert encode_field(2, b"").hex() == "1200"
    assert encode_field(2, b"\x00" * 200)[:3].hex() == "12c801"
    assert encode_field(1, True).hex() == "0801"
    with pytest.raises(ValueError, match="fixed64 needs an integer"):
        encode_field(1, "x", fixed64=True)
    with pytest.raises(ValueError, match="does not fit 64 bits"):
        encode_field(1, 2**64)


def test_invalid_arguments_are_refused() -> None:
    three = Messages(3)
    column = np.arange(3)
    cases = [
        (lambda: three.varint(0, column), "field number 0 outside"),
        (lambda: three.varint(2**29, column), "outside 1..536870911"),
        (lambda: three.varint(1, np.arange(4)), "values: a column of 3 rows"),
        (lambda: three.varint(1, column.astype(float)), "an integer column"),
        (lambda: three.varint(1, column, np.ones(3, np.int8)), "present: an integer column"),
        (lambda: three.fixed64(1, column, np.ones(2, bool)), "present: a column of 3"),
        (lambda: three.lookup([b"a"], np.array([0, 1, 0])), "codes outside the table of 1"),
        (lambda: three.lookup([b"a"], np.array([0, -1, 0])), "codes outside"),
        (lambda: three.repeated_fixed64(1, column, np.array([0, 2, 1, 3])), "non-decreasing"),
        (lambda: three.repeated_fixed64(1, column, np.array([0, 1, 2, 4])), "non-decreasing"),
        (lambda: three.repeated_fixed64(1, column, np.array([0, 1, 2])), "4 integer offsets"),
        (lambda: three.message(1, Messages(2)), "sub: 3 rows expected"),
        (lambda: three.message(1, three), "another Messages"),
        (lambda: three.raw("text"), "data: bytes"),
        (lambda: Messages(-1), "non-negative"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    sub = Messages(3).varint(1, 1)
    Messages(3).message(1, sub)
    with pytest.raises(ValueError, match="already nested"):
        sub.varint(2, 2)
    target = np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match="rows outside out's 10 bytes"):
        sub.write_into(target, np.array([0, 4, 9]))
    with pytest.raises(ValueError, match="rows outside"):
        sub.write_into(target, np.array([-1, 4, 6]))
    with pytest.raises(ValueError, match="1-D uint8"):
        sub.write_into(target.astype(np.int8), np.array([0, 2, 4]))


def test_sizes_cached_and_read_only() -> None:
    messages = Messages(2).varint(1, np.array([1, 300]))
    sizes = messages.sizes()
    assert sizes is messages.sizes()
    assert sizes.tolist() == [2, 3]
    assert not sizes.flags.writeable
    messages.raw(b"\x00")
    assert messages.sizes().tolist() == [3, 4]


# The official runtime as reference: fields are added in field-number order, as it writes them.


def values(rows: int) -> st.SearchStrategy[np.ndarray | int]:
    """One integer for every row, or a column of any integer type (some non-contiguous)."""
    column = st.sampled_from(INTEGER_TYPES).flatmap(
        lambda dtype: st.one_of(arrays(dtype, rows), arrays(dtype, 2 * rows).map(lambda a: a[::2]))
    )
    return st.one_of(st.integers(-(2**63), 2**64 - 1), column)


def presence(rows: int) -> st.SearchStrategy[np.ndarray | None]:
    return st.one_of(st.none(), arrays(np.bool_, rows))


def at(column: np.ndarray | int, row: int) -> int:
    """The 64 bits of row ``row`` of ``column``, unsigned."""
    return (int(column) if isinstance(column, int) else int(column[row])) & MASK


def signed(bits: int) -> int:
    return bits - (1 << 64) if bits >> 63 else bits


def present_rows(present: np.ndarray | None, rows: int) -> list[int]:
    return list(range(rows)) if present is None else np.flatnonzero(present).tolist()


@st.composite
def annotations(draw, rows: int, depth: int) -> tuple[Messages, list[pb.DebugAnnotation]]:
    """DebugAnnotations: name_iid, one of uint_value / int_value / double_value, dict_entries
    nested to ``depth``."""
    messages, refs = Messages(rows), [pb.DebugAnnotation() for _ in range(rows)]
    names, present = draw(values(rows)), draw(presence(rows))
    messages.varint(1, names, present)
    for row in present_rows(present, rows):
        refs[row].name_iid = at(names, row)
    kind = draw(st.sampled_from(["none", "uint", "int", "double"]))
    present = draw(presence(rows))
    if kind == "double":
        doubles = draw(arrays(np.float64, rows, elements=st.floats(allow_nan=False)))
        messages.fixed64(5, doubles.view(np.int64), present)
        for row in present_rows(present, rows):
            refs[row].double_value = float(doubles[row])
    elif kind != "none":
        column = draw(values(rows))
        messages.varint(3 if kind == "uint" else 4, column, present)
        for row in present_rows(present, rows):
            if kind == "uint":
                refs[row].uint_value = at(column, row)
            else:
                refs[row].int_value = signed(at(column, row))
    for _ in range(draw(st.integers(0, 2 if depth else 0))):
        sub, sub_refs = draw(annotations(rows, depth - 1))
        present = draw(presence(rows))
        messages.message(11, sub, present)
        for row in present_rows(present, rows):
            refs[row].dict_entries.add().CopyFrom(sub_refs[row])
    return messages, refs


@st.composite
def track_events(draw, rows: int) -> tuple[Messages, list[pb.TrackEvent]]:
    """TrackEvents: category_iids, debug_annotations, type, track_uuid, categories (a lookup
    of whole fields), name (raw), flow_ids (repeated fixed64)."""
    messages, refs = Messages(rows), [pb.TrackEvent() for _ in range(rows)]
    iids, present = draw(values(rows)), draw(presence(rows))
    messages.varint(3, iids, present)
    for row in present_rows(present, rows):
        refs[row].category_iids.append(at(iids, row))
    for _ in range(draw(st.integers(0, 2))):
        sub, sub_refs = draw(annotations(rows, 2))
        present = draw(presence(rows))
        messages.message(4, sub, present)
        for row in present_rows(present, rows):
            refs[row].debug_annotations.add().CopyFrom(sub_refs[row])
    types, present = draw(arrays(np.int8, rows, elements=st.integers(0, 4))), draw(presence(rows))
    messages.varint(9, types, present)
    for row in present_rows(present, rows):
        refs[row].type = int(types[row])
    uuids, present = draw(values(rows)), draw(presence(rows))
    messages.varint(11, uuids, present)
    for row in present_rows(present, rows):
        refs[row].track_uuid = at(uuids, row)
    table = draw(st.lists(st.lists(st.text(max_size=3), max_size=2), min_size=1, max_size=4))
    codes = draw(arrays(np.int16, rows, elements=st.integers(0, len(table) - 1)))
    present = draw(presence(rows))
    encoded = [b"".join(encode_field(22, name) for name in names) for names in table]
    messages.lookup(encoded, codes, present)
    for row in present_rows(present, rows):
        refs[row].categories.extend(table[codes[row]])
    name, present = draw(st.text(max_size=200)), draw(presence(rows))
    messages.raw(encode_field(23, name), present)
    for row in present_rows(present, rows):
        refs[row].name = name
    counts = draw(arrays(np.int64, rows, elements=st.integers(0, 3)))
    skipped = draw(st.integers(0, 2))
    flat = draw(arrays(np.uint64, skipped + int(counts.sum())))
    offsets = skipped + np.concatenate([[0], np.cumsum(counts)])
    messages.repeated_fixed64(47, flat, offsets)
    for row in range(rows):
        refs[row].flow_ids.extend(flat[offsets[row] : offsets[row + 1]].tolist())
    return messages, refs


@st.composite
def packets(draw) -> tuple[Messages, list[pb.TracePacket]]:
    """TracePackets: timestamp, trusted_packet_sequence_id (uint32), track_event."""
    rows = draw(ROWS)
    messages, refs = Messages(rows), [pb.TracePacket() for _ in range(rows)]
    stamps, present = draw(values(rows)), draw(presence(rows))
    messages.varint(8, stamps, present)
    for row in present_rows(present, rows):
        refs[row].timestamp = at(stamps, row)
    sequence = draw(st.one_of(st.integers(0, 2**32 - 1), arrays(np.uint32, rows)))
    messages.varint(10, sequence)
    for row in range(rows):
        refs[row].trusted_packet_sequence_id = at(sequence, row)
    event, event_refs = draw(track_events(rows))
    present = draw(presence(rows))
    messages.message(11, event, present)
    for row in present_rows(present, rows):
        refs[row].track_event.CopyFrom(event_refs[row])
    return messages, refs


@settings(max_examples=150, deadline=None)
@given(packets())
def test_same_bytes_as_the_official_runtime(shape: tuple[Messages, list[pb.TracePacket]]) -> None:
    messages, refs = shape
    ours = rows_of(messages)
    assert ours == [ref.SerializeToString() for ref in refs]
    assert [pb.TracePacket.FromString(row) for row in ours] == refs


@settings(max_examples=60, deadline=None)
@given(packets(), st.randoms(use_true_random=False), st.integers(1, 3))
def test_write_into_at_shuffled_offsets(shape, random, threads: int) -> None:
    messages, refs = shape
    expected = [ref.SerializeToString() for ref in refs]
    sizes = messages.sizes()
    assert sizes.dtype == np.int64
    assert sizes.tolist() == [len(row) for row in expected]
    order = list(range(messages.rows))
    random.shuffle(order)
    gaps = [random.randint(0, 3) for _ in order]
    offsets, end = np.zeros(messages.rows, np.int64), 0
    for row, gap in zip(order, gaps, strict=True):
        offsets[row], end = end + gap, end + gap + len(expected[row])
    out = np.full(end + 2, 0xEE, np.uint8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(proto_rows, "CHUNK_ROWS", 3)
        messages.write_into(out, offsets, threads=threads)
    written = np.zeros(len(out), bool)
    for row, data in enumerate(expected):
        assert out[offsets[row] : offsets[row] + len(data)].tobytes() == data
        written[offsets[row] : offsets[row] + len(data)] = True
    assert (out[~written] == 0xEE).all()


def test_a_table_flattened_once_looks_up_the_same() -> None:
    table = [b"\x10\x01", b"", encode_field(23, "ab")]
    codes = np.array([2, 1, 0, 2], np.int64)
    flattened = Fragments.of(table)
    assert len(flattened) == 3
    assert not flattened.uniform
    assert Fragments.of([b"ab", b"cd"]).uniform
    once = Messages(4).lookup(flattened, codes).encode()
    assert once == Messages(4).lookup(table, codes).encode()
    with pytest.raises(ValueError, match="bytes entries expected"):
        Fragments.of([b"a", "b"])  # type: ignore[list-item]
