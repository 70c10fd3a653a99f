"""Buffers packed byte by byte with ``struct``, independently of the decoder and its dtypes.

Offsets follow DESIGN.md: AIC slots then AIV slots, slot stride 64 + capacity x 32,
a 64-byte header ``<QIIIIII`` + 32 bytes of padding, records ``<QQIIII``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

HEADER = struct.Struct("<QIIIIII")
RECORD = struct.Struct("<QQIIII")
AIC, AIV = 1, 2
WAIT, TRIGGER, TERMINATE = 0x10000, 0x10007, 0x10006
NO_OWNER = 0xFFFFFFFF
GMM1 = 0x30001
TASK7 = [(110, 160, WAIT, 7, 0, 5), (160, 400, GMM1, 7, 0, 5), (400, 405, TRIGGER, 7, 0, 5)]
"""Task 7 of owner 5 on one core: a wait, its GMM1 compute and its trigger."""


@dataclass
class Slot:
    """One core's slot: header fields and its records (start, end, desc, task, index, owner)."""

    core_type: int
    block_id: int
    entry_cycle: int
    records: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)
    dropped: int = 0
    capacity: int | None = None
    reserved: int = 0
    record_count: int | None = None
    header_core: int | None = None
    header_block: int | None = None


def slot_offset(aic_slots: int, aic_capacity: int, aiv_capacity: int, core: int, block: int) -> int:
    aic_stride = 64 + aic_capacity * 32
    if core == AIC:
        return block * aic_stride
    return aic_slots * aic_stride + block * (64 + aiv_capacity * 32)


def pack(
    aic_slots: int, aiv_slots: int, aic_capacity: int, aiv_capacity: int, slots: list[Slot]
) -> bytearray:
    """A whole buffer with the given slots written and every other byte zero."""
    size = aic_slots * (64 + aic_capacity * 32) + aiv_slots * (64 + aiv_capacity * 32)
    buffer = bytearray(size)
    for slot in slots:
        offset = slot_offset(aic_slots, aic_capacity, aiv_capacity, slot.core_type, slot.block_id)
        planned = aic_capacity if slot.core_type == AIC else aiv_capacity
        HEADER.pack_into(
            buffer,
            offset,
            slot.entry_cycle,
            len(slot.records) if slot.record_count is None else slot.record_count,
            slot.dropped,
            slot.core_type if slot.header_core is None else slot.header_core,
            slot.block_id if slot.header_block is None else slot.header_block,
            planned if slot.capacity is None else slot.capacity,
            slot.reserved,
        )
        for i, record in enumerate(slot.records):
            RECORD.pack_into(buffer, offset + 64 + 32 * i, *record)
    return buffer
