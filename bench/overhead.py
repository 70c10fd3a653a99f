"""Capture overhead: the CPU reference MegaKernel with and without a capture session.

Four modes run the same job (a MoE layer forward, 512 tokens, hidden 256, top-2, torch
limited to one intra-op thread):

(a) no profiler: the baseline;
(b) a session whose schedule never records (``wait`` longer than the job): every launch
    passes through ``prepare_call`` and runs the kernel's fast loop;
(c) a session recording every step with the writer in its own process (the default):
    the job's thread copies each step's buffers to shared memory and hands them over;
(d) the same with ``writer="thread"``: decode, Arrow and Parquet in a thread of the job,
    sharing its GIL (the design (c) replaced, measured here against it);
(e) (c) with ``group_steps=1``: a cores and a records file per step, as before the writer
    wrote a group of steps' rows in one file per table (``GROUP_STEPS`` of them).

The time compared is that of the job's steps (launches and ``prof.step()``) inside an
open session, as in a long job; a session's start and end (run row, git revision,
writer start, final flush) happen once per job and are reported apart. The modes are
interleaved in a rotating order, ``--repeat`` times; each ratio is printed as the
median over repetitions of that repetition's ratio, with their range.

Each recording mode also reports what the session measured of itself and stores in the
run's row: the job thread's time per recorded step (goal <= 0.5 ms) and the writer's CPU
per recorded step (goal <= 2 ms for the 2-launch step).

Three steps are measured: 2 launches of a small MoE (8 experts: 384 records a step, the
writer's fixed cost per step weighs most), 16 launches of it (a 16-layer model), and 2
launches of a MoE of hyper-parallel's size (2 x 1,418 records a step; its two-rank MoE
writes 1,411 per rank and invocation). On this 2-core machine the kernel's worker threads
and the writer share the CPUs, so the writer's CPU shows in (c) too; on a device the
kernel runs on the device and the host is idle while it waits.

The store is a temporary directory of the system's (``--scratch`` to measure another
file system: most of the fixed cost of a file per step (e) is creating 2 directories
and 2 files, which costs ten times more on this machine's ext4 than on tmpfs; (c) pays
it once per group of steps). The last line of each step size is the writer's CPU per
step of (c) over (e), per repetition.

    .venv/bin/python bench/overhead.py [--steps 20] [--repeat 9] [--scratch /dev/shm]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from multicore_profiler import Store, mega_kernel_profile, open_store, schedule
from multicore_profiler.kernels import prepare_call
from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route
from multicore_profiler.storage.runs import CaptureCost

TOKENS, HIDDEN, INTER, TOP_K = 512, 256, 512, 2
Session = Callable[[], contextlib.AbstractContextManager]


@dataclass(frozen=True)
class Kernel:
    """A reference MoE's shape: experts, tiles per expert, token tile, AIC and AIV workers."""

    name: str
    experts: int
    tiles: int
    token_tile: int
    workers: int

    def build(self, generator: torch.Generator) -> tuple[ReferenceMoeKernel, torch.Tensor]:
        router, w1, w2 = make_moe_weights(self.experts, HIDDEN, INTER, generator=generator)
        kernel = ReferenceMoeKernel(
            w1,
            w2,
            tiles_per_expert=self.tiles,
            token_tile=self.token_tile,
            aic_workers=self.workers,
            aiv_workers=self.workers,
        )
        return kernel, router


SMALL = Kernel("small MoE", experts=8, tiles=2, token_tile=64, workers=2)
HYPER_PARALLEL = Kernel("hyper-parallel-sized MoE", experts=14, tiles=9, token_tile=32, workers=4)


@dataclass(frozen=True)
class Run:
    steps_seconds: float
    edge_seconds: float
    cost: CaptureCost | None


def job(
    kernel: ReferenceMoeKernel,
    batches: list[tuple[torch.Tensor, ...]],
    steps: int,
    session: Session,
) -> Run:
    """The job's steps inside ``session()``: their seconds, the session's start and end,
    and the cost the session measured of itself."""
    began = time.perf_counter()
    with session() as prof:
        entered = time.perf_counter()
        for _ in range(steps):
            for batch in batches:
                kernel(*batch)
            if prof is not None:
                prof.step()
        done = time.perf_counter()
    ended = time.perf_counter()
    cost = prof.capture_cost if prof is not None and prof.capture_cost.steps else None
    return Run(done - entered, (entered - began) + (ended - done), cost)


def spread(values: list[float]) -> str:
    """Median [min-max] of per-repetition values."""
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def measure(
    kernel: ReferenceMoeKernel,
    router: torch.Tensor,
    store: Store,
    launches: int,
    steps: int,
    repeat: int,
    generator: torch.Generator,
    goal: float,
) -> None:
    """Run the four modes interleaved and print medians, ratios and the recorded cost."""
    batches = []
    for _ in range(launches):
        x = torch.randn(TOKENS, HIDDEN, generator=generator)
        batches.append((x, *route(x, router, TOP_K)))
    modes: dict[str, Session] = {
        "a: no profiler": lambda: contextlib.nullcontext(None),
        "b: inactive session": lambda: mega_kernel_profile(
            store=store, schedule=schedule(wait=10**9, warmup=0, active=1)
        ),
        "c: recording, writer process": lambda: mega_kernel_profile(store=store),
        "d: recording, writer thread": lambda: mega_kernel_profile(store=store, writer="thread"),
        "e: (c), a file per step": lambda: mega_kernel_profile(store=store, group_steps=1),
    }
    runs: dict[str, list[Run]] = {name: [] for name in modes}
    for session in modes.values():  # warm up threads, allocator and store
        job(kernel, batches, 2, session)
    names = list(modes)
    for rep in range(repeat):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(job(kernel, batches, steps, modes[name]))

    tasks = kernel.config_for(TOKENS).tasks
    per_launch = int((1 + (tasks["wait_event"] >= 0) + (tasks["trigger_event"] >= 0)).sum())
    print(
        f"\n{launches} launches x {per_launch:,} records a step, {steps} steps, "
        f"{repeat} interleaved repetitions:"
    )
    base = [r.steps_seconds for r in runs["a: no profiler"]]
    for name, rs in runs.items():
        seconds = statistics.median(r.steps_seconds for r in rs)
        edge = statistics.median(r.edge_seconds for r in rs)
        print(
            f"  {name:30s} {seconds * 1e3:8.1f} ms  ({seconds / (steps * launches) * 1e3:.2f} "
            f"ms/launch; start + end {edge * 1e3:.1f} ms)"
        )
    quartiles = statistics.quantiles(base, n=4)
    print(f"  noise: a's interquartile range is {(quartiles[2] - quartiles[0]) / min(base):.1%}")
    for name in names[1:]:
        ratios = [r.steps_seconds / a for r, a in zip(runs[name], base, strict=True)]
        target = 1.01 if name.startswith("b") else goal
        print(f"  {name[0]}/a = {spread(ratios)}  (goal <= {target})")
    for name in names[2:]:
        costs = [r.cost for r in runs[name] if r.cost is not None]
        job_ms = [c.job_seconds / c.steps * 1e3 for c in costs]
        writer_ms = [c.writer_cpu_seconds / c.steps * 1e3 for c in costs]
        print(
            f"  {name[0]}: job thread per recorded step {spread(job_ms)} ms (goal <= 0.5); "
            f"writer CPU per step {spread(writer_ms)} ms (goal <= 2)"
        )
    pairs = zip(runs["c: recording, writer process"], runs["e: (c), a file per step"], strict=True)
    ratios = [
        (c.cost.writer_cpu_seconds / c.cost.steps) / (e.cost.writer_cpu_seconds / e.cost.steps)
        for c, e in pairs
        if c.cost is not None and e.cost is not None
    ]
    print(f"  writer CPU per step, c/e (groups / a file per step) = {spread(ratios)}")


def hook_cost(kernel: ReferenceMoeKernel, store: Store, calls: int = 20000) -> None:
    """What (b) adds to a launch, measured directly: ``prepare_call`` + ``complete``
    without a session and inside one whose schedule never records."""
    config = kernel.config_for(TOKENS)

    def per_call() -> float:
        began = time.perf_counter()
        for _ in range(calls):
            with prepare_call(config):
                pass
        return (time.perf_counter() - began) / calls

    plain = min(per_call() for _ in range(5))
    with mega_kernel_profile(store=store, schedule=schedule(wait=10**9, warmup=0, active=1)):
        inactive = min(per_call() for _ in range(5))
    print(
        f"\nlaunch hook: {plain * 1e6:.2f} us without a session, {inactive * 1e6:.2f} us in an "
        f"inactive one: (b) adds {(inactive - plain) * 1e6:.2f} us a launch"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--scratch", type=Path, default=None, help="where the store is made")
    args = parser.parse_args()
    # The kernel's worker threads are its parallelism (as cores are on a device); torch's own
    # intra-op threads on top of them only add scheduling noise on a small machine.
    torch.set_num_threads(1)

    generator = torch.Generator().manual_seed(0)
    with (
        tempfile.TemporaryDirectory(prefix="mcprof-bench-", dir=args.scratch) as scratch,
        open_store(Path(scratch) / "store") as store,
    ):
        small, router = SMALL.build(generator)
        with small:
            measure(small, router, store, 2, args.steps, args.repeat, generator, 1.08)
            steps = max(1, args.steps // 8)
            measure(small, router, store, 16, steps, args.repeat, generator, 1.05)
            hook_cost(small, store)
        large, router = HYPER_PARALLEL.build(generator)
        with large:
            steps = max(2, args.steps // 4)
            measure(large, router, store, 2, steps, args.repeat, generator, 1.08)


if __name__ == "__main__":
    main()
