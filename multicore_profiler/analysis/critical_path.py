"""The critical path walk's tolerance: a per-store setting of the ``records.critical_path``
module (``Store.configure("critical_path_tolerance", cycles)``).

A wait is crossed to the trigger that released it when it ended at most this many cycles
after that trigger did; a longer release latency means something else held the wait (the
core was descheduled, a clock stalled), and the walk stays on the wait's core instead.
"""

from __future__ import annotations

from typing import Any

import duckdb

from multicore_profiler.errors import ArgumentError

DEFAULT_TOLERANCE_CYCLES = 1_000_000
"""20 ms at Ascend's 50 MHz, 1 ms at the CPU reference kernel's 1 GHz counter: longer
than any release latency a healthy kernel shows (microseconds on a device, tens of
microseconds for the reference kernel's host threads)."""


def check_tolerance(con: duckdb.DuckDBPyConnection, cycles: Any) -> None:
    """Refuse (``ArgumentError``) a tolerance that is not a whole number of cycles >= 0."""
    if isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 0:
        raise ArgumentError(
            f"the critical path tolerance must be a whole number of cycles >= 0, got {cycles!r}"
        )


def install_tolerance(con: duckdb.DuckDBPyConnection, cycles: int) -> None:
    """Define ``critical_path_tolerance_cycles()`` for the module's views."""
    con.execute(f"CREATE OR REPLACE MACRO critical_path_tolerance_cycles() AS {int(cycles)}")
