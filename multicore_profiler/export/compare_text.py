"""A run comparison as text: Markdown for a pull-request comment, a JSON document for
machines, and the table a terminal shows."""

from __future__ import annotations

import duckdb
import orjson
import pyarrow as pa

from multicore_profiler.analysis.compare import VERDICTS, Comparison
from multicore_profiler.storage.sql_text import sql_identifier


def _us(value: float | None) -> str:
    """Nanoseconds as microseconds with two decimals; nothing for no value."""
    return "" if value is None else f"{value / 1e3:.2f}"


def _pct(value: float | None) -> str:
    """A relative change as a signed percentage (``+25.0%``); nothing for no value."""
    return "" if value is None else f"{value:+.1%}"


def comparison_markdown(comparison: Comparison) -> str:
    """The comparison as a Markdown summary and table, for a pull-request comment: one row
    per group, times in microseconds, "regressed" in bold, empty cells where a side or a
    statistic is missing (a new or gone group, a base median of zero)."""
    lines = [
        f"**mcprof compare**: {comparison.summary()}",
        "",
        f"base `{comparison.base}` ({len(comparison.base_ids)} run(s)), "
        f"head `{comparison.head}` ({len(comparison.head_ids)} run(s))",
        "",
    ]
    lines += [f"> warning: {warning}" for warning in comparison.warnings]
    header = [*comparison.by, "base median (us)", "head median (us)", "change", "interval", "p"]
    header += ["verdict", "added (us/invocation)"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in comparison.rows.to_pylist():
        low, high = row["change_low"], row["change_high"]
        interval = "" if low is None else f"{_pct(low)} .. {_pct(high)}"
        cells = [str(row[column]) for column in comparison.by]
        cells += [_us(row["base_median_ns"]), _us(row["head_median_ns"]), _pct(row["change"])]
        cells += [interval, "" if row["p_value"] is None else f"{row['p_value']:.2g}"]
        verdict = f"**{row['verdict']}**" if row["verdict"] == "regressed" else row["verdict"]
        cells += [verdict, _us(row["impact_ns"])]
        lines.append("| " + " | ".join(cells) + " |")
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


def comparison_table(comparison: Comparison) -> pa.Table:
    """The comparison's rows as a terminal shows them: the group's columns, both sample
    counts, medians in microseconds (two decimals), the change and its interval as
    percentage text, the p-value (two digits), the verdict and the time added per
    invocation in microseconds."""
    con = duckdb.connect()
    con.register("rows", comparison.rows)
    return con.sql(
        f"""SELECT {", ".join(sql_identifier(c) for c in comparison.by)},
                   base_count AS base_n, head_count AS head_n,
                   round(base_median_ns / 1e3, 2) AS base_us,
                   round(head_median_ns / 1e3, 2) AS head_us,
                   printf('%+.1f%%', change * 100) AS change,
                   printf('%+.1f%% .. %+.1f%%', change_low * 100, change_high * 100)
                       AS interval,
                   printf('%.2g', p_value) AS p, verdict,
                   round(impact_ns / 1e3, 2) AS added_us_per_invocation
            FROM rows""",
    ).to_arrow_table()
