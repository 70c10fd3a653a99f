"""Generation b buffers (hyper-parallel's newer MegaKernel profiling), packed from their layout.

Generation b writes generation a's slot bytes (``golden.pack`` packs them with ``struct``,
independently of the decoder); what differs is the plan: a slot holds the busiest worker's
records rounded up to 16, with no cap of 256, up to ``MAX_RECORDS_B``; and stages are the
compute graph's nodes, numbered ``GRAPH_STAGE + k`` in topological order.
"""

from __future__ import annotations

from golden import Slot, pack

from multicore_profiler.abi import BufferLayout

MAX_RECORDS_B = ((0xFFFFFFFF - 64) // 32) // 16 * 16
"""The most records a generation b slot holds: 64 + capacity x 32 bytes fit 32 bits."""
GRAPH_STAGE = 0x30000
"""Stage k of the compute graph (topological order) is desc id 0x30000 + k."""
FALLBACK = 0x20000
SHMEM_GET_MEM = 107
"""The task type generation b names ShmemGetMem."""


def capacity_b(records: int) -> int:
    """Generation b's capacity for a worker that writes ``records``: rounded up to 16."""
    capacity = -(-records // 16) * 16
    assert capacity <= MAX_RECORDS_B
    return capacity


def pack_b(layout: BufferLayout, slots: list[Slot]) -> bytearray:
    """A whole buffer of a generation b layout (or one left to inference) with ``slots``
    written and every other byte zero."""
    assert layout.generation in (None, "b")
    return pack(layout.aic_slots, layout.aiv_slots, layout.aic_capacity, layout.aiv_capacity, slots)
