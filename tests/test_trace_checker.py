"""The trace checker passes a well-formed trace and names the event and rule a broken one breaks."""

from __future__ import annotations

import copy
import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
import test_export
from trace_checker import EXPORT_HEAD, check_chrome_files, check_trace, load_trace

from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.storage.store import Store

golden = test_export.golden
"""The golden store of test_export (a fixture)."""
PID = 1


def meta(kind: str, tid: int | None = None, /, **args: Any) -> dict[str, Any]:
    """A metadata event `kind` for PID (and `tid` for thread_* kinds) with `args`."""
    event: dict[str, Any] = {"ph": "M", "name": kind, "pid": PID, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event


def x(ts: float, dur: float, tid: int = 1, name: str = "slice") -> dict[str, Any]:
    """A complete event on thread `tid` of PID."""
    return {"ph": "X", "name": name, "cat": "stage", "ts": ts, "dur": dur, "pid": PID, "tid": tid}


def flow(ph: str, ts: float, tid: int, flow_id: int | str = 1, **extra: Any) -> dict[str, Any]:
    """A flow event of cat 'dep', name 'handoff'."""
    event = {"ph": ph, "cat": "dep", "name": "handoff", "id": flow_id, "ts": ts, "pid": PID}
    return {**event, "tid": tid, **extra}


def header(*tids: int) -> list[dict[str, Any]]:
    """process_name plus a thread_name for each tid."""
    return [
        meta("process_name", name="device 0"),
        *(meta("thread_name", tid, name=f"core {tid}") for tid in tids),
    ]


def good_trace() -> dict[str, Any]:
    """Nested and touching slices on two threads, a flow between them, extra top-level keys."""
    return {
        "traceEvents": [
            *header(1, 2),
            meta("process_sort_index", sort_index=0),
            meta("thread_sort_index", 1, sort_index=1),
            x(0, 100, name="kernel"),
            x(10, 20, name="load"),  # nested in kernel
            x(30, 20, name="compute"),  # touches load: 30 == 10 + 20
            x(30, 0, name="mark"),  # zero-length, inside compute
            x(40, 30, tid=2, name="store"),
            flow("s", 25, 1),  # inside load, the slice that started last
            flow("f", 50, 2, bp="e"),  # inside store
            {"ph": "i", "name": "sync", "ts": 60, "pid": PID, "tid": 2, "s": "t"},
            {"ph": "C", "name": "queue", "ts": 5, "pid": PID, "args": {"depth": 3}},
        ],
        "displayTimeUnit": "ns",
        "schemaVersion": 1,
        "megaKernelCycleTrace": {"clock_mhz": 1500},
        "metadata": {"run": "r0"},
    }


def trace_of(*events: dict[str, Any], tids: tuple[int, ...] = (1, 2)) -> list[dict[str, Any]]:
    """An array-form trace: named process and threads, then `events` (from index 1 + len(tids))."""
    return [*header(*tids), *events]


def fails(trace: Any, fragment: str) -> None:
    """check_trace raises AssertionError containing `fragment` (plain text)."""
    with pytest.raises(AssertionError, match=re.escape(fragment)):
        check_trace(trace)


def test_good_trace_passes_as_object_and_as_array() -> None:
    trace = good_trace()
    check_trace(trace)
    check_trace(trace["traceEvents"])


def test_nested_and_touching_slices_pass() -> None:
    check_trace(trace_of(x(0, 10), x(0, 10), x(0, 4), x(4, 6), x(10, 5), x(15, 0), x(15, 0)))


def test_partial_overlap_names_both_events() -> None:
    fails(
        trace_of(x(0, 10, name="a"), x(5, 10, name="b")),
        "event #4 (ph='X', name='b'): [5, 15] partially overlaps event #3 (ph='X', name='a')"
        " [0, 10] on pid 1 tid 1",
    )


def test_overlap_inside_a_parent_is_found() -> None:
    fails(trace_of(x(0, 100), x(10, 20), x(25, 10)), "event #5 (ph='X', name='slice'): [25, 35]")


def test_same_slices_on_other_threads_do_not_clash() -> None:
    check_trace(trace_of(x(0, 10, tid=1), x(5, 10, tid=2)))


@pytest.mark.parametrize("pid", [-1, 2**32, True, 1.0, "1", None])
def test_bad_pid(pid: Any) -> None:
    event = {**x(0, 1), "pid": pid}
    fails(
        trace_of(event), "event #3 (ph='X', name='slice'): 'pid' must be an integer in 0..2**32-1"
    )


def test_largest_pid_passes() -> None:
    top = 2**32 - 1
    check_trace(
        [
            {"ph": "M", "name": "process_name", "pid": top, "args": {"name": "p"}},
            {"ph": "M", "name": "thread_name", "pid": top, "tid": top, "args": {"name": "t"}},
            {**x(0, 1), "pid": top, "tid": top},
        ]
    )


@pytest.mark.parametrize("ts", ["10", None, float("nan"), float("inf"), False])
def test_bad_ts(ts: Any) -> None:
    fails(trace_of({**x(0, 1), "ts": ts}), "'ts' must be a finite JSON number")


def test_negative_dur() -> None:
    fails(trace_of(x(0, -1)), "'dur' must be a finite JSON number >= 0, not -1")


def test_missing_thread_name() -> None:
    fails(trace_of(x(0, 1, tid=3)), "event #3 (ph='X', name='slice'): pid 1 tid 3 has slices")


def test_missing_process_name() -> None:
    fails([meta("thread_name", 1, name="t"), x(0, 1)], "pid 1 has slices but no process_name")


def test_duplicate_thread_name() -> None:
    fails(
        trace_of(meta("thread_name", 1, name="again")),
        "event #3 (ph='M', name='thread_name'): second thread_name for pid 1 tid 1 (first is"
        " event #1)",
    )


@pytest.mark.parametrize(
    ("event", "fragment"),
    [
        (meta("thread_name", None, name="t"), "'tid' must be an integer"),
        (meta("process_name", name=""), "args.name must be a non-empty string"),
        (meta("process_sort_index", sort_index="1"), "args.sort_index must be an integer"),
        (meta("process_labels", labels=["a"]), "args.labels must be a string"),
        (meta("num_cpus", number=4), "metadata name must be one of"),
    ],
)
def test_bad_metadata(event: dict[str, Any], fragment: str) -> None:
    fails(trace_of(event), fragment)


def test_flow_without_end() -> None:
    fails(
        trace_of(x(0, 10), flow("s", 5, 1, flow_id=7)),
        "event #4 (ph='s', name='handoff'): flow start without a flow end ('f' with cat='dep',"
        " name='handoff', id=7)",
    )


def test_flow_end_without_start() -> None:
    fails(
        trace_of(x(0, 10), flow("f", 5, 1, bp="e")), "event #4 (ph='f', name='handoff'): flow end"
    )


def test_flow_end_before_its_start() -> None:
    fails(
        trace_of(x(0, 10), x(0, 10, tid=2), flow("s", 6, 1), flow("f", 5, 2, bp="e")),
        "event #6 (ph='f', name='handoff'): comes before its flow start #5",
    )


def test_flow_end_with_no_enclosing_slice() -> None:
    fails(
        trace_of(x(0, 10), x(0, 10, tid=2), flow("s", 5, 1), flow("f", 12, 2, bp="e")),
        "event #6 (ph='f', name='handoff'): binds to no enclosing slice: Perfetto attaches it"
        " to the slice that started last on pid 1 tid 2, event #4 [0, 10], which ended before"
        " ts=12",
    )


def test_flow_start_on_a_thread_without_slices() -> None:
    fails(
        trace_of(x(0, 10, tid=2), flow("s", 5, 1), flow("f", 6, 2, bp="e")),
        "event #4 (ph='s', name='handoff'): binds to no slice: nothing on pid 1 tid 1 has"
        " started by ts=5",
    )


def test_flow_after_a_finished_child_binds_to_the_child_in_perfetto() -> None:
    # The parent [0, 100] holds ts 50, but Perfetto binds to the last slice started: [10, 20].
    fails(
        trace_of(
            x(0, 100), x(10, 10), x(0, 100, tid=2), flow("s", 50, 1), flow("f", 60, 2, bp="e")
        ),
        "event #6 (ph='s', name='handoff'): binds to no enclosing slice",
    )


def test_thread_instant_takes_the_flow_in_perfetto() -> None:
    instant = {"ph": "i", "name": "mark", "ts": 10, "pid": PID, "tid": 1}
    fails(
        trace_of(x(0, 100), instant, x(0, 100, tid=2), flow("s", 50, 1), flow("f", 60, 2, bp="e")),
        "event #6 (ph='s', name='handoff'): binds to no enclosing slice: Perfetto attaches it"
        " to the slice that started last on pid 1 tid 1, event #4 [10, 10]",
    )


def test_flow_steps() -> None:
    events = [x(0, 10), x(0, 10, tid=2), flow("s", 1, 1), flow("t", 2, 2), flow("f", 3, 1, bp="e")]
    check_trace(trace_of(*events))
    events[3] = flow("t", 4, 2)
    fails(
        trace_of(*events), "event #6 (ph='t', name='handoff'): flow step comes after its flow end"
    )


def test_flow_at_slice_start_and_end_binds() -> None:
    check_trace(trace_of(x(0, 10), x(20, 10, tid=2), flow("s", 10, 1), flow("f", 20, 2, bp="e")))


def test_flow_end_without_bp_binds_to_the_next_slice() -> None:
    check_trace(trace_of(x(0, 10), x(20, 10, tid=2), flow("s", 5, 1), flow("f", 15, 2)))


def test_flow_end_without_bp_and_no_next_slice() -> None:
    fails(
        trace_of(x(0, 10), x(0, 10, tid=2), flow("s", 5, 1), flow("f", 15, 2)),
        "event #6 (ph='f', name='handoff'): binds to no slice: no slice starts on pid 1 tid 2"
        " after ts=15",
    )


def test_flow_end_without_bp_at_a_later_written_slice_start_is_ambiguous() -> None:
    fails(
        trace_of(x(0, 10), flow("s", 5, 1), flow("f", 20, 2), x(20, 10, tid=2), x(30, 1, tid=2)),
        "event #5 (ph='f', name='handoff'): ambiguous flow end",
    )


def test_flow_end_without_bp_in_an_input_category() -> None:
    end = {**flow("f", 15, 2), "cat": "input"}
    start = {**flow("s", 5, 1), "cat": "input"}
    fails(trace_of(x(0, 10), x(20, 10, tid=2), start, end), "add bp 'e'")


def test_duplicate_flow_id() -> None:
    other = {**flow("s", 6, 1), "name": "other"}
    fails(
        trace_of(x(0, 10), x(0, 10, tid=2), flow("s", 5, 1), other, flow("f", 7, 2, bp="e")),
        "event #6 (ph='s', name='other'): duplicate flow id 1: flow start #5 uses it too",
    )


def test_hex_ids_equal_to_perfetto_are_duplicates() -> None:
    fails(
        trace_of(
            x(0, 10),
            x(0, 10, tid=2),
            flow("s", 5, 1, flow_id="0x1f"),
            flow("s", 6, 1, flow_id="1F"),
            flow("f", 7, 2, flow_id="0x1f", bp="e"),
            flow("f", 8, 2, flow_id="1F", bp="e"),
        ),
        "event #6 (ph='s', name='handoff'): duplicate flow: flow start #5 has the same cat, name",
    )


@pytest.mark.parametrize(
    ("flow_id", "fragment"),
    [
        ("zz", "must be a 64-bit hexadecimal number"),
        (2**53, "must be in 0..2**53-1"),
        (-1, "must be in 0..2**53-1"),
        (1.5, "flow 'id' must be an integer or a hex string"),
    ],
)
def test_bad_flow_id(flow_id: Any, fragment: str) -> None:
    fails(trace_of(x(0, 10), flow("s", 5, 1, flow_id=flow_id)), fragment)


def test_flow_binding_point_must_be_e() -> None:
    fails(trace_of(x(0, 10), flow("s", 5, 1, bp="s")), "'bp' must be 'e' when present, not 's'")


@pytest.mark.parametrize("ph", ["B", "E", "b", "P", "", "x"])
def test_unknown_phase(ph: str) -> None:
    fails(trace_of({**x(0, 1), "ph": ph}), f"event #3 (ph={ph!r}, name='slice'): unsupported")


def test_same_ts_parent_must_be_written_first() -> None:
    fails(
        trace_of(x(0, 5, name="child"), x(0, 10, name="parent")),
        "event #3 (ph='X', name='child'): starts at ts=0 like the longer slice #4",
    )


def test_sub_nanosecond_digits_that_break_nesting_in_perfetto() -> None:
    # Exactly nested, but truncated to ns: parent [0, 999], child [1, 1000].
    fails(
        trace_of(x(0.0009, 0.9999), x(0.001, 0.9997)),
        "event #4 (ph='X', name='slice'): partially overlaps event #3 on pid 1 tid 1 once"
        " Perfetto truncates ts and dur to whole nanoseconds",
    )


def test_decimal_floats_are_added_exactly() -> None:
    # In binary floats 1001.5001234 + 30 > 1031.5001234; as written, the two slices touch.
    check_trace(trace_of(x(1000, 100), x(1001.5001234, 30), x(1031.5001234, 30)))


def test_nanosecond_floats_pass() -> None:
    check_trace(trace_of(x(0.001, 1.5), x(0.5, 1.001), x(1.501, 0.25)))


@pytest.mark.parametrize(
    ("trace", "fragment"),
    [
        ("[]", "top level must be a JSON array or object, not str"),
        ({"events": []}, "must hold a 'traceEvents' list"),
        ({"traceEvents": [], "displayTimeUnit": "us"}, "displayTimeUnit must be 'ms' or 'ns'"),
        ({"traceEvents": [], "metadata": []}, "top-level 'metadata' must be an object"),
        ([[1]], "event #0: must be a JSON object, not list"),
        ([{"name": "x"}], "event #0 (ph=None, name='x'): needs a string 'ph'"),
    ],
)
def test_bad_top_level(trace: Any, fragment: str) -> None:
    fails(trace, fragment)


@pytest.mark.parametrize(
    ("event", "fragment"),
    [
        ({**x(0, 1), "args": [1]}, "'args' must be an object"),
        ({**x(0, 1), "cat": 3}, "'cat' must be a string"),
        ({**x(0, 1), "name": None}, "'name' must be a string"),
        ({**x(0, 1), "args": {"v": float("nan")}}, "event #3 (ph='X', name='slice'): not strict"),
        ({**x(0, 1), "args": {"v": {1, 2}}}, "event #3 (ph='X', name='slice'): not strict JSON"),
        ({**x(0, 1), "ph": "i", "s": "x"}, "instant scope 's' must be 'g', 'p' or 't'"),
        ({"ph": "C", "name": "q", "ts": 0, "pid": 1, "args": {}}, "non-empty 'args'"),
        ({"ph": "C", "name": "q", "ts": 0, "pid": 1, "args": {"d": "3"}}, "series 'd'"),
    ],
)
def test_bad_event_fields(event: dict[str, Any], fragment: str) -> None:
    fails(trace_of(event), fragment)


def test_load_plain_and_gzip(tmp_path: Path) -> None:
    trace = good_trace()
    plain = tmp_path / "trace.json"
    plain.write_text(json.dumps(trace))
    packed = tmp_path / "trace.json.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as fh:
        json.dump(trace, fh)
    assert load_trace(plain) == trace
    assert load_trace(str(packed)) == trace
    check_trace(load_trace(packed))


def test_load_rejects_nan_and_broken_json(tmp_path: Path) -> None:
    nan = tmp_path / "nan.json"
    nan.write_text('[{"ph": "X", "ts": NaN}]')
    with pytest.raises(AssertionError, match="NaN"):
        load_trace(nan)
    broken = tmp_path / "broken.json.gz"
    with gzip.open(broken, "wt") as fh:
        fh.write('{"traceEvents": [')
    with pytest.raises(AssertionError, match="not valid JSON"):
        load_trace(broken)


def big_trace(cores: int = 64, kernels: int = 300) -> list[dict[str, Any]]:
    """About 100k events: per core, kernels holding three stages; a flow between neighbours."""
    events: list[dict[str, Any]] = [meta("process_name", name="device")]
    for core in range(cores):
        events.append(meta("thread_name", core, name=f"core {core}"))
        for k in range(kernels):
            base = k * 100.0
            events += [
                x(base, 90, core, "kernel"),
                x(base + 1.5, 30, core, "load"),
                x(base + 31.5, 30, core, "compute"),
                x(base + 61.5, 20.25, core, "store"),
            ]
            if core + 1 < cores:
                flow_id = core * kernels + k
                events.append(flow("s", base + 70, core, flow_id))
                events.append(flow("f", base + 75, core + 1, flow_id, bp="e"))
    return events


def test_a_large_trace_passes_and_one_late_store_in_it_fails() -> None:
    events = big_trace()
    assert len(events) > 100_000
    check_trace(events)
    broken = copy.deepcopy(events)
    broken[-3]["dur"] = 95  # the last kernel's store now ends after the kernel
    with pytest.raises(AssertionError, match="partially overlaps"):
        check_trace(broken)


def test_check_chrome_files_checks_the_exporters_traces(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The conftest hook's check: every file the Chrome JSON writer wrote (by its opening),
    plain or gzipped, however deep; other JSON is left alone, and so is a file whose gzip
    stream is broken or cut (a fuzzed input trace). (Not under tmp_path, which the hook
    itself checks after each test.)"""
    root = tmp_path_factory.mktemp("exports")
    good = [*header(1, 2), x(0, 5, 1), x(6, 2, 2), flow("s", 1, 1), flow("f", 6, 2, bp="e")]
    late = [*header(1, 2), x(0, 5, 1), x(1, 2, 2), flow("s", 4, 1), flow("f", 3, 2, bp="e")]

    def export_text(events: list[dict[str, Any]]) -> bytes:
        rows = b",\n".join(json.dumps(e, separators=(",", ":")).encode() for e in events)
        return EXPORT_HEAD + rows + b'\n],"megaKernelCycleTrace":{}}\n'

    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "t.json.gz").write_bytes(gzip.compress(export_text(good)))
    (root / "t.json").write_bytes(export_text(good))
    (root / "outer.json").write_text(json.dumps({"traceEvents": late}))  # not an export
    (root / "notes.json").write_text("[1, 2")  # not even JSON
    broken = bytearray(gzip.compress(export_text(good) * 50, mtime=0))
    broken[12:16] = b"\xff\xff\xff\xff"  # a fuzzed input: its deflate stream is broken
    (root / "fuzzed.json").write_bytes(bytes(broken))
    (root / "cut.json.gz").write_bytes(gzip.compress(export_text(good))[:5])
    assert check_chrome_files(root) == [root / "a" / "b" / "t.json.gz", root / "t.json"]
    (root / "a" / "late.json").write_bytes(export_text(late))
    message = (
        f"{root / 'a' / 'late.json'}: event #6 (ph='f', name='handoff'): comes before its flow "
        "start #5 (ts 3 < 4, or equal ts and earlier in the file); both viewers drop it"
    )
    with pytest.raises(AssertionError, match=re.escape(message)):
        check_chrome_files(root)


def test_the_hook_finds_the_exporters_traces(golden: Store, tmp_path: Path) -> None:
    """The writer's traces begin with EXPORT_HEAD, so the hook checks each of them."""
    export_chrome_trace(golden, tmp_path / "t.json")
    export_chrome_trace(golden, tmp_path / "t.json.gz")
    assert check_chrome_files(tmp_path) == [tmp_path / "t.json", tmp_path / "t.json.gz"]
