"""The writer's side of a capture session: step batches in, committed steps out.

The session copies each recorded step's buffers into shared memory (``staging``) and
sends a ``Batch`` naming where they lie; the committer decodes them, builds the step's
Arrow rows and adds them to the window's open group, then answers with a ``Done`` that
gives the segment back. A group's cores and records are written as one file per table
(``StoreWrites.stage_steps``) when it holds ``Open.group_steps`` steps or
``GROUP_ROWS`` records, when its first step has waited ``GROUP_SECONDS``, or when its
window ends; with ``group_steps=1`` each step's are written as it comes
(``StoreWrites.stage_step``). The steps' invocations wait: at the window's end
(``WindowClosed``, in order after the window's batches) the committer writes the open
group, then commits the invocations of all the window's steps with one file
(``StoreWrites.commit``), so a window shows whole or not at all; a window with a step
that could not be written is never committed. It runs in a process of its own, started
by ``writer.StepWriter`` with the package's ``__init__`` skipped, so it loads neither
DuckDB nor torch and never takes the job's GIL; or, with ``writer="thread"``, in a
thread of the job, speaking the same messages.

Messages are read ahead: an ``Abort`` drops the queued batches of every window that
has not ended. If the session's end of the socket closes without ``Close`` or ``Abort``
(the job died; an answer that cannot be sent means the same), the committer does the
same: it still writes and commits the windows the job ended, withdraws the steps it
staged of the others (``discard_writes``, so the vacuum deletes their files), then
marks the run failed with the cost measured so far and ends the run's lease.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import ProfileError
from multicore_profiler.ingest.decode import decode_buffers
from multicore_profiler.ingest.staging import Segment, map_segment
from multicore_profiler.ingest.step_rows import KernelInfo, Launches, step_tables
from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.runs import CaptureCost, RunInfo, RunLease
from multicore_profiler.storage.writes import StagedStep, StepRows, StoreWrites

ORPHANED = "the job ended without closing its capture session"
"""The reason the committer gives for the windows it withdraws when the job died."""
GROUP_SECONDS = 1.0
"""The longest a step's rows wait in the writer's memory for the rest of their group
before they are written (the group's first step's arrival to its write)."""
GROUP_ROWS = 1 << 20
"""A group is written once it holds this many records (a Parquet row group's worth), so
that the rows a writer holds stay bounded whatever the steps' size."""


@dataclass(frozen=True)
class Open:
    """The first message: where to write, for which run and rank, and how."""

    location: StoreLocation
    run: RunInfo
    rank: int
    writer: str
    """``process`` or ``thread``: recorded with the cost."""
    lease: str | None = None
    """The run's lease file (``RunLease``), which the committer holds too until the
    session ends."""
    group_steps: int = 1
    """Steps of a window whose cores and records are written together, one file per
    table (1: a file per step); see ``Committer``."""


@dataclass(frozen=True)
class Environment:
    """Sent before ``Open``: the session's environment variables, which a writer process
    takes on before it reads the store's location (so credentials and endpoints set
    after the writer started are the ones its filesystem uses)."""

    variables: dict[str, str]


@dataclass(frozen=True)
class NewSegment:
    """A shared segment; its descriptor follows on the socket."""

    segment_id: int
    size: int
    dropped: int | None
    """A segment the session closed to make room: the committer unmaps it too."""


@dataclass(frozen=True)
class NewKernel:
    """What decoding a kernel's buffers needs, sent once per kernel."""

    key: int
    kernel: KernelInfo
    layout: BufferLayout
    frequency_hz: float
    device: int


class Group(NamedTuple):
    """Consecutive launches of one kernel and direction in a batch's segment, with the
    host's clock around each (``PreparedCall.host_launch_ns`` and ``host_sync_ns``)."""

    kernel: int
    direction: str
    count: int
    offset: int
    host_launch_ns: tuple[int | None, ...]
    host_sync_ns: tuple[int | None, ...]


class Batch(NamedTuple):
    """Launches of one step, invocation ids from ``first_invocation_id`` on. It crosses
    the socket as plain tuples (``wire``): the job's thread pickles one every step, cold
    after the kernel ran, where a dataclass's pickling costs several times as much."""

    sequence: int
    segment_id: int
    write_id: int
    """The id the step's rows are stamped with, picked by the session (which can then
    withdraw them even if the writer dies before answering)."""
    step: int
    window: int
    first_invocation_id: int
    groups: tuple[Group, ...]
    tasks: pa.Table | None
    """Task graphs of kernels this run has not written yet."""
    recorded_steps: int
    job_seconds: float
    """The session's own cost so far, kept in case the job dies before it can store it."""

    def wire(self) -> tuple[Any, ...]:
        """The batch as the plain tuple sent for it."""
        return tuple(self._replace(groups=tuple(map(tuple, self.groups))))

    @classmethod
    def from_wire(cls, values: tuple[Any, ...]) -> Batch:
        """The batch that ``wire`` gave ``values`` for."""
        batch = cls._make(values)
        return batch._replace(groups=tuple(map(Group._make, batch.groups)))


@dataclass(frozen=True)
class WindowClosed:
    """A window ended: commit its steps (answered with a ``Done``); they are final,
    whatever happens to the job later."""

    sequence: int
    window: int


@dataclass(frozen=True)
class Close:
    """Write what is queued, answer ``Closed``, and stop."""


@dataclass(frozen=True)
class Abort:
    """Drop what is queued, answer ``Closed``, and stop."""


class Done(NamedTuple):
    """A batch's answer (the session knows its window, write id and segment, which is
    free again), or a window's: written (a batch's cores and records; a window's commit),
    or its error, or neither (skipped after an error or an abort). Sent as a plain tuple
    (see ``Batch``), the one answer that is."""

    sequence: int
    written: bool
    invocations: int
    cpu_seconds: float
    error: str | None = None
    profile_error: bool = False
    """Whether ``error`` is a ``ProfileError`` (bad buffers or a store refusing them)."""


@dataclass(frozen=True)
class Closed:
    """The committer's last message of a session."""


@dataclass(frozen=True)
class Ready:
    """A writer process's first message: it can take a session."""


Message = NewSegment | NewKernel | Batch | WindowClosed | Close | Abort


def send_plain(connection: Connection, message: Message | Done | Closed) -> None:
    """Send a step's message or its answer with plain pickle, a ``Batch`` as its ``wire``
    tuple and a ``Done`` as its values: ``Connection.send`` builds a ``ForkingPickler`` per
    message, with a copy of its reducer table, and a step's hand-over runs cold after the
    kernel, where that cost the job's thread about 0.04 ms."""
    if isinstance(message, Batch):
        message = message.wire()
    elif isinstance(message, Done):
        message = tuple(message)
    connection.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))


class Committer:
    """Serves one session on its socket until ``Close``, ``Abort`` or the socket's end."""

    def __init__(self, connection: Connection, opening: Open, clock: Callable[[], float]) -> None:
        self._connection = connection
        self._clock = clock
        self._queue: deque[Batch | NewKernel | WindowClosed | Close | Abort | None] = deque()
        self._segments: dict[int, Segment] = {}
        self._kernels: dict[int, NewKernel] = {}
        self._staged: dict[int, list[StagedStep]] = {}
        """The steps written of each window not committed yet."""
        self._group: list[StepRows] = []
        """Steps of one window decoded and not yet written (at most ``group_steps``)."""
        self._group_window = 0
        self._group_since = 0.0
        """When the group's first step arrived (``time.monotonic``)."""
        self._group_rows = 0
        self._late: Done | None = None
        """The error of a group written when its time ran out, answered with the next
        message of the session."""
        self._gone = False
        """Whether the session's end of the socket is closed (answers go nowhere)."""
        self._ended: set[int] = set()
        """Windows the session ended, as far as read (ahead of the batches written)."""
        self._failed = False
        self._aborted = False
        self._cpu_seconds = 0.0
        self._cost = (0, 0.0)
        self._opening = opening
        self._writes = StoreWrites(opening.location)
        self._lease = None if opening.lease is None else RunLease(opening.lease)
        if self._lease is not None:
            self._lease.hold()

    def serve(self) -> bool:
        """Answer batches until the session ends; then close every segment. Return
        whether the session closed (else the socket ended: the job is gone)."""
        try:
            while True:
                message = self._next()
                if message is None:
                    self._orphaned()
                    return False
                if isinstance(message, Batch):
                    self._answer(self._batch(message))
                elif isinstance(message, WindowClosed):
                    self._answer(self._commit(message))
                elif isinstance(message, NewKernel):
                    self._kernels[message.key] = message
                else:  # Close or Abort: every batch before it is answered
                    self._answer(Closed())
                    if not self._gone:
                        return True
        finally:
            for segment in self._segments.values():
                segment.close()
            if self._lease is not None:
                self._lease.release()

    def _answer(self, answer: Done | Closed) -> None:
        """Send an answer; a session that is gone (the job died) gets none, and the
        messages it sent before it went are served as an orphan's."""
        if self._gone:
            return
        try:
            send_plain(self._connection, answer)
        except OSError:
            self._gone = self._aborted = True

    def _next(self) -> Batch | NewKernel | WindowClosed | Close | Abort | None:
        """The next message, after reading every one already sent (None: the socket
        ended without Close; the ``Close`` or ``Abort`` of a session that then went is
        skipped, so its end is served as an orphan's)."""
        while not self._queue or self._connection.poll(0):
            if not self._queue and self._group:
                left = self._group_since + GROUP_SECONDS - time.monotonic()
                if left <= 0 or not self._connection.poll(left):
                    self._write_late()
                    continue
            try:
                message = self._connection.recv()
            except (EOFError, OSError):
                self._gone = self._aborted = True
                self._queue.append(None)
                break
            if type(message) is tuple:
                message = Batch.from_wire(message)
            elif isinstance(message, NewSegment):
                self._map(message)
                continue
            if isinstance(message, WindowClosed):
                self._ended.add(message.window)
            if isinstance(message, Abort):
                self._aborted = True
            self._queue.append(message)
        message = self._queue.popleft()
        if isinstance(message, Close | Abort) and self._gone:
            return self._next()
        return message

    def _map(self, message: NewSegment) -> None:
        fd = recv_handle(self._connection)
        if message.dropped is not None:
            self._segments.pop(message.dropped).close()
        self._segments[message.segment_id] = map_segment(message.segment_id, fd, message.size)

    def _batch(self, batch: Batch) -> Done:
        self._cost = (batch.recorded_steps, batch.job_seconds)
        if self._late is not None:
            return self._late_answer(batch.sequence)
        if self._failed or (self._aborted and batch.window not in self._ended):
            return Done(batch.sequence, False, 0, 0.0)
        began = self._clock()
        try:
            invocations = self._write(batch)
        except BaseException as exc:
            self._failed = True
            return self._error(batch.sequence, exc, began)
        return Done(batch.sequence, True, invocations, self._spent(began))

    def _commit(self, closed: WindowClosed) -> Done:
        """Commit the steps of a window that ended, all of them with one file (after its
        open group's files); none if one of them could not be written."""
        if self._late is not None:
            return self._late_answer(closed.sequence)
        began = self._clock()
        if self._group and self._group_window == closed.window and not self._failed:
            try:
                self._write_group()
            except BaseException as exc:
                self._failed = True
                return self._error(closed.sequence, exc, began)
        staged = self._staged.pop(closed.window, [])
        if self._failed or not staged:
            return Done(closed.sequence, False, 0, self._spent(began))
        try:
            self._writes.commit(self._opening.run.run_id, staged)
        except BaseException as exc:
            self._failed = True
            self._staged[closed.window] = staged  # withdrawn with the run's end
            return self._error(closed.sequence, exc, began)
        invocations = sum(s.invocations.num_rows for s in staged)
        return Done(closed.sequence, True, invocations, self._spent(began))

    def _write_late(self) -> None:
        """Write the open group, whose first step waited ``GROUP_SECONDS``; an error is
        answered with the session's next message. A group that will not be committed
        (after an error, or an abort before its window ended) is dropped."""
        if self._failed or (self._aborted and self._group_window not in self._ended):
            self._group, self._group_rows = [], 0
            return
        began = self._clock()
        try:
            self._write_group()
        except BaseException as exc:
            self._failed = True
            self._late = self._error(0, exc, began)
        else:
            self._spent(began)

    def _late_answer(self, sequence: int) -> Done:
        """The error of a group written late, as the answer to message ``sequence``."""
        late, self._late = self._late, None
        return late._replace(sequence=sequence)

    def _error(self, sequence: int, exc: BaseException, began: float) -> Done:
        """The answer for a batch or window that could not be written."""
        profile = isinstance(exc, ProfileError)
        return Done(
            sequence,
            False,
            0,
            self._spent(began),
            error=str(exc) if profile else repr(exc),
            profile_error=profile,
        )

    def _spent(self, began: float) -> float:
        """The CPU time since ``began``, counted into the session's writer cost."""
        cpu = self._clock() - began
        self._cpu_seconds += cpu
        return cpu

    def _write(self, batch: Batch) -> int:
        """Decode the batch's launches and stage them as one step write of its window;
        return how many invocations it holds."""
        opening = self._opening
        if batch.tasks is not None:
            self._writes.write_tasks(opening.run.run_id, batch.tasks)
        view = self._segments[batch.segment_id].view
        parts = []
        first = batch.first_invocation_id
        for group in batch.groups:
            kernel = self._kernels[group.kernel]
            size = kernel.layout.total_bytes
            buffers = view[group.offset : group.offset + group.count * size]
            decoded = decode_buffers(
                buffers.reshape(group.count, size),
                kernel.layout,
                frequency_hz=kernel.frequency_hz,
                warn_dropped=False,
            )
            launches = Launches(
                rank=opening.rank,
                device=kernel.device,
                step=batch.step,
                first_invocation_id=first,
                direction=group.direction,
                window_id=batch.window,
                host_launch_ns=group.host_launch_ns,
                host_sync_ns=group.host_sync_ns,
            )
            parts.append(step_tables(decoded, kernel.kernel, launches))
            first += group.count
        invocations, cores, records = (
            tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            for tables in zip(*parts, strict=True)
        )
        if opening.group_steps == 1:
            staged = self._writes.stage_step(
                opening.run.run_id,
                batch.step,
                invocations=invocations,
                cores=cores,
                records=records,
                write_id=batch.write_id,
            )
            self._staged.setdefault(batch.window, []).append(staged)
            return invocations.num_rows
        if self._group and self._group_window != batch.window:
            self._write_group()
        if not self._group:
            self._group_window, self._group_since = batch.window, time.monotonic()
        self._group.append(StepRows(batch.step, invocations, cores, records, batch.write_id))
        self._group_rows += records.num_rows
        if (
            len(self._group) >= opening.group_steps
            or self._group_rows >= GROUP_ROWS
            or time.monotonic() - self._group_since >= GROUP_SECONDS
        ):
            self._write_group()
        return invocations.num_rows

    def _write_group(self) -> None:
        """Write the open group's cores and records, one file per table, as staged steps
        of its window; the group is gone either way (a failed write fails the session)."""
        group, self._group, self._group_rows = self._group, [], 0
        staged = self._writes.stage_steps(self._opening.run.run_id, group)
        self._staged.setdefault(self._group_window, []).extend(staged)

    def _orphaned(self) -> None:
        """The job died: withdraw the steps staged of windows never committed, fail the
        run and end its lease (kept if the run's row cannot be written: a full disk)."""
        opening = self._opening
        run_id = opening.run.run_id
        with contextlib.suppress(Exception):  # rows no view shows: only the vacuum's
            for window, staged in self._staged.items():
                self._writes.discard_writes(
                    run_id,
                    opening.rank,
                    [s.write_id for s in staged],
                    window_id=window,
                    reason=ORPHANED,
                )
        steps, job_seconds = self._cost
        cost = CaptureCost(
            steps=steps,
            job_seconds=job_seconds,
            writer_cpu_seconds=self._cpu_seconds,
            writer=opening.writer,
        )
        self._writes.write_run(opening.run.finish("failed", capture=cost))
        if self._lease is not None:
            self._lease.end()


def serve(connection: Connection, clock: Callable[[], float], *, adopt: bool) -> None:
    """Serve sessions one after another, each opened by ``Environment`` and ``Open``,
    until the socket ends; with ``adopt`` (a process of its own) take on each session's
    environment first."""
    while True:
        try:
            environment = connection.recv()
            if adopt and isinstance(environment, Environment):
                for name in os.environ.keys() - environment.variables.keys():
                    del os.environ[name]
                os.environ.update(environment.variables)
            opening = connection.recv()
        except (EOFError, OSError):
            return
        if not isinstance(environment, Environment) or not isinstance(opening, Open):
            raise TypeError(f"a capture session starts with Environment and Open, got {opening!r}")
        if not Committer(connection, opening, clock).serve():
            return


def main(fd: int) -> None:
    """The writer process: say it is ready, then serve the sessions of the job's socket
    ``fd`` (the job's Ctrl-C is the session's to handle, so the writer ignores SIGINT).

    It runs as a batch task (``SCHED_BATCH``, where there is one): the step that wakes
    it does not hand it the CPU of the job's thread at once, which halved the job
    thread's time per step on a busy machine. pyarrow's first conversion of a numpy value
    costs about 8 ms (it looks for pandas, which this process refuses: see ``no_pandas``):
    that is done here, before the first step is waiting for it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(os, "SCHED_BATCH"):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    pa.array(np.zeros(1, np.int64))
    connection = Connection(fd)
    connection.send(Ready())
    serve(connection, time.process_time, adopt=True)
