"""When a capture session records: ``schedule()`` with ``torch.profiler.schedule``'s semantics.

A schedule maps a step number to a ``ProfilerAction``. After ``skip_first`` steps,
cycles of ``wait`` idle steps, ``warmup`` steps (the kernel profiles, the buffers
are thrown away) and ``active`` recorded steps repeat, ``repeat`` times (0: for
ever). The last active step of a cycle is ``RECORD_AND_SAVE``: the window closes
after it and ``on_trace_ready`` runs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from multicore_profiler.errors import ScheduleError


class ProfilerAction(enum.Enum):
    """What a step does, as in ``torch.profiler.ProfilerAction``."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3

    @property
    def records(self) -> bool:
        """Whether launches of a step with this action are kept."""
        return self in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

    @property
    def profiles(self) -> bool:
        """Whether launches of a step with this action run with profiling on."""
        return self is not ProfilerAction.NONE


@dataclass(frozen=True)
class Schedule:
    """A ``schedule(...)``: call it with a step number to get that step's action."""

    wait: int
    warmup: int
    active: int
    repeat: int = 0
    skip_first: int = 0
    skip_first_wait: int = 0

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "active", "repeat", "skip_first", "skip_first_wait"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ScheduleError(f"schedule {name} must be an int, got {value!r}")
            if value < 0:
                raise ScheduleError(f"schedule {name} must be >= 0, got {value}")
        if self.active == 0:
            raise ScheduleError("schedule active must be > 0: a schedule must record something")

    def __call__(self, step: int) -> ProfilerAction:
        """The action of step ``step`` (from 0)."""
        if step < 0:
            raise ScheduleError(f"a step number must be >= 0, got {step}")
        if step < self.skip_first:
            return ProfilerAction.NONE
        step -= self.skip_first
        if self.skip_first_wait:
            step += self.wait
        cycle = self.wait + self.warmup + self.active
        if self.repeat > 0 and step >= self.repeat * cycle:
            return ProfilerAction.NONE
        position = step % cycle
        if position < self.wait:
            return ProfilerAction.NONE
        if position < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        if position < cycle - 1:
            return ProfilerAction.RECORD
        return ProfilerAction.RECORD_AND_SAVE

    def __str__(self) -> str:
        return (
            f"schedule(wait={self.wait}, warmup={self.warmup}, active={self.active}, "
            f"repeat={self.repeat}, skip_first={self.skip_first}, "
            f"skip_first_wait={self.skip_first_wait})"
        )


def schedule(
    *,
    wait: int,
    warmup: int,
    active: int,
    repeat: int = 0,
    skip_first: int = 0,
    skip_first_wait: int = 0,
) -> Schedule:
    """A recording schedule, exactly as ``torch.profiler.schedule`` computes it.

    Raises ``ScheduleError`` for a negative or non-int argument or ``active=0``.
    """
    return Schedule(
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        skip_first=skip_first,
        skip_first_wait=skip_first_wait,
    )
