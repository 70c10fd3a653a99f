"""From decoded device buffers to one step of the store: invocations, cores and records.

``ingest_buffers`` writes a step of a run the caller records; ``ingest_into_run`` also
creates the run when the store has none of that id (what ``mcprof ingest-buffer`` does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from multicore_profiler.abi import BufferLayout
from multicore_profiler.ingest.decode import BufferLike, DecodedBuffers, decode_buffers
from multicore_profiler.limits import DEVICE, INVOCATION_ID, RANK, STEP, WINDOW, check_given
from multicore_profiler.storage.claims import claimed_ids
from multicore_profiler.storage.partitions import check_run_id
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.schema import INVOCATIONS
from multicore_profiler.storage.store import Store

if TYPE_CHECKING:  # torch comes with it; reading or writing a store needs no torch
    from multicore_profiler.kernels.runtime import RuntimeConfig


@dataclass(frozen=True)
class KernelInfo:
    """What the host knows of the kernel whose buffers are decoded.

    With nothing bound, the names fall back to ``MegaKernel`` and ``Owner`` and the
    stages stay unnamed (their desc ids still identify them).
    """

    kernel_name: str = "MegaKernel"
    owner_label: str = "Owner"
    stage_names: Mapping[int, str] = field(default_factory=dict)
    soc: str | None = None
    frequency_source: str = "given"
    """Where the frequency came from: ``given`` by hand, else the backend's source."""
    config_id: str | None = None
    """The RuntimeConfig the launches ran, whose task graph the ``tasks`` table holds."""


@dataclass(frozen=True)
class Launches:
    """Where a batch of launches ran and which invocation ids they take."""

    rank: int = 0
    device: int = 0
    step: int = 0
    first_invocation_id: int | None = None
    """The first launch's invocation id; None: ``ingest_buffers`` takes the next free ids
    of the run and rank (safely when several processes write them at once)."""
    direction: str = "forward"
    window_id: int | None = None
    """The capture session's recording window (none for buffers ingested by hand)."""

    def __post_init__(self) -> None:
        RANK.check(self.rank, "rank")
        DEVICE.check(self.device, "device")
        STEP.check(self.step, "step")
        check_given(
            (self.first_invocation_id, INVOCATION_ID, "the first invocation id"),
            (self.window_id, WINDOW, "window"),
        )


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


def step_tables(
    decoded: DecodedBuffers, kernel: KernelInfo, launches: Launches
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The (invocations, cores, records) rows of a decoded batch, buffer i being invocation
    ``first_invocation_id + i``; each invocation lists in ``partial_slots`` its slots that
    count dropped records without being full."""
    count = decoded.buffers
    layout = decoded.layout
    ids = launches.first_invocation_id + np.arange(count, dtype=np.int64)
    stage_names = sorted((int(k), str(v)) for k, v in kernel.stage_names.items())
    invocations = pa.table(
        {
            "rank": pa.repeat(pa.scalar(launches.rank, pa.int32()), count),
            "device": pa.repeat(pa.scalar(launches.device, pa.int32()), count),
            "step": pa.repeat(pa.scalar(launches.step, pa.int64()), count),
            "invocation_id": ids,
            "direction": [launches.direction] * count,
            "kernel_name": [kernel.kernel_name] * count,
            "soc": pa.array([kernel.soc] * count, pa.string()),
            "frequency_hz": np.full(count, decoded.frequency_hz),
            "frequency_source": [kernel.frequency_source] * count,
            "anchor_cycle": decoded.anchor_cycles,
            "aic_slots": np.full(count, layout.aic_slots, np.uint32),
            "aiv_slots": np.full(count, layout.aiv_slots, np.uint32),
            "aic_capacity": np.full(count, layout.aic_capacity, np.uint32),
            "aiv_capacity": np.full(count, layout.aiv_capacity, np.uint32),
            "record_count": decoded.record_counts,
            "dropped_count": decoded.dropped_counts,
            "owner_label": [kernel.owner_label] * count,
            "stage_names": pa.array(
                [stage_names] * count, INVOCATIONS.schema.field("stage_names").type
            ),
            "window_id": pa.array([launches.window_id] * count, pa.int64()),
            "config_id": pa.array([kernel.config_id] * count, pa.string()),
            "partial_slots": decoded.partial_slots,
        }
    )

    def stamped(table: pa.Table) -> pa.Table:
        invocation = table["buffer"].to_numpy().astype(np.int64)
        invocation += launches.first_invocation_id
        rank = np.full(table.num_rows, launches.rank, np.int32)
        rest = table.drop_columns(["buffer"])
        return rest.add_column(0, "invocation_id", pa.array(invocation)).add_column(
            0, "rank", pa.array(rank)
        )

    return invocations, stamped(decoded.cores), stamped(decoded.records)


def task_table(rank: int, configs: Sequence[RuntimeConfig]) -> pa.Table:
    """The ``tasks`` rows of kernel configs: each task's stage, owner, worker and events."""
    parts = []
    for config in configs:
        tasks = config.tasks
        count = len(tasks)
        parts.append(
            pa.table(
                {
                    "rank": pa.repeat(pa.scalar(rank, pa.int32()), count),
                    "config_id": pa.repeat(pa.scalar(config.config_id), count),
                    "kernel_name": pa.repeat(pa.scalar(config.metadata.kernel_name), count),
                    "task_id": tasks["task_id"],
                    "task_type": tasks["task_type"],
                    "desc_id": config.effective_desc_ids(),
                    "stage_task_index": tasks["profile_task_index"],
                    "owner_id": tasks["profile_owner_id"],
                    "core_type": tasks["core_type"].astype(np.uint8),
                    "worker": tasks["worker"],
                    "wait_event": tasks["wait_event"],
                    "wait_count": tasks["wait_count"],
                    "trigger_event": tasks["trigger_event"],
                    "tiling_position": tasks["tiling_position"],
                    "input_position": tasks["input_position"],
                }
            )
        )
    return pa.concat_tables(parts)


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
    taken. ``new_run``, a run the store does not hold yet, is recorded before the step and
    as finished (or failed) after it.
    """
    kernel = kernel or KernelInfo()
    launches = launches or Launches()
    decoded = _decoded(buffers, layout, frequency_hz)
    count = decoded.buffers
    with claimed_ids(store, run_id, launches.rank, count, launches.first_invocation_id) as first:
        invocations, cores, records = step_tables(
            decoded, kernel, replace(launches, first_invocation_id=first)
        )
        if new_run is not None:
            store.write_run(new_run)
        try:
            write_id = store.write_step(
                run_id, launches.step, invocations=invocations, cores=cores, records=records
            )
        except BaseException:
            if new_run is not None:
                store.write_run(new_run.finish("failed"))
            raise
    if new_run is not None:
        store.write_run(new_run.finish())
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
    ``run_id``, or a fresh id when it is ``None``, and ``label``; it is recorded as running
    before the step and as finished (or failed) after it. A run the store holds keeps its
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
