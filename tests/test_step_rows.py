"""The rows of a recorded step: exactly the store's schemas and values, from a lean import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
from golden import AIC, AIV, GMM1, TASK7, TRIGGER, WAIT, Slot, pack

from multicore_profiler.abi import BufferLayout
from multicore_profiler.ingest.decode import decode_buffers
from multicore_profiler.ingest.step_rows import (
    CORE_ROWS,
    INVOCATION_ROWS,
    RECORD_ROWS,
    KernelInfo,
    Launches,
    step_tables,
)
from multicore_profiler.storage.partitions import conform
from multicore_profiler.storage.schema import CLOCK_COLUMNS, CORES, INVOCATIONS, RECORDS

LAYOUT = BufferLayout(aic_slots=2, aiv_slots=2, aic_capacity=16, aiv_capacity=16)
FIRST = pack(
    2,
    2,
    16,
    16,
    [
        Slot(AIC, 0, 100, TASK7),
        Slot(AIV, 1, 90, [(95, 99, 0x20003, 8, 2, 1)]),
    ],
)
SECOND = pack(
    2,
    2,
    16,
    16,
    [
        Slot(AIC, 1, 500, [(510, 520, GMM1, 3, 1, 0)], dropped=2),
        Slot(AIV, 0, 480, [(490, 495, WAIT, 4, 0, 0), (495, 505, TRIGGER, 4, 0, 0)]),
    ],
)
"""Two launches: the second's AIC/1 counts 2 dropped records although it is not full."""
KERNEL = KernelInfo(
    kernel_name="Moe",
    owner_label="Expert",
    stage_names={0x30001: "GMM1", 3: "Dispatch"},
    soc="Ascend910B",
    frequency_source="backend",
    config_id="cfg-1",
)
LAUNCHES = Launches(
    rank=2,
    device=1,
    step=5,
    first_invocation_id=40,
    window_id=3,
    host_launch_ns=(7_000, 12_000),
    host_sync_ns=(9_000, None),
)
"""The second launch's synchronize was not timed: its host_sync_ns is null."""
STORE_ADDED = {"write_id", "origin_write_id", *CLOCK_COLUMNS}


def tables() -> tuple[pa.Table, pa.Table, pa.Table]:
    decoded = decode_buffers([FIRST, SECOND], LAYOUT, frequency_hz=50e6, warn_dropped=False)
    return step_tables(decoded, KERNEL, LAUNCHES)


def test_tables_have_the_store_schemas_less_what_the_store_adds() -> None:
    schemas = (INVOCATION_ROWS, CORE_ROWS, RECORD_ROWS)
    for table, schema, spec in zip(tables(), schemas, (INVOCATIONS, CORES, RECORDS), strict=True):
        expected = [(f.name, f.type) for f in spec.schema if f.name not in STORE_ADDED]
        assert [(f.name, f.type) for f in table.schema] == expected
        assert table.schema.equals(schema)
        stamped = table
        for name in STORE_ADDED & set(spec.schema.names):
            stamped = stamped.append_column(name, pa.nulls(table.num_rows, pa.int64()))
        assert stamped.select(spec.schema.names).schema.equals(spec.schema)  # conform: no cast
        assert conform(stamped, spec).equals(stamped.select(spec.schema.names))


def test_invocations_of_a_known_batch() -> None:
    invocations, _, _ = tables()
    assert invocations.to_pylist() == [
        {
            "rank": 2,
            "device": 1,
            "step": 5,
            "invocation_id": invocation,
            "direction": "forward",
            "kernel_name": "Moe",
            "soc": "Ascend910B",
            "frequency_hz": 50e6,
            "frequency_source": "backend",
            "anchor_cycle": anchor,
            "aic_slots": 2,
            "aiv_slots": 2,
            "aic_capacity": 16,
            "aiv_capacity": 16,
            "record_count": records,
            "dropped_count": dropped,
            "owner_label": "Expert",
            "stage_names": [(3, "Dispatch"), (0x30001, "GMM1")],
            "window_id": 3,
            "config_id": "cfg-1",
            "partial_slots": partial,
            "abi_generation": "b",  # inferred: it records graph stage 0x30001
            "producer": None,
            "producer_format": None,
            "clock_domain": "shared",
            "host_launch_ns": launch,
            "host_sync_ns": sync,
        }
        for invocation, anchor, records, dropped, partial, launch, sync in (
            (40, 90, 4, 0, [], 7_000, 9_000),
            (41, 480, 3, 2, [1], 12_000, None),
        )
    ]


def test_cores_and_records_of_a_known_batch() -> None:
    _, cores, records = tables()
    assert [
        (c["rank"], c["invocation_id"], c["slot"], c["entry_cycle"], c["record_count"])
        for c in cores.to_pylist()
    ] == [(2, 40, 0, 100, 3), (2, 40, 3, 90, 1), (2, 41, 1, 500, 1), (2, 41, 2, 480, 2)]
    assert records["invocation_id"].to_pylist() == [40, 40, 40, 40, 41, 41, 41]
    assert records["rank"].to_pylist() == [2] * 7
    assert records.slice(3, 3).to_pylist() == [
        {
            "rank": 2,
            "invocation_id": 40,
            "core_type": AIV,
            "block_id": 1,
            "record_index": 0,
            "start_cycle": 95,
            "end_cycle": 99,
            "desc_id": 0x20003,
            "task_id": 8,
            "stage_task_index": 2,
            "owner_id": 1,
            "phase": "compute",
        },
        {
            "rank": 2,
            "invocation_id": 41,
            "core_type": AIC,
            "block_id": 1,
            "record_index": 0,
            "start_cycle": 510,
            "end_cycle": 520,
            "desc_id": GMM1,
            "task_id": 3,
            "stage_task_index": 1,
            "owner_id": 0,
            "phase": "compute",
        },
        {
            "rank": 2,
            "invocation_id": 41,
            "core_type": AIV,
            "block_id": 0,
            "record_index": 0,
            "start_cycle": 490,
            "end_cycle": 495,
            "desc_id": WAIT,
            "task_id": 4,
            "stage_task_index": 0,
            "owner_id": 0,
            "phase": "wait",
        },
    ]


def test_launches_of_another_step_take_their_own_step_and_window() -> None:
    decoded = decode_buffers(
        np.stack([np.frombuffer(FIRST, np.uint8)] * 2), LAYOUT, frequency_hz=50e6
    )
    first, _, _ = step_tables(decoded, KERNEL, LAUNCHES)
    later = Launches(rank=2, device=1, step=6, first_invocation_id=42, window_id=None)
    second, _, records = step_tables(decoded, KERNEL, later)
    assert first["step"].to_pylist() == [5, 5]
    assert second["step"].to_pylist() == [6, 6]
    assert second["window_id"].to_pylist() == [None, None]
    assert second["invocation_id"].to_pylist() == [42, 43]
    assert records["invocation_id"].to_pylist() == [42] * 3 + [43] * 3 + [42, 43]
    assert second["partial_slots"].to_pylist() == [[], []]


LEAN_IMPORT = """
import importlib.util, sys
spec = importlib.util.find_spec("multicore_profiler")
sys.modules["multicore_profiler"] = importlib.util.module_from_spec(spec)
import multicore_profiler.ingest.decode, multicore_profiler.ingest.step_rows
heavy = ("duckdb", "pandas", "pyarrow.dataset", "torch")
print(sorted(name for name in heavy if name in sys.modules))
"""


def test_a_writer_process_imports_decode_and_step_rows_without_heavy_modules() -> None:
    result = subprocess.run(
        [sys.executable, "-c", LEAN_IMPORT], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
