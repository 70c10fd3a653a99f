"""The cross-rank tables as text: what ``mcprof ranks`` prints (a terminal table or
Markdown), the tables as CSV, and a JSON document carrying every row (see
docs/cross-rank.md)."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pyarrow as pa

from multicore_profiler.analysis.cross_rank import CrossRank
from multicore_profiler.export.analysis_text import displayed, tables_csv, text_table
from multicore_profiler.export.markdown import markdown_table
from multicore_profiler.export.terminal_text import printable

TITLES = {
    "step_stragglers": "Who holds each step back: the last arrival at its collectives",
    "slow_rank_causes": "Slowest rank of each step, and where its extra time went",
    "rank_step_breakdown": "Step time breakdown per rank and pipeline stage",
    "collective_waits": "Communication per rank and step: waiting for the last arrival",
    "slow_ranks": "Slow-rank votes (Dixon test per collective)",
    "slow_rank_advice": "Advisor: dimensions whose spread across ranks exceeds 5% of a step",
    "rank_clock_offsets": "Clock offsets per rank (collective ends aligned; not applied)",
    "kernel_rank_steps": "MegaKernel: slowest rank per step",
    "kernel_slow_rank_stages": "MegaKernel: the stage that makes the slowest rank slow",
}
"""Each table's title, in the order the report shows them."""


def _heading(report: CrossRank) -> str:
    """The first line: the jobs and runs the tables cover."""
    jobs = ", ".join(report.jobs) or "none"
    runs = ", ".join(report.runs) or "none"
    return printable(f"mcprof ranks: jobs {jobs}; MegaKernel runs {runs}")


def _shown(report: CrossRank) -> dict[str, pa.Table]:
    """The tables a summary shows: those with rows."""
    return {name: table for name, table in report.tables().items() if table.num_rows}


def ranks_table(report: CrossRank) -> str:
    """The summary as a terminal shows it: a heading, the warnings, each table with rows
    under its title."""
    lines = [_heading(report), *(f"warning: {printable(w)}" for w in report.warnings)]
    for name, table in _shown(report).items():
        header, cells = displayed(name, table)
        lines += ["", f"{TITLES[name]}:", *text_table(header, cells)]
    if not _shown(report):
        lines += ["", "(no cross-rank rows: a job needs two ranks or more)"]
    return "\n".join(lines) + "\n"


def ranks_markdown(report: CrossRank) -> str:
    """The summary in Markdown: the heading in bold, the warnings as a list, each table
    with rows under its title."""
    lines = [f"**{_heading(report)}**", "", *(f"- warning: {w}" for w in report.warnings)]
    for name, table in _shown(report).items():
        header, cells = displayed(name, table)
        lines += ["", f"### {TITLES[name]}", "", *markdown_table(header, cells)]
    return "\n".join(lines) + "\n"


def ranks_csv(report: CrossRank) -> str:
    """Every table as CSV (``tables_csv``), empty ones with their header."""
    return tables_csv(report.tables())


def ranks_json(report: CrossRank) -> bytes:
    """Every table, all rows, as an indented JSON document: the jobs, runs, warnings and
    ``tables`` by view name; numbers as computed."""
    document = {
        "jobs": list(report.jobs),
        "runs": list(report.runs),
        "warnings": list(report.warnings),
        "tables": {name: table.to_pylist() for name, table in report.tables().items()},
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"


RENDERERS: dict[str, Callable[[CrossRank], str | bytes]] = {
    "table": ranks_table,
    "markdown": ranks_markdown,
    "csv": ranks_csv,
    "json": ranks_json,
}
"""Each ``mcprof ranks --format`` and what renders it."""
