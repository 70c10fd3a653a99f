"""Capture overhead: the CPU reference MegaKernel with and without a capture session.

Three modes run the same job (a MoE layer forward, 512 tokens, hidden 256, 8 experts,
top-2, on 2 AIC + 2 AIV worker threads, torch limited to one intra-op thread):

(a) no profiler: the baseline;
(b) a session whose schedule never records (``wait`` longer than the job): every launch
    passes through ``prepare_call`` and runs the kernel's fast loop;
(c) a session recording every step: profiled loop, buffers drained at each step and
    written to a temporary store by the background writer.

The time compared is that of the job's steps (launches and ``prof.step()``) inside an
open session, as in a long job; a session's start and end (run row, git revision,
writer thread, final flush) happen once per job and are reported apart. The modes are
interleaved in a rotating order, ``--repeat`` times, and the ratios are of the medians.
Goals: b/a <= 1.01, c/a <= 1.10.

Two step sizes are measured: 2 launches a step (a one-layer toy: the writer's fixed
cost per step weighs most) and 16 (a step of a 16-layer model). On this machine the
kernel itself runs on the CPU the writer needs, so the writer's CPU time per step is
printed too: on a device it runs while the host would otherwise wait.

    .venv/bin/python bench/overhead.py [--steps 20] [--repeat 9]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from multicore_profiler import Store, mega_kernel_profile, open_store, schedule
from multicore_profiler.kernels import prepare_call
from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route

TOKENS, HIDDEN, INTER, EXPERTS, TOP_K = 512, 256, 512, 8, 2
Session = Callable[[], contextlib.AbstractContextManager]


def job(
    kernel: ReferenceMoeKernel,
    batches: list[tuple[torch.Tensor, ...]],
    steps: int,
    session: Session,
) -> tuple[float, float, float]:
    """Seconds the job's steps take inside ``session()``, seconds its start and end take,
    and the writer's CPU seconds."""
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
    writer = prof.writer_stats.cpu_seconds if prof is not None else 0.0
    return done - entered, (entered - began) + (ended - done), writer


def measure(
    kernel: ReferenceMoeKernel,
    store: Store,
    launches: int,
    steps: int,
    repeat: int,
    generator: torch.Generator,
    router: torch.Tensor,
) -> None:
    """Run the three modes interleaved and print their medians and ratios."""
    batches = []
    for _ in range(launches):
        x = torch.randn(TOKENS, HIDDEN, generator=generator)
        batches.append((x, *route(x, router, TOP_K)))
    modes: dict[str, Session] = {
        "a: no profiler": lambda: contextlib.nullcontext(None),
        "b: inactive session": lambda: mega_kernel_profile(
            store=store, schedule=schedule(wait=10**9, warmup=0, active=1)
        ),
        "c: recording session": lambda: mega_kernel_profile(store=store),
    }
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in modes}
    for session in modes.values():  # warm up threads, allocator and store
        job(kernel, batches, 2, session)
    names = list(modes)
    for rep in range(repeat):
        for name in names[rep % 3 :] + names[: rep % 3]:
            runs[name].append(job(kernel, batches, steps, modes[name]))

    median = {name: statistics.median(r[0] for r in rs) for name, rs in runs.items()}
    print(f"\n{launches} launches a step, {steps} steps, {repeat} interleaved repetitions:")
    for name, seconds in median.items():
        edge = statistics.median(r[1] for r in runs[name])
        print(
            f"  {name:22s} {seconds * 1e3:8.1f} ms  "
            f"({seconds / (steps * launches) * 1e3:.2f} ms/launch; start + end {edge * 1e3:.1f} ms)"
        )
    writer = statistics.median(r[2] for r in runs["c: recording session"]) / steps
    base = median["a: no profiler"]
    quartiles = statistics.quantiles([r[0] for r in runs["a: no profiler"]], n=4)
    print(f"  noise: a's interquartile range is {(quartiles[2] - quartiles[0]) / base:.1%} of a")
    print(f"  writer CPU per step: {writer * 1e3:.1f} ms ({writer * steps / base:.1%} of a)")
    print(f"  b/a = {median['b: inactive session'] / base:.3f}  (goal <= 1.01)")
    print(f"  c/a = {median['c: recording session'] / base:.3f}  (goal <= 1.10)")


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
    args = parser.parse_args()
    # The kernel's worker threads are its parallelism (as cores are on a device); torch's own
    # intra-op threads on top of them only add scheduling noise on a small machine.
    torch.set_num_threads(1)

    generator = torch.Generator().manual_seed(0)
    router, w1, w2 = make_moe_weights(EXPERTS, HIDDEN, INTER, generator=generator)
    with (
        tempfile.TemporaryDirectory(prefix="mcprof-bench-") as scratch,
        open_store(Path(scratch) / "store") as store,
        ReferenceMoeKernel(w1, w2, tiles_per_expert=2, token_tile=64) as kernel,
    ):
        measure(kernel, store, 2, args.steps, args.repeat, generator, router)
        measure(kernel, store, 16, max(1, args.steps // 8), args.repeat, generator, router)
        hook_cost(kernel, store)


if __name__ == "__main__":
    main()
