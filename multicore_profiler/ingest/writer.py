"""The capture session's background writer: host copies in, step partitions out.

The session copies each step's profile buffers to the host and hands them over as a
``StepBatch``; a thread decodes them and writes them to the store while the job runs
its next step. The queue is bounded, so a job that produces buffers faster than the
store takes them waits instead of holding them all in memory. A failure is kept and
raised to the session at its next ``put``, ``flush`` or ``close``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import groupby

import numpy as np
import pyarrow as pa

from multicore_profiler.errors import CaptureError, ProfileError
from multicore_profiler.ingest.buffers import KernelInfo, Launches, step_tables, task_table
from multicore_profiler.ingest.decode import decode_buffers
from multicore_profiler.kernels.runtime import RuntimeConfig
from multicore_profiler.storage.store import Store

QUEUE_DEPTH = 4
"""Batches waiting to be written before the session's next drain blocks."""


@dataclass
class WriterStats:
    """What a session's writer has done: step writes, invocations, and the CPU time it
    took (which a job on the same CPU pays for)."""

    batches: int = 0
    invocations: int = 0
    cpu_seconds: float = 0.0


@dataclass(frozen=True)
class CapturedCall:
    """One recorded launch, copied to the host."""

    config: RuntimeConfig
    direction: str
    buffer: np.ndarray


@dataclass(frozen=True)
class StepBatch:
    """Recorded launches of one step, invocation ids from ``first_invocation_id`` on."""

    step: int
    window: int
    first_invocation_id: int
    calls: list[CapturedCall]
    new_configs: list[RuntimeConfig] = field(default_factory=list)
    """Configs whose task graphs this run has not written yet."""


class StepWriter:
    """Writes ``StepBatch`` es of one (run, rank) on a background thread."""

    def __init__(self, store: Store, run_id: str, rank: int, *, depth: int = QUEUE_DEPTH) -> None:
        self._store = store
        self._run_id = run_id
        self._rank = rank
        self._queue: queue.Queue[StepBatch | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._discarding = threading.Event()
        self._writes: dict[int, list[int]] = defaultdict(list)
        self.stats = WriterStats()
        """Updated by the writer thread after each batch."""
        self._thread = threading.Thread(target=self._run, name="mcprof-writer", daemon=True)
        self._thread.start()

    def put(self, batch: StepBatch) -> None:
        """Queue a batch; blocks while the queue is full."""
        self._raise()
        self._queue.put(batch)

    def flush(self) -> None:
        """Wait until every queued batch is written; raise if one could not be."""
        self._queue.join()
        self._raise()

    def close(self) -> None:
        """Write what is queued, then stop the thread; raise if a batch could not be written."""
        self._queue.join()
        self._queue.put(None)
        self._thread.join()
        self._raise()

    def abort(self) -> None:
        """Drop what is queued, let the batch being written finish, and stop the thread."""
        self._discarding.set()
        self._queue.put(None)
        self._thread.join()

    def write_ids(self, window: int) -> list[int]:
        """The step writes committed for a window so far."""
        return list(self._writes.get(window, ()))

    def _raise(self) -> None:
        if self._error is not None:
            error = self._error
            if isinstance(error, ProfileError):
                raise CaptureError(f"profile buffers could not be stored: {error}") from error
            raise CaptureError(f"the profile writer failed: {error!r}") from error

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                if self._error is None and not self._discarding.is_set():
                    began = time.thread_time()
                    self._write(batch)
                    self.stats.cpu_seconds += time.thread_time() - began
            except BaseException as exc:
                self._error = exc
            finally:
                self._queue.task_done()

    def _write(self, batch: StepBatch) -> None:
        if batch.new_configs:
            self._store.write_tasks(self._run_id, task_table(self._rank, batch.new_configs))
        parts = []
        first = batch.first_invocation_id
        for (config, direction), group in groupby(
            batch.calls, key=lambda c: (c.config, c.direction)
        ):
            calls = list(group)
            backend = config.backend
            decoded = decode_buffers(
                np.stack([c.buffer for c in calls]),  # one 2-D batch decodes fastest
                config.layout,
                frequency_hz=backend.frequency_hz,
                warn_dropped=False,
            )
            meta = config.metadata
            kernel = KernelInfo(
                kernel_name=meta.kernel_name,
                owner_label=meta.owner_label,
                stage_names=meta.stage_names,
                soc=backend.soc,
                frequency_source=backend.frequency_source,
                config_id=config.config_id,
            )
            launches = Launches(
                rank=self._rank,
                device=backend.device_index,
                step=batch.step,
                first_invocation_id=first,
                direction=direction,
                window_id=batch.window,
            )
            parts.append(step_tables(decoded, kernel, launches))
            first += len(calls)
        invocations, cores, records = (
            pa.concat_tables(tables) for tables in zip(*parts, strict=True)
        )
        write_id = self._store.write_step(
            self._run_id, batch.step, invocations=invocations, cores=cores, records=records
        )
        self._writes[batch.window].append(write_id)
        self.stats.batches += 1
        self.stats.invocations += invocations.num_rows
