"""``json_rows``: numpy-rendered JSON text reads back as exactly the values it was given."""

from __future__ import annotations

import json
import os
import threading
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from multicore_profiler.export.json_rows import CHUNK_ROWS, Row, strings

INTEGER_TYPES = [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int32, np.int64]


def parsed(row: Row) -> list[dict]:
    """Each rendered row, a JSON object, parsed with exact decimals."""
    return [json.loads(bytes(text), parse_float=Decimal) for text in row.render()]


@given(st.sampled_from(INTEGER_TYPES).flatmap(lambda t: arrays(t, st.integers(0, 40))))
def test_integers_read_back(values: np.ndarray) -> None:
    row = Row(len(values)).integers('{"k":', values).text("}")
    assert [r["k"] for r in parsed(row)] == values.tolist()
    assert row.width % 4 == 0


@given(arrays(np.int64, st.integers(0, 40), elements=st.integers(-(2**62), 2**62)))
def test_millis_read_back(units: np.ndarray) -> None:
    row = Row(len(units)).millis('{"ts":', units).text("}")
    assert [r["ts"] for r in parsed(row)] == [Decimal(int(u)) / 1000 for u in units]


def test_millis_text() -> None:
    units = np.array([0, 200, 1000, 1500, -500, -12345, 1])
    text = [bytes(r).decode() for r in Row(len(units)).millis("", units).render()]
    assert [t.strip() for t in text] == ["0.0", "0.2", "1.0", "1.5", "-0.5", "-12.345", "0.001"]
    assert len({len(t) for t in text}) == 1


@given(st.lists(st.text(), min_size=1, max_size=8), st.data())
def test_strings_read_back(values: list[str], data: st.DataObject) -> None:
    codes = data.draw(st.lists(st.integers(0, len(values) - 1), max_size=20))
    row = Row(len(codes)).lookup('{"name":', strings(values), np.array(codes, int)).text("}")
    assert [r["name"] for r in parsed(row)] == [values[c] for c in codes]


def test_optional_keys_are_left_out() -> None:
    owner = np.array([5, 0xFFFFFFFF, 7], np.uint32)
    row = (
        Row(3)
        .integers('{"task":', np.arange(3))
        .optional(owner != 0xFFFFFFFF, Row(3).integers(',"owner":', owner))
        .text("}")
    )
    assert parsed(row) == [{"task": 0, "owner": 5}, {"task": 1}, {"task": 2, "owner": 7}]


def test_lookup_of_rendered_rows() -> None:
    inner = Row(2).integers('"a":', np.array([1, 22])).render()
    row = Row(3).lookup("{", inner, np.array([1, 0, 1])).text("}")
    assert parsed(row) == [{"a": 22}, {"a": 1}, {"a": 22}]


@pytest.mark.parametrize("threads", [1, 3])
def test_chunks_and_file_writes_match_one_render(tmp_path: Path, threads: int) -> None:
    count = 2 * CHUNK_ROWS + 17
    values = np.arange(count, dtype=np.uint64) * 7919
    row = Row(count).integers('{"v":', values).millis(',"t":', values.astype(np.int64)).text("}")
    whole = row.render().tobytes()
    assert b"".join(c.tobytes() for c in row.chunks(threads)) == whole
    path = tmp_path / "rows"
    with open(path, "wb") as sink:
        sink.write(b"head")
        sink.flush()
        assert sum(row.write_at(sink.fileno(), 4, threads)) == count
    assert path.read_bytes() == b"head" + whole
    assert os.path.getsize(path) == 4 + count * row.width


def test_threads_write_the_file_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks are rendered side by side but written one after another: the file system
    would serialize the writes anyway, with the waiting thread spinning on a core."""
    count = 6 * CHUNK_ROWS
    row = Row(count).integers('{"v":', np.arange(count, dtype=np.uint64)).text("}")
    writing, most, lock = [0], [0], threading.Lock()
    pwrite = os.pwrite

    def watched(fd: int, data: memoryview, at: int) -> int:
        with lock:
            writing[0] += 1
            most[0] = max(most[0], writing[0])
        time.sleep(0.01)  # long enough for another thread's write to start, were it let
        try:
            return pwrite(fd, data, at)
        finally:
            with lock:
                writing[0] -= 1

    monkeypatch.setattr(os, "pwrite", watched)
    path = tmp_path / "rows"
    with open(path, "wb") as sink:
        assert sum(row.write_at(sink.fileno(), 0, 3)) == count
    assert most[0] == 1
    assert path.read_bytes() == row.render().tobytes()


def test_bad_columns_are_refused() -> None:
    with pytest.raises(ValueError, match="a column of 3 rows expected"):
        Row(3).integers("", np.arange(4))
    with pytest.raises(TypeError, match="integers expected"):
        Row(2).integers("", np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="an optional part of 3 rows"):
        Row(3).optional(np.ones(3, bool), Row(2))
