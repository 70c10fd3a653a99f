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
        store, args.output, selection=record_selection(args), detailed_task_names=args.detailed
    )
    warn(trace.metadata["warnings"])
    print(
        f"{trace.path}: {trace.events} events ({trace.records} records of "
        f"{trace.metadata['invocationCount']} invocation(s), {trace.flows} dependency arrows) "
        f"from {trace.metadata['selection']}"
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
    export.set_defaults(func=cmd_export)
