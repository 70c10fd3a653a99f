"""From decoded device buffers to one step of the store: invocations, cores and records.

``ingest_buffers`` writes a step of a run the caller records; ``ingest_into_run`` also
creates the run when the store has none of that id (what ``mcprof ingest-buffer`` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from multicore_profiler.abi import BufferLayout
from multicore_profiler.ingest.decode import BufferLike, DecodedBuffers, decode_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches, step_tables
from multicore_profiler.storage.claims import claimed_ids
from multicore_profiler.storage.partitions import check_run_id
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store


@dataclass(frozen=True)
class IngestedStep:
    """What ``ingest_buffers`` wrote: the decoded batch, its ids, its write and its run."""

    decoded: DecodedBuffers
    first_invocation_id: int
    """Buffer i is invocation ``first_invocation_id + i``."""
    write_id: int
    run_id: str
    """The step's run (for ``ingest_into_run`` with no run id, the new run's fresh id)."""

    @property
    def invocation_ids(self) -> range:
        """The invocation ids the buffers took, in order."""
        return range(self.first_invocation_id, self.first_invocation_id + self.decoded.buffers)


def ingest_buffers(
    store: Store,
    buffers: Sequence[BufferLike] | np.ndarray | DecodedBuffers,
    layout: BufferLayout,
    *,
    frequency_hz: float,
    run_id: str,
    kernel: KernelInfo | None = None,
    launches: Launches | None = None,
    new_run: RunInfo | None = None,
) -> IngestedStep:
    """Decode a batch of buffers and write them to the store as one step of a run.

    Nothing is written unless every buffer decodes (``buffers`` may be a batch decoded
    already, by ``decode_buffers`` with this layout and frequency). The invocation ids
    are claimed first (see ``storage.claims``): the next free ones of the run and rank, or
    exactly those from ``launches.first_invocation_id``, refused (``StoreError``) if
    taken. ``new_run``, a run the store does not hold yet, is recorded after the step, as
    finished: a step that cannot be written (a full disk) leaves neither rows nor a run.
    """
    kernel = kernel or KernelInfo()
    launches = launches or Launches()
    decoded = _decoded(buffers, layout, frequency_hz)
    count = decoded.buffers
    with claimed_ids(store, run_id, launches.rank, count, launches.first_invocation_id) as first:
        invocations, cores, records = step_tables(
            decoded, kernel, replace(launches, first_invocation_id=first)
        )
        write_id = store.write_step(
            run_id, launches.step, invocations=invocations, cores=cores, records=records
        )
    if new_run is not None:
        try:
            store.write_run(new_run.finish())
        except BaseException:
            store.discard_writes(run_id, launches.rank, [write_id], reason="its run's row failed")
            raise
    return IngestedStep(decoded, first, write_id, run_id)


def ingest_into_run(
    store: Store,
    buffers: Sequence[BufferLike] | np.ndarray | DecodedBuffers,
    layout: BufferLayout,
    *,
    frequency_hz: float,
    run_id: str | None = None,
    label: str | None = None,
    kernel: KernelInfo | None = None,
    launches: Launches | None = None,
) -> IngestedStep:
    """``ingest_buffers`` into the run ``run_id``, created if the store has no such run.

    A new run (``RunInfo.begin``: this host, git revision and package versions) takes
    ``run_id``, or a fresh id when it is ``None``, and ``label``; it is recorded, finished,
    once the step is. A run the store holds keeps its
    row (``label`` is not applied to it). The buffers are decoded before the store is
    read; the step's run id is ``IngestedStep.run_id``.
    """
    decoded = _decoded(buffers, layout, frequency_hz)
    known = run_id is not None and bool(
        store.sql("SELECT 1 FROM runs WHERE run_id = $1", [check_run_id(run_id)]).num_rows
    )
    new_run = None if known else RunInfo.begin(run_id=run_id, label=label)
    return ingest_buffers(
        store,
        decoded,
        layout,
        frequency_hz=frequency_hz,
        run_id=run_id if new_run is None else new_run.run_id,
        kernel=kernel,
        launches=launches,
        new_run=new_run,
    )


def _decoded(
    buffers: Sequence[BufferLike] | np.ndarray | DecodedBuffers,
    layout: BufferLayout,
    frequency_hz: float,
) -> DecodedBuffers:
    """``buffers`` decoded with ``layout`` and ``frequency_hz``, unless they are already."""
    if isinstance(buffers, DecodedBuffers):
        return buffers
    return decode_buffers(buffers, layout, frequency_hz=frequency_hz)
