"""The what-if replay against a real experiment on the CPU reference kernel.

Capture a baseline, predict what ``extra_ns`` more per task of one stage does to the
makespan (``<stage>+<extra_ns>ns``), capture again with the kernel's ``extra_compute_ns``
knob adding exactly that busy time, and compare the medians over the invocations. The two
are captured in alternating rounds, so that both see the same machine: the host threads'
makespans drift by a third between one minute and the next on a busy machine. Used by
tests/test_what_if_experiment.py and bench/analyze.py.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from multicore_profiler import mega_kernel_profile, what_if
from multicore_profiler.analysis.selection import RecordSelection
from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route
from multicore_profiler.storage.store import Store

TOKENS, HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 128, 64, 128, 4, 2
WARMUP_LAUNCHES = 2
WORKERS = {"aic_workers": 2, "aiv_workers": 2}


@dataclass(frozen=True)
class Experiment:
    """Median makespans (ns) over the invocations: observed without the knob, predicted
    by the what-if, measured with the knob; and the prediction's relative error."""

    baseline_ns: float
    predicted_ns: float
    measured_ns: float

    @property
    def error(self) -> float:
        return abs(self.predicted_ns - self.measured_ns) / self.measured_ns


def _capture(
    store: Store,
    kernel: ReferenceMoeKernel,
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    launches: int,
    label: str,
) -> str:
    """``launches`` recorded launches of ``kernel``, one a step, after unrecorded warm-up
    launches; return the run id."""
    for _ in range(WARMUP_LAUNCHES):
        kernel(*batch)
    with mega_kernel_profile(store=store, label=label) as prof:
        for _ in range(launches):
            kernel(*batch)
            prof.step()
    assert prof.run_id is not None
    return prof.run_id


def _median_makespan(store: Store, runs: list[str]) -> float:
    rows = store.sql(
        "SELECT DISTINCT run_id, invocation_id, makespan_ns FROM core_breakdown", runs=runs
    ).column("makespan_ns")
    return float(statistics.median(rows.to_pylist()))


def run_experiment(
    store: Store,
    *,
    stage: str = "GMM1",
    extra_ns: int = 200_000,
    launches: int = 8,
    rounds: int = 2,
) -> Experiment:
    """The experiment above, on a 2 AIC + 2 AIV worker reference kernel: ``rounds`` rounds
    of ``launches`` recorded launches without the knob, then as many with it."""
    router, w1, w2 = make_moe_weights(
        EXPERTS, HIDDEN, INTERMEDIATE, generator=torch.Generator().manual_seed(0)
    )
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    batch = (x, *route(x, router, TOP_K))
    change = f"{stage}+{extra_ns}ns"
    baseline, slowed = [], []
    with (
        ReferenceMoeKernel(w1, w2, token_tile=32, **WORKERS) as plain,
        ReferenceMoeKernel(
            w1, w2, token_tile=32, extra_compute_ns={stage: extra_ns}, **WORKERS
        ) as padded,
    ):
        for _ in range(rounds):
            baseline.append(_capture(store, plain, batch, launches, "baseline"))
            slowed.append(_capture(store, padded, batch, launches, change))
    predicted = what_if(store, RecordSelection(run=tuple(baseline)), [change])
    return Experiment(
        baseline_ns=_median_makespan(store, baseline),
        predicted_ns=float(
            statistics.median(predicted.column("predicted_makespan_ns").to_pylist())
        ),
        measured_ns=_median_makespan(store, slowed),
    )
