"""The rows of one recorded step: invocations, cores, records; and of task graphs.

A writer process imports this module and ``ingest.decode`` without the package: they
need numpy and pyarrow, never duckdb, pandas, pyarrow.dataset or torch. The tables come
with exactly the store's schemas, less the columns the store adds (``write_id``,
``origin_write_id`` and the partition keys), so writing them casts nothing; a batch
costs one Arrow column per field, the columns repeated in every invocation made once
per batch size and launch.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from multicore_profiler.errors import ArgumentError
from multicore_profiler.ingest.decode import DecodedBuffers
from multicore_profiler.limits import DEVICE, INVOCATION_ID, RANK, STEP, WINDOW, check_given
from multicore_profiler.storage.arrow_values import column
from multicore_profiler.storage.schema import (
    CLOCK_COLUMNS,
    CORES,
    INVOCATIONS,
    RECORDS,
    TableSpec,
)

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
    host_launch_ns: Sequence[int | None] | None = None
    """Per launch, the host's monotonic clock (ns) just before it (None: not timed)."""
    host_sync_ns: Sequence[int | None] | None = None
    """Per launch, the host's monotonic clock (ns) once the host knew its kernel had
    finished, after ``host_launch_ns`` (None: not timed)."""

    def __post_init__(self) -> None:
        RANK.check(self.rank, "rank")
        DEVICE.check(self.device, "device")
        STEP.check(self.step, "step")
        check_given(
            (self.first_invocation_id, INVOCATION_ID, "the first invocation id"),
            (self.window_id, WINDOW, "window"),
        )


_STORE_ADDED = ("write_id", "origin_write_id", *CLOCK_COLUMNS)
"""What the store adds to a step's rows: the write's ids, and the cores' clock columns (null:
the device's cores share one counter)."""


def _rows_schema(spec: TableSpec) -> pa.Schema:
    """A table's schema less the columns the store adds when it writes a step."""
    return pa.schema([f for f in spec.schema if f.name not in _STORE_ADDED])


INVOCATION_ROWS = _rows_schema(INVOCATIONS)
CORE_ROWS = _rows_schema(CORES)
RECORD_ROWS = _rows_schema(RECORDS)
"""The schemas of ``step_tables``' three tables, in the store's column order."""


def _repeat(name: str, value: object, count: int) -> pa.Array:
    """Invocation column ``name`` of ``count`` rows holding ``value``."""
    return pa.repeat(pa.scalar(value, INVOCATION_ROWS.field(name).type), count)


@functools.lru_cache(maxsize=64)
def _repeated(values: tuple[tuple[str, object], ...], count: int) -> dict[str, pa.Array]:
    """The invocation columns of ``count`` rows holding ``values`` (name, value): made
    once for the launches of a kernel config, whatever their step."""
    return {name: _repeat(name, value, count) for name, value in values}


def _host_times(launches: Launches, count: int) -> tuple[pa.Array, pa.Array]:
    """The ``host_launch_ns`` and ``host_sync_ns`` columns of ``count`` launches: as given
    (null where a launch has none), all null where none are; ``ArgumentError`` for times
    that are not one int64 per launch, or a launch not timed before its synchronize."""
    columns, values = [], []
    for name in ("host_launch_ns", "host_sync_ns"):
        given = getattr(launches, name)
        if given is None:
            columns.append(pa.nulls(count, pa.int64()))
            values.append((None,) * count)
            continue
        if not hasattr(given, "__len__") or isinstance(given, str | bytes) or len(given) != count:
            raise ArgumentError(f"{name} must hold one time per launch ({count}), got {given!r}")
        wrong = ArgumentError(f"{name} must hold integer ns or None, each an int64, got {given!r}")
        if not all(
            v is None or (isinstance(v, int | np.integer) and not isinstance(v, bool))
            for v in given
        ):
            raise wrong
        try:
            # Without a None, made from numpy's array: a sixth of pa.array's cost.
            columns.append(
                pa.array(given, pa.int64())
                if any(v is None for v in given)
                else column(given, pa.int64())
            )
        except (OverflowError, pa.ArrowException):
            raise wrong from None
        values.append(given)
    # Compared in Python: a step has few launches, and pyarrow.compute's calls cost the
    # writer more than the comparisons (about 0.04 ms a step).
    for index, (launch, sync) in enumerate(zip(*values, strict=True)):
        if launch is not None and sync is not None and launch >= sync:
            raise ArgumentError(
                f"launch {index}: host_launch_ns {launch} is not before its "
                f"host_sync_ns {sync} (the kernel runs between them)"
            )
    return columns[0], columns[1]


def step_tables(
    decoded: DecodedBuffers, kernel: KernelInfo, launches: Launches
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The (invocations, cores, records) rows of a decoded batch, buffer i being invocation
    ``first_invocation_id + i``; each invocation lists in ``partial_slots`` its slots that
    count dropped records without being full. The tables have the schemas
    ``INVOCATION_ROWS``, ``CORE_ROWS`` and ``RECORD_ROWS``."""
    count = decoded.buffers
    layout = decoded.layout
    first = launches.first_invocation_id
    host_launch_ns, host_sync_ns = _host_times(launches, count)
    same = {
        "rank": launches.rank,
        "device": launches.device,
        "direction": launches.direction,
        "kernel_name": kernel.kernel_name,
        "soc": kernel.soc,
        "frequency_hz": decoded.frequency_hz,
        "frequency_source": kernel.frequency_source,
        "aic_slots": layout.aic_slots,
        "aiv_slots": layout.aiv_slots,
        "aic_capacity": layout.aic_capacity,
        "aiv_capacity": layout.aiv_capacity,
        "owner_label": kernel.owner_label,
        "stage_names": tuple(sorted((int(k), str(v)) for k, v in kernel.stage_names.items())),
        "config_id": kernel.config_id,
        "abi_generation": layout.resolved.generation,
        "producer": None,
        "producer_format": None,
        "clock_domain": "shared",
    }
    columns = {
        **_repeated(tuple(same.items()), count),
        "step": _repeat("step", launches.step, count),
        "invocation_id": pa.array(np.arange(first, first + count, dtype=np.int64)),
        "anchor_cycle": pa.array(decoded.anchor_cycles),
        "record_count": pa.array(decoded.record_counts),
        "dropped_count": pa.array(decoded.dropped_counts),
        "window_id": _repeat("window_id", launches.window_id, count),
        "partial_slots": decoded.partial_slots,
        "host_launch_ns": host_launch_ns,
        "host_sync_ns": host_sync_ns,
    }
    invocations = pa.Table.from_arrays(
        [columns[name] for name in INVOCATION_ROWS.names], schema=INVOCATION_ROWS
    )
    rank = pa.scalar(launches.rank, pa.int32())

    def stamped(table: pa.Table) -> pa.Table:
        """``table`` with ``rank`` and ``invocation_id`` for ``buffer``, its first column."""
        invocation = table.column(0).to_numpy().astype(np.int64)
        invocation += first
        ids = table.set_column(0, "invocation_id", pa.array(invocation))
        return ids.add_column(0, "rank", pa.repeat(rank, table.num_rows))

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
