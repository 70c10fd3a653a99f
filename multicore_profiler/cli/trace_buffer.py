"""``mcprof trace-buffer``: device profile buffers to a standalone trace in one command,
for a user with buffers and no store: ``ingest-buffer`` into a temporary store, then
``export`` of its run, in one process."""

from __future__ import annotations

import argparse

from multicore_profiler.cli.arguments import Parents
from multicore_profiler.cli.export import add_trace_options, write_trace
from multicore_profiler.cli.ingest import add_buffers, ingest_given_buffers
from multicore_profiler.export.timeline import RecordSelection
from multicore_profiler.scratch import ScratchDirectory
from multicore_profiler.storage.store import open_store


def cmd_trace_buffer(args: argparse.Namespace) -> None:
    """Decode the buffer files into a new store in a temporary directory, write the trace
    of its one run as ``export`` would, and remove the store."""
    with (
        ScratchDirectory("mcprof-trace-buffer-") as scratch,
        open_store(scratch / "store", create=True) as store,
    ):
        run_id = ingest_given_buffers(args, lambda: store, None, None).run_id
        write_trace(args, store, RecordSelection(run=run_id))


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``trace-buffer`` to ``commands``."""
    trace = commands.add_parser(
        "trace-buffer",
        description="Decode raw profile buffers dumped from a device and write their trace "
        "(Perfetto's protobuf for a .pftrace or .pftrace.gz file, Chrome Trace JSON "
        "otherwise), with no store: the trace 'mcprof ingest-buffer' then 'mcprof export' "
        "write, the buffers going through a temporary store removed afterwards.",
    )
    add_buffers(trace)
    add_trace_options(trace)
    trace.set_defaults(func=cmd_trace_buffer)
