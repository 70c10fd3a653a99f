"""The capture session's writer: a step's buffers handed over, its commit acknowledged.

At the end of a recorded step the session gives the step's launches to
``StepWriter.put``, which copies each buffer from the device into a shared segment
(``staging``) and sends one ``Batch`` to the committer (``committer``). That is all
the job's thread does for a step: decoding, Arrow, Parquet and fsync happen in the
committer, by default in a process of its own (``writer="process"``), where they never
hold the job's GIL; ``writer="thread"`` runs the same committer in a thread of the job.
A writer process outlives its session: the next session of the same process takes it
(starting one costs a few hundred milliseconds of CPU), with that session's environment,
and it exits with the process.

Backpressure is bounded: at most ``depth`` batches are in flight (handed over and not
yet written). A ``put`` beyond that waits until the oldest is written, so a slow
store slows ``prof.step()`` by one step write at a time, and the session holds at most
``depth`` segments, each the size of the largest step it recorded. Every wait for an
answer is bounded by ``timeout`` seconds: a writer that says nothing for that long (a
stopped or stuck process) is killed and reported. A batch that cannot be stored, or a
writer that dies, is raised as ``CaptureError`` at the next ``put``, ``flush`` or
``close``, naming the cause (a process killed by a signal names it).
"""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from typing import IO, TYPE_CHECKING, Any

from multicore_profiler.errors import CaptureError, SessionError
from multicore_profiler.ingest.child_process import start_child
from multicore_profiler.ingest.committer import (
    Abort,
    Batch,
    Close,
    Closed,
    Done,
    Environment,
    Group,
    Message,
    NewKernel,
    NewSegment,
    Open,
    Ready,
    WindowClosed,
    send_plain,
    serve,
)
from multicore_profiler.ingest.decode import dropped_records
from multicore_profiler.ingest.staging import Segments
from multicore_profiler.ingest.step_rows import KernelInfo, task_table
from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.writes import new_write_id

if TYPE_CHECKING:
    from multicore_profiler.kernels.runtime import PreparedCall, RuntimeConfig

QUEUE_DEPTH = 4
"""Batches in flight before the session's next hand-over waits for the writer."""

GROUP_STEPS = 16
"""Steps of a window whose cores and records the committer writes as one file per table
(within ``committer.GROUP_SECONDS``); 1 writes a file per step."""

STDERR_TAIL = 2000
"""Characters of a dead writer process's stderr quoted in the error."""

START_TIMEOUT = 120.0
"""Seconds a new writer process has to say it is ready (it imports numpy and pyarrow)."""

WRITER_TIMEOUT = 300.0
"""Default seconds a session waits for an answer of its writer before it gives up on it."""


@dataclass
class WriterStats:
    """What a session's writer has committed so far: step writes, invocations, and the
    CPU time it took (which a job on the same CPUs pays for)."""

    batches: int = 0
    invocations: int = 0
    cpu_seconds: float = 0.0


def _ended(code: int | None) -> str:
    """How a writer process ended, in words."""
    if code is None:
        return "stopped answering"
    if code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with status {code}"


@dataclass(eq=False)
class WriterProcess:
    """A writer process, its socket and its stderr (a file, read if it dies)."""

    process: subprocess.Popen[bytes]
    connection: Connection
    stderr: IO[bytes]
    owner: int = field(default_factory=os.getpid)
    """The process that started it: a forked child must not speak on its socket."""

    @classmethod
    def start(cls) -> WriterProcess:
        """A new writer process, serving sessions over a socket pair."""
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (kept open while it runs)
        try:
            process, ours = start_child(
                "multicore_profiler.ingest.committer:main", stdout=subprocess.DEVNULL, stderr=stderr
            )
        except BaseException:
            stderr.close()
            raise
        started = cls(process, Connection(ours.detach()), stderr)
        _STARTED.add(started)
        started.wait_ready()
        return started

    def wait_ready(self) -> None:
        """Wait for its ``Ready``; a writer that dies or hangs first is a ``CaptureError``."""
        try:
            if self.connection.poll(START_TIMEOUT) and isinstance(self.connection.recv(), Ready):
                return
        except (EOFError, OSError):
            pass
        self.process.kill()
        error = CaptureError(f"{self.ended()} before it was ready")
        self.stop()
        raise error

    def idle(self) -> bool:
        """Whether it can serve a session: alive, ours, and silent (an idle writer says
        nothing; a readable socket means it ended)."""
        return (
            self.owner == os.getpid()
            and self.process.poll() is None
            and not self.connection.poll(0)
        )

    def ended(self) -> str:
        """How it ended, in words, with the end of what it wrote to stderr."""
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        self.stderr.seek(0)
        said = self.stderr.read().decode(errors="replace").strip()[-STDERR_TAIL:]
        return f"the profile writer process (pid {self.process.pid}) {_ended(code)}" + (
            f"; it said: {said}" if said else ""
        )

    def stop(self) -> None:
        """Close its socket, which ends it, and wait for it (killed if it hangs)."""
        self.connection.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


_IDLE: list[WriterProcess] = []
"""Writer processes whose session ended, for the next session of this process."""

_STARTED: weakref.WeakSet[WriterProcess] = weakref.WeakSet()
"""Every writer process this process started and still knows: busy or idle."""


def _take_writer_process() -> WriterProcess:
    while _IDLE:
        kept = _IDLE.pop()
        if kept.idle():
            return kept
        kept.stop()
    return WriterProcess.start()


def stop_idle_writers() -> None:
    """Stop the writer processes kept for later sessions (done at exit; a session started
    afterwards starts a new one)."""
    while _IDLE:
        _IDLE.pop().stop()


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) closes its copies of the writers' sockets
    without a word: they are its parent's, and a writer must see the parent's end when
    the parent goes, not when the last of its children does."""
    for started in list(_STARTED):
        started.connection.close()
    _STARTED.clear()
    _IDLE.clear()


atexit.register(stop_idle_writers)
os.register_at_fork(after_in_child=_forget_in_child)


class StepWriter:
    """Hands the recorded steps of one (run, rank) to a committer and tracks its answers."""

    def __init__(
        self,
        location: StoreLocation,
        run: RunInfo,
        rank: int,
        *,
        writer: str = "process",
        depth: int = QUEUE_DEPTH,
        timeout: float = WRITER_TIMEOUT,
        lease: str | None = None,
        group_steps: int = GROUP_STEPS,
    ) -> None:
        self.stats = WriterStats()
        """Updated as the committer's answers arrive."""
        self._rank = rank
        self._depth = depth
        self._timeout = timeout
        self._segments = Segments(depth)
        self._kernels: dict[tuple[str, int, int], tuple[int, RuntimeConfig]] = {}
        self._in_flight: dict[int, tuple[int, int, int]] = {}
        """Batches handed over and not answered: sequence -> (window, write id, segment)."""
        self._closing: dict[int, int] = {}
        """Windows whose commit was asked for and not answered: sequence -> window."""
        self._writes: dict[int, list[int]] = defaultdict(list)
        """The step writes of each window, answered as written or not (yet) answered."""
        self._committed: set[int] = set()
        """Windows the writer answered as committed."""
        self._sequence = 0
        self._error: CaptureError | None = None
        self._dead: CaptureError | None = None
        self._process: WriterProcess | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._released = False
        if writer == "process":
            self._process = _take_writer_process()
            self._connection = self._process.connection
        else:
            ours, theirs = socket.socketpair()
            self._thread = threading.Thread(
                target=_serve_in_thread,
                args=(Connection(theirs.detach()),),
                name="mcprof-writer",
                daemon=True,
            )
            self._thread.start()
            self._connection = Connection(ours.detach())
        try:
            self._connection.send(Environment(dict(os.environ)))
            self._connection.send(Open(location, run, rank, writer, lease, group_steps))
        except (TypeError, AttributeError, pickle.PicklingError) as exc:  # a live filesystem
            self._release()  # the writer has the environment and waits for an Open: stop it
            raise SessionError(
                f"the store at {location} cannot be handed to a writer ({exc})"
            ) from exc

    @property
    def pid(self) -> int | None:
        """The writer process's id (None for a thread)."""
        return None if self._process is None else self._process.process.pid

    def put(
        self,
        calls: Sequence[PreparedCall],
        *,
        step: int,
        window: int,
        first_invocation_id: int,
        new_configs: Sequence[RuntimeConfig],
        recorded_steps: int,
        job_seconds: float,
    ) -> tuple[int, int]:
        """Copy the launches' buffers (synchronized already) to shared memory and hand
        them over as one batch, with each launch's host times; wait first while ``depth``
        batches are in flight. Return
        how many records the device dropped in them: in full slots, and in slots that
        are not full.

        Answers are read only when the queue is full, all those there at once, so a step
        costs one message; a writer that died is seen at once all the same."""
        self._check_alive()
        while len(self._in_flight) >= self._depth and self._dead is None:
            self._answers(wait=True)
        self._raise()
        segment, new, dropped_id = self._segments.take(
            sum(c.config.layout.total_bytes for c in calls)
        )
        if new:
            self._send(NewSegment(segment.id, segment.size, dropped_id), fd=segment.fd)
        view = segment.view
        groups, offset, full, partial = [], 0, 0, 0
        for (kernel, direction), group in groupby(
            calls, key=lambda c: (self._kernel(c.config), c.direction)
        ):
            members = list(group)
            groups.append(
                Group(
                    kernel,
                    direction,
                    len(members),
                    offset,
                    tuple(c.host_launch_ns for c in members),
                    tuple(c.host_sync_ns for c in members),
                )
            )
            first = offset
            for call in members:
                size = call.config.layout.total_bytes
                call.config.backend.to_host(call.buffer, view[offset : offset + size])
                offset += size
            in_full, in_partial = dropped_records(view[first:offset], members[0].config.layout)
            full, partial = full + in_full, partial + in_partial
        self._sequence += 1
        write_id = new_write_id()
        self._send(
            Batch(
                sequence=self._sequence,
                segment_id=segment.id,
                write_id=write_id,
                step=step,
                window=window,
                first_invocation_id=first_invocation_id,
                groups=tuple(groups),
                tasks=task_table(self._rank, new_configs) if new_configs else None,
                recorded_steps=recorded_steps,
                job_seconds=job_seconds,
            )
        )
        self._in_flight[self._sequence] = (window, write_id, segment.id)
        self._writes[window].append(write_id)
        return full, partial

    def window_closed(self, window: int) -> None:
        """A window ended: the writer commits its steps, all at once, and they stay
        whatever happens to the job later."""
        self._sequence += 1
        self._send(WindowClosed(self._sequence, window))
        self._closing[self._sequence] = window

    def flush(self) -> None:
        """Wait until every batch handed over is taken by the writer (written, or held in
        its window's open group) and every window ended is committed; raise if one could
        not be."""
        while (self._in_flight or self._closing) and self._dead is None:
            self._answers(wait=True)
        self._raise()

    def close(self) -> None:
        """Commit what is in flight, then stop the writer; raise if a batch could not be
        stored or the writer died."""
        try:
            self.flush()
            self._send(Close())
            self._until_closed()
            self._closed = True
            self._raise()
        finally:
            self._release()

    def abort(self) -> None:
        """Drop the batches not yet being written, let the one being written finish, and
        stop the writer; a writer that is already dead is only cleaned up."""
        if self._released:
            return
        try:
            if self._dead is None:
                try:
                    self._send(Abort())
                    self._until_closed()
                    self._closed = True
                except CaptureError:
                    pass  # it died meanwhile: there is nothing left to stop
        finally:
            self._release()

    def uncommitted(self) -> dict[int, list[int]]:
        """The step writes of each window that the writer has not answered as committed:
        those it staged, those not answered, and those it may have committed (a writer
        that died may have committed a window without saying so)."""
        return {w: ids for w, ids in self._writes.items() if w not in self._committed}

    def _kernel(self, config: RuntimeConfig) -> int:
        """The committer's key of a config's kernel, sent the first time it is seen."""
        identity = (config.config_id, id(config.metadata), id(config.backend))
        known = self._kernels.get(identity)
        if known is not None:
            return known[0]
        key = len(self._kernels)
        self._kernels[identity] = (key, config)  # holds metadata and backend: ids stay theirs
        meta, backend = config.metadata, config.backend
        kernel = KernelInfo(
            kernel_name=meta.kernel_name,
            owner_label=meta.owner_label,
            stage_names=meta.stage_names,
            soc=backend.soc,
            frequency_source=backend.frequency_source,
            config_id=config.config_id,
        )
        self._send(
            NewKernel(key, kernel, config.layout, backend.frequency_hz, backend.device_index)
        )
        return key

    def _send(self, message: Message, fd: int | None = None) -> None:
        if self._dead is not None:
            raise self._dead
        try:
            send_plain(self._connection, message)  # descriptors go by send_handle
            if fd is not None:
                send_handle(self._connection, fd, self.pid or 0)
        except OSError as exc:
            raise self._died() from exc

    def _receive(self) -> Done | Closed:
        if self._dead is not None:
            raise self._dead
        try:
            if not self._connection.poll(self._timeout):
                raise self._silent()
            return _answer(self._connection.recv())
        except (EOFError, OSError) as exc:
            raise self._died() from exc

    def _silent(self) -> CaptureError:
        """The error that a writer that said nothing for ``timeout`` seconds is reported
        with; a process is killed (it may be stopped, or stuck), a thread left behind."""
        if self._process is None:
            self._dead = CaptureError(
                f"the profile writer thread did not answer for {self._timeout:g} s"
            )
        else:
            self._process.process.kill()
            self._dead = CaptureError(
                f"the profile writer process (pid {self._process.process.pid}) did not "
                f"answer for {self._timeout:g} s (stopped or stuck), and was killed"
            )
        return self._dead

    def _check_alive(self) -> None:
        """Raise if the writer ended, without reading its answers. A thread is looked at;
        a process is not (a ``waitpid`` each step): its end of the socket closed with it,
        so the step's first send to it fails and says how it ended."""
        if self._dead is None and self._process is None and not self._thread.is_alive():
            raise self._died()
        if self._dead is not None:
            raise self._dead

    def _answers(self, *, wait: bool) -> None:
        """Take in the answers already there, and (``wait``) at least one."""
        while wait or self._connection.poll(0):
            answer = self._receive()
            if isinstance(answer, Done):
                self._answered(answer)
            wait = False

    def _answered(self, done: Done) -> None:
        self.stats.cpu_seconds += done.cpu_seconds
        window = self._closing.pop(done.sequence, None)
        if window is not None:
            if done.written:
                self._committed.add(window)
        else:
            _, _, segment = self._in_flight.pop(done.sequence)
            self._segments.give_back(segment)
            if done.written:
                self.stats.batches += 1
                self.stats.invocations += done.invocations
        if done.error is not None and self._error is None:
            self._error = CaptureError(
                f"profile buffers could not be stored: {done.error}"
                if done.profile_error
                else f"the profile writer failed: {done.error}"
            )

    def _until_closed(self) -> None:
        while not isinstance(answer := self._receive(), Closed):
            self._answered(answer)

    def _raise(self) -> None:
        if self._dead is not None:
            raise self._dead
        if self._error is not None:
            raise self._error

    def _died(self) -> CaptureError:
        """The error that a writer that stopped answering is reported with."""
        if self._dead is None:
            self._last_answers()
            self._dead = CaptureError(
                "the profile writer thread ended unexpectedly"
                if self._process is None
                else self._process.ended()
            )
        return self._dead

    def _last_answers(self) -> None:
        """Take in what a writer that ended said before it went."""
        try:
            while self._connection.poll(0):
                answer = _answer(self._connection.recv())
                if isinstance(answer, Done):
                    self._answered(answer)
        except (EOFError, OSError):
            return

    def _release(self) -> None:
        """Close this side: the segments, and the thread, or the process, which is kept
        for the next session when it closed this one cleanly."""
        self._released = True
        self._segments.close()
        if self._process is not None:
            if self._closed:
                _IDLE.append(self._process)
            else:
                self._process.stop()
        else:
            self._connection.close()
            self._thread.join(None if self._dead is None else 0)  # a stuck one is left


def _answer(received: Any) -> Done | Closed:
    """A committer's answer as received: a ``Done`` comes as its plain tuple."""
    return Done._make(received) if type(received) is tuple else received


def _serve_in_thread(connection: Connection) -> None:
    """The committer in a thread of the job, for one session (its CPU clock is the
    thread's)."""
    try:
        serve(connection, time.thread_time, adopt=False)
    finally:
        connection.close()
