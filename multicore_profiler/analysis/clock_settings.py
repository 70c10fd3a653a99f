"""The clock checks' store settings: the tolerance of causality (``clock_tolerance``, ns) and
the per-core clock correction applied to every record view (``clock_correction``).

``Store.configure("clock_tolerance", ns)`` sets how far a wait may end before the trigger
that released it ended before ``clock_sanity`` and ``mcprof analyze`` call the cores' clocks
contradicted (default 0: records of one shared counter never disagree). The correction is
set by ``analysis.clock_offsets.correct_clocks`` (``--clock-correction``), which estimates
it first; ``Store.configure("clock_correction", None)`` removes it.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa

from multicore_profiler.errors import ArgumentError

DEFAULT_CLOCK_TOLERANCE_NS = 0
"""Records of one counter shared by all cores never put a wait's end before its releasing
trigger's end: any such record is a contradiction."""

CORRECTION_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("rank", pa.int32()),
        ("invocation_id", pa.int64()),
        ("write_id", pa.int64()),
        ("core_type", pa.uint8()),
        ("block_id", pa.uint32()),
        ("offset_cycles", pa.int64()),
    ]
)
"""A clock correction: the cycles added to each core's records (``_clock_corrections``)."""


def check_clock_tolerance(con: duckdb.DuckDBPyConnection, ns: Any) -> None:
    """Refuse (``ArgumentError``) a tolerance that is not a whole number of ns >= 0."""
    if isinstance(ns, bool) or not isinstance(ns, int) or ns < 0:
        raise ArgumentError(f"the clock tolerance must be a whole number of ns >= 0, got {ns!r}")


def install_clock_tolerance(con: duckdb.DuckDBPyConnection, ns: int) -> None:
    """Define ``clock_tolerance_ns()`` for the clock views."""
    con.execute(f"CREATE OR REPLACE MACRO clock_tolerance_ns() AS {int(ns)}")


def no_correction() -> pa.Table:
    """The default: no core's records are shifted (a table of no batches, as
    ``Schema.empty_table`` would import pandas)."""
    return pa.Table.from_batches([], CORRECTION_SCHEMA)


def check_correction(con: duckdb.DuckDBPyConnection, table: Any) -> None:
    """Refuse (``ArgumentError``) anything but a table of ``CORRECTION_SCHEMA``."""
    if not isinstance(table, pa.Table) or not table.schema.equals(CORRECTION_SCHEMA):
        got = table.schema if isinstance(table, pa.Table) else type(table).__name__
        raise ArgumentError(
            f"a clock correction must be an Arrow table of {CORRECTION_SCHEMA.names} "
            f"({CORRECTION_SCHEMA}), got {got}"
        )


def install_correction(con: duckdb.DuckDBPyConnection, table: pa.Table) -> None:
    """Hold the correction in ``_clock_corrections``, which the record views add."""
    con.register("_clock_correction_rows", table)
    try:
        con.execute(
            "CREATE OR REPLACE TABLE _clock_corrections AS SELECT * FROM _clock_correction_rows"
        )
    finally:
        con.unregister("_clock_correction_rows")
