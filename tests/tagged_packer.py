"""Raw profile buffers of FlashInfer, Mirage MPK and Triton-distributed, packed from
records: the slot scheme and each producer's tag (see ``ingest/import_tagged.py``), plus a
synthetic FlashInfer buffer for the benchmark and a plain numpy decode as its baseline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

BEGIN, END, INSTANT = 0, 1, 2
EMPTY_TRITON = 0x7FFF_FFFF_FFFF_FFFF

Record = tuple[int, int]
"""``(tag, globaltimer_lo)`` of one record."""


def flashinfer_tag(kind: int, event: int, block: int, smid: int) -> int:
    """FlashInfer since #1305: type bits 0-1, event 2-11, block 12-23, smid 24-31 (a block
    past 12 bits ORs into the smid, as the device code does)."""
    return (kind | event << 2 | block << 12 | smid << 24) & 0xFFFF_FFFF


def fi(kind: int, event: int, block: int, smid: int, time: int) -> tuple[int, int]:
    """A FlashInfer record: its tag and its globaltimer_lo."""
    return flashinfer_tag(kind, event, block, smid), time


COLUMNS = (
    "core_type", "block_id", "record_index", "start_cycle", "end_cycle", "desc_id", "task_id",
    "stage_task_index", "owner_id", "phase",
)  # fmt: skip
"""The record columns the tests compare, in this order."""


def launch_rows(launch: Any) -> list[tuple]:
    """An imported launch's records as tuples of ``COLUMNS``, in core and record order."""
    table = pa.concat_tables(list(launch.records))
    return sorted(zip(*(table[c].to_pylist() for c in COLUMNS), strict=True))


def mpk_tag(kind: int, task_type: int, worker: int, event_no: int) -> int:
    """MPK: type bits 0-1, task type 2-10, worker 11-18 (wraps), event_no 19-31 (wraps)."""
    return kind | task_type << 2 | (worker & 0xFF) << 11 | (event_no & 0x1FFF) << 19


def triton_tag(is_start: bool, task_type: int, global_id: int) -> int:
    """Triton-distributed: bit 0 is_start (1 start), task type 1-11, pid*ngroups+group 12-31."""
    return int(is_start) | task_type << 1 | global_id << 12


def pack(
    nblocks: int,
    ngroups: int,
    writers: Mapping[tuple[int, int], Sequence[Record]],
    *,
    rows: int | None = None,
    block_sms: Mapping[int, int] | None = None,
) -> np.ndarray:
    """A buffer of ``rows`` record rows (default: the longest writer's records); with
    ``block_sms`` a Triton-distributed one (meta slots, empty slots filled)."""
    stride = nblocks * ngroups
    rows = max((len(r) for r in writers.values()), default=0) if rows is None else rows
    meta = 0 if block_sms is None else nblocks
    empty = 0 if block_sms is None else EMPTY_TRITON
    buffer = np.full(1 + meta + rows * stride, empty, dtype=np.uint64)
    buffer[0] = nblocks | ngroups << 32
    for block, sm in (block_sms or {}).items():
        buffer[1 + block] = block | sm << 32
    for (block, group), records in writers.items():
        for k, (tag, time) in enumerate(records):
            buffer[1 + meta + k * stride + block * ngroups + group] = (
                tag | (time & 0xFFFF_FFFF) << 32
            )
    return buffer


def write_synthetic(path: str | Path, records: int) -> int:
    """A FlashInfer buffer (.npy) of about ``records`` records on 132 SMs x 2 groups: each
    writer alternates begin/end of events 0..8 with 100 ns steps. Returns the records."""
    nblocks, ngroups = 132, 2
    stride = nblocks * ngroups
    rows = max(2, (records // stride) // 2 * 2)
    k = np.arange(rows, dtype=np.uint64)[:, None]
    writer = np.arange(stride, dtype=np.uint64)[None, :]
    block = writer // np.uint64(ngroups)
    kind = k % np.uint64(2)
    event = (k // np.uint64(2)) % np.uint64(9)
    tag = kind | event << np.uint64(2) | block << np.uint64(12) | block << np.uint64(24)
    time = (np.uint64(1000) + k * np.uint64(100) + writer) & np.uint64(0xFFFF_FFFF)
    buffer = np.empty(1 + rows * stride, dtype=np.uint64)
    buffer[0] = nblocks | ngroups << 32
    buffer[1:] = (tag | time << np.uint64(32)).reshape(-1)
    np.save(path, buffer)
    return rows * stride


def numpy_decode(path: str | Path) -> dict[str, np.ndarray]:
    """The baseline: FlashInfer's fields of every written slot, no pairing, no checks."""
    buffer = np.load(path, mmap_mode="r")
    data = np.frombuffer(buffer, dtype="<u8", offset=8)
    written = data[data != 0]
    tag = (written & np.uint64(0xFFFF_FFFF)).astype(np.uint32)
    return {
        "kind": tag & 3,
        "event": (tag >> 2) & 0x3FF,
        "block": (tag >> 12) & 0xFFF,
        "smid": tag >> 24,
        "time": (written >> np.uint64(32)).astype(np.uint32),
    }
