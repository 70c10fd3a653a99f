"""Per-step outer-kernel family times of traces in the store: what ``mcprof kernels`` prints.

A step is a row of the ``steps`` view (a step annotation with a GPU period, under the
store's ``OuterKernelRules``); a family's time in a step is its union (wall) time from
``step_family_totals``. ``check_steps`` says why a trace has no step rather than letting
it make an empty table.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from multicore_profiler.errors import RulesError
from multicore_profiler.storage.sql_text import sql_identifier, sql_string
from multicore_profiler.storage.store import Store


def check_steps(store: Store, source_id: str) -> None:
    """Raise ``RulesError`` when the trace ``source_id`` has no step with a GPU period
    under the store's rules, saying how many annotations the step pattern matched."""
    if store.sql("SELECT 1 FROM steps WHERE source_id = $1", [source_id]).num_rows:
        return
    pattern = store.kernel_rules.steps
    annotations = store.sql(
        "SELECT count(*) AS n FROM step_annotations WHERE source_id = $1", [source_id]
    ).to_pylist()[0]["n"]
    raise RulesError(
        f"trace {source_id} has no step with a GPU period: {annotations} annotation(s) "
        f"match the step pattern '{pattern}'; a step needs device kernels launched from inside "
        "its annotation and, unless it is the only annotation, a next step (the last one is "
        "dropped; see last_step in the rules); give --steps REGEX"
    )


BREAKDOWN_COLUMNS = (
    "stage",
    "computing",
    "communication",
    "communication_not_overlapped",
    "overlapped",
    "free",
)
"""The ``step_time_breakdown`` times ``family_times_by_step`` shows, each as ``<name>_ms``
(msprof-analyze's step trace table: computing + communication not overlapped + free =
stage)."""


def family_times_by_step(store: Store, sources: Sequence[str]) -> pa.Table:
    """One row per step of the traces ``sources`` (in that order, then by step): its
    ``source_id``, ``rank``, ``step`` (index), ``annotation``, ``period_ms``, ``busy_pct``
    (the share of the period the device was busy), the step's time breakdown
    (``BREAKDOWN_COLUMNS`` as ``<name>_ms``, from ``step_time_breakdown``) and one
    ``<family>_ms`` column per family holding its union time, the families by total time
    over these steps, largest first (ms rounded to 3 decimals, the share to 1)."""
    where = {"sources": list(sources)}
    order = store.sql(
        """SELECT family FROM step_family_totals WHERE list_contains($sources, source_id)
           GROUP BY family ORDER BY sum(union_ns) DESC, family""",
        where,
    )["family"].to_pylist()
    families = [
        f"round(sum(f.union_ns) FILTER (WHERE f.family = {sql_string(family)}) / 1e6, 3) "
        f"AS {sql_identifier(family + '_ms')}"
        for family in order
    ]
    breakdown = [
        f"round(any_value(b.{name}_ns) / 1e6, 3) AS {sql_identifier(name + '_ms')}"
        for name in BREAKDOWN_COLUMNS
    ]
    columns = [
        "s.source_id",
        "s.rank",
        "s.step_index AS step",
        "s.step_name AS annotation",
        "round(s.period_ns / 1e6, 3) AS period_ms",
        "round(100 * s.busy_ns / s.period_ns, 1) AS busy_pct",
        *(breakdown if order else []),
        *families,
    ]
    return store.sql(
        f"""SELECT {", ".join(columns)}
            FROM steps s JOIN step_family_totals f USING (source_id, step_index)
            LEFT JOIN step_time_breakdown b USING (source_id, step_index)
            WHERE list_contains($sources, s.source_id)
            GROUP BY 1, 2, 3, 4, 5, 6
            ORDER BY list_position($sources, s.source_id), s.step_index""",
        where,
    )
