"""``mcprof analyze``: where a selection's kernel time goes (makespan, critical path,
blockers, imbalance, the replay's fidelity) and what faster stages would buy."""

from __future__ import annotations

import argparse
import sys

from multicore_profiler.analysis.analyze import analyze
from multicore_profiler.analysis.changes import Change, parse_change
from multicore_profiler.analysis.critical_path import DEFAULT_TOLERANCE_CYCLES
from multicore_profiler.analysis.selection import RecordSelection
from multicore_profiler.cli.arguments import (
    Parents,
    add_clock_correction,
    add_clock_tolerance,
    add_record_selection,
    configure_clock_tolerance,
    in_range,
    open_given_store,
    path,
    selection_arguments,
    text,
)
from multicore_profiler.cli.output import write_rendered
from multicore_profiler.errors import ArgumentError, ProfileError
from multicore_profiler.export.analysis_text import RENDERERS, AnalysisReport
from multicore_profiler.limits import INT64, Range
from multicore_profiler.storage.store import Store

TOLERANCE = Range("a tolerance in cycles", 0, INT64.high)
"""``analyze --tolerance``: the critical path walk's tolerance, a whole number of cycles."""


def change(value: str) -> Change:
    """An argparse ``type`` reading a what-if change (``GMM1*0.8``, ``AIC+200us``): text
    that is not one is a usage error saying why."""
    try:
        return parse_change(text(value))
    except ArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _selection(store: Store, args: argparse.Namespace) -> RecordSelection:
    """The records the selection options pick: ``--select``'s runs, else ``--run``."""
    given = selection_arguments(args)
    if args.select is not None:
        given["run"] = tuple(store.select_runs(args.select))
    return RecordSelection(**given)


def cmd_analyze(args: argparse.Namespace) -> None:
    """Print (or write) the analysis of the selected invocations, with the what-if table of
    each ``--what-if`` and the speed-up curves; draw the curves with ``--plot``."""
    if args.format == "table" and args.output is not None:
        raise ProfileError("--format table prints to the terminal; pick csv, json or markdown")
    store = open_given_store(args)
    if args.tolerance is not None:
        store.configure("critical_path_tolerance", args.tolerance)
    configure_clock_tolerance(store, args)
    analysis = analyze(store, _selection(store, args), clock_correction=args.clock_correction)
    report = AnalysisReport(
        analysis=analysis,
        what_ifs=tuple((c.text, analysis.what_if([c])) for c in args.what_if),
        curves=None if analysis.graph is None else analysis.speedup_curves(),
    )
    if args.plot is not None and report.curves is not None:
        from multicore_profiler.export.analysis_plot import plot_speedup_curves  # matplotlib

        print(f"mcprof: picture: {plot_speedup_curves(report.curves, args.plot)}", file=sys.stderr)
    write_rendered(RENDERERS[args.format](report), args.output)


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``analyze`` to ``commands``."""
    parser = commands.add_parser(
        "analyze",
        parents=[parents.store],
        description="Analyse the invocations of a run (default: the latest) or of the runs a "
        "selector picks, narrowed to a step, invocation, rank, window or SQL condition: the "
        "makespan, static bound and slack, the critical path's shares and its tiling check, "
        "the top blockers per consumer stage, imbalance per core type, the what-if replay's "
        "fidelity, a prediction per --what-if and the speed-up curve of every stage. See "
        "docs/analysis.md.",
    )
    runs = parser.add_mutually_exclusive_group()
    add_record_selection(parser, one_run_among=runs)
    runs.add_argument(
        "--select",
        metavar="SELECTOR",
        help="the runs a selector picks, e.g. label:nightly,latest:3 (instead of --run)",
    )
    parser.add_argument(
        "--what-if",
        type=change,
        action="append",
        default=[],
        metavar="CHANGE",
        help="predict the makespan with this change (repeatable; each alone), e.g. "
        "'GMM1*0.8', 'AIC+200us', 'GMM1&owner=0-3*0.5'",
    )
    parser.add_argument(
        "--format",
        choices=tuple(RENDERERS),
        default="table",
        help="output format (default: table)",
    )
    parser.add_argument("-o", "--output", type=path, help="write to this file")
    parser.add_argument(
        "--plot", type=path, metavar="IMAGE", help="draw the speed-up curves (e.g. curves.png)"
    )
    parser.add_argument(
        "--tolerance",
        type=in_range(TOLERANCE),
        metavar="CYCLES",
        help="critical path: the longest release latency (cycles) at which a wait is "
        f"crossed to its releasing trigger (default {DEFAULT_TOLERANCE_CYCLES})",
    )
    add_clock_correction(parser)
    add_clock_tolerance(parser, "which keeps an invocation out of the critical path and the replay")
    parser.set_defaults(func=cmd_analyze)
