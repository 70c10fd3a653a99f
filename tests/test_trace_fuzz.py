"""Hypothesis fuzzing of outer traces (issue 18): a real fixture's text, mutated (bytes
flipped, deleted, tricky tokens inserted), either loads or ends in a ``ProfileError``,
never in another exception; and any number literal loads exactly or is refused as out
of range, whatever its digits or exponent."""

from __future__ import annotations

import gzip
from decimal import ROUND_HALF_UP, Decimal, localcontext
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from shared_fixtures import shared_fixture

from multicore_profiler.errors import ProfileError, TraceFormatError
from multicore_profiler.ingest.outer_trace import events_table, ingest_trace
from multicore_profiler.ingest.trace_reader import read_trace
from multicore_profiler.storage.store import Store

TOKENS = [
    b"1e999999",
    b"-1e100000",
    b"9" * 120,
    b"9223372036854775808",
    b"1.5",
    b'"\\ud800"',
    b"\\ud800",
    b"\\q",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b'"',
    b"\\",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"null",
    b"NaN",
    b'"ts": 1e400, ',
    b'"pid": 18446744073709551616, ',
    b'"args": {"correlation": 1e30}, ',
    b'"dur": 9223372036854775, ',
]
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

mutation = st.tuples(
    st.sampled_from(["flip", "delete", "insert"]),
    st.floats(0, 1, exclude_max=True),
    st.integers(0, 255),
    st.sampled_from(TOKENS),
)


def mutated(data: bytes, mutations: list[tuple[str, float, int, bytes]]) -> bytes:
    """``data`` with each mutation applied at its fraction of the length."""
    text = bytearray(data)
    for kind, where, number, token in mutations:
        at = int(where * len(text))
        if kind == "flip" and text:
            text[at] ^= 1 << (number % 8)
        elif kind == "delete":
            del text[at : at + 1 + number % 24]
        else:
            text[at:at] = token
    return bytes(text)


@pytest.fixture(scope="module")
def triton() -> bytes:
    """The real one-kernel Triton trace, inflated: the text every example mutates."""
    return gzip.decompress(shared_fixture("kineto/a100_triton_example.json.gz").read_bytes())


def listing(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())


@SETTINGS
@given(mutations=st.lists(mutation, min_size=1, max_size=5), compressed=st.booleans())
def test_a_mutated_trace_loads_or_raises_a_profile_error(
    store: Store,
    tmp_path: Path,
    triton: bytes,
    mutations: list[tuple[str, float, int, bytes]],
    compressed: bool,
) -> None:
    """One store for all examples (a fresh one costs more than the ingest): a refused
    trace leaves its files as they were, a loaded one holds all its events."""
    data = gzip.compress(triton, mtime=0) if compressed else triton
    path = tmp_path / "trace.json"
    path.write_bytes(mutated(data, mutations))
    before = listing(store.root)
    try:
        source = ingest_trace(store, path)
    except ProfileError:
        assert listing(store.root) == before
        return
    stored = store.sql(
        "SELECT count(*) AS n FROM trace_events WHERE source_id = $1", [source.source_id]
    )
    assert stored["n"].to_pylist() == [source.events]


def expected_ns(literal: str) -> int | None:
    """The literal's microseconds as ns rounded half up, or None past int64."""
    with localcontext() as context:
        context.prec = 400  # every digit of the product: no rounding but the last step
        value = (Decimal(literal) * 1000).to_integral_value(rounding=ROUND_HALF_UP)
    return int(value) if -(2**63) <= value < 2**63 else None


digits = st.text(alphabet="0123456789", min_size=1, max_size=60)
literal = st.builds(
    lambda sign, whole, fraction, exponent: (
        sign
        + whole.lstrip("0").rjust(1, "0")
        + (f".{fraction}" if fraction else "")
        + (f"e{exponent}" if exponent is not None else "")
    ),
    st.sampled_from(["", "-"]),
    digits,
    st.one_of(st.just(""), digits),
    st.one_of(st.none(), st.integers(-80, 80), st.integers(-(10**5), 10**5)),
)


@settings(max_examples=150, deadline=None)
@given(literals=st.lists(literal, min_size=1, max_size=12), quoted=st.booleans())
@example(literals=["486864e-71"], quoted=False)  # Arrow's decimal cast read it as 7.056
def test_any_number_literal_is_exact_or_refused_as_out_of_range(
    tmp_path_factory: pytest.TempPathFactory, literals: list[str], quoted: bool
) -> None:
    path = tmp_path_factory.mktemp("numbers") / "trace.json"
    written = [f'"{x}"' if quoted else x for x in literals]
    events = ", ".join(f'{{"ph": "X", "ts": {x}}}' for x in written)
    path.write_text(f'{{"traceEvents": [{events}]}}')
    expected = [expected_ns(x) for x in literals]

    def stored() -> list[int | None]:
        with read_trace(path) as trace:
            tables = [events_table(block) for block in trace.blocks]
        return [value for table in tables for value in table["ts_ns"].to_pylist()]

    if None in expected:
        first = expected.index(None)
        with pytest.raises(TraceFormatError, match=f"event {first} has ts .* out of range"):
            stored()
    else:
        assert stored() == expected
