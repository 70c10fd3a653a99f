"""``mcprof import``: other MegaKernel profilers' files (Proton, FlashInfer, MPK,
Triton-distributed, HazyResearch, simpler) into the store, as one run."""

from __future__ import annotations

import argparse

from multicore_profiler.cli.arguments import (
    Parents,
    id_names,
    in_range,
    key_values,
    named_id,
    open_given_store,
    path,
    text,
)
from multicore_profiler.ingest.imports import FORMATS, import_profile
from multicore_profiler.limits import FREQUENCY_MHZ, RANK
from multicore_profiler.storage.partitions import check_run_id


def cmd_import(args: argparse.Namespace) -> None:
    """Import the files as one run; print its id and what it holds."""
    frequency_hz = None if args.freq_mhz is None else args.freq_mhz * 1e6
    imported = import_profile(
        open_given_store(args, create=True),
        args.files,
        format=args.format,
        run_id=check_run_id(args.run) if args.run else None,
        label=args.label,
        tags=key_values(args.tag, "--tag"),
        kernel_name=args.kernel,
        frequency_hz=frequency_hz,
        names=id_names(args.name, "--name", "id"),
        rank=args.rank,
        dependencies=args.deps,
    )
    ids = imported.invocation_ids
    print(
        f"run {imported.run_id}: {len(ids)} invocation(s) from id {ids.start}, "
        f"{imported.records} records"
    )


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``import`` to ``commands``."""
    parser = commands.add_parser(
        "import",
        parents=[parents.store],
        description="Import the files another intra-kernel profiler wrote as one run of the "
        "store: each launch an invocation, each span a record with its raw times and ids, so "
        "that analyze, compare, report, export and fuse work on it. See docs/import.md for "
        "each format: how to obtain the file, what maps where, what is lost.",
    )
    parser.add_argument("files", nargs="+", type=path, metavar="FILE")
    parser.add_argument("--format", required=True, choices=tuple(FORMATS), help="the producer")
    parser.add_argument("--kernel", type=text, help="the kernel's name (default: the file's)")
    parser.add_argument(
        "--freq-mhz",
        type=in_range(FREQUENCY_MHZ),
        help="the cycle counter's frequency, for producers that count cycles (see docs/import.md)",
    )
    parser.add_argument(
        "--name",
        action="append",
        default=[],
        type=named_id("a name", "ID=NAME (e.g. 3=attention)"),
        metavar="ID=NAME",
        help="name a stage by the producer's id: a Proton scope, a FlashInfer event, an opcode "
        "(repeatable)",
    )
    parser.add_argument("--rank", type=in_range(RANK), help="the rank, where the file says none")
    parser.add_argument("--deps", type=path, help="simpler: the run's deps.json (its task graph)")
    parser.add_argument("--run", help="add to this run (created if new; default: a new run)")
    parser.add_argument("--label", help="label of a new run")
    parser.add_argument(
        "--tag", action="append", default=[], metavar="KEY=VALUE", help="a tag (repeatable)"
    )
    parser.set_defaults(func=cmd_import)
