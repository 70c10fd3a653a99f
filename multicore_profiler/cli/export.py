"""``mcprof export``: the Chrome Trace of records of the store."""

from __future__ import annotations

import argparse

from multicore_profiler.cli.arguments import (
    Parents,
    add_record_selection,
    open_given_store,
    path,
    record_selection,
)
from multicore_profiler.cli.output import warn
from multicore_profiler.export.chrome_trace import export_chrome_trace


def cmd_export(args: argparse.Namespace) -> None:
    """Write the trace of the records selected and say what it holds."""
    store = open_given_store(args)
    trace = export_chrome_trace(
        store,
        args.output,
        selection=record_selection(args),
        detailed_task_names=args.detailed,
        critical_path=args.critical_path,
    )
    warn(trace.metadata["warnings"])
    critical = (
        f", {trace.metadata['criticalRecordCount']} critical records, "
        f"{trace.critical_flows} critical path flows"
        if args.critical_path
        else ""
    )
    print(
        f"{trace.path}: {trace.events} events ({trace.records} records of "
        f"{trace.metadata['invocationCount']} invocation(s), {trace.flows} dependency arrows"
        f"{critical}) from {trace.metadata['selection']}"
    )


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``export`` to ``commands``."""
    export = commands.add_parser(
        "export",
        parents=[parents.store],
        help="write a Chrome Trace (Perfetto, chrome://tracing) of records in the store",
        description="Write the Chrome Trace of a run (default: the latest), narrowed to a step, "
        "invocation, rank, window or SQL condition, or of the rows of any query.",
    )
    export.add_argument(
        "-o", "--output", type=path, required=True, help="trace file (.json, or .json.gz)"
    )
    add_record_selection(export)
    export.add_argument(
        "--detailed", action="store_true", help="name events <owner><id>_<stage>_task<n>"
    )
    export.add_argument(
        "--critical-path",
        action="store_true",
        help="mark each record on its invocation's critical path (args.critical = 1) and chain "
        "them in path order with flow events of category critical_path",
    )
    export.set_defaults(func=cmd_export)
