"""``mcprof fuse``: a MegaKernel's AIC/AIV tracks added to an outer torch.profiler or
torch_npu trace."""

from __future__ import annotations

import argparse
from typing import Any

from multicore_profiler.cli.arguments import (
    Parents,
    add_clock_correction,
    add_record_selection,
    in_range,
    path,
    selection_arguments,
    store_location,
    text,
)
from multicore_profiler.cli.output import say_clock_correction, warn
from multicore_profiler.errors import ArgumentError, FuseError
from multicore_profiler.fuse.align import check_kernel_pattern
from multicore_profiler.fuse.merge import merge_chrome_traces
from multicore_profiler.limits import COUNT, PID, RANK
from multicore_profiler.storage.store import default_store_path, open_store

SELECTION = ("run", "step", "window")
"""What selects the MegaKernel's records of a store for fusion."""


def cmd_fuse(args: argparse.Namespace) -> None:
    """Write the fused trace and say what was added where."""
    if args.trace is not None:
        store = open_store(args.store) if args.store is not None else None
        mega_kernel = args.trace
    else:
        store = open_store(args.store or default_store_path(), create=False)
        mega_kernel = store
    merged = merge_chrome_traces(
        args.torch_trace,
        mega_kernel,
        args.output,
        store=store,
        **selection_arguments(args, SELECTION),
        rank=args.rank,
        kernel_pattern=args.kernel_pattern,
        kernel_index=args.kernel_index,
        outer_pid=args.outer_pid,
        allow_host_alignment=args.allow_host_alignment,
        rebase_timestamps=args.rebase,
        clock_correction=args.clock_correction,
    )
    report = merged.report
    warn(report["warnings"])
    counts = report["counts"]
    first = report["invocations"][0]["outerKernel"]
    print(
        f"{merged.path}: {merged.records} records of {counts['invocations']} invocation(s) "
        f"({merged.added_events} events with threads and arrows) on {counts['addedThreads']} "
        f"new thread(s) of pid {first['pid']}, aligned to {_targets(report)}; outer trace "
        f"{report['outerTrace']['sourceId']}: {report['outerTrace']['events']} events kept"
    )
    if args.clock_correction:
        say_clock_correction(report["clockCorrection"], "megaKernelTraceMerge.clockCorrection")


def _targets(report: dict[str, Any]) -> str:
    """Each kernel's first outer kernel and its pattern (one for an explicit pattern)."""
    targets = []
    for kernel in report["kernels"]:
        first = next(
            i["outerKernel"]["name"]
            for i in report["invocations"]
            if kernel["kernelName"] in (None, i["kernelName"])
        )
        name = first if len(first) <= 60 else first[:57] + "..."
        targets.append(f"{name!r} (pattern {kernel['pattern']!r})")
    return " and ".join(targets)


def kernel_pattern(value: str) -> str:
    """An argparse ``type`` for ``--kernel-pattern``: text that selects outer kernels
    (``check_kernel_pattern``); one that matches every name, or no regular expression, is a
    usage error."""
    try:
        check_kernel_pattern(text(value))
    except (ArgumentError, FuseError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``fuse`` to ``commands`` (its ``--store`` is its own: optional with ``--trace``)."""
    fuse = commands.add_parser(
        "fuse",
        description="Align the MegaKernel invocations of a standalone trace (--trace) or of a "
        "run in the store (--run) to the outer trace's device kernels and write one fused trace.",
    )
    fuse.add_argument("torch_trace", type=path, metavar="TORCH_TRACE")
    source = fuse.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=path, help="a MegaKernel trace from mcprof export")
    add_record_selection(fuse, SELECTION, one_run_among=source, scope="with --run: ")
    fuse.add_argument(
        "--store",
        type=store_location,
        help="store (with --run, default $MCPROF_STORE or ./mcprof-store; with --trace the "
        "outer trace goes to a temporary store unless this is given)",
    )
    fuse.add_argument(
        "-o", "--output", type=path, required=True, help="fused trace (.json, or .json.gz)"
    )
    fuse.add_argument(
        "--rank", type=in_range(RANK), help="rank of the outer trace (default: its own)"
    )
    fuse.add_argument(
        "--kernel-pattern",
        type=kernel_pattern,
        help="regex of the outer kernel's name, for every invocation (default: each kernel's "
        "from its name)",
    )
    fuse.add_argument(
        "--kernel-index",
        type=in_range(COUNT),
        default=0,
        help="skip this many matching outer kernels of each kernel first (in the duration "
        "fallback: device kernels)",
    )
    fuse.add_argument("--outer-pid", type=in_range(PID), help="only align to kernels of this pid")
    fuse.add_argument(
        "--allow-host-alignment",
        action="store_true",
        help="align to host-side events (CPU ops) when no device kernel matches",
    )
    fuse.add_argument(
        "--rebase",
        action="store_true",
        help="shift every timestamp so the trace starts near 0 (exact in viewers that read "
        "ts as a double)",
    )
    add_clock_correction(fuse, scope="with --run: ")
    fuse.set_defaults(func=cmd_fuse)
