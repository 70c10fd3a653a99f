"""How one store file is encoded: row groups that fill before the tables end are written on
a thread of their own while the next ones are made, one at a time, and a write in flight
always ends before the file closes, whatever fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from multicore_profiler.storage.partitions import write_parquet
from multicore_profiler.storage.schema import TableSpec

SPEC = TableSpec(
    name="numbers",
    schema=pa.schema([("x", pa.int64()), ("label", pa.string())]),
    partition_by=(),
    delta_columns=("x",),
    dictionary_columns=("label",),
    row_group_rows=4,
)


def table(first: int, rows: int) -> pa.Table:
    xs = list(range(first, first + rows))
    return pa.table({"x": xs, "label": [f"v{x % 3}" for x in xs]}, schema=SPEC.schema)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, str]]:
    """Each row group's write: ("start" or "end", its rows, the thread that wrote it), and
    ("close", 0, thread) when the writer closes. A write takes 0.2 s, so that a thread
    that did not wait for it would be seen."""
    seen: list[tuple[str, int, str]] = []
    write, close = pq.ParquetWriter.write_table, pq.ParquetWriter.close

    def slow_write(
        self: pq.ParquetWriter, batch: pa.Table, *args: object, **kwargs: object
    ) -> None:
        name = threading.current_thread().name
        seen.append(("start", batch.num_rows, name))
        time.sleep(0.2)
        write(self, batch, *args, **kwargs)
        seen.append(("end", batch.num_rows, name))

    def watched_close(self: pq.ParquetWriter) -> None:
        seen.append(("close", 0, threading.current_thread().name))
        close(self)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", slow_write)
    monkeypatch.setattr(pq.ParquetWriter, "close", watched_close)
    return seen


def test_full_row_groups_are_written_on_a_thread_while_the_next_are_made(
    tmp_path: Path, writes: list[tuple[str, int, str]]
) -> None:
    made: list[tuple[int, int]] = []  # (table, writes ended when it was made)

    def tables() -> Iterator[pa.Table]:
        for index, (first, rows) in enumerate([(0, 3), (3, 3), (6, 3), (9, 3), (12, 2)]):
            made.append((index, sum(1 for kind, *_ in writes if kind == "end")))
            yield table(first, rows)

    path = tmp_path / "part.parquet"
    assert write_parquet(path, tables(), SPEC) == 14
    main = threading.current_thread().name
    assert [(kind, rows, name == main) for kind, rows, name in writes] == [
        ("start", 6, False),  # tables 0 and 1: the group fills, is written aside
        ("end", 6, False),
        ("start", 6, False),  # tables 2 and 3
        ("end", 6, False),
        ("start", 2, True),  # the last, partial group: written in place, after the others
        ("end", 2, True),
        ("close", 0, True),
    ]
    # Table 2 was made while the first group was still being written (none had ended).
    assert made[2] == (2, 0)
    parquet = pq.ParquetFile(path)
    groups = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
    assert groups == [4, 2, 4, 2, 2]  # each write cut at row_group_rows, as before
    assert parquet.read() == table(0, 14)


def test_a_failure_of_the_tables_waits_for_the_write_in_flight_and_leaves_no_file(
    tmp_path: Path, writes: list[tuple[str, int, str]]
) -> None:
    def tables() -> Iterator[pa.Table]:
        yield table(0, 4)
        yield table(4, 1)  # the first group is being written now
        raise RuntimeError("the trace ended early")

    path = tmp_path / "part.parquet"
    with pytest.raises(RuntimeError, match="the trace ended early"):
        write_parquet(path, tables(), SPEC)
    assert [kind for kind, *_ in writes] == ["start", "end", "close"]
    assert not path.exists()


def test_a_failed_write_on_the_thread_is_raised_and_leaves_no_file(tmp_path: Path) -> None:
    def tables() -> Iterator[pa.Table]:
        yield table(0, 4)
        yield pa.table({"x": ["a", "b", "c", "d"], "label": ["v"] * 4})  # a group of its own
        yield table(8, 1)

    path = tmp_path / "part.parquet"
    with pytest.raises(ValueError, match="schema does not match"):
        write_parquet(path, tables(), SPEC)
    assert not path.exists()
