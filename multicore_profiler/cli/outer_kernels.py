"""``mcprof kernels``: per step of outer (torch.profiler / kineto, torch_npu) traces, the
time of each outer-kernel family."""

from __future__ import annotations

import argparse
import sys

from multicore_profiler.analysis.outer_kernel_steps import check_steps, family_times_by_step
from multicore_profiler.cli.arguments import Parents, in_range, open_given_store, outer_kernel_rules
from multicore_profiler.cli.output import emit
from multicore_profiler.ingest.outer_trace import resolve_trace
from multicore_profiler.limits import RANK


def cmd_kernels(args: argparse.Namespace) -> None:
    """Print, per step of each trace, its GPU period, busy share and each family's union
    time in ms, the families by total time, largest first."""
    store = open_given_store(args, create=True)
    store.use_kernel_rules(outer_kernel_rules(args))
    sources: list[str] = []
    for item in args.traces:
        source = resolve_trace(store, item, rank=args.rank, label=args.label)
        if source.new:
            loaded = f"{source.source_id}  {source.path}: {source.events} events loaded"
            print(loaded, file=sys.stderr)
        sources.append(source.source_id)
    sources = list(dict.fromkeys(sources))  # a trace named twice is shown once
    for source_id in sources:
        check_steps(store, source_id)
    emit(family_times_by_step(store, sources), args.format, args.output, store)


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``kernels`` to ``commands``."""
    kernels = commands.add_parser(
        "kernels",
        parents=[parents.store, parents.output, parents.rules],
        description="Load trace files into the store (or name traces already there by source "
        "id) and print, per step, its GPU period, busy share and each kernel family's union "
        "(wall) time in ms.",
    )
    kernels.add_argument("traces", nargs="+", metavar="TRACE_OR_SOURCE")
    kernels.add_argument("--rank", type=in_range(RANK), help="rank of newly loaded traces")
    kernels.add_argument("--label", help="label of newly loaded traces")
    kernels.set_defaults(func=cmd_kernels)
