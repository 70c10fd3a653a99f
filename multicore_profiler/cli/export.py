"""``mcprof export``: the trace (Chrome JSON or Perfetto protobuf) of records of the store."""

from __future__ import annotations

import argparse

from multicore_profiler.cli.arguments import (
    Parents,
    add_clock_correction,
    add_record_selection,
    open_given_store,
    path,
    record_selection,
)
from multicore_profiler.cli.output import say_clock_correction, warn
from multicore_profiler.export.files import ExportedTrace
from multicore_profiler.export.perfetto_trace import sidecar_path
from multicore_profiler.export.timeline import RecordSelection
from multicore_profiler.export.trace_formats import TRACE_FORMATS, export_trace, trace_format
from multicore_profiler.storage.store import Store


def cmd_export(args: argparse.Namespace) -> None:
    """Write the trace of the records selected and say what it holds."""
    write_trace(args, open_given_store(args), record_selection(args))


def write_trace(args: argparse.Namespace, store: Store, selection: RecordSelection) -> None:
    """Write the trace of ``selection`` with the options ``add_trace_options`` took, and
    say what it holds: its events, records, invocations and arrows, and where from."""
    chosen = trace_format(args.output, args.format)
    trace = export_trace(
        store,
        args.output,
        selection,
        format=chosen,
        detailed_task_names=args.detailed,
        critical_path=args.critical_path,
        clock_correction=args.clock_correction,
    )
    say_trace(args, chosen, trace)


def say_trace(args: argparse.Namespace, chosen: str, trace: ExportedTrace) -> None:
    """Print what a written trace holds (and its warnings, its sidecar, its clock
    correction)."""
    warn(trace.metadata["warnings"])
    critical = (
        f", {trace.metadata['criticalRecordCount']} critical records, "
        f"{trace.critical_flows} critical path flows"
        if args.critical_path
        else ""
    )
    events = "events" if chosen == "json" else "track events"
    print(
        f"{trace.path}: {trace.events} {events} ({trace.records} records of "
        f"{trace.metadata['invocationCount']} invocation(s), {trace.flows} dependency arrows"
        f"{critical}) from {trace.metadata['selection']}"
    )
    if chosen == "perfetto":
        print(f"{sidecar_path(trace.path)}: the trace's megaKernelCycleTrace metadata")
    if args.clock_correction:
        say_clock_correction(
            trace.metadata["clockCorrection"], "megaKernelCycleTrace.clockCorrection"
        )


def add_trace_options(parser: argparse.ArgumentParser) -> None:
    """Add the trace's file, format, names, critical path and clock correction, as
    ``write_trace`` reads them: ``export`` and ``trace-buffer`` take the same."""
    parser.add_argument(
        "-o",
        "--output",
        type=path,
        required=True,
        help="trace file: .pftrace or .pftrace.gz (Perfetto), .json or .json.gz (Chrome JSON)",
    )
    parser.add_argument(
        "--format",
        choices=sorted(TRACE_FORMATS),
        help="the trace's format, whatever the file's suffix says",
    )
    parser.add_argument(
        "--detailed", action="store_true", help="name events <owner><id>_<stage>_task<n>"
    )
    parser.add_argument(
        "--critical-path",
        action="store_true",
        help="mark each record on its invocation's critical path (args.critical = 1) and chain "
        "them in path order with flows (JSON: of category critical_path)",
    )
    add_clock_correction(parser)


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``export`` to ``commands``."""
    export = commands.add_parser(
        "export",
        parents=[parents.store],
        description="Write the trace of a run (default: the latest), narrowed to a step, "
        "invocation, rank, window or SQL condition, or of the rows of any query: Perfetto's "
        "protobuf for a .pftrace or .pftrace.gz file, Chrome Trace JSON otherwise.",
    )
    add_trace_options(export)
    add_record_selection(export)
    export.set_defaults(func=cmd_export)
