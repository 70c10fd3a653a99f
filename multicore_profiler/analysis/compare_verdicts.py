"""The verdicts of a run comparison: the rule (threshold and significance level) and each
group's verdict under it.

A group is ``regressed`` (``improved``) when its median grew (shrank) by more than the
threshold and the Mann-Whitney p-value is below alpha; else ``unchanged``. A group found
on one side only is ``new`` or ``gone``. The threshold is a relative change for durations
(0.05: 5%) and an absolute one for shares (0.05: 5 percentage points): a larger share of
the makespan on the critical path is a regression, the stage bounds the kernel more.
"""

from __future__ import annotations

from multicore_profiler.analysis.compare_statistics import Difference
from multicore_profiler.errors import SelectorError

VERDICTS = ("regressed", "improved", "unchanged", "new", "gone")


def check_rule(threshold: float, alpha: float, unit: str = "ns") -> None:
    """``SelectorError`` unless alpha is in (0, 1) and the threshold is not negative (and,
    for shares, below 1: no share changes by more)."""
    if not 0 < alpha < 1 or threshold < 0:
        raise SelectorError(f"alpha must be in (0, 1) and threshold >= 0, got {alpha}, {threshold}")
    if unit == "share" and threshold >= 1:
        raise SelectorError(
            f"a share changes by less than 1 (100 points); threshold {threshold} is never met"
        )


def rule_text(threshold: float, alpha: float, unit: str = "ns") -> str:
    """The rule in words: "change of the median above 5%, Mann-Whitney p < 0.01", or for
    shares "change of the median share above 5 points, Mann-Whitney p < 0.01"."""
    if unit == "share":
        return (
            f"change of the median share above {threshold * 100:g} points, "
            f"Mann-Whitney p < {alpha:g}"
        )
    return f"change of the median above {threshold:.0%}, Mann-Whitney p < {alpha:g}"


def verdict(difference: Difference, *, threshold: float, alpha: float) -> str:
    """The verdict of a group found on both sides, from its base-against-head difference."""
    change = difference.change
    significant = change is not None and difference.p_value < alpha
    if significant and change > threshold:
        return "regressed"
    if significant and change < -threshold:
        return "improved"
    return "unchanged"


def one_sided(in_base: bool) -> str:
    """The verdict of a group found on one side only: ``gone`` (base) or ``new`` (head)."""
    return "gone" if in_base else "new"
