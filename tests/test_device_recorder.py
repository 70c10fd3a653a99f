"""The AscendC recorder, compiled with g++ through a shim of the AscendC names it uses: a
program records a known sequence on AIC and AIV slots (an overflow, an idle slot, the
worker pattern) and the Python decoder reads its buffer back exactly."""

from __future__ import annotations

import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import DroppedRecordsWarning
from multicore_profiler.ingest.decode import decode_buffer

ROOT = Path(__file__).resolve().parent.parent
HEADER_DIR = ROOT / "multicore_profiler" / "kernels" / "device"
SHIM_DIR = Path(__file__).resolve().parent / "device"
LAYOUT = BufferLayout(aic_slots=2, aiv_slots=3, aic_capacity=16, aiv_capacity=32)
WAIT, TRIGGER, NO_OWNER = 0x10000, 0x10007, 0xFFFFFFFF


@pytest.fixture(scope="module")
def buffer(tmp_path_factory) -> np.ndarray:
    compiler = shutil.which("g++")
    assert compiler is not None, "g++ is needed to compile the recorder on the host"
    work = tmp_path_factory.mktemp("recorder")
    program = work / "record_sequence"
    subprocess.run(
        [compiler, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{SHIM_DIR}",
         f"-I{HEADER_DIR}", str(SHIM_DIR / "record_sequence.cpp"), "-o", str(program)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    subprocess.run([str(program), str(work / "buffer.bin")], check=True, capture_output=True)
    return np.fromfile(work / "buffer.bin", np.uint8)


def direct(core: int, block: int, k: int, count: int) -> list[dict]:
    """The records record_sequence.cpp writes directly into a slot (the kept ones)."""
    rows = []
    for i in range(count):
        start = 2000 + 100 * k + 10 * i
        desc = (WAIT, 0x30001 + block, TRIGGER)[i % 3]
        phase = ("wait", "compute", "trigger")[i % 3]
        rows.append(
            {"core_type": core, "block_id": block, "record_index": i, "start_cycle": start,
             "end_cycle": start + 5 + i, "desc_id": desc, "task_id": 100 * block + i,
             "stage_task_index": i, "owner_id": block if i % 2 == 0 else NO_OWNER,
             "phase": phase}
        )  # fmt: skip
    return rows


def test_recorded_buffer_decodes_exactly(buffer: np.ndarray) -> None:
    assert buffer.size == LAYOUT.total_bytes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decoded = decode_buffer(buffer, LAYOUT, frequency_hz=50e6)
    assert [w.category for w in caught] == [DroppedRecordsWarning]
    cores = decoded.cores.drop(["buffer"]).to_pylist()
    assert cores == [
        {
            "slot": 0,
            "core_type": 1,
            "block_id": 0,
            "entry_cycle": 1000,
            "record_count": 3,
            "dropped_count": 0,
            "record_capacity": 16,
        },
        {
            "slot": 1,
            "core_type": 1,
            "block_id": 1,
            "entry_cycle": 1100,
            "record_count": 16,
            "dropped_count": 4,
            "record_capacity": 16,
        },
        {
            "slot": 2,
            "core_type": 2,
            "block_id": 0,
            "entry_cycle": 5000,
            "record_count": 7,
            "dropped_count": 0,
            "record_capacity": 32,
        },
        {
            "slot": 4,
            "core_type": 2,
            "block_id": 2,
            "entry_cycle": 1200,
            "record_count": 32,
            "dropped_count": 1,
            "record_capacity": 32,
        },
    ]  # fmt: skip  (AIV slot 1, slot 3 of the buffer, stayed idle)
    assert decoded.dropped_counts.tolist() == [5]
    assert decoded.anchor_cycles.tolist() == [1000]
    # The worker pattern on AIV 0, from cycle 6000: wait 7, compute 50 + type, trigger 3.
    worker = [
        (WAIT if phase == "wait" else TRIGGER if phase == "trigger" else desc, task, index,
         start, end, phase)
        for desc, task, index, start, end, phase in [
            (0x30002, 40, 0, 6000, 6055, "compute"),
            (0, 40, 0, 6055, 6058, "trigger"),
            (0, 41, 1, 6058, 6065, "wait"),
            (0x30002, 41, 1, 6065, 6121, "compute"),
            (0, 41, 1, 6121, 6124, "trigger"),
            (0, 42, 2, 6124, 6131, "wait"),
            (0x20007, 42, 2, 6131, 6188, "compute"),  # no stage: 0x20000 + task type 7
        ]
    ]  # fmt: skip
    expected = direct(1, 0, 0, 3) + direct(1, 1, 1, 16) + [
        {"core_type": 2, "block_id": 0, "record_index": i, "start_cycle": start,
         "end_cycle": end, "desc_id": desc, "task_id": task, "stage_task_index": index,
         "owner_id": 7, "phase": phase}
        for i, (desc, task, index, start, end, phase) in enumerate(worker)
    ] + direct(2, 2, 2, 32)  # fmt: skip
    assert decoded.records.drop(["buffer"]).to_pylist() == expected
