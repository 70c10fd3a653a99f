"""The statistics of a run comparison: each group's base sample against its head sample.

Per side: count, median and p90 (linear interpolation, as DuckDB's ``quantile_cont``).
Between the sides: the change of the median with a percentile bootstrap interval, relative
(head / base - 1) for durations and absolute (head - base, in points of a share) for
shares, a two-sided Mann-Whitney U p-value (scipy, imported on first use: it takes a
second, which only comparisons pay), and what is added per unit (time, or share).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BOOTSTRAP_SAMPLES = 5000
"""Each side's sample is bootstrapped from at most this many values (a random subset):
the interval's width then no longer depends on how many records a group has."""


@dataclass(frozen=True)
class Described:
    """One side's sample in a group, summarized (``None`` where the side has none)."""

    count: int
    median: float | None
    p90: float | None


def describe(sample: np.ndarray | None) -> Described:
    """Count, median and p90 of a sample, or of a side that has none."""
    if sample is None:
        return Described(0, None, None)
    return Described(int(sample.size), float(np.median(sample)), float(np.quantile(sample, 0.9)))


@dataclass(frozen=True)
class Difference:
    """Base against head in one group: the change of the median with its interval (a
    relative change is ``None`` when the base median is 0), and the Mann-Whitney p-value."""

    change: float | None
    change_low: float | None
    change_high: float | None
    p_value: float


def bootstrap(
    base: np.ndarray,
    head: np.ndarray,
    level: float,
    resamples: int,
    rng: np.random.Generator,
    *,
    relative: bool = True,
) -> tuple[float, float]:
    """A percentile bootstrap interval of median(head) / median(base) - 1 (``relative``)
    or of median(head) - median(base)."""
    medians = []
    for sample in (base, head):
        if sample.size > BOOTSTRAP_SAMPLES:
            sample = rng.choice(sample, BOOTSTRAP_SAMPLES, replace=False)
        draws = rng.integers(0, sample.size, (resamples, sample.size))
        medians.append(np.median(sample[draws], axis=1))
    change = medians[1] / medians[0] - 1 if relative else medians[1] - medians[0]
    tail = (1 - level) / 2
    low, high = np.quantile(change, [tail, 1 - tail])
    return float(low), float(high)


def difference(
    base: np.ndarray,
    head: np.ndarray,
    alpha: float,
    resamples: int,
    rng: np.random.Generator,
    *,
    relative: bool = True,
) -> Difference:
    """Test head against base: the change of the median, relative or absolute, with its
    interval at level 1 - alpha, drawn from ``rng``."""
    from scipy.stats import mannwhitneyu

    p_value = float(mannwhitneyu(head, base).pvalue)
    base_median, head_median = np.median(base), np.median(head)
    if not relative:
        low, high = bootstrap(base, head, 1 - alpha, resamples, rng, relative=False)
        return Difference(float(head_median - base_median), low, high, p_value)
    # A relative change needs a base above zero (waits that did not wait have none).
    if not base_median > 0:
        return Difference(None, None, None, p_value)
    low, high = bootstrap(base, head, 1 - alpha, resamples, rng)
    return Difference(float(head_median / base_median - 1), low, high, p_value)


def impact(base: np.ndarray | None, head: np.ndarray | None, units: dict[bool, int]) -> float:
    """What is added per unit (invocation or trace; ``units`` by side, ``True``: head): the
    median's change for each head sample; for a group on one side only, all of it."""
    if head is None:
        return -float(np.median(base)) * base.size / units[False]
    if base is None:
        return float(np.median(head)) * head.size / units[True]
    return float(np.median(head) - np.median(base)) * head.size / units[True]
