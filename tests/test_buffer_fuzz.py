"""Fuzzing of device buffers (issue 18): valid buffers with bytes flipped, cut off, extended
or header and record fields set to extremes. Every outcome is a ``ProfileError``, or a
decode (with or without a ``DroppedRecordsWarning``) whose every invariant holds: never
another exception."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest
from golden import AIC, AIV, GMM1, TASK7, TRIGGER, WAIT, Slot, pack
from hypothesis import given, settings
from hypothesis import strategies as st

from multicore_profiler.abi import (
    RECORD_BYTES,
    RECORD_DTYPE,
    SLOT_HEADER_BYTES,
    SLOT_HEADER_DTYPE,
    BufferLayout,
    CoreType,
)
from multicore_profiler.errors import DroppedRecordsWarning, ProfileError
from multicore_profiler.ingest.decode import DecodedBuffers, decode_buffer, decode_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches, step_tables
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel

GOLDEN_LAYOUT = BufferLayout(aic_slots=2, aiv_slots=3, aic_capacity=16, aiv_capacity=16)
GOLDEN = bytes(
    pack(
        2,
        3,
        16,
        16,
        [
            Slot(AIC, 0, 100, TASK7),
            Slot(AIC, 1, 90, [(95 + i, 96 + i, GMM1, i, i, 1) for i in range(16)], dropped=3),
            Slot(AIV, 0, 120, [(130, 140, WAIT, 9, 0, 2), (140, 190, 0x20003, 9, 0, 2)]),
            Slot(AIV, 2, 2**40, [(2**40, 2**41, TRIGGER, 10, 1, 0xFFFFFFFF)]),
        ],
    )
)
"""A buffer with a full slot that dropped records, an idle slot and cycles far apart."""
KERNEL = SimulatedMoeKernel(
    experts=2, tiles=2, aic_workers=2, aiv_workers=2, aic_slots=2, aiv_slots=4
)
SIMULATED = KERNEL.launch(np.random.default_rng(7), start_cycle=2**62).tobytes()
BASES = [(GOLDEN, GOLDEN_LAYOUT), (SIMULATED, KERNEL.layout)]
EXTREMES = {"<u4": [0, 1, 2**31, 2**32 - 1], "<u8": [0, 1, 2**63 - 1, 2**63, 2**64 - 1]}


def check(decoded: DecodedBuffers) -> None:
    """Everything a valid decode promises, whatever bytes it came from."""
    records, cores = decoded.records, decoded.cores
    assert records.num_rows == int(decoded.record_counts.sum())
    assert cores["record_count"].to_numpy().sum() == records.num_rows
    assert cores["dropped_count"].to_numpy().sum() == int(decoded.dropped_counts.sum())
    start, end = records["start_cycle"].to_numpy(), records["end_cycle"].to_numpy()
    assert (end >= start).all()
    anchor = decoded.anchor_cycles[records["buffer"].to_numpy()]
    timed = decoded.timed_records()
    ts, dur = timed["ts_us"].to_numpy(), timed["dur_us"].to_numpy()
    assert np.isfinite(ts).all()
    assert ((ts >= 0) == (start >= anchor)).all()  # the sign of every time is right
    assert (dur >= 0).all()
    partial = decoded.partial_slots.to_pylist()
    assert len(partial) == decoded.buffers
    invocations, _, stamped = step_tables(decoded, KernelInfo(), Launches(first_invocation_id=0))
    assert invocations["partial_slots"].to_pylist() == partial
    assert stamped.num_rows == records.num_rows


def outcome(decode: Callable[[], DecodedBuffers]) -> None:
    """Decode: a ProfileError is fine, and so is a decode that keeps its invariants; a
    warning may only be about dropped records, and only when some were."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            decoded = decode()
        except ProfileError:
            return
    check(decoded)
    for warning in caught:
        assert warning.category is DroppedRecordsWarning, warning.message
        assert decoded.dropped_counts.any()


def header_offset(layout: BufferLayout, slot: int) -> int:
    """Byte offset of a slot's header, counting AIC slots first."""
    kind = CoreType.AIC if slot < layout.aic_slots else CoreType.AIV
    index = slot if kind == CoreType.AIC else slot - layout.aic_slots
    return layout.offset(kind) + index * layout.stride(kind)


def setter(dtype: np.dtype) -> st.SearchStrategy[tuple[int, str, int]]:
    """(byte offset within the struct, field, extreme value) of a struct dtype's fields."""
    fields = [(name, *dtype.fields[name]) for name in dtype.names]
    return st.sampled_from(fields).flatmap(
        lambda f: st.tuples(st.just(f[2]), st.just(f[1].str), st.sampled_from(EXTREMES[f[1].str]))
    )


def write(raw: bytearray, offset: int, kind: str, value: int) -> None:
    raw[offset : offset + np.dtype(kind).itemsize] = np.array(value, kind).tobytes()


@settings(max_examples=150, deadline=None)
@given(
    base=st.sampled_from(BASES),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), max_size=8),
)
def test_flipped_bytes(base: tuple[bytes, BufferLayout], flips: list[tuple[float, int]]) -> None:
    raw, layout = bytearray(base[0]), base[1]
    for where, mask in flips:
        raw[int(where * len(raw))] ^= mask
    outcome(lambda: decode_buffer(raw, layout, frequency_hz=50e6))


@settings(max_examples=60, deadline=None)
@given(base=st.sampled_from(BASES), cut=st.integers(0, 4096), extra=st.binary(max_size=64))
def test_cut_off_or_extended(base: tuple[bytes, BufferLayout], cut: int, extra: bytes) -> None:
    raw, layout = base
    outcome(lambda: decode_buffer(raw[: max(len(raw) - cut, 0)] + extra, layout, frequency_hz=1e9))


@settings(max_examples=200, deadline=None)
@given(
    base=st.sampled_from(BASES),
    slot=st.integers(0, 5),
    headers=st.lists(setter(SLOT_HEADER_DTYPE), min_size=1, max_size=3),
    record=st.integers(0, 15),
    fields=st.lists(setter(RECORD_DTYPE), max_size=3),
)
def test_fields_set_to_extremes(
    base: tuple[bytes, BufferLayout],
    slot: int,
    headers: list[tuple[int, str, int]],
    record: int,
    fields: list[tuple[int, str, int]],
) -> None:
    raw, layout = bytearray(base[0]), base[1]
    start = header_offset(layout, slot % layout.total_slots)
    for offset, kind, value in headers:
        write(raw, start + offset, kind, value)
    for offset, kind, value in fields:
        write(raw, start + SLOT_HEADER_BYTES + record * RECORD_BYTES + offset, kind, value)
    outcome(lambda: decode_buffers([base[0], raw], layout, frequency_hz=50e6))


@pytest.mark.parametrize(("raw", "layout"), BASES)
def test_the_unmutated_bases_decode(raw: bytes, layout: BufferLayout) -> None:
    """The fuzzed buffers start valid, so that mutations reach every check."""
    outcome(lambda: decode_buffer(raw, layout, frequency_hz=50e6))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        decoded = decode_buffer(raw, layout, frequency_hz=50e6)
    assert decoded.records.num_rows > 0
