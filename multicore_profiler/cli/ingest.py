"""``mcprof ingest-buffer`` (raw device profile buffers) and ``mcprof ingest-trace`` (outer
Chrome traces): files into the store."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from multicore_profiler.abi import GENERATIONS, BufferLayout
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
from multicore_profiler.ingest.buffers import IngestedStep, ingest_into_run
from multicore_profiler.ingest.decode import decode_buffers, read_buffer_file
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.limits import (
    DEVICE,
    FREQUENCY_MHZ,
    INVOCATION_ID,
    RANK,
    SLOTS,
    STEP,
)
from multicore_profiler.storage.partitions import check_run_id
from multicore_profiler.storage.store import Store


def cmd_ingest_buffer(args: argparse.Namespace) -> None:
    """Decode the buffer files as one step of ``--run`` (a new run unless it exists)."""
    run_id = check_run_id(args.run) if args.run else None
    step = ingest_given_buffers(
        args, lambda: open_given_store(args, create=True), run_id, args.label
    )
    decoded = step.decoded
    print(
        f"run {step.run_id}: {decoded.buffers} invocation(s) from id {step.first_invocation_id}, "
        f"{int(decoded.record_counts.sum())} records, {int(decoded.dropped_counts.sum())} dropped"
    )


def ingest_given_buffers(
    args: argparse.Namespace, store: Callable[[], Store], run_id: str | None, label: str | None
) -> IngestedStep:
    """Read and decode the buffer files ``add_buffers`` took (regular files only, in
    bounded time), then write them to the store ``store()`` opens, only then, as one step
    of the run ``run_id`` (a new run, labelled ``label``, unless it exists): buffers
    refused leave no store behind."""
    layout = BufferLayout(
        args.aic_slots, args.aiv_slots, args.aic_capacity, args.aiv_capacity, args.abi_generation
    )
    kernel = KernelInfo(
        kernel_name=args.kernel,
        owner_label=args.owner_label,
        stage_names=id_names(args.stage, "--stage", "desc id"),
        soc=args.soc,
    )
    frequency_hz = args.freq_mhz * 1e6
    decoded = decode_buffers(
        [read_buffer_file(file, layout) for file in args.files], layout, frequency_hz=frequency_hz
    )
    return ingest_into_run(
        store(),
        decoded,
        layout,
        frequency_hz=frequency_hz,
        run_id=run_id,
        label=label,
        kernel=kernel,
        launches=Launches(
            rank=args.rank,
            device=args.device,
            step=args.step,
            first_invocation_id=args.invocation,
            direction=args.direction,
        ),
    )


def cmd_ingest_trace(args: argparse.Namespace) -> None:
    """Load the traces and output folders as the ranks of one job; print each source's id,
    where it came from, its event count, rank and job, and whether it was new."""
    from multicore_profiler.ingest.jobs import ingest_job  # the trace readers: not for buffers

    store = open_given_store(args, create=True)
    tags = key_values(args.tag, "--tag")
    sources = ingest_job(
        store, args.files, job=args.job, rank=args.rank, label=args.label, tags=tags
    )
    for source in sources:
        state = "loaded" if source.new else "already in the store"
        rank = "" if source.rank is None else f", rank {source.rank}"
        what = (
            "no trace: the profiler's tables"
            if source.form == "outputs"
            else (f"{source.events} events")
        )
        print(f"{source.source_id}  {source.path}: {what}{rank}, job {source.job_id} ({state})")


def add_buffers(parser: argparse.ArgumentParser) -> None:
    """Add the buffer files, their layout and frequency, and what names and numbers their
    launches (kernel, stages, rank, device, step, invocation), as ``ingest_given_buffers``
    reads them: ``ingest-buffer`` and ``trace-buffer`` take the same."""
    parser.add_argument(
        "files",
        nargs="+",
        type=path,
        metavar="FILE",
        help="one buffer per file, one invocation each",
    )
    for name in ("aic-slots", "aiv-slots", "aic-capacity", "aiv-capacity"):
        parser.add_argument(f"--{name}", type=in_range(SLOTS), required=True)
    parser.add_argument(
        "--abi-generation",
        choices=tuple(GENERATIONS),
        help="the hyper-parallel ABI generation that wrote the buffers: a (at most 256 records "
        "a slot) or b (up to 134217712); default: b where a capacity is above 256 or a "
        "record's desc id is a graph stage 0x30000..0x3FFFF, else a",
    )
    parser.add_argument(
        "--freq-mhz",
        type=in_range(FREQUENCY_MHZ),
        required=True,
        help="cycle counter frequency in MHz",
    )
    parser.add_argument("--rank", type=in_range(RANK), default=0)
    parser.add_argument("--device", type=in_range(DEVICE), default=0)
    parser.add_argument("--step", type=in_range(STEP), default=0)
    parser.add_argument("--kernel", default="MegaKernel", help="kernel name (default: MegaKernel)")
    parser.add_argument(
        "--invocation",
        type=in_range(INVOCATION_ID),
        help="id of the first invocation (default: next free one)",
    )
    parser.add_argument("--direction", default="forward")
    parser.add_argument("--soc", help="SoC name, e.g. Ascend910B4")
    parser.add_argument("--owner-label", default="Owner")
    parser.add_argument(
        "--stage",
        action="append",
        default=[],
        type=named_id("a stage", "DESC_ID=NAME (e.g. 0x30001=GMM1)"),
        metavar="DESC_ID=NAME",
        help="name a stage id (repeatable)",
    )


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``ingest-buffer`` and ``ingest-trace`` to ``commands``."""
    buffers = commands.add_parser(
        "ingest-buffer",
        parents=[parents.store],
    )
    add_buffers(buffers)
    buffers.add_argument("--run", help="add to this run (created if new; default: a new run)")
    buffers.add_argument("--label", help="label of a new run")
    buffers.set_defaults(func=cmd_ingest_buffer)

    traces = commands.add_parser(
        "ingest-trace",
        parents=[parents.store],
        description="Stream Chrome traces (.json or .json.gz) into the store's trace_events and "
        "trace_sources; print each source's id. A folder is torch_npu's output (a *_ascend_pt "
        "folder, or a folder holding one per rank): its trace_view.json, its rank "
        "(profiler_info_N.json), the job's parallel groups (profiler_metadata.json) and "
        "msprof's own step_trace_time.csv and communication.json. Everything one call loads "
        "is one job (see --job). A file already there is not loaded again.",
    )
    traces.add_argument("files", nargs="+", type=path, metavar="FILE|FOLDER")
    traces.add_argument(
        "--job",
        type=text,
        metavar="NAME",
        help="the job these are ranks of (default: one named by their contents; a single "
        "trace file is a job of its own)",
    )
    traces.add_argument(
        "--rank", type=in_range(RANK), help="the traces' rank (default: their distributedInfo.rank)"
    )
    traces.add_argument("--label", help="a label for the traces")
    traces.add_argument(
        "--tag", action="append", default=[], metavar="KEY=VALUE", help="a tag (repeatable)"
    )
    traces.set_defaults(func=cmd_ingest_trace)
