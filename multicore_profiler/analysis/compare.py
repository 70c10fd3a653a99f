"""Compare two sets of runs, group by group, with statistics: what got slower between commits.

For each group (default: kernel, stage and phase) the records' durations of the base runs
and of the head runs are two samples. A group is ``regressed`` (``improved``) when its
median grew (shrank) by more than the threshold (default 5%) and a two-sided
Mann-Whitney U test gives p below alpha (default 0.01); else ``unchanged``. A group found
on one side only is ``new`` or ``gone``. The relative change of the median comes with a
bootstrap confidence interval at level 1 - alpha. Durations are the store's ``dur_ns``:
cycles converted with each invocation's own frequency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from multicore_profiler.errors import SelectorError
from multicore_profiler.storage.selectors import RunSelector
from multicore_profiler.storage.sql_text import sql_identifier

if TYPE_CHECKING:
    from multicore_profiler.storage.store import Store


@dataclass(frozen=True)
class Level:
    """What one sample is: the SQL of the samples (``id``: the run or trace they belong to,
    the group columns, ``value`` in ns), of the units time is added per (one row each, with
    ``id``), the columns a comparison may group by, its default grouping, and whether its
    selectors choose runs or traces."""

    samples: str
    units: str
    columns: tuple[str, ...]
    default_by: tuple[str, ...]
    of: str


LEVELS = {
    "records": Level(
        "SELECT run_id AS id, *, dur_ns AS value FROM records_ns",
        "SELECT run_id AS id FROM invocations",
        ("kernel_name", "direction", "stage", "phase", "core", "owner_id", "rank", "step"),
        ("kernel_name", "stage", "phase"),
        "runs",
    ),
    # An invocation's wall time: its last record's end minus its first record's start.
    "invocations": Level(
        """SELECT run_id AS id, kernel_name, direction, rank, step,
                  max(ts_ns + dur_ns) - min(ts_ns) AS value
           FROM records_ns GROUP BY run_id, rank, invocation_id, kernel_name, direction, step""",
        "SELECT run_id AS id FROM invocations",
        ("kernel_name", "direction", "rank", "step"),
        ("kernel_name",),
        "runs",
    ),
    # Device kernels of the outer traces in the store (see the kernel views).
    "kernels": Level(
        "SELECT source_id AS id, family, name, kind, rank, dur_ns AS value FROM kernels",
        "SELECT source_id AS id FROM trace_sources",
        ("family", "name", "kind", "rank"),
        ("family",),
        "traces",
    ),
}
"""What a comparison compares: device records, kernel invocations, or the kernels of
outer (torch / torch_npu) traces."""

METRICS = ("duration",)
"""What is compared: durations in ns (of a record, an invocation or a trace kernel)."""

VERDICTS = ("regressed", "improved", "unchanged", "new", "gone")

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
"""The columns of a comparison's rows after the group's."""

BOOTSTRAP_SAMPLES = 5000
"""Each side's sample is bootstrapped from at most this many values (a random subset):
the interval's width then no longer depends on how many records a group has."""


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
    """Each group's values (ns) by side (``False``: base, ``True``: head), for pictures."""

    def summary(self) -> str:
        """The verdicts counted, with the rule: "1 regressed, 12 unchanged (change of the
        median above 5%, Mann-Whitney p < 0.01)"."""
        counts = ", ".join(f"{self.count(v)} {v}" for v in VERDICTS if self.count(v))
        return (
            f"{counts} (change of the median above {self.threshold:.0%}, "
            f"Mann-Whitney p < {self.alpha:g})"
        )

    def count(self, verdict: str) -> int:
        """How many groups have this verdict."""
        return sum(v == verdict for v in self.rows["verdict"].to_pylist())

    @property
    def regressed(self) -> bool:
        """Whether any group regressed."""
        return self.count("regressed") > 0


def _selected(
    store: Store, selector: RunSelector | str | Sequence[str], of: str
) -> tuple[str, list[str]]:
    if isinstance(selector, (str, RunSelector)):
        select = store.select_runs if of == "runs" else store.select_traces
        return str(selector), select(selector)
    ids = list(selector)
    if not ids:
        raise SelectorError(f"an empty list of {of} selects nothing")
    return ",".join(ids), ids


def _bootstrap(
    base: np.ndarray, head: np.ndarray, level: float, resamples: int, rng: np.random.Generator
) -> tuple[float, float]:
    """A percentile bootstrap interval of median(head) / median(base) - 1."""
    medians = []
    for sample in (base, head):
        if sample.size > BOOTSTRAP_SAMPLES:
            sample = rng.choice(sample, BOOTSTRAP_SAMPLES, replace=False)
        draws = rng.integers(0, sample.size, (resamples, sample.size))
        medians.append(np.median(sample[draws], axis=1))
    ratio = medians[1] / medians[0] - 1
    tail = (1 - level) / 2
    low, high = np.quantile(ratio, [tail, 1 - tail])
    return float(low), float(high)


_COMPARABLE = (
    ("SoC", "invocations", "soc"),
    ("frequency (Hz)", "invocations", "frequency_hz"),
    ("buffer layout", "invocations", "[aic_slots, aiv_slots, aic_capacity, aiv_capacity]"),
    ("kernel spec (stage names)", "invocations", "stage_names"),
    ("schedule", "runs", "schedule"),
)
"""What shapes durations besides the code: (what, the view it is in, its SQL)."""


def _comparability(store: Store, base: list[str], head: list[str]) -> list[str]:
    """Warnings where base and head differ in what shapes their durations."""
    warnings = []
    for what, view, expression in _COMPARABLE:
        found = store.sql(
            f"""SELECT list_contains($head, run_id) AS head,
                       list_sort(list_distinct(list(({expression})::VARCHAR))) AS seen
                FROM {view} WHERE list_contains($runs, run_id) GROUP BY ALL""",
            {"head": head, "runs": base + head},
            runs=base + head,
        ).to_pylist()
        seen = {row["head"]: ", ".join(row["seen"]) for row in found}
        if seen.get(False) != seen.get(True):
            warnings.append(
                f"base and head differ in {what}: base {seen.get(False)}; head {seen.get(True)}"
            )
    return warnings


def compare(
    store: Store,
    base: RunSelector | str | Sequence[str],
    head: RunSelector | str | Sequence[str],
    *,
    level: str = "records",
    by: Sequence[str] | None = None,
    metric: str = "duration",
    threshold: float = 0.05,
    alpha: float = 0.01,
    resamples: int = 1000,
    seed: int = 0,
) -> Comparison:
    """Compare the ``base`` runs with the ``head`` runs (selectors, their text, or lists of
    ids; traces at level ``kernels``), per group of ``by`` columns; see the module's doc."""
    if level not in LEVELS:
        raise SelectorError(f"unknown level {level!r}; one of {sorted(LEVELS)}")
    kind = LEVELS[level]
    by = tuple(kind.default_by if by is None else by)
    unknown = [column for column in by if column not in kind.columns]
    if not by or unknown:
        raise SelectorError(
            f"cannot group {level} by {unknown or 'nothing'}; by takes {kind.columns}"
        )
    if metric not in METRICS:
        raise SelectorError(f"unknown metric {metric!r}; one of {METRICS}")
    if not 0 < alpha < 1 or threshold < 0:
        raise SelectorError(f"alpha must be in (0, 1) and threshold >= 0, got {alpha}, {threshold}")
    base_text, base_ids = _selected(store, base, kind.of)
    head_text, head_ids = _selected(store, head, kind.of)
    shared = sorted(set(base_ids) & set(head_ids))
    if shared:
        raise SelectorError(f"base ({base_text}) and head ({head_text}) share {kind.of} {shared}")
    sides = {"head": head_ids, "ids": base_ids + head_ids}
    scope = sides["ids"] if kind.of == "runs" else None  # read only these runs' files
    columns = ", ".join(sql_identifier(column) for column in by)
    samples = store.sql(
        f"""SELECT {columns}, list_contains($head, id) AS head,
                   list(value ORDER BY value) AS values
            FROM ({kind.samples}) WHERE list_contains($ids, id) AND value IS NOT NULL
            GROUP BY ALL ORDER BY ALL""",
        sides,
        runs=scope,
    )
    units = {
        row["head"]: row["n"]
        for row in store.sql(
            f"""SELECT list_contains($head, id) AS head, count(*) AS n FROM ({kind.units})
                WHERE list_contains($ids, id) GROUP BY ALL""",
            sides,
            runs=scope,
        ).to_pylist()
    }
    found = set(samples["head"].to_pylist())  # the sides that have samples
    for side, ids, text in ((False, base_ids, base_text), (True, head_ids, head_text)):
        if not units.get(side) or side not in found:
            raise SelectorError(f"the {kind.of} of {text} ({', '.join(ids)}) hold no {level}")

    groups: dict[tuple, dict[bool, np.ndarray]] = {}
    offsets = samples["values"].combine_chunks()
    values = offsets.values.to_numpy(zero_copy_only=False).astype(np.float64)
    starts = offsets.offsets.to_numpy()
    keys = samples.select(list(by)).to_pylist()
    for row, (key, is_head) in enumerate(zip(keys, samples["head"].to_pylist(), strict=True)):
        groups.setdefault(tuple(key.values()), {})[is_head] = values[starts[row] : starts[row + 1]]

    # scipy.stats takes a second to import: only comparisons pay it, not every store.
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(seed)
    out: dict[str, list[Any]] = {column: [] for column in by}
    out.update({name: [] for name in RESULT_COLUMNS})
    for key, sides in groups.items():
        for column, value in zip(by, key, strict=True):
            out[column].append(value)
        base_values, head_values = sides.get(False), sides.get(True)
        stats: dict[str, Any] = dict.fromkeys(
            ("change", "change_low", "change_high", "p_value"), None
        )
        for prefix, sample in (("base", base_values), ("head", head_values)):
            present = sample is not None
            out[f"{prefix}_count"].append(int(sample.size) if present else 0)
            out[f"{prefix}_median_ns"].append(float(np.median(sample)) if present else None)
            out[f"{prefix}_p90_ns"].append(float(np.quantile(sample, 0.9)) if present else None)
        if head_values is None:
            verdict = "gone"
            impact = -float(np.median(base_values)) * base_values.size / units[False]
        elif base_values is None:
            verdict = "new"
            impact = float(np.median(head_values)) * head_values.size / units[True]
        else:
            base_median, head_median = np.median(base_values), np.median(head_values)
            p_value = float(mannwhitneyu(head_values, base_values).pvalue)
            stats["p_value"] = p_value
            # A relative change needs a base above zero (waits that did not wait have none).
            change = float(head_median / base_median - 1) if base_median > 0 else None
            if change is not None:
                low, high = _bootstrap(base_values, head_values, 1 - alpha, resamples, rng)
                stats.update(change=change, change_low=low, change_high=high)
            significant = change is not None and p_value < alpha
            verdict = (
                "regressed"
                if significant and change > threshold
                else "improved"
                if significant and change < -threshold
                else "unchanged"
            )
            # Time added per invocation (or trace): the median's change for each sample.
            impact = float(head_median - base_median) * head_values.size / units[True]
        for name, value in stats.items():
            out[name].append(value)
        out["verdict"].append(verdict)
        out["impact_ns"].append(impact)
    rows = pa.table(out)
    order = np.argsort(-np.asarray(rows["impact_ns"].to_numpy(zero_copy_only=False)), kind="stable")
    return Comparison(
        rows=rows.take(order),
        base_ids=tuple(base_ids),
        head_ids=tuple(head_ids),
        base=base_text,
        head=head_text,
        by=tuple(by),
        metric=metric,
        threshold=threshold,
        alpha=alpha,
        level=level,
        warnings=tuple(_comparability(store, base_ids, head_ids)) if kind.of == "runs" else (),
        samples=groups,
    )
