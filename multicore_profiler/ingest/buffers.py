"""From decoded device buffers to one step of the store: invocations, cores and records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from multicore_profiler.ingest.abi import BufferLayout
from multicore_profiler.ingest.decode import BufferLike, DecodedBuffers, decode_buffers
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
    first_invocation_id: int = 0
    direction: str = "forward"
    window_id: int | None = None
    """The capture session's recording window (none for buffers ingested by hand)."""


def step_tables(
    decoded: DecodedBuffers, kernel: KernelInfo, launches: Launches
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The (invocations, cores, records) rows of a decoded batch, buffer i being invocation
    ``first_invocation_id + i``."""
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
    buffers: Sequence[BufferLike] | np.ndarray,
    layout: BufferLayout,
    *,
    frequency_hz: float,
    run_id: str,
    kernel: KernelInfo | None = None,
    launches: Launches | None = None,
) -> DecodedBuffers:
    """Decode a batch of buffers and write them to the store as one step of a run.

    Nothing is written unless every buffer decodes.
    """
    kernel = kernel or KernelInfo()
    launches = launches or Launches()
    decoded = decode_buffers(buffers, layout, frequency_hz=frequency_hz)
    invocations, cores, records = step_tables(decoded, kernel, launches)
    store.write_step(run_id, launches.step, invocations=invocations, cores=cores, records=records)
    return decoded
