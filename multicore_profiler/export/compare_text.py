"""A run comparison as text: Markdown for a pull-request comment, a JSON document for
machines, and the table a terminal shows. Durations show in microseconds and their change
as a percentage; shares of a makespan (level ``critical``) as percentages and their change
in points."""

from __future__ import annotations

import orjson
import pyarrow as pa

from multicore_profiler.analysis.compare import VERDICTS, Comparison
from multicore_profiler.export.markdown import markdown_table
from multicore_profiler.storage.connection import arrow_cursor
from multicore_profiler.storage.sql_text import sql_identifier


def _us(value: float | None) -> str:
    """Nanoseconds as microseconds with two decimals; nothing for no value."""
    return "" if value is None else f"{value / 1e3:.2f}"


def _pct(value: float | None) -> str:
    """A relative change as a signed percentage (``+25.0%``); nothing for no value."""
    return "" if value is None else f"{value:+.1%}"


def _share(value: float | None) -> str:
    """A share as a percentage with one decimal (``51.5%``); nothing for no value."""
    return "" if value is None else f"{value:.1%}"


def _points(value: float | None) -> str:
    """A change of a share in signed percentage points (``+11.7 pts``); nothing for none."""
    return "" if value is None else f"{value * 100:+.1f} pts"


def comparison_markdown(comparison: Comparison) -> str:
    """The comparison as a Markdown summary and table, for a pull-request comment: one row
    per group, times in microseconds (shares in percent, their change in points),
    "regressed" in bold, empty cells where a side or a statistic is missing (a new or gone
    group, a base median of zero)."""
    lines = [
        f"**mcprof compare**: {comparison.summary()}",
        "",
        f"base `{comparison.base}` ({len(comparison.base_ids)} run(s)), "
        f"head `{comparison.head}` ({len(comparison.head_ids)} run(s))",
        "",
    ]
    lines += [f"> warning: {warning}" for warning in comparison.warnings]
    unit = comparison.unit
    value, change, added = (_share, _points, _points) if unit == "share" else (_us, _pct, _us)
    shown, per = ("share", "per invocation") if unit == "share" else ("us", "us/invocation")
    header = [*comparison.by, f"base median ({shown})", f"head median ({shown})", "change"]
    header += ["interval", "p", "verdict", f"added ({per})"]
    rows = []
    for row in comparison.rows.to_pylist():
        low, high = row["change_low"], row["change_high"]
        interval = "" if low is None else f"{change(low)} .. {change(high)}"
        cells = [str(row[column]) for column in comparison.by]
        cells += [value(row[f"base_median_{unit}"]), value(row[f"head_median_{unit}"])]
        cells += [change(row["change"]), interval]
        cells += ["" if row["p_value"] is None else f"{row['p_value']:.2g}"]
        verdict = f"**{row['verdict']}**" if row["verdict"] == "regressed" else row["verdict"]
        cells += [verdict, added(row[f"impact_{unit}"])]
        rows.append(cells)
    lines += markdown_table(header, rows)
    return "\n".join(lines) + "\n"


def comparison_json(comparison: Comparison) -> bytes:
    """The comparison as an indented JSON document ending in a newline: both sides'
    selectors and run ids, the grouping, the rule (metric, threshold, alpha), the verdicts
    counted, the warnings and every group's row as it is in ``comparison.rows``."""
    document = {
        "base": {"selector": comparison.base, "runs": list(comparison.base_ids)},
        "head": {"selector": comparison.head, "runs": list(comparison.head_ids)},
        "by": list(comparison.by),
        "metric": comparison.metric,
        "threshold": comparison.threshold,
        "alpha": comparison.alpha,
        "counts": {verdict: comparison.count(verdict) for verdict in VERDICTS},
        "warnings": list(comparison.warnings),
        "groups": comparison.rows.to_pylist(),
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"


_TABLE_VALUES = {
    "ns": """round(base_median_ns / 1e3, 2) AS base_us,
             round(head_median_ns / 1e3, 2) AS head_us,
             printf('%+.1f%%', change * 100) AS change,
             printf('%+.1f%% .. %+.1f%%', change_low * 100, change_high * 100) AS interval,
             printf('%.2g', p_value) AS p, verdict,
             round(impact_ns / 1e3, 2) AS added_us_per_invocation""",
    "share": """round(base_median_share * 100, 1) AS base_pct,
                round(head_median_share * 100, 1) AS head_pct,
                printf('%+.1f pts', change * 100) AS change,
                printf('%+.1f .. %+.1f pts', change_low * 100, change_high * 100) AS interval,
                printf('%.2g', p_value) AS p, verdict,
                round(impact_share * 100, 1) AS added_pts_per_invocation""",
}
"""The terminal table's value columns for durations (ns) and for shares."""


def comparison_table(comparison: Comparison) -> pa.Table:
    """The comparison's rows as a terminal shows them: the group's columns, both sample
    counts, medians in microseconds (two decimals), the change and its interval as
    percentage text, the p-value (two digits), the verdict and the time added per
    invocation in microseconds; for shares, medians in percent (one decimal) and the
    change, its interval and what is added per invocation in points."""
    with arrow_cursor() as con:
        con.register("rows", comparison.rows)
        return con.sql(
            f"""SELECT {", ".join(sql_identifier(c) for c in comparison.by)},
                       base_count AS base_n, head_count AS head_n,
                       {_TABLE_VALUES[comparison.unit]}
                FROM rows""",
        ).to_arrow_table()
