"""The trace reader's bounds on crafted traces: whitespace between events is skipped, not
held; one event holds at most ``EVENT_BYTES_MAX`` bytes and the text around the events
array ``FIELDS_BYTES_MAX`` (each past it a ``TraceFormatError`` naming the file and the
byte); the search for the top-level ``traceEvents`` key looks at each byte once; and a
second top-level ``traceEvents`` key is refused. The limits are lowered so that every
case is small."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multicore_profiler.errors import TraceFormatError
from multicore_profiler.ingest import trace_reader
from multicore_profiler.ingest.outer_trace import events_table


def write(folder: Path, text: str | bytes, name: str = "t.json") -> Path:
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def names(path: Path) -> list[str | None]:
    """Every event's name, as the reader gives it."""
    with trace_reader.read_trace(path) as trace:
        return [name for block in trace.blocks for name in block.strings("name").to_pylist()]


def refusal(path: Path) -> str:
    """The message of the ``TraceFormatError`` reading ``path`` ends in."""
    with pytest.raises(TraceFormatError) as raised, trace_reader.read_trace(path) as trace:
        list(trace.blocks)
    return str(raised.value)


# Whitespace between events: skipped as it is read, never held.

SPACES = 24 << 20
"""Spaces in each gap of the generated trace: 72 MiB of text in all, gzipped to 72 KiB."""


def spaced_trace(path: Path) -> None:
    """A gzipped trace of three events with ``SPACES`` spaces after the array's ``[``,
    after a comma, and after the last event (written a MiB at a time)."""
    gap = b" " * (1 << 20)
    parts = [b'{"traceEvents": [', b'{"name": "a"},', b'{"name": "b"}', b', {"name": "c"}']
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(parts[0])
        for part in parts[1:]:
            for _ in range(SPACES >> 20):
                out.write(gap)
            out.write(part)
        out.write(b"]}")


def test_whitespace_between_events_is_skipped_not_held(tmp_path: Path, monkeypatch) -> None:
    """Before, each gap was held whole and searched again at every chunk read (512 MiB
    took 49 s and 2.2 GB in the issue): the read now holds a few chunks, whatever the
    gaps (4.3 MB at its peak here, against 24 MiB for one gap's text)."""
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 1 << 20)
    path = tmp_path / "t.json.gz"
    spaced_trace(path)
    tracemalloc.start()
    try:
        with trace_reader.read_trace(path) as trace:
            sizes = [(len(block), block.offset, block.text.size) for block in trace.blocks]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert trace.text_bytes == 3 * SPACES + 61
    assert trace.events == 3
    assert trace.fields == {}
    assert trace.epilogue == b"]}"
    # Each block is one event (and the space before "c"), at its exact byte.
    assert sizes == [(1, 17 + SPACES, 13), (1, 31 + 2 * SPACES, 13), (1, 45 + 3 * SPACES, 14)]
    assert peak < 8 << 20, peak


def test_whitespace_and_chunks_in_every_place_read_the_same(tmp_path: Path, monkeypatch) -> None:
    """Gaps longer than a chunk before, between and after events (and inside one, as
    part of it), read in chunks of many sizes; the byte of an event is still exact."""
    gap = " " * 300
    text = (
        f'{{"traceEvents": [{gap}{{"name": "a"}}{gap},{gap}{{"name":{gap}"b"}}'
        f'{gap}, {{"name": "c", "ts": 1e999999}}{gap}]{gap}, "x": 1}}{gap}'
    )
    path = write(tmp_path, text)
    for size in (1, 7, 64, 256, 1000, 1 << 20):
        monkeypatch.setattr(trace_reader, "CHUNK_BYTES", size)
        with trace_reader.read_trace(path) as trace:
            blocks = list(trace.blocks)
            found = [name for block in blocks for name in block.strings("name").to_pylist()]
            with pytest.raises(TraceFormatError) as raised:
                events_table(blocks[-1])
        assert found == ["a", "b", "c"], size
        assert trace.fields == {"x": 1}
        assert f"at byte {text.index('1e999999')} of its JSON text" in str(raised.value)


def test_text_that_follows_an_event_but_no_comma_is_refused_at_its_byte(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 64)
    text = '{"traceEvents": [{"name": "a"}' + " " * 100 + '{"name": "b"}]}'
    path = write(tmp_path, text)
    assert refusal(path) == (
        f"{path}: at byte {len(text) - 15} of its JSON text: the events array holds "
        "something other than comma-separated objects there (b'{' follows an event)"
    )


def test_a_file_ending_after_an_event_and_whitespace_is_truncated(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 64)
    path = write(tmp_path, '{"traceEvents": [{"name": "a"}, {"name": "b"}' + " " * 200)
    assert refusal(path) == (
        f"{path} ends inside its events array after 2 complete events (a truncated file?)"
    )


# One event: at most EVENT_BYTES_MAX bytes, from its "{" to its "}".

LIMIT = 4096


@pytest.fixture
def small_limits(monkeypatch) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 256)
    monkeypatch.setattr(trace_reader, "EVENT_BYTES_MAX", LIMIT, raising=False)
    monkeypatch.setattr(trace_reader, "FIELDS_BYTES_MAX", LIMIT, raising=False)


def sized_event(size: int, field: str = "name") -> str:
    """An event of exactly ``size`` bytes whose ``field`` is a long string."""
    shell = f'{{"ph": "X", "{field}": ""}}' if field == "name" else '{"ph": "X", "args": {"a": ""}}'
    filler = "},{" * ((size - len(shell)) // 3) + "x" * ((size - len(shell)) % 3)
    event = shell.replace('""', f'"{filler}"')
    assert len(event) == size
    return event


@pytest.mark.usefixtures("small_limits")
@pytest.mark.parametrize("field", ["name", "args"])
def test_an_event_longer_than_the_limit_is_refused_naming_it_and_its_byte(
    tmp_path: Path, field: str
) -> None:
    """Before, such an event was read whole whatever its size (a 2 GiB string in a
    gzipped trace of 2 MB)."""
    small = ", ".join(['{"ph": "i", "name": "},{"}'] * 20)
    text = '{"traceEvents": [' + small + ",\n  " + sized_event(LIMIT + 1, field) + "]}"
    path = write(tmp_path, text)
    start = len('{"traceEvents": [' + small + ",\n  ")
    assert refusal(path) == (
        f"{path}: at byte {start} of its JSON text: event 20 holds more "
        f"than {LIMIT} bytes of JSON text, the most one event may hold"
    )


@pytest.mark.usefixtures("small_limits")
def test_an_event_of_the_limit_exactly_loads(tmp_path: Path) -> None:
    event = sized_event(LIMIT)
    path = write(tmp_path, "[" + event + ", " + event + ', {"name": "z"}]')
    assert names(path) == [json.loads(event)["name"]] * 2 + ["z"]


@pytest.mark.usefixtures("small_limits")
def test_whitespace_inside_an_event_counts_toward_it(tmp_path: Path) -> None:
    text = '[{"name": "a"}, {"name":' + " " * LIMIT + '"b"}]'
    path = write(tmp_path, text)
    assert refusal(path) == (
        f"{path}: at byte 16 of its JSON text: event 1 holds more than {LIMIT} bytes of JSON "
        "text, the most one event may hold"
    )


@pytest.mark.usefixtures("small_limits")
def test_small_events_holding_cuts_in_strings_are_never_taken_for_a_long_one(
    tmp_path: Path,
) -> None:
    """Each event's ``},`` is a cut that fails: the reader finds the events' ends exactly
    rather than reading on, so a trace of many such events (40 times the limit) loads."""
    events = [f'{{"name": "{i}}},{"x" * 60}"}}' for i in range(2000)]
    path = write(tmp_path, '{"traceEvents": [' + ", ".join(events) + "]}")
    assert names(path) == [f"{i}}},{'x' * 60}" for i in range(2000)]


# The text around the events array: at most FIELDS_BYTES_MAX bytes before, and after.


@pytest.mark.usefixtures("small_limits")
@pytest.mark.parametrize(
    "text",
    [
        '{"a": "' + "x" * 2 * LIMIT + '", "traceEvents": [{}]}',
        "{" + " " * 2 * LIMIT + '"traceEvents": [{}]}',
        '{"a": "' + "x" * 2 * LIMIT + '"}',
    ],
    ids=["string", "whitespace", "no-traceEvents"],
)
def test_text_before_the_events_past_the_limit_is_refused(tmp_path: Path, text: str) -> None:
    """Before, it was held whole, and searched again for the key at every chunk read."""
    path = write(tmp_path, text)
    assert refusal(path) == (
        f"{path}: at byte {LIMIT} of its JSON text: no top-level traceEvents array begins "
        f"before it: the text before the events array may hold at most {LIMIT} bytes"
    )


@pytest.mark.usefixtures("small_limits")
@pytest.mark.parametrize(
    "after", [', "a": "' + "x" * LIMIT + '"}', "}" + " " * LIMIT], ids=["string", "whitespace"]
)
def test_text_after_the_events_past_the_limit_is_refused(tmp_path: Path, after: str) -> None:
    text = '{"traceEvents": [{"name": "a"}, {"name": "b"}]' + after
    path = write(tmp_path, text)
    assert refusal(path) == (
        f"{path}: at byte {text.index(']')} of its JSON text: the text from the events "
        f"array's end holds more than {LIMIT} bytes, the most the text after it may hold"
    )


@pytest.mark.usefixtures("small_limits")
def test_text_around_the_events_of_the_limit_exactly_loads(tmp_path: Path) -> None:
    a = "x" * (LIMIT - len('{"a": "", "traceEvents": ['))
    b = "y" * (LIMIT - len('], "b": ""}'))
    path = write(tmp_path, f'{{"a": "{a}", "traceEvents": [{{"name": "e"}}], "b": "{b}"}}')
    with trace_reader.read_trace(path) as trace:
        assert [len(block) for block in trace.blocks] == [1]
    assert (len(trace.prologue), len(trace.epilogue)) == (LIMIT, LIMIT)
    assert trace.fields == {"a": a, "b": b}


def test_the_search_for_the_events_key_looks_at_each_byte_once(tmp_path: Path, monkeypatch) -> None:
    """A long text before the key (2 MiB, in chunks of 4 KiB, many ``traceEvents`` keys
    nested in it): before, every chunk read searched the whole text again (and parsed
    it again with ``json`` for each nested key), quadratic in its length."""
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 4096)
    scanned = []
    step = trace_reader._Structure.step

    def counted(self, piece: np.ndarray, marks: np.ndarray) -> tuple[np.ndarray, ...]:
        scanned.append(piece.size)
        return step(self, piece, marks)

    monkeypatch.setattr(trace_reader._Structure, "step", counted)
    nested = ", ".join(['{"traceEvents": [1, {"traceEvents": []}], "b": "x"}'] * 40_000)
    head = '{"a": [' + nested + '], "traceEvents": ['
    path = write(tmp_path, head + '{"name": "e"}]}')
    assert names(path) == ["e"]
    assert len(head) - len('"traceEvents": [') <= sum(scanned) <= len(head) + 2 * 4096


# A second top-level traceEvents key: which events the trace holds is ambiguous.


@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": [{"name": "a"}], "traceEvents": [{"name": "b"}, {"name": "c"}]}',
        '{"traceEvents": 5, "traceEvents": [{"name": "a"}]}',
        '{"traceEvents": [], "x": {"y": 1},\n "traceEvents" : {"a": []}}',
    ],
    ids=["two-arrays", "a-number-first", "an-object-after"],
)
def test_a_second_top_level_traceevents_key_is_refused(
    tmp_path: Path, monkeypatch, text: str
) -> None:
    """Before, the first array was read and the second dropped, silently, where JSON
    readers keep the last."""
    second = text.index('"traceEvents"', 2)
    for size in (1, 16, 1 << 20):
        monkeypatch.setattr(trace_reader, "CHUNK_BYTES", size)
        path = write(tmp_path, text)
        assert refusal(path) == (
            f"{path}: at byte {second} of its JSON text: traceEvents is a top-level key a "
            "second time (first at byte 1): which events the trace holds is ambiguous"
        )


@pytest.mark.parametrize(
    "text",
    [
        '{"x": {"traceEvents": [{"name": "no"}]}, "traceEvents": [{"name": "a"}]}',
        '{"traceEvents": [{"name": "a"}], "x": {"traceEvents": [{"name": "no"}]}}',
        '{"name": "traceEvents", "traceEvents": [{"name": "a"}], "n": ["traceEvents"]}',
        '{"s": "x\\\\", "t": "\\"", "traceEvents": [{"name": "a"}]}',
    ],
)
def test_nested_or_quoted_traceevents_are_not_the_key(
    tmp_path: Path, monkeypatch, text: str
) -> None:
    for size in (1, 16, 1 << 20):
        monkeypatch.setattr(trace_reader, "CHUNK_BYTES", size)
        assert names(write(tmp_path, text)) == ["a"]


# The structure the reader finds where a guess failed, against a byte-by-byte reference.


def reference_structure(text: bytes) -> tuple[list[tuple[bool, int]], int | None]:
    """For each byte, whether it is inside a string and the depth before it; and where
    the depth first falls below 0."""
    depth, inside, escaped, closed = 0, False, False, None
    states = []
    for at, byte in enumerate(text):
        states.append((inside, depth))
        char = chr(byte)
        if escaped:
            escaped = False
        elif inside:
            escaped = char == "\\"
            inside = char != '"'
        elif char == '"':
            inside = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth < 0 and closed is None:
                closed = at
    return states, closed


json_like = st.lists(
    st.one_of(
        st.sampled_from(["{", "}", "[", "]", ",", ":", " ", "1"]),
        st.text(alphabet='ab{}[],"\\', max_size=6).map(json.dumps),
    ),
    max_size=40,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=json_like, window=st.integers(1, 9))
def test_the_structure_matches_a_byte_by_byte_reference(text: str, window: int) -> None:
    """Strings holding escaped quotes and runs of backslashes, windows cut anywhere (so
    a run of backslashes or a string spans windows)."""
    data = text.encode()
    states, closed = reference_structure(data)
    marks = np.arange(len(data), dtype=np.int64)
    structure = trace_reader._Structure()
    original = trace_reader._SCAN_BYTES
    trace_reader._SCAN_BYTES = window
    try:
        inside, depth = structure.scan(data, 0, len(data), marks)
    finally:
        trace_reader._SCAN_BYTES = original
    assert list(zip(inside.tolist(), depth.tolist(), strict=True)) == states
    assert structure.closed_at == closed
