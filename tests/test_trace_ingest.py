"""Outer trace ingest: real kineto and torch_npu traces into trace_events, exactly.

Every expectation comes from a plain-Python reference over the same JSON, read with
``Decimal`` numbers so no timestamp passes through a float.
"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from exact_json import events_of, load, ns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from npu_trace import write_npu_trace
from shared_fixtures import shared_fixture

from multicore_profiler import cli
from multicore_profiler.errors import TraceFormatError
from multicore_profiler.ingest import trace_reader
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.storage.store import Store, open_store

FIXTURES = [
    "kineto/a100_training_rank0.json.gz",
    "kineto/a100_triton_example.json.gz",
    "kineto/mi250_minitoy_train.json.gz",
    "ascend/torchnpu_advisor_trace_view.json.gz",
]
COLUMNS = "event_index, ph, cat, name, pid, tid, pid_name, tid_name, ts_ns, dur_ns, flow_id"


def reference_row(index: int, event: dict[str, Any]) -> tuple:
    def integer(key: str) -> int | None:
        value = event.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def text(key: str) -> str | None:
        value = event.get(key)
        return value if isinstance(value, str) else None

    flow = event.get("id")
    return (
        index,
        event.get("ph"),
        event.get("cat"),
        event.get("name"),
        integer("pid"),
        integer("tid"),
        text("pid"),
        text("tid"),
        ns(event.get("ts")),
        ns(event.get("dur")),
        None if flow is None else str(flow),
    )


def stored_rows(store: Store, source_id: str) -> list[tuple]:
    rows = store.sql(
        f"SELECT {COLUMNS} FROM trace_events WHERE source_id = $1 ORDER BY event_index",
        [source_id],
    )
    return [tuple(row.values()) for row in rows.to_pylist()]


@pytest.mark.parametrize("name", FIXTURES)
def test_every_event_of_a_real_trace_is_stored_exactly(store: Store, name: str) -> None:
    path = shared_fixture(name)
    source = ingest_trace(store, path)
    events = events_of(load(path))
    assert source.events == len(events)
    assert source.new
    expected = [reference_row(i, e) for i, e in enumerate(events)]
    assert stored_rows(store, source.source_id) == expected


def test_args_are_kept_as_written_and_their_ids_in_columns(store: Store) -> None:
    path = shared_fixture("kineto/a100_training_rank0.json.gz")
    source = ingest_trace(store, path)
    events = events_of(load(path))
    rows = store.sql(
        "SELECT event_index, correlation, external_id, stream, device, args FROM trace_events "
        "WHERE source_id = $1 AND args IS NOT NULL ORDER BY event_index",
        [source.source_id],
    ).to_pylist()
    with_args = [(i, e) for i, e in enumerate(events) if "args" in e]
    assert len(rows) == len(with_args)
    for row, (index, event) in zip(rows, with_args, strict=True):
        args = event["args"]
        assert row["event_index"] == index
        assert json.loads(row["args"], parse_float=Decimal) == args
        assert row["correlation"] == args.get("correlation")
        assert row["external_id"] == args.get("External id")
        assert row["stream"] == args.get("stream")
        assert row["device"] == args.get("device")
    kernels = store.sql(
        "SELECT count(*) AS n, sum(dur_ns) AS total FROM trace_events "
        "WHERE source_id = $1 AND cat = 'kernel'",
        [source.source_id],
    ).to_pylist()[0]
    assert kernels == {"n": 6080, "total": 401_445_000}


def test_a_torch_npu_trace_keeps_string_times_and_huge_flow_ids(store: Store) -> None:
    path = shared_fixture("ascend/torchnpu_advisor_trace_view.json.gz")
    source = ingest_trace(store, path)
    assert (source.form, source.rank) == ("array", None)
    first = store.sql(
        "SELECT name, ts_ns, dur_ns, args FROM trace_events WHERE source_id = $1 "
        "AND event_index = 0",
        [source.source_id],
    ).to_pylist()[0]
    # "ts": "1704161511420306.491", "dur": 13.08 in the file.
    assert first["ts_ns"] == 1_704_161_511_420_306_491
    assert first["dur_ns"] == 13_080
    device = store.sql(
        "SELECT task_type, count(*) AS n, min(stream) AS stream FROM trace_events "
        "WHERE source_id = $1 AND pid = 800 AND ph = 'X' GROUP BY ALL ORDER BY ALL",
        [source.source_id],
    ).to_pylist()
    tasks = Counter(
        (e["args"]["Task Type"], e["args"]["Stream Id"])
        for e in load(path)
        if e.get("pid") == 800 and e["ph"] == "X"
    )
    assert device == [
        {"task_type": kind, "n": n, "stream": stream} for (kind, stream), n in sorted(tasks.items())
    ]
    flows = store.sql(
        "SELECT flow_id FROM trace_events WHERE source_id = $1 AND cat = 'async_npu' "
        "ORDER BY event_index LIMIT 1",
        [source.source_id],
    ).to_pylist()
    assert int(flows[0]["flow_id"]) > 2**53


def test_a_written_npu_trace_with_ids_above_2_64(store: Store, tmp_path: Path) -> None:
    written = write_npu_trace(tmp_path / "trace_view.json")
    source = ingest_trace(store, tmp_path / "trace_view.json")
    events = load(tmp_path / "trace_view.json")
    assert stored_rows(store, source.source_id) == [
        reference_row(i, e) for i, e in enumerate(events)
    ]
    huge = store.sql(
        "SELECT flow_id FROM trace_events WHERE source_id = $1 AND length(flow_id) >= 20 "
        "ORDER BY event_index",
        [source.source_id],
    )["flow_id"].to_pylist()
    assert huge == [str(e["id"]) for e in events if int(e.get("id", 0)) > 2**64]
    assert len(huge) == 2
    assert all(int(flow) > 2**64 for flow in huge)
    kernels = store.sql(
        "SELECT ts_ns, dur_ns FROM trace_events WHERE source_id = $1 AND task_type = 'MIX_AIC' "
        "ORDER BY ts_ns",
        [source.source_id],
    ).to_pylist()
    assert kernels == [
        {"ts_ns": k["ts_ns"], "dur_ns": k["dur_ns"]} for k in written["device_kernels"]
    ]


def test_a_file_already_in_the_store_is_not_loaded_twice(store: Store, tmp_path: Path) -> None:
    path = shared_fixture("kineto/mi250_minitoy_train.json.gz")
    first = ingest_trace(store, path, label="mi250", tags={"job": "a"})
    again = ingest_trace(store, path, label="other")
    assert (again.source_id, again.new, again.events) == (first.source_id, False, 220)
    counts = store.sql(
        "SELECT (SELECT count(*) FROM trace_events) AS events, "
        "(SELECT count(*) FROM trace_sources) AS sources"
    ).to_pylist()[0]
    assert counts == {"events": 220, "sources": 1}
    source = store.sql("SELECT * FROM trace_sources").to_pylist()[0]
    assert source["label"] == "mi250"
    assert source["tags"] == [("job", "a")]
    assert source["form"] == "object"
    assert source["compressed"] is True
    assert source["base_time_ns"] == 1_735_632_360_000_000_000
    metadata = json.loads(source["metadata"])
    assert metadata["traceName"] == "./logs/mi250_minitoy_train_ROCm6_2_kineto.json"
    assert "traceEvents" not in metadata
    assert source["first_ts_ns"] == 4_203_669_603_018_756
    assert source["sha256"].startswith(first.source_id)


def test_rank_comes_from_distributed_info_unless_given(store: Store) -> None:
    assert ingest_trace(store, shared_fixture("kineto/a100_training_rank0.json.gz")).rank == 0
    assert (
        ingest_trace(store, shared_fixture("kineto/a100_triton_example.json.gz"), rank=7).rank == 7
    )
    ranks = store.sql("SELECT DISTINCT source_id, rank FROM trace_events ORDER BY rank")
    assert ranks["rank"].to_pylist() == [0, 7]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


TRICKY = (
    '{"otherData": {"traceEvents": [1, 2]}, "traceEvents"  :  [\n'
    ' {"name": "a \\"quoted\\" [name] {x}", "ph": "X", "ts": 1.5, "dur": 2, "pid": "Spans",'
    ' "tid": -3, "args": {"ts": 99, "nested": {"correlation": 5}, "correlation": 7}},\n'
    ' {"args": {}, "tid": 1, "pid": 2, "dur": 0.0004, "ts": -12.0015, "ph": "i",'
    ' "name": "caf\\u00e9 \\\\"},\n'
    ' {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "t"}}\n'
    '], "displayTimeUnit": "ns", "baseTimeNanoseconds": 1700000000000000000}'
)


def test_escapes_nesting_key_order_and_sub_ns_digits(store: Store, tmp_path: Path) -> None:
    source = ingest_trace(store, write(tmp_path / "t.json", TRICKY))
    rows = store.sql(
        "SELECT name, pid, pid_name, tid, ts_ns, dur_ns, correlation, args FROM trace_events "
        "ORDER BY event_index"
    ).to_pylist()
    keys = ("name", "pid", "pid_name", "tid", "ts_ns", "dur_ns")
    assert [tuple(r[k] for k in keys) for r in rows] == [
        ('a "quoted" [name] {x}', None, "Spans", -3, 1500, 2000),
        ("café \\", 2, None, 1, -12002, 0),
        ("thread_name", 2, None, 1, None, None),
    ]  # fmt: skip
    # The args' own correlation, not the nested one; args text exactly as written.
    assert [r["correlation"] for r in rows] == [7, None, None]
    assert rows[0]["args"] == '{"ts": 99, "nested": {"correlation": 5}, "correlation": 7}'
    described = store.sql("SELECT rounded_count, base_time_ns FROM trace_sources").to_pylist()
    # -12.0015 us and 0.0004 us have digits below 1 ns: rounded half up, and counted.
    assert described == [{"rounded_count": 2, "base_time_ns": 1_700_000_000_000_000_000}]
    assert source.events == 3


def test_events_without_args_before_deeply_nested_top_level_fields(
    store: Store, tmp_path: Path
) -> None:
    text = (
        '{"traceEvents": [{"ph": "s", "id": 1, "ts": 2}, {"ph": "f", "id": 1, "ts": 3}],'
        ' "meta": {"a": {"b": {"c": {"d": 1}}}, "e": [{"f": {"g": 2}}]}}'
    )
    source = ingest_trace(store, write(tmp_path / "t.json", text))
    assert stored_rows(store, source.source_id) == [
        (0, "s", None, None, None, None, None, None, 2000, None, "1"),
        (1, "f", None, None, None, None, None, None, 3000, None, "1"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        ("   \n", "is empty"),
        ("42", "not an object or an array"),
        ('{"traceEvents": [{"ph": "X", "ts": 1}', "truncated"),
        ('{"traceEvents": [{"ph": "X", "ts": 1}], "x": ', "does not close the document"),
        ('{"traceEvents": [{"ph": "X"}, 7, {"ph": "X"}]}', "other than comma-separated objects"),
        ('{"traceEvents": [{"ph": "X"} {"ph": "X"}]}', "other than comma-separated objects"),
        (
            '{"traceEvents": [{"ph": "X", "ts": "soon"}]}',
            'event 0 has ts "soon", which is not a number',
        ),
        ('{"traceEvents": [{"ph": "X", "ts": 1}]} {}', "text follows the end"),
        ('{"displayTimeUnit": "ns"}', "no top-level traceEvents array"),
    ],
)
def test_bad_files_raise_and_leave_nothing(
    store: Store, tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(TraceFormatError, match=message):
        ingest_trace(store, write(tmp_path / "bad.json", text))
    counts = store.sql(
        "SELECT (SELECT count(*) FROM trace_events) + (SELECT count(*) FROM trace_sources) AS n"
    )
    assert counts["n"].to_pylist() == [0]


def test_a_truncated_gzip_file_is_an_error(store: Store, tmp_path: Path) -> None:
    whole = (shared_fixture("kineto/mi250_minitoy_train.json.gz")).read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceFormatError, match=r"cut\.json\.gz: "):
        ingest_trace(store, cut)
    assert store.sql("SELECT count(*) AS n FROM trace_sources")["n"].to_pylist() == [0]


names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
times = st.decimals(
    min_value=Decimal(-(10**9)), max_value=Decimal(10**15), places=3, allow_nan=False
)
event = st.fixed_dictionaries(
    {"name": names, "ph": st.sampled_from(["X", "i", "M"]), "pid": st.integers(-5, 2**40)},
    optional={
        "ts": times,
        "dur": times,
        "tid": st.one_of(st.integers(-(2**40), 2**40), names),
        "cat": st.one_of(st.none(), names),
        "args": st.dictionaries(names, st.one_of(st.integers(), names, times), max_size=3),
    },
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    events=st.lists(event, max_size=40),
    indent=st.sampled_from([None, 1, 4]),
    bare=st.booleans(),
    as_string=st.booleans(),
    block=st.sampled_from([7, 64, 1 << 20]),
)
def test_any_trace_round_trips_exactly_whatever_the_blocks(
    tmp_path_factory, monkeypatch, events, indent, bare, as_string, block
) -> None:
    """Hypothesis: random events, written compact or indented, as an object or a bare
    array, with ts as numbers or strings, read in blocks of any size."""
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", block)
    for e in events:
        for key in ("ts", "dur"):
            if key in e:
                e[key] = str(e[key]) if as_string and key == "ts" else e[key]
    document = events if bare else {"schemaVersion": 1, "traceEvents": events}
    text = json.dumps(document, indent=indent, default=str, ensure_ascii=bool(indent))
    folder = tmp_path_factory.mktemp("prop")
    path = write(folder / "trace.json", text)
    with open_store(folder / "store") as store:
        source = ingest_trace(store, path)
        expected = [reference_row(i, e) for i, e in enumerate(events_of(load(path)))]
        assert stored_rows(store, source.source_id) == expected


def test_cli_ingest_trace_prints_source_ids(capsys, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    paths = [
        str(shared_fixture("kineto/a100_triton_example.json.gz")),
        str(shared_fixture("kineto/mi250_minitoy_train.json.gz")),
    ]
    # One call loads the ranks of one job: traces that say no rank are refused together.
    assert cli.main(["ingest-trace", "--store", store, *paths]) == 1
    assert "no rank for it in job 'job-" in capsys.readouterr().err
    for path in paths:
        assert (
            cli.main(["ingest-trace", "--store", store, path, "--label", "x", "--tag", "k=v"]) == 0
        )
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"f1702aba1e49885c  {paths[0]}: 71 events, job f1702aba1e49885c (loaded)",
        f"39fdab670f9e80a0  {paths[1]}: 220 events, job 39fdab670f9e80a0 (loaded)",
    ]
    assert cli.main(["ingest-trace", "--store", store, paths[0], "--rank", "2"]) == 0
    assert capsys.readouterr().out == (
        f"f1702aba1e49885c  {paths[0]}: 71 events, job f1702aba1e49885c (already in the store)\n"
    )
    assert cli.main(["ingest-trace", "--store", store, paths[0], "--tag", "novalue"]) == 1
    assert capsys.readouterr().err == "mcprof: error: --tag 'novalue' is not KEY=VALUE\n"
