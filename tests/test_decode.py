from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from golden import AIC, AIV, NO_OWNER, TASK7, TRIGGER, WAIT, Slot, pack

from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import DroppedRecordsWarning
from multicore_profiler.ingest.decode import as_byte_array, decode_buffer, decode_buffers

LAYOUT = BufferLayout(aic_slots=2, aiv_slots=3, aic_capacity=16, aiv_capacity=16)


def golden() -> bytearray:
    """AIC/0 runs one task (wait, compute, trigger); AIV/0 one fallback compute; AIV/2 is up
    but recorded nothing; AIC/1 and AIV/1 are idle."""
    return pack(
        2,
        3,
        16,
        16,
        [
            Slot(AIC, 0, 100, TASK7),
            Slot(AIV, 0, 90, [(95, 95, 0x20003, 8, 2, NO_OWNER)]),
            Slot(AIV, 2, 80),
        ],
    )


def test_golden_buffer_decodes_to_exact_rows() -> None:
    decoded = decode_buffer(golden(), LAYOUT, frequency_hz=50e6)
    assert decoded.cores.to_pylist() == [
        {
            "buffer": 0,
            "slot": 0,
            "core_type": 1,
            "block_id": 0,
            "entry_cycle": 100,
            "record_count": 3,
            "dropped_count": 0,
            "record_capacity": 16,
        },
        {
            "buffer": 0,
            "slot": 2,
            "core_type": 2,
            "block_id": 0,
            "entry_cycle": 90,
            "record_count": 1,
            "dropped_count": 0,
            "record_capacity": 16,
        },
        {
            "buffer": 0,
            "slot": 4,
            "core_type": 2,
            "block_id": 2,
            "entry_cycle": 80,
            "record_count": 0,
            "dropped_count": 0,
            "record_capacity": 16,
        },
    ]
    rows = [
        tuple(
            r[k]
            for k in (
                "core_type",
                "block_id",
                "record_index",
                "start_cycle",
                "end_cycle",
                "desc_id",
                "task_id",
                "stage_task_index",
                "owner_id",
                "phase",
            )
        )
        for r in decoded.records.to_pylist()
    ]
    assert rows == [
        (1, 0, 0, 110, 160, WAIT, 7, 0, 5, "wait"),
        (1, 0, 1, 160, 400, 0x30001, 7, 0, 5, "compute"),
        (1, 0, 2, 400, 405, TRIGGER, 7, 0, 5, "trigger"),
        (2, 0, 0, 95, 95, 0x20003, 8, 2, NO_OWNER, "compute"),
    ]
    # The anchor is the earliest entry of a slot that has records: AIV/2 (80) has none.
    assert decoded.anchor_cycles.tolist() == [90]
    assert decoded.record_counts.tolist() == [4]
    assert decoded.dropped_counts.tolist() == [0]


def test_worked_case_times_in_microseconds() -> None:
    buffer = pack(1, 0, 16, 0, [Slot(AIC, 0, 100, [(110, 160, WAIT, 0, 0, 5)])])
    decoded = decode_buffer(buffer, BufferLayout(1, 0, 16, 0), frequency_hz=50e6)
    timed = decoded.timed_records()
    assert timed["ts_us"].to_pylist() == [0.2]
    assert timed["dur_us"].to_pylist() == [1.0]


def test_record_before_the_anchor_has_a_negative_time() -> None:
    buffer = pack(
        1,
        1,
        16,
        16,
        [Slot(AIC, 0, 100, [(90, 100, 3, 0, 0, 0)]), Slot(AIV, 0, 200, [(300, 301, 3, 1, 0, 0)])],
    )
    timed = decode_buffer(buffer, BufferLayout(1, 1, 16, 16), frequency_hz=1e9).timed_records()
    assert timed["ts_us"].to_pylist() == [-0.01, 0.2]


def test_phase_comes_from_the_desc_id() -> None:
    descs = [0x10000, 0x10007, 0x10006, 0x10001, 0x20000, 0x20005, 0, 0xFFFFFFFF]
    buffer = pack(1, 0, 16, 0, [Slot(AIC, 0, 1, [(1, 2, d, 0, 0, 0) for d in descs])])
    decoded = decode_buffer(buffer, BufferLayout(1, 0, 16, 0), frequency_hz=1e6)
    assert decoded.records["phase"].to_pylist() == [
        "wait",
        "trigger",
        "terminate",
        "compute",
        "compute",
        "compute",
        "compute",
        "compute",
    ]


def test_batch_numbers_buffers_and_anchors_each() -> None:
    first = pack(2, 3, 16, 16, [Slot(AIC, 1, 1000, [(1001, 1002, 3, 0, 0, 0)])])
    second = golden()
    decoded = decode_buffers([first, second], LAYOUT, frequency_hz=1e9)
    assert decoded.buffers == 2
    assert decoded.anchor_cycles.tolist() == [1000, 90]
    assert decoded.record_counts.tolist() == [1, 4]
    assert decoded.records["buffer"].to_pylist() == [0, 1, 1, 1, 1]
    assert decoded.cores["buffer"].to_pylist() == [0, 1, 1, 1]
    stacked = np.stack([np.frombuffer(first, np.uint8), np.frombuffer(second, np.uint8)])
    as_array = decode_buffers(stacked, LAYOUT, frequency_hz=1e9)
    assert as_array.records.equals(decoded.records)
    assert as_array.cores.equals(decoded.cores)


def test_full_slot_counts_dropped_records_and_warns() -> None:
    full = [(i, i + 1, 3, i, i, 0) for i in range(16)]
    buffer = pack(
        2, 3, 16, 16, [Slot(AIC, 1, 0, full, dropped=5), Slot(AIV, 2, 0, full, dropped=1)]
    )
    with pytest.warns(DroppedRecordsWarning) as caught:
        decoded = decode_buffer(buffer, LAYOUT, frequency_hz=1e9)
    assert str(caught[0].message) == (
        "device dropped 6 records on 2 core(s): AIC/1 (5), AIV/2 (1); "
        "their slots were full (plan a larger capacity)"
    )
    assert decoded.dropped_counts.tolist() == [6]
    assert decoded.cores["dropped_count"].to_pylist() == [5, 1]
    assert decoded.records.num_rows == 32


@pytest.mark.parametrize(
    "convert",
    [
        bytes,
        bytearray,
        memoryview,
        lambda b: np.frombuffer(b, np.uint8),
        lambda b: np.frombuffer(b, np.uint64),
        lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8),
    ],
    ids=["bytes", "bytearray", "memoryview", "numpy-u8", "numpy-u64", "torch-u8"],
)
def test_every_buffer_kind_decodes_the_same(convert) -> None:
    expected = decode_buffer(golden(), LAYOUT, frequency_hz=50e6)
    decoded = decode_buffer(convert(bytes(golden())), LAYOUT, frequency_hz=50e6)
    assert decoded.records.equals(expected.records)
    assert decoded.cores.equals(expected.cores)


def test_buffers_are_read_in_place() -> None:
    array = np.frombuffer(bytes(golden()), np.uint8)
    assert np.shares_memory(as_byte_array(array), array)
    tensor = torch.zeros(64, dtype=torch.uint8)
    view = as_byte_array(tensor)
    tensor[3] = 7
    assert view[3] == 7
    raw = bytearray(16)
    view = as_byte_array(memoryview(raw))
    raw[1] = 9
    assert view[1] == 9


def test_a_two_dimensional_batch_lists_records_by_core_type_then_buffer() -> None:
    """A batch given as one array is gathered a cache-sized chunk of buffers at a time, each
    chunk's AIC records before its AIV ones; a list of buffers, buffer after buffer."""
    buffers = [
        pack(2, 3, 16, 16, [Slot(AIC, 0, b, [(b, b + 1, 3, 0, 0, 0)]), Slot(AIV, 1, b, TASK7)])
        for b in (10, 20)
    ]
    stacked = np.stack([np.frombuffer(b, np.uint8) for b in buffers])
    as_array = decode_buffers(stacked, LAYOUT, frequency_hz=1e9).records
    as_list = decode_buffers(buffers, LAYOUT, frequency_hz=1e9).records

    def order(records: pa.Table) -> list[tuple[int, int]]:
        columns = (records["buffer"].to_pylist(), records["core_type"].to_pylist())
        return list(zip(*columns, strict=True))

    assert order(as_array) == [(0, AIC), (1, AIC)] + [(0, AIV)] * 3 + [(1, AIV)] * 3
    assert order(as_list) == [(0, AIC)] + [(0, AIV)] * 3 + [(1, AIC)] + [(1, AIV)] * 3


def test_buffers_gathered_in_several_pieces_decode_as_one_by_one() -> None:
    """Slots of 256 records: each buffer of the batch is gathered in several pieces."""
    layout = BufferLayout(aic_slots=24, aiv_slots=48, aic_capacity=256, aiv_capacity=256)

    def slot(core: int, block: int, b: int) -> Slot:
        count = (block * 37 + b * 11) % 256 + 1
        base = 10**6 * (b + 1) + 1000 * block
        return Slot(
            core, block, base, [(base + i, base + i + 1, 3, i, block, b) for i in range(count)]
        )

    buffers = [
        pack(
            24,
            48,
            256,
            256,
            [slot(AIC, k, b) for k in range(24)] + [slot(AIV, k, b) for k in range(0, 48, 3)],
        )
        for b in range(3)
    ]
    batch = decode_buffers(
        np.stack([np.frombuffer(b, np.uint8) for b in buffers]), layout, frequency_hz=1e9
    )
    for b, buffer in enumerate(buffers):
        alone = decode_buffer(buffer, layout, frequency_hz=1e9)
        rows = batch.records.filter(pc.equal(batch.records["buffer"], b))
        assert rows.drop_columns(["buffer"]).equals(alone.records.drop_columns(["buffer"]))
    records = batch.records.filter(
        pc.and_(pc.equal(batch.records["buffer"], 1), pc.equal(batch.records["block_id"], 30))
    )
    count = (30 * 37 + 11) % 256 + 1
    assert records["record_index"].to_pylist() == list(range(count))
    assert records["start_cycle"].to_pylist() == [2 * 10**6 + 30000 + i for i in range(count)]
    assert batch.record_counts.tolist() == [
        sum((k * 37 + b * 11) % 256 + 1 for k in [*range(24), *range(0, 48, 3)]) for b in range(3)
    ]


def test_a_batch_without_drops_has_no_partial_slots() -> None:
    decoded = decode_buffers([golden(), golden(), golden()], LAYOUT, frequency_hz=1e9)
    assert decoded.partial_slots.to_pylist() == [[], [], []]
    assert decoded.partial_slots.type == pa.list_(pa.uint32())
