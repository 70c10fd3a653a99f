"""The capture session: ``mega_kernel_profile()`` and ``prof.step()``, shaped like torch.profiler.

While a session is open, every MegaKernel launch passes through it (the kernel calls
``prepare_call``). The schedule decides per step whether launches run plain (no
buffer, no clock), profile for warmup (buffers thrown away) or record. At the end of
each recorded step the session synchronizes the device, copies the buffers into
host memory shared with the writer, returns them to the pool and hands the step over;
the writer (a process of its own, see ``writer``) decodes and stores it as that step's
partition while the job runs on. A window (the recorded steps of one schedule cycle)
ends with ``on_trace_ready(prof)``, once its rows are in the store.

The session times itself on the job's thread (launch preparation, hand-over, waits
for the writer) over the recorded steps, and stores that with the writer's CPU time in
the run's row (``CaptureCost``).

It also times each profiled launch on the host's monotonic clock
(``time.perf_counter_ns``), stored as the invocation's ``host_launch_ns`` (as ``prepare``
hands the call out) and ``host_sync_ns`` (once the host knew the kernel had finished:
``complete()`` for a backend whose launches block, else the step's synchronize).

The user gives no rank, device, frequency or buffer: the rank comes from
torch.distributed when it is initialized, everything else from the kernel's config
and backend.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from multicore_profiler.errors import DroppedRecordsWarning, ProfileError, SessionError
from multicore_profiler.extension import Extensible
from multicore_profiler.ingest.pool import BufferPool
from multicore_profiler.ingest.schedule import ProfilerAction, Schedule
from multicore_profiler.ingest.writer import GROUP_STEPS, WRITER_TIMEOUT, StepWriter, WriterStats
from multicore_profiler.kernels.runtime import (
    PreparedCall,
    RuntimeConfig,
    install_sink,
    remove_sink,
)
from multicore_profiler.storage.claims import Claim, hold_ids, release_claim
from multicore_profiler.storage.runs import WRITERS, CaptureCost, RunInfo, RunLease, new_run_id
from multicore_profiler.storage.store import Store, open_store

RUN_ID_ENV = "MCPROF_RUN_ID"
WRITER_TIMEOUT_ENV = "MCPROF_WRITER_TIMEOUT"
"""Seconds a session waits for an answer of its writer, when ``writer_timeout`` is not given."""
ID_BLOCK = 1024
"""Invocation ids a session claims at a time in a run that other sessions may share."""
_PACKAGE = "multicore_profiler."

ScheduleFn = Callable[[int], Any]
"""A step number to an action: ``schedule(...)``, or ``torch.profiler.schedule(...)``."""


@dataclass(frozen=True)
class Window:
    """A recording window that has ended: its index, steps and invocations kept."""

    index: int
    steps: tuple[int, ...]
    invocations: int


def _action(value: Any) -> ProfilerAction:
    """A schedule's answer as our ``ProfilerAction`` (torch's enum maps by name)."""
    name = getattr(value, "name", None)
    if name not in ProfilerAction.__members__:
        raise SessionError(f"the schedule returned {value!r}, which is not a ProfilerAction")
    return ProfilerAction[name]


def _describe(schedule: ScheduleFn | None) -> str:
    """A schedule as the ``runs`` table keeps it: ``schedule(wait=1, ...)`` also for
    ``torch.profiler.schedule`` (read from its closure), else the callable's name."""
    if schedule is None:
        return "every step"
    if isinstance(schedule, Schedule):
        return str(schedule)
    code = getattr(schedule, "__code__", None)
    cells = getattr(schedule, "__closure__", None) or ()
    values = (
        dict(zip(code.co_freevars, (c.cell_contents for c in cells), strict=True)) if code else {}
    )
    names = ("wait", "warmup", "active", "repeat", "skip_first", "skip_first_wait")
    if all(n in values for n in names[:3]):
        args = ", ".join(f"{n}={values[n]}" for n in names if n in values)
        return f"{getattr(schedule, '__module__', '')}.schedule({args})".lstrip(".")
    return getattr(schedule, "__qualname__", type(schedule).__qualname__)


def _writer_timeout(value: float | None) -> float:
    """``writer_timeout``, else ``$MCPROF_WRITER_TIMEOUT``, else the default; a positive,
    finite number of seconds."""
    where = "writer_timeout"
    if value is None and os.environ.get(WRITER_TIMEOUT_ENV):
        where, text = f"${WRITER_TIMEOUT_ENV}", os.environ[WRITER_TIMEOUT_ENV]
        try:
            value = float(text)
        except ValueError:
            raise SessionError(f"{where} must be a number of seconds, got {text!r}") from None
    if value is None:
        return WRITER_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SessionError(f"{where} must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise SessionError(f"{where} must be a positive number of seconds, got {value}")
    return float(value)


def _dropped_message(step: int, launches: int, full: int, partial: int) -> str:
    """What the end of a step says of the records its launches' slots dropped: in full
    slots, and in slots that are not full."""
    reasons = [
        (full, "because slots were full (plan a larger capacity)"),
        (
            partial,
            "in slots that are not full (their record_count is below their capacity; the "
            "invocations list them in partial_slots)",
        ),
    ]
    given = [(n, why) for n, why in reasons if n]
    head = f"step {step}: the device dropped {full + partial} records in {launches} launch(es)"
    if len(given) == 1:
        return f"{head} {given[0][1]}; the rest are kept"
    return f"{head}: {', '.join(f'{n} {why}' for n, why in given)}; the rest are kept"


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside this package."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def _distributed() -> tuple[int, int]:
    """(rank, world size) from torch.distributed, or (0, 1) when it is not initialized."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _job_run_id(world_size: int) -> str:
    """One run id for every rank of a job: ``$MCPROF_RUN_ID``, else rank 0's, broadcast."""
    run_id = os.environ.get(RUN_ID_ENV) or new_run_id()
    if world_size > 1 and not os.environ.get(RUN_ID_ENV):
        import torch.distributed as dist

        box = [run_id]
        dist.broadcast_object_list(box, src=0)
        run_id = box[0]
    return run_id


class MegaKernelProfile(Extensible):
    """An open capture session; see ``mega_kernel_profile``. Its ``export_chrome_trace``
    comes from ``export`` (``export/handlers.py``), which ingest does not import."""

    def __init__(
        self,
        *,
        schedule: ScheduleFn | None,
        on_trace_ready: Callable[[MegaKernelProfile], object] | None,
        store: Store | Path | str | None,
        detailed_task_names: bool,
        max_pending_calls: int,
        label: str | None,
        tags: Mapping[str, str] | None,
        writer: str,
        writer_timeout: float | None = None,
        group_steps: int = GROUP_STEPS,
    ) -> None:
        if isinstance(group_steps, bool) or not isinstance(group_steps, int) or group_steps < 1:
            raise SessionError(f"group_steps must be an int >= 1, got {group_steps!r}")
        if isinstance(max_pending_calls, bool) or not isinstance(max_pending_calls, int):
            raise SessionError(f"max_pending_calls must be an int, got {max_pending_calls!r}")
        if max_pending_calls < 1:
            raise SessionError(f"max_pending_calls must be >= 1, got {max_pending_calls}")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise SessionError(f"on_trace_ready must be callable, got {on_trace_ready!r}")
        if schedule is not None and not callable(schedule):
            raise SessionError(f"schedule must be callable, got {schedule!r}")
        if writer not in WRITERS:
            raise SessionError(f"writer must be one of {WRITERS}, got {writer!r}")
        self._schedule = schedule
        self._on_trace_ready = on_trace_ready
        self._store_arg = store
        self.detailed_task_names = detailed_task_names
        """Whether traces exported from this session name each task, not only its stage."""
        self.max_pending_calls = max_pending_calls
        self._label = label
        self._tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self._writer_kind = writer
        self._writer_timeout = _writer_timeout(writer_timeout)
        self._group_steps = group_steps
        self.pool = BufferPool()
        """The session's profile buffers, reused across launches."""
        self.windows: list[Window] = []
        """Windows that have ended, oldest first."""
        self.step_num = 0
        self.current_action = ProfilerAction.NONE
        self.rank = 0
        self.run_id: str | None = None
        self._store: Store | None = None
        self._run: RunInfo | None = None
        self._writer: StepWriter | None = None
        self._state = "new"
        self._lock = threading.Lock()
        self._draining = threading.Lock()
        self._pending: list[PreparedCall] = []
        self._window: int | None = None
        self._window_steps: list[int] = []
        self._window_invocations = 0
        self._next_invocation = 0
        self._handed = 0
        self._first_window = 0
        self._configs_written: set[str] = set()
        self._recorded_steps = 0
        self._handed_step: int | None = None
        self._job_seconds = 0.0
        self._lease: RunLease | None = None
        self._claims: list[Claim] = []
        """Blocks of invocation ids held in a shared run (``$MCPROF_RUN_ID``)."""
        self._id_end: int | None = None
        """The end of the ids this session may take (None: all, a run of its own)."""

    @property
    def store(self) -> Store:
        """The store the session writes; still open after the session, for queries."""
        return self._started()[0]

    def _started(self) -> tuple[Store, StepWriter, RunInfo]:
        if self._store is None or self._writer is None or self._run is None:
            raise SessionError("the session has not started: use it in a 'with' statement")
        return self._store, self._writer, self._run

    @property
    def invocations(self) -> int:
        """Recorded invocations handed to the writer so far."""
        return self._handed

    @property
    def writer_stats(self) -> WriterStats:
        """Step writes and invocations stored so far, and the writer's CPU time."""
        return self._started()[1].stats

    @property
    def writer_pid(self) -> int | None:
        """The writer process's id (None when the writer is a thread)."""
        return self._started()[1].pid

    @property
    def capture_cost(self) -> CaptureCost:
        """What recording has cost so far: the job thread's time in the session over the
        recorded steps, and the writer's CPU time (the run's row keeps the final one)."""
        return CaptureCost(
            steps=self._recorded_steps,
            job_seconds=self._job_seconds,
            writer_cpu_seconds=self._started()[1].stats.cpu_seconds,
            writer=self._writer_kind,
        )

    def _act(self, step: int) -> ProfilerAction:
        if self._schedule is None:
            return ProfilerAction.RECORD
        return _action(self._schedule(step))

    def __enter__(self) -> MegaKernelProfile:
        if self._state != "new":
            raise SessionError("a mega_kernel_profile session cannot be entered twice")
        install_sink(self)
        try:
            self.rank, world = _distributed()
            self.current_action = self._act(0)
            self._store = (
                self._store_arg
                if isinstance(self._store_arg, Store)
                else open_store(self._store_arg)
            )
            self.run_id = _job_run_id(world)
            self._run = RunInfo.begin(
                run_id=self.run_id,
                label=self._label,
                tags=self._tags,
                schedule=_describe(self._schedule),
                rank=self.rank,
            )
            self._lease = RunLease.take(self._store.location, self.run_id, self.rank)
            try:
                self._writer = StepWriter(
                    self._store.location,
                    self._run,
                    self.rank,
                    writer=self._writer_kind,
                    timeout=self._writer_timeout,
                    lease=None if self._lease is None else self._lease.path,
                    group_steps=self._group_steps,
                )
            except BaseException:
                self._end_lease()
                raise
            begun = False
            try:
                self._store.write_run(self._run)
                begun = True
                if os.environ.get(RUN_ID_ENV):  # a fresh id has nothing to continue
                    self._continue_run(self._store)
            except BaseException:
                self._writer.abort()
                if not begun:
                    self._end_lease()
                else:
                    with contextlib.suppress(ProfileError, OSError):
                        self._end_run(self._store, self._run.finish("failed"))
                raise
        except BaseException:
            remove_sink(self)
            raise
        self._state = "open"
        if self.current_action.records:
            self._open_window()
        return self

    def start(self) -> MegaKernelProfile:
        """Open the session without a ``with`` block (as ``torch.profiler``'s ``start``)."""
        return self.__enter__()

    def stop(self) -> None:
        """Close a session opened with ``start()``: store what is left, end the run."""
        self.__exit__(None, None, None)

    def flush(self) -> None:
        """Wait until every step recorded so far is in the store (the writer commits in the
        background; ``on_trace_ready`` and the session's end wait for it on their own)."""
        if self._state != "open":
            raise SessionError("prof.flush() called outside its session")
        self._drain()
        self._started()[1].flush()

    def step(self) -> None:
        """Mark the end of a step: store what it recorded, move to the next step's action."""
        if self._state != "open":
            raise SessionError(
                "prof.step() called outside its session (the 'with mega_kernel_profile()' "
                "block has not started or has ended)"
            )
        began = time.perf_counter()
        previous = self.current_action
        self._drain()
        self.step_num += 1
        action = self._act(self.step_num)
        ready = False
        if previous.records and (previous is ProfilerAction.RECORD_AND_SAVE or not action.records):
            if previous is ProfilerAction.RECORD:
                warnings.warn(
                    f"Incorrect schedule: RECORD followed by {action.name} at step "
                    f"{self.step_num}; the window ends without on_trace_ready",
                    stacklevel=_caller_stacklevel(),
                )
            ready = self._close_window(ready=previous is ProfilerAction.RECORD_AND_SAVE)
        self.current_action = action
        if action.records:
            if self._window is None:
                self._open_window()
            else:
                self._window_steps.append(self.step_num)
        if previous.records:
            self._add_cost(time.perf_counter() - began)
        if ready:
            self._on_trace_ready(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._state != "open":
            return
        try:
            if exc is None:
                self._finish()
            else:
                self._abandon(exc)
        finally:
            self._state = "closed"
            remove_sink(self)
            self.pool.clear()

    def _finish(self) -> None:
        """Normal exit: store the last step, close the window, mark the run complete."""
        store, writer, run = self._started()
        try:
            began = time.perf_counter()
            self._drain()  # the last step's hand-over is a step's cost; closing is not
            if self.current_action.records:
                self._add_cost(time.perf_counter() - began)
            ready = self._close_window(ready=True)
            writer.close()
            if ready:
                self._on_trace_ready(self)
        except BaseException as exc:
            self._abandon(exc)
            raise
        self._release_claims()
        self._end_run(store, run.finish("complete", capture=self.capture_cost))

    def _abandon(self, error: BaseException) -> None:
        """Exit on an exception: drop the open window's buffers, withdraw every window the
        writer did not say it committed, mark the run failed. Each of these is tried even
        if one before it fails (a full disk); if the run's row cannot be written, its
        lease stays, and ``mcprof check`` reports the run left running."""
        store, writer, run = self._started()
        with self._lock:
            calls, self._pending = self._pending, []
        try:
            self._release(calls)
        finally:
            writer.abort()
            self._window = None
            reason = f"{type(error).__name__}: {error}"
            with contextlib.suppress(ProfileError, OSError):
                for window, write_ids in sorted(writer.uncommitted().items()):
                    store.discard_writes(
                        run.run_id, self.rank, write_ids, window_id=window, reason=reason
                    )
            self._release_claims()
            self._end_run(store, run.finish("failed", capture=self.capture_cost))

    def _end_run(self, store: Store, row: RunInfo) -> None:
        """Write the run's last row and end its lease; if the row cannot be written, let
        go of the lease but keep its file, by which ``mcprof check`` reports the run."""
        lease, self._lease = self._lease, None
        try:
            store.write_run(row)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        if lease is not None:
            lease.end()

    def _end_lease(self) -> None:
        """No row of the run was written: the lease ends."""
        if self._lease is not None:
            self._lease.end()
            self._lease = None

    def _release_claims(self) -> None:
        """Let go of the invocation ids claimed, once the writer has committed or ended."""
        store = self._store
        while self._claims and store is not None:
            with contextlib.suppress(ProfileError, OSError):
                release_claim(store.location, self._claims.pop())

    def _take_ids(self, count: int) -> int:
        """The first of ``count`` invocation ids for the next hand-over: the next ones of
        the run, or, in a run other sessions may share, of a block of ids this session
        claimed (``storage.claims``), so that no two sessions write the same ids."""
        first = self._next_invocation
        if self._id_end is None or first + count <= self._id_end:
            return first
        store, _, run = self._started()
        claim = hold_ids(store, run.run_id, self.rank, max(count, ID_BLOCK))
        self._claims.append(claim)
        self._id_end = claim.last + 1
        return claim.first

    def _continue_run(self, store: Store) -> None:
        """In a run id given by ``$MCPROF_RUN_ID`` (which several sessions, or a retried
        job, may share) take invocation ids from claimed blocks (``_take_ids``), and start
        window ids after those this rank already committed to the run."""
        taken = store.sql(
            """SELECT max(window_id) + 1 AS next_window
               FROM raw_invocations WHERE run_id = $1 AND rank = $2""",
            [self.run_id, self.rank],
            runs=[self.run_id],  # every rank asks at start: list and read this run only
        ).to_pylist()[0]
        self._first_window = taken["next_window"] or 0
        self._id_end = 0

    def _open_window(self) -> None:
        self._window = self._first_window + len(self.windows)
        self._window_steps = [self.step_num]
        self._window_invocations = 0

    def _close_window(self, *, ready: bool) -> bool:
        """End the open window; return whether ``on_trace_ready`` is to be called (its
        rows are in the store by then)."""
        window = self._window
        if window is None:
            return False
        writer = self._started()[1]
        writer.window_closed(window)
        call = ready and self._on_trace_ready is not None
        if call:
            writer.flush()
        self.windows.append(
            Window(
                index=window,
                steps=tuple(self._window_steps),
                invocations=self._window_invocations,
            )
        )
        self._window = None
        return call

    # The sink protocol: what prepare_call and PreparedCall call.

    def prepare(self, config: RuntimeConfig, direction: str) -> PreparedCall:
        """A launch's call: plain unless this step profiles, then with a pooled buffer."""
        if not self.current_action.profiles:
            return PreparedCall(config, config.backend.placeholder, direction=direction)
        began = time.perf_counter()
        buffer = self.pool.acquire(config.backend, config.layout.total_bytes)
        call = PreparedCall(
            config.with_profiling(),
            buffer,
            direction=direction,
            sink=self,
        )
        self._charge(began)
        call.host_launch_ns = time.perf_counter_ns()
        return call

    def complete(self, call: PreparedCall) -> None:
        """A profiled launch went out: keep its buffer until the step ends. A backend
        whose launches block has finished the kernel by now: its ``host_sync_ns``."""
        if call.config.backend.launch_blocks:
            call.host_sync_ns = time.perf_counter_ns()
        if self._state != "open":
            self.pool.release([call.buffer])
            raise SessionError(
                "a profiled call completed after its session ended; its buffer is dropped"
            )
        began = time.perf_counter()
        with self._lock:
            self._pending.append(call)
            full = len(self._pending) >= self.max_pending_calls
        if full:
            self._drain()
        self._charge(began)

    def _charge(self, began: float) -> None:
        """Count the time since ``began`` as the session's cost, in a recording window."""
        if self._window is not None:
            self._add_cost(time.perf_counter() - began)

    def _add_cost(self, seconds: float) -> None:
        """Add to the job thread's time in the session (launches may come from threads)."""
        with self._lock:
            self._job_seconds += seconds

    def cancel(self, call: PreparedCall) -> None:
        """A profiled launch failed: its buffer goes back unread."""
        self.pool.release([call.buffer])

    @staticmethod
    def _synchronize(calls: list[PreparedCall]) -> None:
        """Wait until the launches of ``calls`` have written their buffers."""
        for backend in {id(c.config.backend): c.config.backend for c in calls}.values():
            backend.synchronize()

    def _release(self, calls: list[PreparedCall]) -> None:
        self._synchronize(calls)
        self.pool.release([c.buffer for c in calls])

    def _drain(self) -> None:
        """Synchronize the pending launches; in a recording window, hand their host copies
        to the writer, else (warmup) just return their buffers. Drains run one at a time,
        so invocation ids follow the order in which launches completed, from any thread."""
        with self._draining:
            with self._lock:
                calls, self._pending = self._pending, []
            if not calls:
                return
            window = self._window
            if window is None:
                self._release(calls)
                return
            new_configs = []
            for c in calls:
                if c.config.config_id not in self._configs_written:
                    self._configs_written.add(c.config.config_id)
                    new_configs.append(c.config)
            if self._handed_step != self.step_num:
                self._handed_step = self.step_num
                self._recorded_steps += 1
            try:
                self._synchronize(calls)
                synced = time.perf_counter_ns()
                for c in calls:
                    if c.host_sync_ns is None:  # a launch that did not block
                        c.host_sync_ns = synced
                first = self._take_ids(len(calls))
                full, partial = self._started()[1].put(
                    calls,
                    step=self.step_num,
                    window=window,
                    first_invocation_id=first,
                    new_configs=new_configs,
                    recorded_steps=self._recorded_steps,
                    job_seconds=self._job_seconds,
                )
            finally:
                self.pool.release([c.buffer for c in calls])
            self._window_invocations += len(calls)
            self._handed += len(calls)
            self._next_invocation = first + len(calls)
            if full or partial:
                warnings.warn(
                    DroppedRecordsWarning(
                        _dropped_message(self.step_num, len(calls), full, partial)
                    ),
                    stacklevel=_caller_stacklevel(),
                )

    def __repr__(self) -> str:
        return (
            f"MegaKernelProfile(run {self.run_id}, rank {self.rank}, step {self.step_num}, "
            f"{self.current_action.name}, {self._state})"
        )


def mega_kernel_profile(
    *,
    schedule: ScheduleFn | None = None,
    on_trace_ready: Callable[[MegaKernelProfile], object] | None = None,
    store: Store | Path | str | None = None,
    detailed_task_names: bool = False,
    max_pending_calls: int = 16,
    label: str | None = None,
    tags: Mapping[str, str] | None = None,
    writer: str = "process",
    writer_timeout: float | None = None,
    group_steps: int = GROUP_STEPS,
) -> MegaKernelProfile:
    """Profile the MegaKernel launches of a block of code into a store, step by step.

    Use it like ``torch.profiler.profile``::

        with mega_kernel_profile(schedule=schedule(wait=1, warmup=1, active=3)) as prof:
            for batch in data:
                model(batch)
                prof.step()

    Without a schedule every launch is recorded and the one window ends at exit.
    ``store`` is a ``Store`` or a path (default ``$MCPROF_STORE`` or ``./mcprof-store``).
    ``max_pending_calls`` bounds the launches held on the device before they are
    drained within a step. ``writer`` is where recorded steps are decoded and stored:
    ``"process"`` (a process of its own: the job's thread only copies and hands over) or
    ``"thread"`` (a thread of the job, sharing its GIL). ``writer_timeout`` bounds each
    wait for the writer, in seconds (default ``$MCPROF_WRITER_TIMEOUT``, else 300): a
    writer silent for longer is killed and the wait ends in ``CaptureError``.
    ``group_steps`` steps of a window are written together, one file per table (1: a
    file per step, as stores written before groups hold them); a step waits at most a
    second for the rest of its group. Sessions do
    not nest. A window's steps become visible together when it ends. On an exception
    inside the block, or if the writer dies, the open window's buffers and rows are
    discarded, the run is marked failed, and the exception propagates.
    """
    return MegaKernelProfile(
        schedule=schedule,
        on_trace_ready=on_trace_ready,
        store=store,
        detailed_task_names=detailed_task_names,
        max_pending_calls=max_pending_calls,
        label=label,
        tags=tags,
        writer=writer,
        writer_timeout=writer_timeout,
        group_steps=group_steps,
    )
