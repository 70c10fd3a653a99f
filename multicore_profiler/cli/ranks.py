"""``mcprof ranks``: across the ranks of a job, step by step, who is slow, by how much,
where its extra time went, and how much of each rank's communication waited."""

from __future__ import annotations

import argparse

from multicore_profiler.analysis.cross_rank import cross_rank
from multicore_profiler.cli.arguments import Parents, in_range, open_given_store, path, text
from multicore_profiler.cli.output import warn, write_rendered
from multicore_profiler.errors import ProfileError
from multicore_profiler.export.cross_rank_text import RENDERERS
from multicore_profiler.limits import STEP


def cmd_ranks(args: argparse.Namespace) -> None:
    """Print (or write) the cross-rank tables of the jobs and runs asked for; warn of the
    ranks their inputs lack."""
    if args.format == "table" and args.output is not None:
        raise ProfileError("--format table prints to the terminal; pick csv, json or markdown")
    store = open_given_store(args)
    runs = list(args.run)
    if args.select is not None:
        runs += store.select_runs(args.select)
    report = cross_rank(
        store,
        jobs=args.job or None,
        runs=runs,
        steps=args.step or None,
    )
    warn(report.warnings)
    write_rendered(RENDERERS[args.format](report), args.output)


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``ranks`` to ``commands``."""
    parser = commands.add_parser(
        "ranks",
        parents=[parents.store],
        description="Compare the ranks of jobs step by step: each rank's step breakdown and "
        "each pipeline stage's (as msprof-analyze's cluster_step_trace_time), the slowest "
        "rank and where its extra time went against the median rank, each rank's "
        "communication time split into transfer and waiting for the last arrival, "
        "msprof-analyze's slow-rank votes and advisor rule, and the clock offset of each "
        "rank; for MegaKernel runs, each rank's kernel time per step and the stage that makes "
        "the slowest rank slow. Jobs are the outer traces loaded by one ingest-trace call or "
        "--job (default: every job of two ranks or more). See docs/cross-rank.md.",
    )
    parser.add_argument("--job", action="append", default=[], type=text, help="a job (repeatable)")
    parser.add_argument(
        "--run",
        action="append",
        default=[],
        type=text,
        help="a MegaKernel run whose ranks to compare (repeatable)",
    )
    parser.add_argument(
        "--select",
        metavar="SELECTOR",
        type=text,
        help="the MegaKernel runs a selector picks, e.g. label:nightly,latest:1",
    )
    parser.add_argument(
        "--step", action="append", type=in_range(STEP), help="only this step (repeatable)"
    )
    parser.add_argument("--format", choices=tuple(RENDERERS), default="table", help="output format")
    parser.add_argument("-o", "--output", type=path, help="write to this file")
    parser.set_defaults(func=cmd_ranks)
