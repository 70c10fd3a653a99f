"""The what-if replay against a real capture: 2 ms more per GMM1 task of the CPU reference
kernel, predicted from a baseline capture, then measured with the kernel's knob. The
signal (8 ms on each AIC worker's chain) is large against the host threads' jitter; the
baseline's median still moves by +-2 ms when both cores are busy (measured: errors of
4-26 % at load 6), hence the loose bound. bench/analyze.py reports the error at 200 us."""

from __future__ import annotations

from what_if_experiment import run_experiment

from multicore_profiler.storage.store import Store


def test_predicted_makespan_matches_the_measured_one(store: Store) -> None:
    result = run_experiment(store, extra_ns=2_000_000, launches=4, rounds=2)
    # Each AIC worker runs 4 of the 8 GMM1 tasks: the makespan grows by up to 4 x 2 ms
    # (less where the baseline's GMM1 chain had slack).
    assert 6_000_000 <= result.predicted_ns - result.baseline_ns <= 8_000_000
    assert result.error <= 0.35, result
