"""What a change to compute durations would buy: ``what_if`` replays the invocations with
changes (``analysis/changes.py``: a ``Change`` or its text form) and ``speedup_curves`` with
each stage made faster by each speed-up."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from multicore_profiler.analysis.changes import Change, parse_change
from multicore_profiler.analysis.replay import (
    FIDELITY_LIMIT,
    KEY_COLUMNS,
    ReplayGraph,
    predict_makespans,
    replay,
    replay_table,
)
from multicore_profiler.errors import AnalysisError, ArgumentError

DEFAULT_SPEEDUPS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)


def _changes(changes: Sequence[Change | str]) -> tuple[Change, ...]:
    """Changes, each given as a ``Change`` or its text."""
    return tuple(parse_change(c) if isinstance(c, str) else c for c in changes)


def what_if(
    graph: ReplayGraph, changes: Sequence[Change | str], *, strict: bool = False
) -> pa.Table:
    """``replay`` with the changes (``Change`` objects or their text). With ``strict``,
    ``AnalysisError`` naming the invocations whose replay is not faithful instead of
    their NULL predictions."""
    table = replay(graph, _changes(changes))
    if strict:
        unfaithful = np.flatnonzero(~table.column("faithful").to_numpy())
        if unfaithful.size:
            errors = table.column("fidelity_error").to_numpy()
            named = "; ".join(
                f"{graph.describe(int(i))} (error {errors[i]:.1%})" for i in unfaithful[:5]
            )
            more = f" and {unfaithful.size - 5} more" if unfaithful.size > 5 else ""
            raise AnalysisError(
                f"the replay does not reproduce the observed makespan within "
                f"{FIDELITY_LIMIT:.0%} for "
                f"{named}{more}: no prediction"
            )
    return table


def speedup_curves(
    graph: ReplayGraph,
    stages: Sequence[str] | None = None,
    speedups: Sequence[float] = DEFAULT_SPEEDUPS,
) -> pa.Table:
    """One row per (invocation, stage, speed-up): key columns, ``stage``, ``speedup``,
    ``observed_makespan_ns``, ``faithful``, ``predicted_makespan_ns`` with the stage's
    compute scaled by ``1 - speedup`` (NULL where not faithful) and ``ratio`` (predicted
    / observed). Stages default to every stage with compute records; all scenarios are
    replayed together."""
    stages = tuple(graph.stages if stages is None else stages)
    speedups = tuple(float(s) for s in speedups)
    bad = [s for s in speedups if not 0 <= s <= 1]
    if bad:
        raise ArgumentError(f"a speed-up is a fraction in [0, 1], got {bad[0]}")
    scenarios = [()] + [
        (Change(stage=stage, scale=1 - s, text=f"{stage}*{1 - s:g}"),)
        for stage in stages
        for s in speedups
    ]
    spans = predict_makespans(graph, scenarios)
    base = replay_table(graph, spans[:, 0], spans[:, 0])
    n_inv, n_curve = len(graph), len(scenarios) - 1
    faithful = np.repeat(base.column("faithful").to_numpy(), n_curve)
    observed = np.repeat(graph.observed_makespan_ns, n_curve)
    predicted = spans[:, 1:].reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = predicted / observed
    rows = np.repeat(np.arange(n_inv), n_curve)
    stage_of = np.tile(np.repeat(np.arange(len(stages)), len(speedups)), n_inv)
    return pa.table(
        {
            **{name: graph.keys.column(name).take(pa.array(rows)) for name in KEY_COLUMNS},
            "stage": pa.array(stages, pa.string()).take(pa.array(stage_of, pa.int64())),
            "speedup": pa.array(
                np.tile(np.asarray(speedups, dtype=np.float64), len(stages) * n_inv)
            ),
            "observed_makespan_ns": pa.array(observed),
            "faithful": pa.array(faithful),
            "predicted_makespan_ns": pa.array(predicted, mask=~faithful),
            "ratio": pa.array(ratio, mask=~faithful | (observed == 0)),
        }
    )
