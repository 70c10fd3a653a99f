"""A kernel analysis as text: the summary ``mcprof analyze`` prints (a terminal table or
Markdown), its summary tables as CSV, and a JSON document carrying every table.

The summary is computed here from the tables of ``analyze``, ``what_if`` and
``speedup_curves`` (see docs/analysis.md): the makespan (per invocation when few, else its
median, min and max per kernel) with the static bound and slack, the tiling check, the
critical path's shares over the selection, the top blockers of each consumer stage,
imbalance per core type, the replay's fidelity, the what-if predictions and the speed-up
curves.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.analysis.analyze import KernelAnalysis
from multicore_profiler.analysis.replay import FIDELITY_LIMIT
from multicore_profiler.export.markdown import markdown_table
from multicore_profiler.export.terminal_text import printable
from multicore_profiler.storage.connection import arrow_cursor

FEW_INVOCATIONS = 8
"""Up to this many invocations the makespan table has a row per invocation; above, one
per kernel with the median, min and max."""
TOP_BLOCKERS = 3
"""Producers shown per consumer stage (the JSON document's ``tables`` carry all)."""
NAMED = 5
"""Invocations named in a line that lists those failing a check."""

_MAKESPAN_FEW = """
SELECT run_id, rank, step, invocation_id, kernel_name, makespan_ns, static_bound_ns,
       slack_ns, slack_share
FROM invocations ORDER BY run_id, rank, invocation_id
"""
_MAKESPAN_MANY = """
SELECT kernel_name, count(*) AS invocations,
       median(makespan_ns) AS median_makespan_ns, min(makespan_ns) AS min_makespan_ns,
       max(makespan_ns) AS max_makespan_ns, median(static_bound_ns) AS median_static_bound_ns,
       median(slack_ns) AS median_slack_ns, median(slack_share) AS median_slack_share
FROM invocations GROUP BY kernel_name ORDER BY kernel_name
"""
_SHARES = "SELECT kernel_name, stage, kind, share, dur_ns FROM critical_shares"
_BLOCKERS = f"""
WITH ranked AS (
    SELECT *,
        sum(total_wait_ns) OVER (PARTITION BY kernel_name, consumer_stage) AS stage_wait_ns,
        row_number() OVER (
            PARTITION BY kernel_name, consumer_stage
            ORDER BY total_wait_ns DESC, producer_stage NULLS LAST, producer_core NULLS LAST
        ) AS place
    FROM blockers
)
SELECT kernel_name, consumer_stage, producer_stage, producer_core, waits, total_wait_ns,
       wait_share
FROM ranked WHERE place <= {TOP_BLOCKERS}
ORDER BY kernel_name, stage_wait_ns DESC, consumer_stage NULLS LAST, place
"""
_IMBALANCE = """
SELECT kernel_name, core, count(*) AS invocations, avg(imbalance) AS mean_imbalance,
       max(imbalance) AS max_imbalance, count(*) FILTER (WHERE imbalanced) AS flagged
FROM core_imbalance GROUP BY kernel_name, core ORDER BY kernel_name, core
"""
_WHAT_IF = """
SELECT $change AS change, count(*) AS invocations,
       count(*) FILTER (WHERE faithful) AS faithful,
       median(observed_makespan_ns) AS median_observed_ns,
       median(predicted_makespan_ns) AS median_predicted_ns, median(ratio) AS median_ratio
FROM predicted
"""
_CURVES = """
SELECT stage, speedup, count(ratio) AS invocations, median(ratio) AS median_ratio
FROM curves GROUP BY stage, speedup ORDER BY stage, speedup
"""


@dataclass(frozen=True)
class AnalysisReport:
    """What ``mcprof analyze`` shows: ``analysis`` (``analyze``), one ``what_if`` table per
    change, named by its text, in the order given, and the ``speedup_curves`` table (None
    where no selected invocation can be replayed: ``analysis.limits`` says why)."""

    analysis: KernelAnalysis
    what_ifs: tuple[tuple[str, pa.Table], ...]
    curves: pa.Table | None


def _query(sql: str, params: dict[str, Any] | None = None, **tables: pa.Table) -> pa.Table:
    """``sql`` over the Arrow ``tables``, registered by name."""
    with arrow_cursor() as con:
        for name, table in tables.items():
            con.register(name, table)
        return con.sql(sql, params=params).to_arrow_table()


def speedup_medians(curves: pa.Table) -> pa.Table:
    """Per stage and speed-up of a ``speedup_curves`` table: how many invocations have a
    prediction (the faithful ones) and the median of their ``ratio`` (predicted /
    observed makespan)."""
    return _query(_CURVES, curves=curves)


def summary_tables(report: AnalysisReport) -> dict[str, pa.Table]:
    """The summary's tables by name: ``makespan`` (with the static bound and slack),
    ``critical_shares``, ``blockers`` (the top producers per consumer stage),
    ``imbalance`` (per kernel and core type), ``what_if`` (one row per change, where
    changes were given), ``speedup_curves`` (per stage and speed-up) and
    ``clock_correction`` (the cores a clock correction moved, where one was applied)."""
    analysis = report.analysis
    invocations = analysis.invocations
    makespan = _MAKESPAN_FEW if invocations.num_rows <= FEW_INVOCATIONS else _MAKESPAN_MANY
    tables = {
        "makespan": _query(makespan, invocations=invocations),
        "critical_shares": _query(_SHARES, critical_shares=analysis.critical_shares),
        "blockers": _query(_BLOCKERS, blockers=analysis.blockers),
        "imbalance": _query(_IMBALANCE, core_imbalance=analysis.core_imbalance),
    }
    if report.what_ifs:
        tables["what_if"] = pa.concat_tables(
            _query(_WHAT_IF, {"change": change}, predicted=table)
            for change, table in report.what_ifs
        )
    if report.curves is not None:
        tables["speedup_curves"] = speedup_medians(report.curves)
    if analysis.clock_correction is not None:
        tables["clock_correction"] = analysis.clock_correction
    return tables


def _invocation(row: dict[str, Any]) -> str:
    return f"run {row['run_id']} rank {row['rank']} invocation {row['invocation_id']}"


def _named(rows: Sequence[dict[str, Any]], detail: Callable[[dict[str, Any]], str]) -> str:
    """The first ``NAMED`` invocations of ``rows`` with their detail, and how many more."""
    named = "; ".join(f"{_invocation(row)} ({detail(row)})" for row in rows[:NAMED])
    return named + (f" and {len(rows) - NAMED} more" if len(rows) > NAMED else "")


def _not_tiling(invocations: pa.Table) -> list[dict[str, Any]]:
    return [row for row in invocations.to_pylist() if row["path_tiles"] is False]


def _unfaithful(invocations: pa.Table) -> list[dict[str, Any]]:
    return [row for row in invocations.to_pylist() if row["faithful"] is False]


def check_lines(analysis: KernelAnalysis) -> list[str]:
    """The tiling check and the replay's fidelity in words: a line each, and a flag line
    naming the invocations whose replay is not faithful (they get no prediction)."""
    invocations = analysis.invocations.filter(pc.is_valid(analysis.invocations["path_tiles"]))
    total = invocations.num_rows
    broken = _not_tiling(invocations)
    if broken:
        detail = _named(
            broken, lambda r: f"path {r['critical_path_ns']} ns, makespan {r['makespan_ns']} ns"
        )
        tiling = (
            f"critical path: does not tile the makespan of {len(broken)} of {total} "
            f"invocation(s): {detail}"
        )
    else:
        tiling = f"critical path: tiles the makespan of every invocation ({total} of {total})"
    # Invocations the replay cannot take get none (analyze's notes say why).
    replayed = invocations.filter(pc.is_valid(invocations["fidelity_error"]))
    errors = [e for e in replayed.column("fidelity_error").to_pylist() if e is not None]
    worst = max(errors, default=0.0)
    fidelity = (
        f"replay fidelity: max error {worst:.2%} over {replayed.num_rows} invocation(s) "
        f"(limit {FIDELITY_LIMIT:.0%})"
        if replayed.num_rows
        else "replay: no invocation could be replayed (the notes say why)"
    )
    lines = [
        tiling,
        fidelity,
    ]
    unfaithful = _unfaithful(replayed)
    if unfaithful:
        lines.append(
            f"FLAG: the replay is not faithful for {len(unfaithful)} of {replayed.num_rows} "
            "invocation(s), which get no prediction: "
            + _named(unfaithful, lambda r: f"error {r['fidelity_error']:.2%}")
        )
    for row in analysis.limits.to_pylist():
        producer = "" if row["producer"] is None else f"{row['producer']}, "
        lines.append(
            printable(
                f"NOTE: run {row['run_id']}, {row['kernel_name']} ({producer}"
                f"{row['invocations']} invocation(s)): {row['note']}"
            )
        )
    if analysis.clock_correction is not None:
        lines.append(correction_line(analysis.clock_correction))
    return lines


def correction_line(moved: pa.Table) -> str:
    """What a clock correction did, in words: how many cores of how many invocations it
    moved (the ``clock_correction`` table says by how much)."""
    if moved.num_rows == 0:
        return (
            "NOTE: clock correction applied: no causal edge was contradicted, so no core's "
            "clock was moved"
        )
    invocations = len(set(zip(*(moved[c].to_pylist() for c in _INVOCATION), strict=True)))
    return (
        f"NOTE: clock correction applied: {moved.num_rows} core(s) of {invocations} "
        "invocation(s) moved by the offsets the records' causality asks for (see the clock "
        "correction table); every time above reads the corrected cycles"
    )


_INVOCATION = ("run_id", "rank", "invocation_id")


_TITLES = {
    "makespan": "makespan, static bound and slack",
    "critical_shares": "critical path over the selection (share of the total makespan)",
    "blockers": f"top blockers (up to {TOP_BLOCKERS} producers per consumer stage)",
    "imbalance": "imbalance per core type (busy = compute + trigger + control)",
    "what_if": "what-if (median over the invocations)",
    "speedup_curves": "speed-up curves (median predicted / observed makespan)",
    "clock_correction": "clock correction (offset added to each moved core's cycles; low/high: "
    "the interval causality allows)",
}


def _heading(report: AnalysisReport) -> str:
    """The summary's first line, its names escaped for a terminal (``printable``)."""
    invocations = report.analysis.invocations
    kernels = sorted(set(invocations.column("kernel_name").to_pylist()))
    return printable(
        f"mcprof analyze: {report.analysis.described}: {invocations.num_rows} invocation(s) "
        f"of {', '.join(kernels)}"
    )


def _cell(name: str, value: Any) -> str:
    """A value as the summary shows it: ns as us (three decimals: to the ns), shares, imbalances and
    errors as percentages, ratios with four decimals, booleans as yes/no, text escaped for a
    terminal (``printable``)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        if name.endswith("_ns"):
            return f"{float(value) / 1e3:.3f}"
        if "share" in name or "imbalance" in name or "error" in name:
            return f"{float(value):.1%}"
        if "ratio" in name:
            return f"{float(value):.4f}"
    return printable(str(value))


def _header(name: str) -> str:
    """A column's name as the summary shows it: ``_ns`` columns in us."""
    if name.endswith("_ns"):
        return name.removesuffix("_ns") + "_us"
    return name


def displayed(name: str, table: pa.Table) -> tuple[list[str], list[list[str]]]:
    """A summary table's header and cells as shown, names escaped for a terminal
    (``printable``); the speed-up curves one row per stage, a column per speed-up."""
    if name == "speedup_curves":
        rows = table.to_pylist()
        speedups = sorted({row["speedup"] for row in rows})
        ratios = {(row["stage"], row["speedup"]): row["median_ratio"] for row in rows}
        stages = list(dict.fromkeys(row["stage"] for row in rows))
        header = ["stage", *(f"{s:.0%} faster" for s in speedups)]
        cells = [
            [printable(stage), *(_cell("ratio", ratios.get((stage, s))) for s in speedups)]
            for stage in stages
        ]
        return header, cells
    names = table.column_names
    cells = [[_cell(n, row[n]) for n in names] for row in table.to_pylist()]
    return [_header(n) for n in names], cells


def text_table(header: list[str], cells: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell; text left-aligned, numbers right-aligned."""

    def numeric(column: int) -> bool:
        values = [row[column] for row in cells if row[column]]
        return bool(values) and all(
            v.lstrip("-").rstrip("%").replace(".", "").isdigit() for v in values
        )

    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    right = [numeric(i) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(
            (cell.rjust(w) if r else cell.ljust(w))
            for cell, w, r in zip(row, widths, right, strict=True)
        ).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(row) for row in cells)]


def analysis_table(report: AnalysisReport) -> str:
    """The summary as a terminal shows it: a heading, the checks, and each summary table
    under its title."""
    lines = [_heading(report), *check_lines(report.analysis)]
    for name, table in summary_tables(report).items():
        header, cells = displayed(name, table)
        lines += ["", f"{_TITLES[name]}:", *(text_table(header, cells) if cells else ["(none)"])]
    return "\n".join(lines) + "\n"


def analysis_markdown(report: AnalysisReport) -> str:
    """The summary in Markdown (for a pull-request comment): the heading in bold, the
    checks as a list, each summary table under its title."""
    lines = [f"**{_heading(report)}**", "", *(f"- {line}" for line in check_lines(report.analysis))]
    for name, table in summary_tables(report).items():
        header, cells = displayed(name, table)
        lines += ["", f"### {_TITLES[name]}", ""]
        if not cells:
            lines.append("(none)")
            continue
        lines += markdown_table(header, cells)
    return "\n".join(lines) + "\n"


def tables_csv(tables: dict[str, pa.Table]) -> str:
    """Tables as CSV, with their values as computed (ns, fractions): each after a
    ``# <name>`` line, separated by an empty line."""
    out = io.StringIO()
    for index, (name, table) in enumerate(tables.items()):
        if index:
            out.write("\n")
        out.write(f"# {name}\n")
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(table.column_names)
        for row in table.to_pylist():
            writer.writerow(["" if v is None else v for v in row.values()])
    return out.getvalue()


def analysis_csv(report: AnalysisReport) -> str:
    """The summary tables as CSV (``tables_csv``)."""
    return tables_csv(summary_tables(report))


def analysis_json(report: AnalysisReport) -> bytes:
    """Every table, all rows, as an indented JSON document ending in a newline: the
    selection, the checks (``tiles``, ``not_tiling``, ``max_fidelity_error``,
    ``unfaithful``), the ``summary`` tables, every table of the analysis (``tables``),
    each change's per-invocation predictions (``what_if``) and every row of the
    speed-up curves (``speedup_curves``); numbers as computed."""
    analysis = report.analysis
    invocations = analysis.invocations
    errors = [e for e in invocations.column("fidelity_error").to_pylist() if e is not None]
    document = {
        "selection": analysis.described,
        "invocations": invocations.num_rows,
        "tiles": not _not_tiling(invocations),
        "not_tiling": _not_tiling(invocations),
        "max_fidelity_error": max(errors, default=0.0),
        "fidelity_limit": FIDELITY_LIMIT,
        "unfaithful": _unfaithful(invocations),
        "summary": {name: t.to_pylist() for name, t in summary_tables(report).items()},
        "tables": {name: t.to_pylist() for name, t in analysis.tables().items()},
        "what_if": [
            {"change": change, "invocations": table.to_pylist()}
            for change, table in report.what_ifs
        ],
        "speedup_curves": None if report.curves is None else report.curves.to_pylist(),
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"


RENDERERS: dict[str, Callable[[AnalysisReport], str | bytes]] = {
    "table": analysis_table,
    "markdown": analysis_markdown,
    "csv": analysis_csv,
    "json": analysis_json,
}
"""Each ``mcprof analyze --format`` and what renders it."""
