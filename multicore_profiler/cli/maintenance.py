"""``mcprof check`` (verify the store's files), ``mcprof compact`` (merge small files) and
``mcprof gc`` (remove whole runs)."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

import pyarrow as pa

from multicore_profiler.analysis.clock_check import summary as clock_summary
from multicore_profiler.cli.arguments import (
    Parents,
    add_clock_tolerance,
    configure_clock_tolerance,
    in_range,
    open_given_store,
)
from multicore_profiler.cli.output import emit, one_line
from multicore_profiler.limits import COUNT, DAYS, HOURS
from multicore_profiler.storage.vacuum import GRACE


def cmd_check(args: argparse.Namespace) -> int:
    """Print each problem of the store's files as ``<file>: <check>: <reason>`` (with
    ``--clocks``, each run's clock check first) and the summary on standard error; status
    1 when a check failed."""
    store = open_given_store(args)
    configure_clock_tolerance(store, args)
    report = store.check(args.run or None, clocks=args.clocks)
    if report.clocks is not None:
        for row in report.clocks.to_pylist():
            print(one_line(clock_summary(row)))
    for problem in report.problems:
        print(one_line(str(problem)))
    print(report.summary(), file=sys.stderr)
    return 0 if report.ok else 1


def cmd_compact(args: argparse.Namespace) -> None:
    """Compact the runs given (default: all) and print what was merged."""
    report = open_given_store(args).compact(args.run or None, grace=timedelta(hours=args.grace))
    print(
        f"compacted {report.runs} run(s): {report.files_before} files in {report.partitions} "
        f"partition(s) merged into {report.files_after} ({report.rows} rows)"
        + (
            f"; {report.uncommitted_files} uncommitted file(s) left alone"
            if report.uncommitted_files
            else ""
        )
        + (f"; {report.files_deleted} dead file(s) deleted" if report.files_deleted else "")
    )


def cmd_gc(args: argparse.Namespace) -> None:
    """Print the runs the retention rules remove (and remove them with ``--apply``)."""
    older = None if args.older_than is None else timedelta(days=args.older_than)
    store = open_given_store(args)
    plan = store.gc(keep_last=args.keep_last, older_than=older, labels=args.label, apply=args.apply)
    columns = ["run_id", "label", "commit", "status", "start_time", "updated_at", "files", "bytes"]
    if plan.runs:
        emit(pa.Table.from_pylist(plan.runs).select(columns), args.format, args.output, store)
    print(plan.summary(), file=sys.stderr)


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``check``, ``compact`` and ``gc`` to ``commands``."""
    check = commands.add_parser(
        "check",
        parents=[parents.store],
        description="Read every file of the store (or of some runs) with its page checksums "
        "verified; compare its schema with its table's and each invocation's record count with "
        "its records; list orphan and leftover files, symbolic links, and runs left running "
        "by a capture session whose job and writer are gone. With --clocks, also judge each "
        "run's records by their own causality (a wait cannot end before the trigger that "
        "released it), its frequency by the host's launch-to-synchronize times and its "
        "workers by their planned queues, printing one line per run. Print one line per "
        "problem, <file>: <check>: <reason> (a run's clock problems: run <id>: clocks: "
        "<reason>), and a summary on standard error. Exit status: 1 when a check failed, "
        "else 0. Nothing is changed.",
    )
    check.add_argument(
        "--run", action="append", default=[], help="check only this run (repeatable)"
    )
    check.add_argument(
        "--clocks",
        action="store_true",
        help="also check each run's clocks, frequency and schedule against its records' own "
        "causality and the host's launch times, and print one line per run (docs/clocks.md)",
    )
    add_clock_tolerance(check, "a problem of --clocks")
    check.set_defaults(func=cmd_check)

    compact = commands.add_parser(
        "compact",
        parents=[parents.store],
    )
    compact.add_argument(
        "--run", action="append", default=[], help="run to compact (repeatable; default: all)"
    )
    compact.add_argument(
        "--grace",
        type=in_range(HOURS),
        default=GRACE.total_seconds() / 3600,
        metavar="HOURS",
        help="keep files hidden for good this long for queries still reading them "
        f"(default: {GRACE.total_seconds() / 3600:g})",
    )
    compact.set_defaults(func=cmd_compact)

    gc = commands.add_parser(
        "gc",
        parents=[parents.store, parents.output],
    )
    gc.add_argument("--keep-last", type=in_range(COUNT), metavar="N", help="keep the N newest runs")
    gc.add_argument(
        "--older-than",
        type=in_range(DAYS),
        metavar="DAYS",
        help="remove runs last updated DAYS ago or more",
    )
    gc.add_argument(
        "--label", action="append", default=[], help="only runs of this label (repeatable)"
    )
    gc.add_argument("--apply", action="store_true", help="remove them (default: only list them)")
    gc.set_defaults(func=cmd_gc)
