"""Any layout and any valid records come back exactly through decode, store and SQL."""

from __future__ import annotations

import tempfile
import warnings

from golden import AIC, AIV, Slot, pack
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import DroppedRecordsWarning
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import Launches
from multicore_profiler.storage.store import open_store

U32 = st.integers(0, 2**32 - 1)


SPAN = 2**63 - 1
"""Cycles of one buffer lie within this of each other: the decoder refuses a cycle 2^63 or
more from its buffer's anchor."""


@st.composite
def record(draw: st.DrawFn, base: int) -> tuple[int, int, int, int, int, int]:
    start = draw(st.integers(base, base + SPAN))
    end = draw(st.integers(start, min(start + 2**40, base + SPAN)))
    return (start, end, draw(U32), draw(U32), draw(U32), draw(U32))


@st.composite
def buffers(draw: st.DrawFn) -> tuple[BufferLayout, list[Slot]]:
    aic_slots, aiv_slots = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    assume(aic_slots + aiv_slots > 0)
    layout = BufferLayout(
        aic_slots=aic_slots,
        aiv_slots=aiv_slots,
        aic_capacity=draw(st.sampled_from([0, 16, 32])),
        aiv_capacity=draw(st.sampled_from([0, 16, 32])),
    )
    base = draw(st.integers(1, 2**64 - 1 - SPAN))
    slots = []
    for core, count, capacity in (
        (AIC, aic_slots, layout.aic_capacity),
        (AIV, aiv_slots, layout.aiv_capacity),
    ):
        for block in range(count):
            if draw(st.booleans()):
                continue  # an idle core: its slot stays all zero
            records = draw(st.lists(record(base), max_size=capacity))
            dropped = draw(st.integers(0, 5)) if len(records) == capacity else 0
            entry = draw(st.integers(base, base + SPAN))
            slots.append(Slot(core, block, entry, records, dropped))
    assume(any(s.records for s in slots))
    return layout, slots


PHASES = {0x10000: "wait", 0x10007: "trigger", 0x10006: "terminate"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=buffers(), frequency=st.floats(1e3, 1e10), rank=st.integers(0, 1023))
def test_decode_store_sql_round_trip(
    case: tuple[BufferLayout, list[Slot]], frequency: float, rank: int
) -> None:
    layout, slots = case
    raw = pack(layout.aic_slots, layout.aiv_slots, layout.aic_capacity, layout.aiv_capacity, slots)
    with (
        tempfile.TemporaryDirectory() as scratch,
        open_store(scratch) as store,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore", DroppedRecordsWarning)
        ingest_buffers(
            store,
            [raw],
            layout,
            frequency_hz=frequency,
            run_id="p",
            launches=Launches(rank=rank, step=3),
        )

        slots.sort(key=lambda s: (s.core_type, s.block_id))
        anchor = min(s.entry_cycle for s in slots if s.records)
        expected = [
            (
                s.core_type,
                s.block_id,
                i,
                *r,
                PHASES.get(r[2], "compute"),
                float(r[0] - anchor) * 1e9 / frequency,
            )
            for s in slots
            for i, r in enumerate(s.records)
        ]
        got = store.sql(
            """SELECT core_type, block_id, record_index, start_cycle, end_cycle, desc_id, task_id,
                      stage_task_index, owner_id, phase, ts_ns
               FROM records_ns WHERE run_id = 'p' AND step = 3 AND rank = $1
               ORDER BY core_type, block_id, record_index""",
            [rank],
        )
        assert [tuple(r.values()) for r in got.to_pylist()] == expected

        cores = store.sql(
            "SELECT core_type, block_id, entry_cycle, record_count, dropped_count "
            "FROM cores ORDER BY slot"
        )
        assert [tuple(r.values()) for r in cores.to_pylist()] == [
            (s.core_type, s.block_id, s.entry_cycle, len(s.records), s.dropped) for s in slots
        ]
        (invocation,) = store.sql(
            "SELECT anchor_cycle, record_count, dropped_count FROM invocations"
        ).to_pylist()
        assert invocation == {
            "anchor_cycle": anchor,
            "record_count": len(expected),
            "dropped_count": sum(s.dropped for s in slots),
        }
