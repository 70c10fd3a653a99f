"""The ranges of the numbers users give (ranks, devices, steps, ids, frequencies), and one
check of them, so that every entry point refuses the same values with the same words.

The integer ranges are those of the store's columns: a rank that does not fit its
``int32`` column is refused where it is given, not when a file is written half-way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from multicore_profiler.errors import ArgumentError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT32_MAX = 2**32 - 1


@dataclass(frozen=True)
class Range:
    """The values a named quantity can take: integers or finite numbers in [low, high]."""

    what: str
    """What the quantity is, for messages (``"a rank"``)."""
    low: float
    high: float
    integer: bool = True
    unit: str = ""

    def check(self, value: object, name: str | None = None) -> int | float:
        """``value`` if it is in range (an ``int`` for an integer range), else
        ``ArgumentError`` naming ``name`` (default: ``what``), the value and the range."""
        label = name or self.what
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = "an integer" if self.integer else "a number"
            raise ArgumentError(f"{label} must be {kind} {self.bounds()}, got {value!r}")
        if self.integer and isinstance(value, float):
            if not value.is_integer():
                raise ArgumentError(f"{label} must be an integer {self.bounds()}, got {value!r}")
            value = int(value)
        if isinstance(value, float) and not math.isfinite(value):
            raise ArgumentError(f"{label} must be a finite number {self.bounds()}, got {value!r}")
        if not self.low <= value <= self.high:
            raise ArgumentError(f"{label} {value!r}{self.unit} is out of range {self.bounds()}")
        return value

    def parse(self, text: str, name: str | None = None) -> int | float:
        """The value written in ``text`` (integers also in hex, ``0x30001``), checked."""
        label = name or self.what
        try:
            value: int | float = _integer(text) if self.integer else float(text)
        except ValueError:
            kind = "an integer" if self.integer else "a number"
            raise ArgumentError(f"{label} must be {kind} {self.bounds()}, got {text!r}") from None
        return self.check(value, label)

    def bounds(self) -> str:
        """The range as text: ``0 .. 2147483647``."""

        def shown(bound: float) -> str:
            if self.integer or (float(bound).is_integer() and abs(bound) < 1e15):
                return f"{int(bound)}"
            return f"{bound:g}"

        return f"[{shown(self.low)} .. {shown(self.high)}{self.unit}]"


def check_given(*checks: tuple[object, Range, str]) -> None:
    """Check each ``(value, range, name)`` whose value is given (not None)."""
    for value, limit, name in checks:
        if value is not None:
            limit.check(value, name)


def _integer(text: str) -> int:
    """An integer in decimal (leading zeros allowed) or with a 0x, 0o or 0b prefix."""
    prefixed = text.strip().lstrip("+-")[:2].lower() in ("0x", "0o", "0b")
    return int(text, 0) if prefixed else int(text)


RANK = Range("a rank", 0, INT32_MAX)
DEVICE = Range("a device index", 0, INT32_MAX)
STEP = Range("a step", 0, INT64_MAX)
INVOCATION_ID = Range("an invocation id", 0, INT64_MAX)
WINDOW = Range("a capture window index", 0, INT64_MAX)
INT64 = Range("a 64-bit integer", -(2**63), INT64_MAX)
"""What an ``int64`` column holds (times in ns, ids of outer traces)."""
PID = Range("a process id", INT64.low, INT64.high)
"""An outer trace's ``pid``, kept as the int64 of its ``trace_events`` column."""
DESC_ID = Range("a desc id", 1, UINT32_MAX)
COUNT = Range("a count", 0, INT64_MAX)
SLOTS = Range("a slot count", 0, UINT32_MAX)
FREQUENCY_HZ = Range("a cycle frequency", 1e3, 1e11, integer=False, unit=" Hz")
"""1 kHz to 100 GHz: every counter a device has lies well inside, and a value outside is a
typo (MHz given as Hz) that would make every later time wrong."""
FREQUENCY_MHZ = Range("a cycle frequency", 1e-3, 1e5, integer=False, unit=" MHz")
"""``FREQUENCY_HZ`` in MHz, as the command line takes it."""
DAYS = Range("an age in days", 0, 36_500, integer=False)
HOURS = Range("a duration in hours", 0, 876_000, integer=False)
