"""What-if changes to compute durations, and their text form.

A change selects compute records (by stage, core type, owners and tasks; every given
target must match, none given selects every compute record) and scales their durations
by ``scale`` then shifts them by ``shift_ns`` (``analysis/replay.py`` replays an invocation
with them; ``analysis/what_if.py`` predicts with them). Its text form,
``<target>[&<target>...]<op><value>``:

- target: a stage name, a core type (``AIC``, ``AIV``, ``SM``, ``CTA``), ``owner=<ids>`` or
  ``task=<ids>``, where ids are ``3``, ``1,4``, ``10-20`` (inclusive) or a comma list of
  those;
- ``*<factor>`` scales (``GMM1*0.8``); ``+<number>[unit]`` or ``-<number>[unit]`` shifts
  every selected record (``GMM1+200us``, ``AIC-5000``), unit ``ns`` (the default), ``us``
  or ``ms``.

Both the replay and the predictions import this module, one way.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from multicore_profiler.abi import CORE_NAMES
from multicore_profiler.errors import ArgumentError

CORE_TYPES = {name: code for code, name in CORE_NAMES.items()}
"""Core types by the names a change gives them."""
_UNITS_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6}
_MAX_IDS = 1 << 20
"""The most ids one ``owner=`` or ``task=`` target may expand to."""

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_CHANGE = re.compile(rf"(?P<targets>.+?)(?P<op>[*+-])(?P<value>{_NUMBER})(?P<unit>[a-z]*)")
_IDS = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")


@dataclass(frozen=True)
class ComputeRecords:
    """The compute records of one chunk, with the columns a change selects them by."""

    stage: np.ndarray
    """Index into ``stage_names`` (-1: no stage)."""
    stage_names: tuple[str, ...]
    core_type: np.ndarray
    owner: np.ndarray
    task: np.ndarray
    frequency_hz: np.ndarray


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
            raise ArgumentError(
                f"a change's core_type is one of {', '.join(CORE_TYPES)}, got {self.core_type!r}"
            )
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
