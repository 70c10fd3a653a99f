"""What-if changes to compute durations, their text form, and the predictions they give.

A change selects compute records (by stage, core type, owners and tasks; every given
target must match, none given selects every compute record) and scales their durations
by ``scale`` then shifts them by ``shift_ns`` (see ``replay`` for how the invocation is
then replayed). Its text form, ``<target>[&<target>...]<op><value>``:

- target: a stage name, ``AIC``, ``AIV``, ``owner=<ids>`` or ``task=<ids>``, where ids are
  ``3``, ``1,4``, ``10-20`` (inclusive) or a comma list of those;
- ``*<factor>`` scales (``GMM1*0.8``); ``+<number>[unit]`` or ``-<number>[unit]`` shifts
  every selected record (``GMM1+200us``, ``AIC-5000``), unit ``ns`` (the default), ``us``
  or ``ms``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from multicore_profiler.analysis.replay import (
    FIDELITY_LIMIT,
    KEY_COLUMNS,
    ComputeRecords,
    ReplayGraph,
    predict_makespans,
    refuse_recorded_dependencies,
    replay,
    replay_table,
)
from multicore_profiler.errors import AnalysisError, ArgumentError

CORE_TYPES = {"AIC": 1, "AIV": 2}
_UNITS_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6}
_MAX_IDS = 1 << 20
"""The most ids one ``owner=`` or ``task=`` target may expand to."""

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_CHANGE = re.compile(rf"(?P<targets>.+?)(?P<op>[*+-])(?P<value>{_NUMBER})(?P<unit>[a-z]*)")
_IDS = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")
DEFAULT_SPEEDUPS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)


@dataclass(frozen=True)
class Change:
    """A change to the durations of the compute records it selects (all given targets
    must match; none selects every compute record): ``max(0, round(dur * scale +
    shift))``, the shift ``shift_ns`` in the invocation's cycles. ``text`` names it in
    messages (its text form when left empty)."""

    stage: str | None = None
    core_type: str | None = None
    owners: tuple[int, ...] | None = None
    tasks: tuple[int, ...] | None = None
    scale: float = 1.0
    shift_ns: float = 0.0
    text: str = ""

    def __post_init__(self) -> None:
        for name in ("owners", "tasks"):
            ids = getattr(self, name)
            if ids is not None:
                object.__setattr__(self, name, tuple(int(i) for i in ids))
        if self.core_type is not None and self.core_type not in CORE_TYPES:
            raise ArgumentError(f"a change's core_type is AIC or AIV, got {self.core_type!r}")
        if not (math.isfinite(self.scale) and self.scale >= 0):
            raise ArgumentError(f"a change's scale must be a finite number >= 0, got {self.scale}")
        if not math.isfinite(self.shift_ns):
            raise ArgumentError(f"a change's shift_ns must be finite, got {self.shift_ns}")
        if not self.text:
            object.__setattr__(self, "text", self._render())

    def _render(self) -> str:
        """The change in its text form."""
        targets = [t for t in (self.stage, self.core_type) if t is not None]
        for name, ids in (("owner", self.owners), ("task", self.tasks)):
            if ids is not None:
                targets.append(f"{name}={','.join(map(str, ids))}")
        target = "&".join(targets) or "*"
        if self.shift_ns == 0:
            return f"{target}*{self.scale:g}"
        shift = f"{'+' if self.shift_ns > 0 else '-'}{abs(self.shift_ns):g}ns"
        return f"{target}{shift}" if self.scale == 1 else f"{target}*{self.scale:g}{shift}"

    def matches(self, records: ComputeRecords) -> np.ndarray:
        """Which of ``records`` the change selects."""
        mask = np.ones(len(records.stage), dtype=bool)
        if self.stage is not None:
            names = records.stage_names
            code = names.index(self.stage) if self.stage in names else -2
            mask &= records.stage == code
        if self.core_type is not None:
            mask &= records.core_type == CORE_TYPES[self.core_type]
        if self.owners is not None:
            mask &= np.isin(records.owner, self.owners)
        if self.tasks is not None:
            mask &= np.isin(records.task, self.tasks)
        return mask


def _ids(text: str, change: str) -> tuple[int, ...]:
    """The ids of ``3``, ``1,4``, ``10-20`` (comma lists of numbers and inclusive ranges)."""
    if not _IDS.fullmatch(text):
        raise ArgumentError(f"change {change!r}: {text!r} is not a list of ids (3, 1,4 or 10-20)")
    ids: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if last < first:
            raise ArgumentError(f"change {change!r}: the range {part} runs backwards")
        if len(ids) + last - first + 1 > _MAX_IDS:
            raise ArgumentError(f"change {change!r}: more than {_MAX_IDS} ids")
        ids.extend(range(first, last + 1))
    return tuple(sorted(set(ids)))


def parse_change(text: str) -> Change:
    """The change ``text`` describes (grammar in the module docstring); ``ArgumentError``
    saying what is wrong with text that is not one."""
    found = _CHANGE.fullmatch(text.strip())
    if found is None:
        raise ArgumentError(
            f"change {text!r} is not <target>[&<target>...] followed by *<factor>, "
            "+<number>[ns|us|ms] or -<number>[ns|us|ms] (for example GMM1*0.8, AIC+200us)"
        )
    op, value, unit = found["op"], float(found["value"]), found["unit"]
    fields: dict[str, str | tuple[int, ...]] = {}
    for target in found["targets"].split("&"):
        name, equals, ids = target.partition("=")
        if not target:
            raise ArgumentError(f"change {text!r} has an empty target")
        if equals:
            if name not in ("owner", "task"):
                raise ArgumentError(
                    f"change {text!r}: {name!r}= is not a target (owner=<ids> or task=<ids>)"
                )
            key, parsed = f"{name}s", _ids(ids, text)
        elif target in CORE_TYPES:
            key, parsed = "core_type", target
        elif re.search(r"[*+\s]", target):
            raise ArgumentError(f"change {text!r}: {target!r} is not a stage name")
        else:
            key, parsed = "stage", target
        if key in fields:
            raise ArgumentError(f"change {text!r} gives its {key.rstrip('s')} twice")
        fields[key] = parsed
    if op == "*":
        if unit:
            raise ArgumentError(f"change {text!r}: a factor takes no unit, got {unit!r}")
        if not math.isfinite(value):
            raise ArgumentError(f"change {text!r}: the factor {value} is not finite")
        return _change(fields, scale=value, text=text)
    if (unit or "ns") not in _UNITS_NS:
        raise ArgumentError(f"change {text!r}: unit {unit!r} is not one of ns, us, ms")
    shift = value * _UNITS_NS[unit or "ns"]
    if not math.isfinite(shift):
        raise ArgumentError(f"change {text!r}: the shift {value} is not finite")
    return _change(fields, shift_ns=shift if op == "+" else -shift, text=text)


def _change(
    fields: dict[str, str | tuple[int, ...]],
    *,
    text: str,
    scale: float = 1.0,
    shift_ns: float = 0.0,
) -> Change:
    """The change of parsed targets."""
    stage, core_type = fields.get("stage"), fields.get("core_type")
    owners, tasks = fields.get("owners"), fields.get("tasks")
    return Change(
        stage=stage if isinstance(stage, str) else None,
        core_type=core_type if isinstance(core_type, str) else None,
        owners=owners if isinstance(owners, tuple) else None,
        tasks=tasks if isinstance(tasks, tuple) else None,
        scale=scale,
        shift_ns=shift_ns,
        text=text,
    )


def _changes(changes: Sequence[Change | str]) -> tuple[Change, ...]:
    """Changes, each given as a ``Change`` or its text."""
    return tuple(parse_change(c) if isinstance(c, str) else c for c in changes)


def what_if(
    graph: ReplayGraph, changes: Sequence[Change | str], *, strict: bool = False
) -> pa.Table:
    """``replay`` with the changes (``Change`` objects or their text). With ``strict``,
    ``AnalysisError`` naming the invocations whose replay is not faithful instead of
    their NULL predictions. An invocation of recorded dependency edges (an imported simpler
    graph), which the replay cannot release, gets no prediction either (with ``strict``, an
    ``AnalysisError`` naming it)."""
    if strict:
        refuse_recorded_dependencies(graph)
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
    replayed together. An invocation of recorded dependency edges (an imported simpler
    graph) is not faithful: the replay cannot release its tasks."""
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
