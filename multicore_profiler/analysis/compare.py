"""Compare two sets of runs, group by group, with statistics: what got slower between commits.

For each group (default: kernel, stage and phase) the records' durations of the base runs
and of the head runs are two samples. A group is ``regressed`` (``improved``) when its
median grew (shrank) by more than the threshold (default 5%) and a two-sided
Mann-Whitney U test gives p below alpha (default 0.01); else ``unchanged``. A group found
on one side only is ``new`` or ``gone``. The relative change of the median comes with a
bootstrap confidence interval at level 1 - alpha. Durations are the store's ``dur_ns``:
cycles converted with each invocation's own frequency.

At level ``critical`` a sample is the share of one invocation's makespan that a group
(default: kernel and stage) holds on the invocation's critical path; its change is in
points (head median - base median), and a share that grew by more than the threshold
(default 0.05: 5 points), significantly, is ``regressed``. At level ``ranks`` a sample is
the slowest rank's share of one aligned invocation of a multi-rank run (its makespan above
the median rank's, over its makespan), compared in points too. Their rows name their values
``*_share`` where the other levels' are ``*_ns`` (``result_columns``).

``compare`` composes three pieces: ``compare_samples`` (what a sample is at each level, and
which samples each group of each side has, read from the store), ``compare_statistics``
(medians, bootstrap interval, Mann-Whitney test, time added) and ``compare_verdicts`` (the
rule and the verdicts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from multicore_profiler.analysis.compare_samples import (
    LEVELS,
    METRICS,
    Level,
    comparability,
    grouping,
    metric_of,
    read_samples,
    select_side,
)
from multicore_profiler.analysis.compare_statistics import describe, difference, impact
from multicore_profiler.analysis.compare_verdicts import (
    VERDICTS,
    check_rule,
    one_sided,
    rule_text,
    verdict,
)
from multicore_profiler.errors import SelectorError
from multicore_profiler.storage.selectors import RunSelector

if TYPE_CHECKING:
    from multicore_profiler.storage.store import Store

__all__ = [
    "LEVELS",
    "METRICS",
    "RESULT_COLUMNS",
    "VERDICTS",
    "Comparison",
    "Level",
    "compare",
    "result_columns",
]

RESULT_COLUMNS = (
    "base_count",
    "head_count",
    "base_median_ns",
    "head_median_ns",
    "base_p90_ns",
    "head_p90_ns",
    "change",
    "change_low",
    "change_high",
    "p_value",
    "verdict",
    "impact_ns",
)
"""The columns of a comparison's rows after the group's, at the levels of durations."""


def result_columns(unit: str) -> tuple[str, ...]:
    """The columns of a comparison's rows after the group's for values in ``unit``:
    ``RESULT_COLUMNS``, with ``_share`` for ``_ns`` at the level of shares."""
    return tuple(column.replace("_ns", f"_{unit}") for column in RESULT_COLUMNS)


@dataclass(frozen=True)
class Comparison:
    """The result of ``compare``: one row per group in ``rows``, most time added first."""

    rows: pa.Table
    base_ids: tuple[str, ...]
    head_ids: tuple[str, ...]
    base: str
    head: str
    by: tuple[str, ...]
    level: str
    metric: str
    threshold: float
    alpha: float
    warnings: tuple[str, ...]
    samples: dict[tuple, dict[bool, np.ndarray]] = field(repr=False, compare=False)
    """Each group's values (in ``unit``) by side (``False``: base, ``True``: head), for
    pictures."""

    @property
    def unit(self) -> str:
        """The unit of the values: ``ns`` (durations) or ``share`` (of a makespan)."""
        return LEVELS[self.level].unit

    def summary(self) -> str:
        """The verdicts counted, with the rule: "1 regressed, 12 unchanged (change of the
        median above 5%, Mann-Whitney p < 0.01)"."""
        counts = ", ".join(f"{self.count(v)} {v}" for v in VERDICTS if self.count(v))
        return f"{counts} ({rule_text(self.threshold, self.alpha, self.unit)})"

    def count(self, verdict: str) -> int:
        """How many groups have this verdict."""
        return sum(v == verdict for v in self.rows["verdict"].to_pylist())

    @property
    def regressed(self) -> bool:
        """Whether any group regressed."""
        return self.count("regressed") > 0


def compare(
    store: Store,
    base: RunSelector | str | Sequence[str],
    head: RunSelector | str | Sequence[str],
    *,
    level: str = "records",
    by: Sequence[str] | None = None,
    metric: str | None = None,
    threshold: float = 0.05,
    alpha: float = 0.01,
    resamples: int = 1000,
    seed: int = 0,
) -> Comparison:
    """Compare the ``base`` runs with the ``head`` runs (selectors, their text, or lists of
    ids; traces at level ``kernels``), per group of ``by`` columns; ``metric`` is the level's
    own (``duration``, or ``share`` at level ``critical``) unless given; see the module's
    doc."""
    kind, by = grouping(level, by, metric)
    check_rule(threshold, alpha, kind.unit)
    base_side = select_side(store, base, kind.of)
    head_side = select_side(store, head, kind.of)
    shared = sorted(set(base_side.ids) & set(head_side.ids))
    if shared:
        raise SelectorError(
            f"base ({base_side.text}) and head ({head_side.text}) share {kind.of} {shared}"
        )
    samples = read_samples(store, level, by, base_side, head_side)

    rng = np.random.default_rng(seed)
    unit, relative = kind.unit, kind.unit == "ns"  # durations change relatively, shares in points
    out: dict[str, list[Any]] = {column: [] for column in by}
    out.update({name: [] for name in result_columns(unit)})
    for key, sides in samples.groups.items():
        for column, value in zip(by, key, strict=True):
            out[column].append(value)
        base_values, head_values = sides.get(False), sides.get(True)
        for prefix, sample in (("base", base_values), ("head", head_values)):
            described = describe(sample)
            out[f"{prefix}_count"].append(described.count)
            out[f"{prefix}_median_{unit}"].append(described.median)
            out[f"{prefix}_p90_{unit}"].append(described.p90)
        if base_values is None or head_values is None:
            out["change"].append(None)
            out["change_low"].append(None)
            out["change_high"].append(None)
            out["p_value"].append(None)
            out["verdict"].append(one_sided(in_base=head_values is None))
        else:
            found = difference(base_values, head_values, alpha, resamples, rng, relative=relative)
            out["change"].append(found.change)
            out["change_low"].append(found.change_low)
            out["change_high"].append(found.change_high)
            out["p_value"].append(found.p_value)
            out["verdict"].append(verdict(found, threshold=threshold, alpha=alpha))
        out[f"impact_{unit}"].append(impact(base_values, head_values, samples.units))
    rows = pa.table(out)
    added = rows[f"impact_{unit}"].to_numpy(zero_copy_only=False)
    order = np.argsort(-np.asarray(added), kind="stable")
    return Comparison(
        rows=rows.take(order),
        base_ids=base_side.ids,
        head_ids=head_side.ids,
        base=base_side.text,
        head=head_side.text,
        by=by,
        metric=metric_of(level),
        threshold=threshold,
        alpha=alpha,
        level=level,
        warnings=(
            tuple(comparability(store, base_side.ids, head_side.ids)) if kind.of == "runs" else ()
        ),
        samples=samples.groups,
    )
