"""The trace reader (msgspec, chunked) against a plain-Python ``Decimal`` reference: every
column of every real fixture, chunks cut at every byte of a tricky trace, and random
events in every JSON form, all exact."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from exact_json import events_of, load, ns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_fixtures import shared_fixture

from multicore_profiler.errors import TraceFormatError
from multicore_profiler.ingest import trace_reader
from multicore_profiler.ingest.outer_trace import events_table

FIXTURES = [
    "kineto/a100_training_rank0.json.gz",
    "kineto/a100_alexnet.json.gz",
    "kineto/a100_triton_example.json.gz",
    "kineto/mi250_minitoy_train.json.gz",
    "ascend/torchnpu_advisor_trace_view.json.gz",
    "ascend/torchnpu_imagenet_2025_L0_rank0_trace_view.json.gz",
]


def integer(value: Any) -> int | None:
    """What an integer column holds: the integer a number is, else null."""
    if isinstance(value, bool):
        return None
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    return value if isinstance(value, int) else None


def text(value: Any) -> str | None:
    """What a string column holds: the string, or a number's (or object's) JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def reference(events: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The ``trace_events`` columns of ``events`` (read with ``Decimal`` numbers); ``args``
    as its parsed value (its text is checked apart)."""
    rows = []
    for index, event in enumerate(events):
        args = event.get("args")
        fields = args if isinstance(args, dict) else {}
        stream = integer(fields.get("stream"))
        pid, tid = event.get("pid"), event.get("tid")
        rows.append(
            {
                "event_index": index,
                "ph": text(event.get("ph")),
                "cat": text(event.get("cat")),
                "name": text(event.get("name")),
                "pid": integer(pid),
                "pid_name": pid if isinstance(pid, str) else None,
                "tid": integer(tid),
                "tid_name": tid if isinstance(tid, str) else None,
                "ts_ns": ns(event.get("ts")),
                "dur_ns": ns(event.get("dur")),
                "flow_id": text(event.get("id")),
                "correlation": integer(fields.get("correlation")),
                "external_id": integer(fields.get("External id")),
                "stream": stream if stream is not None else integer(fields.get("Stream Id")),
                "device": integer(fields.get("device")),
                "task_type": text(fields.get("Task Type")),
                "args": ("args" in event, args),
            }
        )
    return {key: [row[key] for row in rows] for key in rows[0]} if rows else {}


def read(path: Path) -> dict[str, list[Any]]:
    """Every column the reader gives, with ``args`` parsed back (and whether present)."""
    with trace_reader.read_trace(path) as trace:
        tables = [events_table(block) for block in trace.blocks]
    columns = pa.concat_tables(tables).to_pydict() if tables else {}
    if columns:
        columns["args"] = [
            (value is not None, None if value is None else json.loads(value, parse_float=Decimal))
            for value in columns["args"]
        ]
    return columns


@pytest.mark.parametrize("name", FIXTURES)
def test_every_column_of_every_fixture_matches_the_decimal_reference(name: str) -> None:
    path = shared_fixture(name)
    assert read(path) == reference(events_of(load(path)))


TRICKY = (
    '{"schemaVersion": 1, "note": "},{ and \\n  },\\n  { in a string", "traceEvents": [\n'
    '  {"ph": "X", "name": "a},{\\"ph\\": \\"X\\"}, {", "ts": 1.5, "dur": 2, "pid": 1,'
    ' "tid": "main", "args": {"correlation": 7, "text": "\\n  },\\n  {"}},\n'
    '  {"ph": "i", "name": "\\u00e9\\n\\\\", "ts": "1704161511420306.491", "pid": "proc",'
    ' "tid": -3, "id": 18446744073709551617}  ,\n'
    '  {"ph": "X", "name": "nested", "ts": 1e3, "dur": 0.0005, "args": {"list": [{"ph": '
    '"X", "a": 1}, {"b": [1, 2]}], "External id": 9, "stream": 7}},\n'
    '  {"ph": "f", "id": {"local": 1, "x": 2}, "ts": 3, "args": "not an object"},\n'
    "  {},\n"
    '  {"ph": "X", "name": "caf\u00e9 \u6f22", "cat": ",", "tid": "a,", "ts": -12.0015,'
    ' "args": {"Stream Id": 3, "Task Type": "AI_CORE,"}}\n'
    '], "displayTimeUnit": "ms", "after": [{"a": "},{"}, {"b": 2}]}'
)
"""Cut candidates inside strings (``},{``, ``}, {``), inside nested args, between events
after whitespace, and in the text after the array; an object where a scalar is expected
and a nested ``{"ph":`` (the general path); strings ending in a comma (``,"`` where no
key follows); non-ASCII text; no args, args of another type."""


def test_the_tricky_trace_reads_exactly(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(TRICKY)
    columns = read(path)
    assert columns == reference(json.loads(TRICKY, parse_float=Decimal)["traceEvents"])
    assert columns["flow_id"][:4] == [None, "18446744073709551617", None, '{"local": 1, "x": 2}']
    assert columns["ts_ns"] == [1500, 1_704_161_511_420_306_491, 1_000_000, 3000, None, -12_002]
    with trace_reader.read_trace(path) as trace:
        args = [value for block in trace.blocks for value in block.strings("args", raw=True)]
    assert [value.as_py() for value in args][:2] == [
        '{"correlation": 7, "text": "\\n  },\\n  {"}',
        None,
    ]
    assert trace.fields["after"] == [{"a": "},{"}, {"b": 2}]
    assert trace.epilogue.startswith(b"]")
    assert trace.text_bytes == len(TRICKY.encode())


@pytest.mark.parametrize(
    ("events", "split"),
    [
        ('{"ph": "X", "cat": ",", "name": "a,", "pid": "\\",", "ts": 1}', True),
        ('{"ph": "X", "args": {"ph": 1, "x": [{"ph": 2}]}}', False),
        ('{"ph": "X", "id": {"local": 1}}', False),
        ('{"ph": "X"}, {}', True),
    ],
)
def test_scalars_take_the_vectorized_split_and_nested_values_the_general_path(
    events: str, split: bool
) -> None:
    """Strings ending in a comma (``,"`` where no key follows) still split; a nested value
    where a scalar goes, or a nested ``{"ph":`` in args, takes the general path."""
    structs, _, exact = trace_reader._decoded(("[" + events + "]").encode())
    found = trace_reader._encoded(structs, trace_reader.EVENT_KEYS, len(events))
    assert exact
    assert (found is not None) == split
    if found is not None:
        texts = [
            [
                None if a < 0 else bytes(found.text[a:b]).decode()
                for a, b in zip(found.start[key], found.stop[key], strict=True)
            ]
            for key in trace_reader.EVENT_KEYS
        ]
        expected = [
            [None if v is None else json.dumps(v) for v in row]
            for row in zip(
                *[
                    [e.get(key) for key in trace_reader.EVENT_KEYS]
                    for e in json.loads(f"[{events}]")
                ],
                strict=True,
            )
        ]
        assert texts == expected


def test_chunks_cut_at_every_byte_read_the_same(tmp_path: Path, monkeypatch) -> None:
    """Every chunk size from 1 byte to the whole text, so that chunks end at every byte:
    at every event boundary, inside every string, inside the text around the events."""
    path = tmp_path / "t.json"
    path.write_text(TRICKY)
    whole = read(path)
    for size in range(1, len(TRICKY.encode()) + 1):
        monkeypatch.setattr(trace_reader, "CHUNK_BYTES", size)
        assert read(path) == whole, size


def test_blocks_grow_with_the_chunk_not_the_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 4096)
    event = '{"ph": "X", "name": "k", "ts": 1, "dur": 2, "args": {"correlation": 3}}'
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + ",\n".join([event] * 5000) + "]}")
    with trace_reader.read_trace(path) as trace:
        sizes = [(len(block), block.text.size) for block in trace.blocks]
    assert sum(count for count, _ in sizes) == 5000
    assert len(sizes) >= 5000 * (len(event) + 2) // 4096
    assert max(size for _, size in sizes) <= 4096


def test_a_cut_inside_a_huge_event_reads_on(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 64)
    big = '{"ph": "X", "name": "' + "},{" * 200 + '", "ts": 5}'
    path = tmp_path / "t.json"
    path.write_text(f'[{big}, {{"ph": "i", "ts": 6}}]')
    columns = read(path)
    assert columns["name"] == ["},{" * 200, None]
    assert columns["ts_ns"] == [5000, 6000]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ('{"ph": "X"},]', "other than comma-separated objects"),
        ('{"ph": "X"}, , {"ph": "X"}]', "other than comma-separated objects"),
        ('{"ph": "X", "ts": 1,}]', "at byte 37 of its JSON text"),
        ('{"ph": "X"}, "s"]', "event 1 is not an object"),
        ('{"x": ' + "[" * 3000 + "]" * 3000 + "}]", "nests too deeply"),
    ],
)
def test_a_malformed_events_array_names_what_and_where(
    tmp_path: Path, body: str, words: str
) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + body + "}")
    with pytest.raises(TraceFormatError, match=words), trace_reader.read_trace(path) as trace:
        list(trace.blocks)


@pytest.mark.parametrize(
    ("event", "byte", "reason"),
    [
        ('{"ph": "X" "ts": 1}', 28, "expected ',' or '}'"),
        ('{"ph": X, "ts": 1}', 24, "invalid character"),
        ('{"ts": 1 2}', 26, "expected ',' or '}'"),
        ('{"ph": "X", "args": {"a": tru}}', 44, "invalid character"),
        ('{"ph": "X", "args": {"a": [1,,2]}}', 46, "invalid character"),
        ('{"ph": "X",, "ts": 1}', 28, "object keys must be strings"),
        ('{"ph": "X", "ts": 01}', 36, "invalid number"),
        ('{"ph": "X", "name": "a\tb"}', 39, "invalid character"),
        ('{"ph": "X", "ts": 1.}', 37, "invalid number"),
        ('{"ph": "X", "args": {"a": 1,}}', 45, "trailing comma in object"),
    ],
)
def test_an_event_that_is_not_json_is_refused_at_its_byte(
    tmp_path: Path, event: str, byte: int, reason: str
) -> None:
    """The numpy scanner before this reader stored each of these (a ``ph`` of
    ``X" "ts": ``, args text no JSON reader takes back): the parser refuses them, at the
    byte it stopped at (the bad one, or the one after)."""
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + event + "]}")
    with pytest.raises(TraceFormatError) as raised, trace_reader.read_trace(path) as trace:
        list(trace.blocks)
    assert str(raised.value) == (
        f"{path}: at byte {byte} of its JSON text: the events array holds something other "
        f"than comma-separated objects there (JSON is malformed: {reason})"
    )


def test_top_level_spans_name_the_values_in_the_whole_text(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(TRICKY)
    with trace_reader.read_trace(path) as trace:
        list(trace.blocks)
    spans = trace.top_level_spans()
    assert set(spans) == {"schemaVersion", "note", "displayTimeUnit", "after"}
    for key, (begin, end) in spans.items():
        assert json.loads(TRICKY.encode()[begin:end]) == json.loads(TRICKY)[key]


scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8),
)
nested = st.recursive(
    scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
times = st.decimals(-(10**12), 10**15, places=4, allow_nan=False)


def written_time(value: Decimal, form: int) -> str:
    """A time in one JSON form: plain, exponent, quoted, or integer digits."""
    if form == 0:
        return format(value, "f")
    if form == 1:
        return format(value, "e")
    if form == 2:
        return f'"{value}"'
    return format(value.to_integral_value(), "f")


event_parts = st.fixed_dictionaries(
    {
        "name": st.text(
            alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12
        ),
        "ts": st.tuples(times, st.integers(0, 3)),
        "pid": st.one_of(st.integers(-(2**62), 2**62), st.text(max_size=4)),
    },
    optional={
        "dur": st.tuples(times, st.integers(0, 3)),
        "args": st.tuples(
            st.dictionaries(st.sampled_from(["x", "correlation", "nest"]), nested, max_size=3),
            st.sampled_from([None, 1, 2]),
            st.integers(-(2**62), 2**62),
        ),
    },
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    parts=st.lists(event_parts, max_size=25),
    ascii_only=st.booleans(),
    separator=st.sampled_from([",", ",\n  ", " , ", ",\t"]),
    chunk=st.sampled_from([1, 13, 200, 1 << 20]),
)
def test_generated_events_round_trip_exactly(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch,
    parts: list[dict[str, Any]],
    ascii_only: bool,
    separator: str,
    chunk: int,
) -> None:
    """Hypothesis: names with escapes and non-ASCII (escaped or not), times in every JSON
    form, pids as numbers or names, nested args written compact or indented, any
    separator, any chunk size; the reader's columns are the reference's, and the args text
    is the text written."""
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", chunk)
    texts, args_texts = [], []
    for part in parts:
        fields = [
            f'"name": {json.dumps(part["name"], ensure_ascii=ascii_only)}',
            f'"ts": {written_time(*part["ts"])}',
            f'"pid": {json.dumps(part["pid"])}',
        ]
        if "dur" in part:
            fields.append(f'"dur": {written_time(*part["dur"])}')
        args_text = None
        if "args" in part:
            args, indent, correlation = part["args"]
            args = {**args, "correlation": correlation}
            args_text = json.dumps(args, indent=indent, ensure_ascii=ascii_only)
            fields.append(f'"args": {args_text}')
        texts.append("{" + ", ".join(fields) + "}")
        args_texts.append(args_text)
    document = '{"traceEvents": [' + separator.join(texts) + '], "x": 1}'
    path = tmp_path_factory.mktemp("round") / "t.json"
    path.write_bytes(document.encode())
    events = json.loads(document, parse_float=Decimal)["traceEvents"]
    with trace_reader.read_trace(path) as trace:
        tables = [events_table(block) for block in trace.blocks]
    columns = pa.concat_tables(tables).to_pydict() if tables else {}
    assert trace.events == len(parts)
    if not parts:
        return
    assert columns.pop("args") == args_texts
    expected = reference(events)
    expected.pop("args")
    assert columns == expected
