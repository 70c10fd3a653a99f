"""A corpus of corrupt buffers, one per error the decoder must raise, each named exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from golden import AIC, AIV, Slot, pack

from multicore_profiler.abi import BufferLayout, CoreType
from multicore_profiler.errors import (
    BufferSizeError,
    DecodeError,
    EmptyBufferError,
    FrequencyError,
    ProfileError,
    RecordError,
    SlotError,
)
from multicore_profiler.ingest.decode import decode_buffer, decode_buffers

LAYOUT = BufferLayout(aic_slots=2, aiv_slots=2, aic_capacity=16, aiv_capacity=16)
GOOD = Slot(AIC, 0, 100, [(110, 160, 3, 0, 0, 0)])


def buffer(*slots: Slot) -> bytearray:
    return pack(2, 2, 16, 16, [GOOD, *slots])


SLOT_CASES = {
    "core_type": (
        Slot(AIC, 1, 5, [(6, 7, 3, 0, 0, 0)], header_core=AIV),
        1,
        "slot 1 (AIC block 1): core_type is 2, expected 1 (AIC)",
    ),
    "block_id": (
        Slot(AIV, 1, 5, [(6, 7, 3, 0, 0, 0)], header_block=0),
        3,
        "slot 3 (AIV block 1): block_id is 0, expected 1",
    ),
    "record_capacity": (
        Slot(AIV, 0, 5, [(6, 7, 3, 0, 0, 0)], capacity=32),
        2,
        "slot 2 (AIV block 0): record_capacity is 32, expected the planned 16",
    ),
    "reserved": (
        Slot(AIC, 1, 5, [(6, 7, 3, 0, 0, 0)], reserved=1),
        1,
        "slot 1 (AIC block 1): reserved is 1, expected 0",
    ),
    "record_count": (
        Slot(AIV, 1, 5, [(6, 7, 3, 0, 0, 0)], record_count=17),
        3,
        "slot 3 (AIV block 1): record_count is 17, above the capacity 16",
    ),
}


@pytest.mark.parametrize("field", list(SLOT_CASES))
def test_header_that_contradicts_its_slot(field: str) -> None:
    slot, index, message = SLOT_CASES[field]
    with pytest.raises(SlotError) as raised:
        decode_buffer(buffer(slot), LAYOUT, frequency_hz=1e9)
    assert raised.value.slot == index
    assert raised.value.field == field
    assert raised.value.buffer == 0
    assert str(raised.value).startswith(message)


def test_every_bad_slot_is_counted() -> None:
    bad = [Slot(AIV, b, 5, [(6, 7, 3, 0, 0, 0)], reserved=9) for b in (0, 1)]
    with pytest.raises(
        SlotError, match=r"slot 2 \(AIV block 0\): reserved is 9, expected 0 \(and 1 more slot\)$"
    ):
        decode_buffer(buffer(*bad), LAYOUT, frequency_hz=1e9)


def test_record_that_ends_before_it_starts() -> None:
    slot = Slot(AIV, 0, 5, [(6, 7, 3, 0, 0, 0), (9, 8, 3, 1, 0, 0)])
    with pytest.raises(RecordError) as raised:
        decode_buffer(buffer(slot), LAYOUT, frequency_hz=1e9)
    assert (raised.value.slot, raised.value.field, raised.value.record) == (2, "end_cycle", 1)
    assert str(raised.value).startswith(
        "slot 2 (AIV block 0), record 1: end_cycle 8 is before start_cycle 9"
    )


def test_idle_header_over_written_records() -> None:
    raw = buffer()
    raw[2 * (64 + 16 * 32) + 64 + 5] = 1  # a record byte of AIV/0, whose header is all zero
    with pytest.raises(SlotError) as raised:
        decode_buffer(raw, LAYOUT, frequency_hz=1e9)
    assert (raised.value.slot, raised.value.field) == (2, None)
    assert "the header is all zero (an idle core) but its records are not" in str(raised.value)


@pytest.mark.parametrize("delta", [-1, 1, -32])
def test_buffer_of_the_wrong_size(delta: int) -> None:
    raw = bytes(buffer()) + bytes(max(delta, 0))
    raw = raw[: len(raw) + min(delta, 0)]
    with pytest.raises(BufferSizeError, match=f"holds {LAYOUT.total_bytes + delta} bytes"):
        decode_buffer(raw, LAYOUT, frequency_hz=1e9)


@pytest.mark.parametrize("frequency", [0, -50e6, math.nan, math.inf, -math.inf, "fast", None])
def test_cycle_frequency_must_be_positive_and_finite(frequency: object) -> None:
    with pytest.raises(FrequencyError, match="cycle frequency must be"):
        decode_buffer(buffer(), LAYOUT, frequency_hz=frequency)


def test_buffer_without_any_record() -> None:
    with pytest.raises(
        EmptyBufferError, match=r"no slot of the buffer holds a record \(4 slots, 0 not idle\)"
    ):
        decode_buffer(bytes(LAYOUT.total_bytes), LAYOUT, frequency_hz=1e9)
    started = pack(2, 2, 16, 16, [Slot(AIC, 0, 5), Slot(AIV, 1, 6)])
    with pytest.raises(EmptyBufferError, match=r"\(4 slots, 2 not idle\)"):
        decode_buffer(started, LAYOUT, frequency_hz=1e9)


def test_errors_in_a_batch_name_their_buffer() -> None:
    bad = buffer(Slot(AIC, 1, 5, [(6, 7, 3, 0, 0, 0)], reserved=1))
    with pytest.raises(SlotError, match=r"^buffer 1, slot 1 \(AIC block 1\)") as raised:
        decode_buffers([buffer(), bad], LAYOUT, frequency_hz=1e9)
    assert raised.value.buffer == 1
    with pytest.raises(EmptyBufferError, match=r"^buffer 2: "):
        decode_buffers([buffer(), buffer(), bytes(LAYOUT.total_bytes)], LAYOUT, frequency_hz=1e9)
    with pytest.raises(BufferSizeError, match=r"^buffer 1: "):
        decode_buffers([buffer(), bytes(10)], LAYOUT, frequency_hz=1e9)


def test_buffers_that_cannot_be_read_in_place() -> None:
    raw = np.frombuffer(bytes(buffer()) * 2, np.uint8)
    with pytest.raises(DecodeError, match="not C-contiguous"):
        decode_buffer(raw[::2], LAYOUT, frequency_hz=1e9)
    with pytest.raises(DecodeError, match="must be 2-D"):
        decode_buffers(raw.reshape(2, 1, -1), LAYOUT, frequency_hz=1e9)
    with pytest.raises(DecodeError, match="cannot read a str as a byte buffer"):
        decode_buffer("not bytes", LAYOUT, frequency_hz=1e9)
    with pytest.raises(DecodeError, match="no buffer to decode"):
        decode_buffers([], LAYOUT, frequency_hz=1e9)


def test_every_decode_error_is_a_profile_error() -> None:
    for error in (BufferSizeError, SlotError, RecordError, FrequencyError, EmptyBufferError):
        assert issubclass(error, DecodeError)
        assert issubclass(error, ProfileError)


def test_errors_in_a_later_piece_of_a_batch_name_their_record() -> None:
    """Slots of 256 records: the bad record lies in a later piece of a later buffer."""
    full = [(10 + i, 11 + i, 3, i, 0, 0) for i in range(256)]

    def big(*slots: Slot) -> bytes:
        return bytes(pack(4, 8, 256, 256, [*(Slot(AIC, k, 10, full) for k in range(4)), *slots]))

    late = [*full[:150], (500, 499, 3, 150, 0, 0), *full[151:]]
    batch = np.stack(
        [np.frombuffer(b, np.uint8) for b in (big(), big(Slot(AIV, 6, 10, late)), big())]
    )
    with pytest.raises(RecordError) as raised:
        decode_buffers(batch, BufferLayout(4, 8, 256, 256), frequency_hz=1e9)
    assert (raised.value.buffer, raised.value.slot, raised.value.record) == (1, 10, 150)
    assert str(raised.value) == (
        "buffer 1, slot 10 (AIV block 6), record 150: end_cycle 499 is before start_cycle 500 "
        "(1 such record(s) in all)"
    )
    idle = bytearray(big())
    idle[BufferLayout(4, 8, 256, 256).offset(CoreType.AIV) + 3 * (64 + 256 * 32) + 64 + 7] = 1
    with pytest.raises(SlotError, match=r"^buffer 2, slot 7 \(AIV block 3\): the header is all"):
        decode_buffers([big(), big(), idle], BufferLayout(4, 8, 256, 256), frequency_hz=1e9)
