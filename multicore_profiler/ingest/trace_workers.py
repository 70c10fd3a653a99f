"""A trace's ``trace_events`` columns made on every core: worker processes decode its chunks.

msgspec holds the GIL while it decodes, so threads read a trace at one core's speed. Here
the reading process only cuts the events array into chunks (``trace_reader.Guess``);
worker processes decode each and make its columns (``events_table``), which come back
pickled over a socket and are taken in order; the reading process writes them. A chunk
a worker cannot take (a cut inside a string, an error) is read again by the reading
process itself, so every refusal names the byte ``read_trace`` names. A small trace, or
one read where no more than one core is idle, is read in-process: starting the workers,
or making them compete for busy cores, costs more than it saves (``worker_count``).

A worker is a fresh interpreter (``child_process``, as the capture writer is) that imports
this module alone (numpy, pyarrow, msgspec; no DuckDB, no torch). It ignores Ctrl-C: the
reading process stops its workers when it stops, however it stops.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import socket
import struct
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from multicore_profiler.errors import ArgumentError
from multicore_profiler.ingest.child_process import start_child
from multicore_profiler.ingest.event_columns import TimeStats, events_table
from multicore_profiler.ingest.trace_reader import (
    ARGS_KEYS,
    EventBlock,
    Guess,
    Pending,
    TraceText,
    guessed_block,
    read_guessed,
    read_trace,
    text_size,
)

WORKERS_ENV = "MCPROF_TRACE_WORKERS"
"""The environment variable that sets how many processes read a trace (1: in-process)."""

PARALLEL_BYTES_MIN = 64 << 20
"""The smallest trace file read by workers when their number is not given."""


@dataclass
class ChunkColumns:
    """A chunk's ``trace_events`` columns (``event_index`` counted from 0) and time stats."""

    table: pa.Table
    stats: TimeStats

    def __len__(self) -> int:
        return self.table.num_rows


def _chunk_columns(path: Path, guess: Guess, args_keys: tuple[str, ...]) -> ChunkColumns | None:
    """In a worker: the chunk's columns, or ``None`` where the reading process must read
    it itself (to refuse it naming the event and byte, or to cut it elsewhere)."""
    try:
        block = guessed_block(path, guess, args_keys)
        if block is None:
            return None
        stats = TimeStats()
        return ChunkColumns(events_table(block, stats), stats)
    except Exception:  # read again by the reading process, which raises what it finds
        return None


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def idle_cores(cores: int, load: float) -> int:
    """The cores of ``cores`` that a ``load`` (processes running, on average) leaves idle,
    rounded, and at least 1: workers beyond them slow a read down (on 2 cores that other
    work keeps busy, 2 workers took 1.45 times as long as one process)."""
    return max(1, min(cores, round(cores - load)))


def worker_count(path: Path, workers: int | None) -> int:
    """How many processes read ``path``: ``workers`` where given, else ``WORKERS_ENV``, else
    a worker per idle core (``idle_cores`` of the last minute's load) for a file of
    ``PARALLEL_BYTES_MIN`` or more of JSON text (a gzip file's text, not its bytes), and 1
    (this process alone) below or where no more than one core is idle."""
    if workers is None and os.environ.get(WORKERS_ENV):
        text = os.environ[WORKERS_ENV]
        if not text.isdigit():
            raise ArgumentError(f"{WORKERS_ENV} must be a number of processes, got {text!r}")
        workers = int(text)
    if workers is None:
        if text_size(path) < PARALLEL_BYTES_MIN:
            return 1
        return idle_cores(cores(), os.getloadavg()[0])
    if workers < 1:
        raise ArgumentError(f"a trace is read by 1 process or more, got {workers}")
    return workers


_GONE = object()
"""What a worker's answers hold once it ended."""

_READY = "ready"
"""A worker's first message."""

_WARM_UP = Guess(
    0,
    b'{"ph": "X", "cat": "k", "name": "a", "ts": 1.5, "dur": 2, "pid": 1, "tid": "t", "id": 3, '
    b'"args": {"correlation": 1, "External id": 2, "stream": 7, "device": 0}}',
    b",",
    False,
)
"""An event a worker reads before it says it is ready: the first chunk costs 0.2 s more
than the next ones (pyarrow and numpy set up what they use on first use), which would
hold up the chunks queued behind it."""


_LENGTH = struct.Struct("<Q")


def _send(channel: socket.socket, message: object) -> None:
    """``message`` pickled, after its length."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    channel.sendall(_LENGTH.pack(len(data)))
    channel.sendall(data)


class _Inbox:
    """The messages ``_send`` sent over a socket, each read into one buffer kept for the
    next: ``multiprocessing``'s ``Connection`` reads a message a few hundred KiB at a time,
    each into a new buffer of the size still missing, and took twice the CPU (1.0 to 1.3 s
    against 0.45 s for 200 messages of 4 MiB, both ends counted)."""

    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        self.buffer = bytearray()

    def receive(self) -> Any:
        (size,) = _LENGTH.unpack(self._read(_LENGTH.size))
        return pickle.loads(self._read(size))  # copies what it makes: the buffer is reused

    def _read(self, size: int) -> memoryview:
        if len(self.buffer) < size:
            self.buffer = bytearray(size)
        view = memoryview(self.buffer)[:size]
        done = 0
        while done < size:
            count = self.channel.recv_into(view[done:])
            if not count:
                raise EOFError("the other end closed its socket")
            done += count
        return view


def serve(fd: int) -> None:
    """A worker's loop: it says it is ready (its imports done), then sends the columns of
    each chunk sent over the socket ``fd`` until the socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with socket.socket(fileno=fd) as channel:
        inbox = _Inbox(channel)
        try:
            _chunk_columns(Path(), _WARM_UP, ARGS_KEYS)
            _send(channel, _READY)
            while True:
                _send(channel, _chunk_columns(*inbox.receive()))
        except (EOFError, OSError):  # the reading process ended
            return


class _Worker:
    """A worker process and its socket, with a thread sending it work and one taking its
    answers as they come, so that neither side waits on the other's full socket."""

    def __init__(self) -> None:
        self.process, ours = start_child("multicore_profiler.ingest.trace_workers:serve")
        self.channel = ours
        self.inbox = _Inbox(ours)
        self.work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.ready = threading.Event()
        self.gone = False
        """Whether it ended (what is sent to it then comes back unread)."""
        self.waiting = 0
        """Chunks sent whose answer is not taken yet."""
        self.threads = [
            threading.Thread(target=target, name=f"mcprof-trace-worker-{name}", daemon=True)
            for target, name in ((self._send, "send"), (self._receive, "receive"))
        ]
        for thread in self.threads:
            thread.start()

    def _send(self) -> None:
        try:
            while (work := self.work.get()) is not None:
                _send(self.channel, work)
        except OSError:  # the worker ended: its answers say so
            return

    def _receive(self) -> None:
        try:
            if self.inbox.receive() == _READY:
                self.ready.set()
            while True:
                self.answers.put(self.inbox.receive())
        except Exception:  # ended, or an answer that does not unpickle: read in-process
            self.gone = True
            self.answers.put(_GONE)

    def submit(self, work: tuple[Path, Guess, tuple[str, ...]]) -> _Answer:
        self.work.put(work)
        self.waiting += 1
        return _Answer(self)

    def answer(self) -> ChunkColumns | None:
        """The next answer; ``None`` once the worker ended."""
        self.waiting -= 1
        found = self.answers.get()
        if found is _GONE:
            self.answers.put(_GONE)
            return None
        return found

    def stop(self) -> None:
        """End it (what it was doing is no longer wanted), and its threads."""
        self.process.kill()
        self.work.put(None)
        self.process.wait()
        for thread in self.threads:
            thread.join()
        self.channel.close()


@dataclass
class _Pool:
    """The workers reading one trace; each answers its chunks in the order it got them."""

    count: int
    path: Path
    args_keys: tuple[str, ...]
    workers: list[_Worker] = field(default_factory=list)

    def start(self) -> None:
        while len(self.workers) < self.count:
            self.workers.append(_Worker())

    def _serving(self) -> list[_Worker]:
        return [worker for worker in self.workers if worker.ready.is_set() and not worker.gone]

    def ready(self) -> bool:
        """Whether a worker serves (until one does, the reading process reads alone)."""
        return bool(self._serving())

    def decode(self, guess: Guess) -> Pending[ChunkColumns]:
        """Send the chunk to the serving worker with the fewest chunks waiting."""
        serving = self._serving()
        if not serving:  # they ended: the reading process reads the chunk
            return _Unread()
        worker = min(serving, key=lambda worker: worker.waiting)
        return worker.submit((self.path, guess, self.args_keys))

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


@dataclass
class _Answer:
    worker: _Worker

    def result(self) -> ChunkColumns | None:
        return self.worker.answer()


class _Unread:
    def result(self) -> None:
        return None


def tables_of(pieces: Iterator[ChunkColumns | EventBlock], stats: TimeStats) -> Iterator[pa.Table]:
    """The ``trace_events`` tables of what ``read_guessed`` yields: a worker's columns
    numbered on from the events before them, a block read in this process made here."""
    first = 0
    for piece in pieces:
        if isinstance(piece, EventBlock):
            table = events_table(piece, stats)
        else:
            stats.add(piece.stats)
            index = pa.array(np.arange(first, first + len(piece)))
            table = piece.table.set_column(0, "event_index", index)
        first += table.num_rows
        yield table


def read_tables(
    path: Path | str,
    stats: TimeStats,
    *,
    args_keys: tuple[str, ...] = ARGS_KEYS,
    workers: int | None = None,
) -> tuple[TraceText, Generator[pa.Table, None, None]]:
    """A trace's ``trace_events`` tables (but ``write_id``) in order, read by ``workers``
    processes (``worker_count``; 1: ``read_trace`` in this process), and the trace, whose
    fields are known once the tables are exhausted; ``stats`` gathers the times. Close
    both when done: the workers are stopped (also on an error or an interrupt)."""
    path = Path(path)
    count = worker_count(path, workers)
    if count == 1:
        trace = read_trace(path, args_keys=args_keys)
        return trace, (events_table(block, stats) for block in trace.blocks)
    pool = _Pool(count, path, args_keys)
    trace, pieces = read_guessed(path, pool.decode, 2 * count, pool.ready, args_keys=args_keys)

    def tables() -> Generator[pa.Table, None, None]:
        try:
            pool.start()
            yield from tables_of(pieces, stats)
        finally:
            pieces.close()
            pool.stop()

    return trace, tables()
