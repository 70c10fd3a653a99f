"""A trace read by worker processes gives what one process reading it gives: the same
tables, times and fields of a real fixture, and on crafted traces the same refusal, naming
the same event and byte, wherever a chunk is cut; and no worker is left behind."""

from __future__ import annotations

import glob
import gzip
import os
import signal
from collections.abc import Callable, Generator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from shared_fixtures import shared_fixture

from multicore_profiler import cli
from multicore_profiler.errors import ArgumentError, TraceFormatError
from multicore_profiler.ingest import trace_reader, trace_workers
from multicore_profiler.ingest.event_columns import TimeStats
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.ingest.trace_workers import (
    PARALLEL_BYTES_MIN,
    WORKERS_ENV,
    read_tables,
    worker_count,
)
from multicore_profiler.storage.store import open_store


def read(path: Path, workers: int) -> tuple[pa.Table | None, TimeStats, trace_reader.TraceText]:
    """Every table of ``path`` read by ``workers`` processes, joined; its stats and trace."""
    stats = TimeStats()
    trace, tables = read_tables(path, stats, workers=workers)
    with trace, closing(tables):
        found = list(tables)
    return (pa.concat_tables(found) if found else None), stats, trace


def refusal(path: Path, workers: int) -> str:
    with pytest.raises(TraceFormatError) as raised:
        read(path, workers)
    return str(raised.value)


def children() -> set[int]:
    """This process's living child processes."""
    found: set[int] = set()
    for name in glob.glob("/proc/self/task/*/children"):
        found.update(int(pid) for pid in Path(name).read_text().split())
    return found


def test_a_real_trace_reads_the_same_on_workers(monkeypatch) -> None:
    """The A100 fixture in 128 KiB chunks (200 of them; its C++ names hold ``},``)."""
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 1 << 17)
    path = shared_fixture("kineto/a100_training_rank0.json.gz")
    alone, alone_stats, alone_trace = read(path, 1)
    shared, shared_stats, shared_trace = read(path, 2)
    assert alone is not None
    assert shared is not None
    assert shared.equals(alone)
    assert shared.num_rows == 108_936
    assert shared_stats == alone_stats
    for key in ("form", "prologue", "epilogue", "events", "text_bytes", "fields"):
        assert getattr(shared_trace, key) == getattr(alone_trace, key), key


EVENT = '{"ph": "X", "name": "k%d", "ts": %d.5, "dur": 2, "pid": 1, "tid": 2, "args": {"a": 1}}'
TRAP = '{"ph": "i", "name": "a}, {", "ts": %d, "args": {"s": "}, {\\"ph\\": 1}, {"}}'
"""An event whose strings end in ``}, {``, where the workers' cut is a wrong guess."""


def crafted(
    tmp_path: Path, bad: str, *, before: int = 40, after: int = 40, end: str = "]}"
) -> Path:
    """A trace of ``before`` events (traps among them), ``bad`` and ``after`` more."""
    events = [
        (TRAP if i % 7 == 3 else EVENT) % ((i, i) if i % 7 != 3 else (i,)) for i in range(before)
    ]
    events += [bad] if bad else []
    events += [EVENT % (i, i) for i in range(before, before + after)]
    path = tmp_path / "t.json"
    path.write_bytes(
        ('{"traceEvents": [\n' + ",\n".join(events) + end).encode(errors="surrogatepass")
    )
    return path


@pytest.mark.parametrize("chunk", [300, 1000, 2500])
def test_traps_in_strings_read_the_same(tmp_path: Path, monkeypatch, chunk: int) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", chunk)
    path = crafted(tmp_path, "")
    alone, alone_stats, _ = read(path, 1)
    shared, shared_stats, shared_trace = read(path, 2)
    assert alone is not None
    assert shared is not None
    assert shared.equals(alone)
    assert shared["name"].to_pylist()[3] == "a}, {"
    assert shared_stats == alone_stats
    assert shared_trace.events == 80


BAD = {
    "malformed": '{"ph": "X" "ts": 1}',
    "not an object": '"s"',
    "ts not a number": '{"ph": "X", "ts": "abc"}',
    "pid out of range": '{"ph": "X", "pid": 9223372036854775808}',
    "lone surrogate": '{"ph": "X", "name": "a\\ud800b"}',
    "not UTF-8": '{"ph": "X", "name": "a\udcffb"}',
    "a trailing comma": '{"ph": "X", "args": {"a": 1,}}',
    "ends past int64": '{"ph": "X", "ts": 9223372036854775, "dur": 1000}',
}


@pytest.mark.parametrize("chunk", [700, 2048])
@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_refusal_names_the_same_event_and_byte(
    tmp_path: Path, monkeypatch, kind: str, chunk: int
) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", chunk)
    path = crafted(tmp_path, BAD[kind])
    alone = refusal(path, 1)
    assert refusal(path, 2) == alone
    assert str(path) in alone


@dataclass
class Done:
    """A guess decoded at once."""

    columns: trace_workers.ChunkColumns | None

    def result(self) -> trace_workers.ChunkColumns | None:
        return self.columns


def read_here(path: Path) -> pa.Table | None:
    """``path`` read as the workers read it, each guess decoded at once by their function
    in this process: every cut and every fallback, without processes."""
    stats = TimeStats()

    def decode(guess: trace_reader.Guess) -> Done:
        return Done(trace_workers._chunk_columns(path, guess, trace_reader.ARGS_KEYS))

    trace, pieces = trace_reader.read_guessed(path, decode, 3, lambda: True)
    with trace, closing(pieces):
        found = list(trace_workers.tables_of(pieces, stats))
    return pa.concat_tables(found) if found else None


def alone_or_refused(path: Path, read_with: Callable[[Path], pa.Table | None]) -> Any:
    try:
        return read_with(path)
    except TraceFormatError as exc:
        return str(exc)


@pytest.mark.parametrize("kind", ["", *sorted(BAD)])
def test_every_cut_reads_or_refuses_the_same(tmp_path: Path, monkeypatch, kind: str) -> None:
    """Chunks of every size, so that cuts fall at every byte around the bad event."""
    path = crafted(tmp_path, BAD.get(kind, ""), before=10, after=3)
    size = path.stat().st_size
    for chunk in range(24, size + 1, 23):
        monkeypatch.setattr(trace_reader, "CHUNK_BYTES", chunk)
        alone = alone_or_refused(path, lambda path: read(path, 1)[0])
        found = alone_or_refused(path, read_here)
        if isinstance(alone, str):
            assert found == alone, chunk
        else:
            assert found.equals(alone), chunk


def test_a_truncated_trace_names_the_same_count(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 900)
    path = crafted(tmp_path, "", end="")
    message = refusal(path, 2)
    assert message == refusal(path, 1)
    assert (
        message
        == f"{path} ends inside its events array after 80 complete events (a truncated file?)"
    )


def test_no_worker_is_left_behind(tmp_path: Path, monkeypatch) -> None:
    """After a refusal, a consumer that stops early, and an interrupt in its loop."""
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 700)
    before = children()
    refusal(crafted(tmp_path, BAD["malformed"]), 2)
    assert children() <= before
    path = crafted(tmp_path, "")
    trace, tables = read_tables(path, TimeStats(), workers=2)
    with trace, closing(tables):
        next(tables)
        assert len(children() - before) == 2
    assert children() <= before
    trace, tables = read_tables(path, TimeStats(), workers=2)
    with pytest.raises(KeyboardInterrupt):
        interrupted(trace, tables)
    assert children() <= before


def interrupted(trace: trace_reader.TraceText, tables: Generator[pa.Table, None, None]) -> None:
    """Ctrl-C in the loop over the tables, after the first."""
    with trace, closing(tables):
        for _ in tables:
            raise KeyboardInterrupt


def test_a_worker_killed_midway_costs_nothing_but_time(tmp_path: Path, monkeypatch) -> None:
    """Its chunks, and those after, are read by the others and the reading process."""
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 400)
    path = crafted(tmp_path, "", before=300)
    before = children()
    trace, tables = read_tables(path, TimeStats(), workers=2)
    with trace, closing(tables):
        found = [next(tables)]
        os.kill(min(children() - before), signal.SIGKILL)
        found += list(tables)
    alone = read(path, 1)[0]
    assert alone is not None
    assert pa.concat_tables(found).equals(alone)
    assert children() <= before


def test_ingest_on_workers_stores_the_same_events(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 1 << 18)
    path = shared_fixture("kineto/a100_triton_example.json.gz")
    rows = []
    for workers in (1, 2):
        store = open_store(tmp_path / f"store{workers}")
        source = ingest_trace(store, path, workers=workers)
        rows.append(
            (
                store.sql("SELECT * FROM trace_events ORDER BY event_index"),
                store.sql(
                    "SELECT event_count, first_ts_ns, last_ts_ns, rounded_count, layout "
                    "FROM trace_sources"
                ).to_pylist(),
                source.events,
            )
        )
    assert rows[1][0].equals(rows[0][0])
    assert rows[1][1:] == rows[0][1:]


def test_the_cli_refuses_the_same_on_workers(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(trace_reader, "CHUNK_BYTES", 700)
    path = crafted(tmp_path, BAD["ts not a number"])
    before = children()
    said = []
    for workers in ("1", "2"):
        monkeypatch.setenv(WORKERS_ENV, workers)
        assert cli.main(["ingest-trace", "--store", str(tmp_path / "store"), str(path)]) == 1
        said.append(capsys.readouterr().err)
    assert said[1] == said[0]
    assert 'event 40 has ts "abc", which is not a number (at byte' in said[0]
    assert children() <= before


@pytest.mark.parametrize(
    ("cores", "load", "idle"), [(2, 0.3, 2), (2, 0.6, 1), (2, 4.5, 1), (16, 3.2, 13), (16, 0, 16)]
)
def test_a_worker_per_idle_core(cores: int, load: float, idle: int) -> None:
    assert trace_workers.idle_cores(cores, load) == idle


def test_how_many_workers(tmp_path: Path, monkeypatch) -> None:
    small = tmp_path / "t.json"
    small.write_text("[]")
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert worker_count(small, None) == 1
    assert worker_count(small, 3) == 3
    monkeypatch.setattr(trace_workers, "PARALLEL_BYTES_MIN", 2)
    assert 1 <= worker_count(small, None) <= trace_workers.cores()
    monkeypatch.setenv(WORKERS_ENV, "5")
    assert worker_count(small, None) == 5
    assert worker_count(small, 1) == 1
    monkeypatch.setenv(WORKERS_ENV, "two")
    with pytest.raises(ArgumentError, match="MCPROF_TRACE_WORKERS must be a number"):
        worker_count(small, None)
    with pytest.raises(ArgumentError, match="1 process or more, got 0"):
        worker_count(small, 0)


def test_a_gzipped_trace_counts_its_text(tmp_path: Path, monkeypatch) -> None:
    """A large trace is often gzipped to a few percent of its text: its workers are chosen
    by the text's size, which its gzip trailer gives, not by the file's."""
    text = b"[" + b" " * (PARALLEL_BYTES_MIN - 2) + b"]"
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(text, compresslevel=1))
    plain = tmp_path / "t.json"
    plain.write_bytes(text[:1000])
    assert packed.stat().st_size < PARALLEL_BYTES_MIN // 100
    assert trace_reader.text_size(packed) == PARALLEL_BYTES_MIN
    assert trace_reader.text_size(plain) == 1000
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    monkeypatch.setattr(trace_workers, "cores", lambda: 4)
    monkeypatch.setattr(trace_workers.os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    assert worker_count(packed, None) == 3
    assert worker_count(plain, None) == 1
