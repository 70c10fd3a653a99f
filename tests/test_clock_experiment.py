"""The knob's experiment: the CPU reference kernel recorded with known clock skews, and what
the clock checks recover of them.

The reference kernel's workers read one host clock, so a run without the knob contradicts
nothing: every core keeps offset 0 and the check passes. With a core's clock set ahead or
behind by more than a whole launch lasts (hundreds of ms against a few), its waits and
triggers contradict causality in every launch, the check fails and names it, and each
skewed core's offset interval (relative to the reference core, AIC/0, whose clock is
right) holds minus its skew, while every other core's holds 0. Corrected, the records
contradict nothing. A skew of hundreds of us would not do: on a loaded machine a waiter
busy or preempted for longer than the skew leaves a launch without a contradiction.
(A wrong frequency, ``clock_scale``: tests/test_clock_frequency.py.)
"""

from __future__ import annotations

from moe_layer import moe_layer

from multicore_profiler import mega_kernel_profile
from multicore_profiler.abi import CoreType
from multicore_profiler.analysis.clock_offsets import correct_clocks
from multicore_profiler.kernels.reference import ReferenceMoeKernel
from multicore_profiler.storage.store import Store

SKEWS = {(CoreType.AIV, 1): 400_000_000, (CoreType.AIC, 1): -300_000_000}
"""ns each core's clock is set ahead (behind, negative) of the host clock: 0.4 s and 0.3 s."""
LAUNCHES = 3


def capture(store: Store, skews: dict[tuple[CoreType, int], int]) -> str:
    """``LAUNCHES`` recorded launches, one a step, with these skews; the run id."""
    layer = moe_layer(tokens=128)
    with (
        ReferenceMoeKernel(layer.w1, layer.w2, clock_skew_ns=skews) as kernel,
        mega_kernel_profile(store=store) as prof,
    ):
        for _ in range(LAUNCHES):
            kernel(*layer.batch)
            prof.step()
    assert prof.run_id is not None
    return prof.run_id


def test_a_run_on_one_clock_reports_no_skew(store: Store) -> None:
    run_id = capture(store, {})
    report = store.check([run_id], clocks=True)
    assert report.ok, report.problems
    (row,) = report.clocks.to_pylist()
    assert (row["invocations"], row["cores"], row["contradicted_edges"]) == (LAUNCHES, 12, 0)
    assert (row["largest_offset_ns"], row["moved_cores"]) == (0.0, 0)
    verdicts = store.sql("SELECT DISTINCT verdict FROM clock_sanity", runs=[run_id])
    assert verdicts["verdict"].to_pylist() == ["ok"]


def test_every_injected_skew_lies_in_the_interval_the_estimate_reports(store: Store) -> None:
    run_id = capture(store, SKEWS)
    report = store.check([run_id], clocks=True)
    # The contradicted edges, and maybe the frequency: the skewed cores stretch their
    # invocations' spans on the counter and shift their gaps, which the host's launch times
    # may then contradict (the frequency check takes every core for the device's counter).
    causal, *others = sorted(report.problems, key=lambda p: "causal edge" not in p.reason)
    assert causal.path == f"run {run_id}"
    assert f"causal edge(s) in {LAUNCHES} invocation(s) contradict causality" in causal.reason
    assert all(p.reason.startswith("rank 0 device 0: ") for p in others), others
    offsets = store.sql(
        "SELECT invocation_id, core_type, block_id, offset_ns, low_ns, high_ns, constrained "
        "FROM clock_offsets ORDER BY ALL",
        runs=[run_id],
    ).to_pylist()
    assert len(offsets) == LAUNCHES * 4
    for row in offsets:
        truth = -SKEWS.get((CoreType(row["core_type"]), row["block_id"]), 0)
        assert row["constrained"], row
        assert row["low_ns"] is None or row["low_ns"] <= truth, row
        assert row["high_ns"] is None or truth <= row["high_ns"], row
        assert row["low_ns"] is not None or row["high_ns"] is not None, row
        # Each skewed core moves the way its skew asks, or not at all: AIV/1, ahead, back;
        # AIC/1, behind, forward (the two share the 700 ms between them as the other
        # cores' edges allow, so neither lands on its skew exactly).
        assert row["offset_ns"] * truth >= 0, row
    moved = correct_clocks(store, [run_id])
    back = [r for r in moved.to_pylist() if (r["core"], r["block_id"]) == ("AIV", 1)]
    assert len(back) == LAUNCHES

    assert store.sql("SELECT count(*) AS n FROM clock_violations", runs=[run_id]).to_pylist() == [
        {"n": 0}
    ]
