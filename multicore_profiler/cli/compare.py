"""``mcprof compare`` (what changed between two sets of runs) and ``mcprof report`` (an HTML
page of runs)."""

from __future__ import annotations

import argparse
import sys

from multicore_profiler.analysis.compare import LEVELS
from multicore_profiler.cli.arguments import Parents, in_range, open_given_store, path
from multicore_profiler.cli.output import emit, warn
from multicore_profiler.errors import ProfileError
from multicore_profiler.export.compare_text import (
    comparison_json,
    comparison_markdown,
    comparison_table,
)
from multicore_profiler.limits import INVOCATION_ID, Range

THRESHOLD = Range("a relative change of the median", 0, 100, integer=False)
"""``compare --threshold``: 0 (any significant change) to 100 (a 100-fold change); at level
``critical`` a change of a share in points, below 1 (checked by ``compare``)."""
ALPHA = Range("a significance level", 1e-9, 0.5, integer=False)
"""``compare --alpha``: a p-value cut above 0.5 would call noise a change."""


def cmd_compare(args: argparse.Namespace) -> int:
    """Print or write the comparison; status 1 with ``--fail-on-regression`` when a group
    regressed."""
    store = open_given_store(args)
    comparison = store.compare(
        args.base,
        args.head,
        level=args.level,
        by=None if args.by is None else [column.strip() for column in args.by.split(",")],
        threshold=args.threshold,
        alpha=args.alpha,
    )
    warn(comparison.warnings)
    if args.plot is not None:
        from multicore_profiler.export.compare_plot import plot_comparison  # matplotlib

        print(f"mcprof: picture: {plot_comparison(comparison, args.plot)}", file=sys.stderr)
    if args.format in ("json", "markdown"):
        text = (
            comparison_json(comparison)
            if args.format == "json"
            else comparison_markdown(comparison).encode()
        )
        if args.output is None:
            sys.stdout.buffer.write(text)
        else:
            args.output.write_bytes(text)
    elif args.format == "csv":
        emit(comparison.rows, "csv", args.output, store)
    else:
        if args.output is not None:
            raise ProfileError("--format table prints to the terminal; pick csv, json or markdown")
        print(f"mcprof compare: {comparison.summary()}")
        emit(comparison_table(comparison), "table", None, store)
    return 1 if args.fail_on_regression and comparison.regressed else 0


def cmd_report(args: argparse.Namespace) -> None:
    """Write the HTML report of ``--run`` (against ``--base``) and say where."""
    from multicore_profiler.export.report import write_report

    written = write_report(
        open_given_store(args),
        args.run,
        args.output,
        base=args.base,
        invocation=args.invocation,
        traces=args.traces,
        job=args.job,
    )
    print(f"{written}: report of {args.run}" + (f" against {args.base}" if args.base else ""))


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``compare`` and ``report`` to ``commands``."""
    compare = commands.add_parser(
        "compare",
        parents=[parents.store],
        description="Compare the records of the base runs with those of the head runs, per "
        "group: medians, p90, the median's relative change with a bootstrap interval, a "
        "Mann-Whitney U p-value and a verdict (at --level critical: each stage's share of the "
        "makespan on the critical path, its change in points). Exit status: 1 with "
        "--fail-on-regression when a group regressed, 2 on a usage error, else 0.",
    )
    compare.add_argument("--base", required=True, metavar="SELECTOR", help="e.g. commit:3f2a")
    compare.add_argument("--head", required=True, metavar="SELECTOR", help="e.g. commit:9c1e")
    compare.add_argument(
        "--level",
        choices=sorted(LEVELS),
        default="records",
        help="records (default), invocations (wall time of each launch), kernels (of the "
        "outer traces in the store; the selectors then choose traces), critical (each "
        "invocation's share of its makespan on the critical path, per stage), or ranks (the "
        "slowest rank's share of each invocation of a multi-rank run: its time above the "
        "median rank's, in points)",
    )
    compare.add_argument(
        "--by",
        help="group columns (default: kernel_name,stage,phase for records, kernel_name for "
        "invocations, family for kernels, kernel_name,stage for critical (add kind there for "
        "compute, wait, trigger... apart), kernel_name for ranks)",
    )
    compare.add_argument(
        "--threshold",
        type=in_range(THRESHOLD),
        default=0.05,
        help="relative change of the median (0.05); at --level critical or ranks, change of the "
        "median share in points (0.05: 5 points)",
    )
    compare.add_argument(
        "--alpha", type=in_range(ALPHA), default=0.01, help="significance level (0.01)"
    )
    compare.add_argument("--format", choices=("table", "json", "markdown", "csv"), default="table")
    compare.add_argument("-o", "--output", type=path, help="write to this file")
    compare.add_argument(
        "--plot", type=path, metavar="IMAGE", help="draw each group's durations (e.g. out.png)"
    )
    compare.add_argument(
        "--fail-on-regression", action="store_true", help="exit with status 1 if a group regressed"
    )
    # Status 1 means "regressed": compare's errors are usage errors (2).
    compare.set_defaults(func=cmd_compare, error_status=2)

    report = commands.add_parser(
        "report",
        parents=[parents.store],
    )
    report.add_argument("--run", required=True, metavar="SELECTOR", help="e.g. commit:9c1e")
    report.add_argument("--base", metavar="SELECTOR", help="compare the runs against these")
    report.add_argument(
        "--invocation",
        type=in_range(INVOCATION_ID),
        help="the invocation to draw (default: the latest run's first)",
    )
    report.add_argument(
        "--traces",
        metavar="SELECTOR",
        help="also draw the step time breakdown of these outer traces (e.g. label:nightly)",
    )
    report.add_argument(
        "--job",
        metavar="JOB",
        help="also draw step x rank heatmaps of this job's step time and communication wait",
    )
    report.add_argument("-o", "--output", type=path, required=True, help="the page (.html)")
    report.set_defaults(func=cmd_report)
