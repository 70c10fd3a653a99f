"""``mcprof demo``: the CPU reference MegaKernel profiled into the store, with a torch trace
of the same steps, fused."""

from __future__ import annotations

import argparse
from pathlib import Path

from multicore_profiler.cli.arguments import Parents, in_range, open_given_store
from multicore_profiler.cli.output import emit
from multicore_profiler.errors import FuseError
from multicore_profiler.fuse.merge import merge_chrome_traces
from multicore_profiler.ingest.schedule import schedule
from multicore_profiler.limits import COUNT, Range
from multicore_profiler.progress import progress

DEMO_STEPS = Range("a step count", 3, COUNT.high)
"""``demo --steps``: the schedule records from step 2 on, so fewer record nothing."""
LAUNCHES = Range("a launch count", 1, COUNT.high)
SEED = Range("a seed", 0, 2**64 - 1)
"""``demo --seed``: what ``torch.Generator.manual_seed`` takes."""
DEMO_SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}


def cmd_demo(args: argparse.Namespace) -> None:
    """Run the CPU reference MoE MegaKernel under both profilers; summarize its stages in SQL."""
    # torch only here: the other commands read and write stores and traces without it.
    import torch
    import torch.profiler

    from multicore_profiler.ingest.session import mega_kernel_profile
    from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route

    store = open_given_store(args, create=True)
    generator = torch.Generator().manual_seed(args.seed)
    router, w1, w2 = make_moe_weights(8, 256, 512, generator=generator)
    # Beside a local store; in the working directory for a remote one.
    name = store.uri.rstrip("/").rsplit("/", 1)[-1]
    parent = store.root.parent if store.location.is_local else Path.cwd()
    torch_trace = parent / f"{name}-torch"
    torch_trace.mkdir(exist_ok=True)
    trace_path = torch_trace / "pending.pt.trace.json"
    with (
        ReferenceMoeKernel(w1, w2, tiles_per_expert=2, token_tile=64) as kernel,
        # The same schedule as the MegaKernel's: each torch trace covers one capture window.
        torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(**DEMO_SCHEDULE),
            on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path)),
        ) as outer,
        mega_kernel_profile(
            store=store,
            schedule=schedule(**DEMO_SCHEDULE),
            label="demo",
            tags={"kernel": "ReferenceMegaMoe", "tokens": "256"},
        ) as prof,
    ):
        for _ in progress(range(args.steps), desc="demo", unit="step"):
            for _ in range(args.launches):
                x = torch.randn(256, 256, generator=generator)
                kernel(x, *route(x, router, 2))
            prof.step()
            outer.step()
    window = prof.windows[-1].index
    trace_path = trace_path.rename(torch_trace / f"{prof.run_id}.window{window}.pt.trace.json")
    summary = store.sql(
        """SELECT stage, records,
                  round(compute_p50_us, 1) AS p50_compute_us,
                  round(compute_p99_us, 1) AS p99_compute_us,
                  round(wait_p50_us, 1) AS p50_wait_us,
                  round(wait_p99_us, 1) AS p99_wait_us,
                  dropped
           FROM stage_stats WHERE run_id = $1 ORDER BY stage_desc_id""",
        [prof.run_id],
    )
    totals = store.sql("SELECT * FROM run_summary WHERE run_id = $1", [prof.run_id]).to_pylist()
    print(
        f"run {prof.run_id} in {store.uri}: {totals[0]['invocations']} invocations in "
        f"{len(prof.windows)} window(s) of {schedule(**DEMO_SCHEDULE)}, "
        f"{totals[0]['records']} records, {totals[0]['dropped']} dropped"
    )
    emit(summary, "table", None, store)
    print(f"torch.profiler trace of window {window}: {trace_path}")
    fused = torch_trace / f"{prof.run_id}.window{window}.fused.json"
    selection = {"store": store, "run": prof.run_id, "window": window}
    try:
        merge_chrome_traces(trace_path, store, fused, **selection)
    except FuseError as exc:
        # The CPU kernel has no device event: only host-side ops carry its name.
        print(f"fuse: refused without --allow-host-alignment: {exc}")
    merged = merge_chrome_traces(trace_path, store, fused, allow_host_alignment=True, **selection)
    for warning in merged.report["warnings"]:
        print(f"fuse: with --allow-host-alignment, warning: {warning}")
    print(
        f"fused trace of window {window}: {merged.path} ({merged.records} records, "
        f"{merged.added_events} events added)"
    )
    print(f'try: mcprof query --store {store.uri} "SELECT * FROM stage_stats"')
    print(f"     mcprof analyze --store {store.uri} --what-if 'GMM1*0.8'  # where the time goes")
    print(f"     mcprof export --store {store.uri} -o {prof.run_id}.json  # for ui.perfetto.dev")
    print(
        f"     mcprof fuse {trace_path} --store {store.uri} --run {prof.run_id} "
        f"--window {window} --allow-host-alignment -o {prof.run_id}.fused.json"
    )


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``demo`` to ``commands``."""
    demo = commands.add_parser(
        "demo",
        parents=[parents.store],
    )
    demo.add_argument(
        "--steps", type=in_range(DEMO_STEPS), default=10, help="steps to run (default 10)"
    )
    demo.add_argument(
        "--launches",
        type=in_range(LAUNCHES),
        default=2,
        help="kernel launches per step (default 2)",
    )
    demo.add_argument("--seed", type=in_range(SEED), default=0)
    demo.set_defaults(func=cmd_demo)
