"""``--clock-correction`` for the duration of one command: the clock offsets of the runs it
reads estimated from their records' causality and applied to every record view of the
store (``clock_offsets.correct_clocks``), and the store's correction as it was once the
command's work is done, so that a later call reads the records as they were before."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pyarrow as pa

from multicore_profiler.analysis.clock_offsets import correct_clocks
from multicore_profiler.storage.store import Store

APPLIED_COLUMNS = (
    "run_id",
    "rank",
    "invocation_id",
    "core",
    "block_id",
    "offset_cycles",
    "offset_ns",
    "low_ns",
    "high_ns",
)
"""What every output says of each core a correction moved: its invocation and core, the
cycles added to its records (and as ns at its invocation's frequency), and the interval
its offset can lie in relative to its invocation's reference core (NULL: open)."""


@contextmanager
def corrected_clocks(
    store: Store, runs: Sequence[str] | None, apply: bool
) -> Iterator[pa.Table | None]:
    """With ``apply``, the clocks of ``runs`` (None: every run) corrected for the block, which
    gets the ``APPLIED_COLUMNS`` of the cores moved; ``ClockError`` where the records cannot
    be corrected. Without, None and the store as it is."""
    if not apply:
        yield None
        return
    before = store.setting("clock_correction")
    try:
        yield correct_clocks(store, runs).select(list(APPLIED_COLUMNS))
    finally:
        store.configure("clock_correction", before)
