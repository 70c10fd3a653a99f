"""The Python API behind ``mcprof kernels``: ``resolve_trace`` (a trace file or a source id
prefix), ``check_steps`` and ``family_times_by_step`` (the table the command prints)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from shared_fixtures import shared_fixture

from multicore_profiler import cli
from multicore_profiler.analysis.outer_kernel_steps import check_steps, family_times_by_step
from multicore_profiler.errors import ArgumentError, RulesError
from multicore_profiler.ingest.outer_trace import TraceSource, resolve_trace, source_id_of
from multicore_profiler.storage.store import Store

A100 = "kineto/a100_training_rank0.json.gz"
MI250 = "kineto/mi250_minitoy_train.json.gz"
A100_ID = "b8ce7a1a143b55dd"
A100_EVENTS = 108936
BASE_COLUMNS = ["source_id", "rank", "step", "annotation", "period_ms", "busy_pct"]
BREAKDOWN = ["stage_ms", "computing_ms", "communication_ms", "communication_not_overlapped_ms",
             "overlapped_ms", "free_ms"]  # fmt: skip
FAMILIES = ["collective", "gemm", "elementwise", "copy", "triton", "reduce", "memset", "rest"]
A100_STEPS = [
    (0, 550, 208.697, 34.7, 202.276, 36.213, 29.532, 29.072, 0.46, 136.991,
     29.532, 21.595, 11.502, 9.544, 1.361, 0.981, 0.071, 0.073),
    (1, 551, 216.392, 37.1, 209.597, 36.019, 36.85, 36.355, 0.495, 137.223,
     36.85, 21.469, 11.194, 9.578, 1.384, 1.106, 0.09, 0.071),
    (2, 552, 216.331, 34.2, 209.309, 36.226, 30.134, 29.651, 0.483, 143.432,
     30.134, 21.524, 11.262, 9.891, 1.402, 1.179, 0.091, 0.078),
    (3, 553, 215.375, 37.2, 208.629, 36.049, 36.81, 36.377, 0.433, 136.203,
     36.81, 21.46, 11.243, 9.413, 1.369, 1.105, 0.088, 0.068),
]  # fmt: skip
"""``mcprof kernels`` on the A100 fixture, as docs/kernels.md shows it: step, ProfilerStep#
number, period_ms, busy_pct, the step time breakdown (``BREAKDOWN``: stage = computing +
communication not overlapped + free) and the families' ms in the order of ``FAMILIES``."""


def test_a_trace_file_then_its_prefix(store: Store) -> None:
    a100 = shared_fixture(A100)
    loaded = resolve_trace(store, str(a100))
    # A trace loaded alone is a job of its own, named by its source id.
    assert loaded == TraceSource(A100_ID, a100, A100_EVENTS, 0, "object", True, A100_ID)
    again = TraceSource(A100_ID, a100.absolute(), A100_EVENTS, 0, "object", False, A100_ID)
    assert resolve_trace(store, a100) == again  # the file again: found by its contents
    assert resolve_trace(store, A100_ID) == again
    assert resolve_trace(store, "B8CE") == again  # 4 characters, any case
    assert resolve_trace(store, "b8ce7a1a", rank=5, label="ignored") == again
    short = f"'b8c' is neither a trace file nor the source id of a trace in {store.uri}"
    with pytest.raises(ArgumentError, match=f"^{re.escape(short)}$"):
        resolve_trace(store, "b8c")  # unique, but shorter than 4 characters


def two_traces_sharing_a_prefix(folder: Path) -> tuple[Path, Path, str]:
    """Two empty traces whose source ids share their first 4 hex digits (the first pair of
    ``{"traceEvents": [], "n": i}`` texts that do, counting i from 0)."""
    seen: dict[str, Path] = {}
    for i in range(100_000):
        text = json.dumps({"traceEvents": [], "n": i}).encode()
        prefix = source_id_of(hashlib.sha256(text).hexdigest())[:4]
        path = folder / f"empty{i}.json"
        path.write_bytes(text)
        if prefix in seen:
            return seen[prefix], path, prefix
        seen[prefix] = path
    raise AssertionError("no pair found")


def test_an_ambiguous_short_or_unknown_name_is_refused(store: Store, tmp_path: Path) -> None:
    first, second, prefix = two_traces_sharing_a_prefix(tmp_path)
    a, b = resolve_trace(store, first), resolve_trace(store, second)
    assert (a.new, b.new, a.events, b.events) == (True, True, 0, 0)
    assert a.source_id[:4] == b.source_id[:4] == prefix != a.source_id[:5]
    assert resolve_trace(store, a.source_id[:5]).source_id == a.source_id
    refused = {
        prefix: f"{prefix!r} names several the source id of a trace in {store.uri}",
        a.source_id[:3]: f"{a.source_id[:3]!r} names several the source id of a trace in "
        f"{store.uri}",
        "0123456789": f"'0123456789' is neither a trace file nor the source id of a trace in "
        f"{store.uri}",
        str(tmp_path / "missing.json"): f"{str(tmp_path / 'missing.json')!r} is neither a trace "
        f"file nor the source id of a trace in {store.uri}",
    }
    for name, message in refused.items():
        with pytest.raises(ArgumentError, match=f"^{re.escape(message)}$"):
            resolve_trace(store, name)


def test_check_steps_says_what_the_pattern_matched(store: Store) -> None:
    mi250 = resolve_trace(store, shared_fixture(MI250)).source_id
    message = (
        f"trace {mi250} has no step with a GPU period: 2 annotation(s) match the step pattern "
        r"'^ProfilerStep#(?P<step>\d+)$'; a step needs device kernels launched from inside its "
        "annotation and, unless it is the only annotation, a next step (the last one is "
        "dropped; see last_step in the rules); give --steps REGEX"
    )
    with pytest.raises(RulesError, match=f"^{re.escape(message)}$"):
        check_steps(store, mi250)
    assert check_steps(store, resolve_trace(store, shared_fixture(A100)).source_id) is None


def test_family_times_by_step_is_what_mcprof_kernels_prints(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a100 = resolve_trace(store, shared_fixture(A100)).source_id
    table = family_times_by_step(store, [a100])
    assert table.column_names == BASE_COLUMNS + BREAKDOWN + [f"{f}_ms" for f in FAMILIES]
    assert table.to_pylist() == [
        dict(zip(table.column_names, (A100_ID, 0, step, f"ProfilerStep#{n}", *rest), strict=True))
        for step, n, *rest in A100_STEPS
    ]
    argv = ["kernels", "--store", str(store.uri), A100_ID, "--format", "json"]
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out) == table.to_pylist()
    empty = family_times_by_step(store, [])
    assert (empty.column_names, empty.num_rows) == (BASE_COLUMNS, 0)
