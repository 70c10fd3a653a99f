"""Reading traces back for tests with every number exact: non-integers as ``Decimal``."""

from __future__ import annotations

import gzip
import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any


def load(path: Path) -> Any:
    """A ``.json`` or ``.json.gz`` trace, non-integer numbers as ``Decimal``."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as source:
        return json.loads(source.read(), parse_float=Decimal)


def events_of(document: Any) -> list[dict[str, Any]]:
    """The events of a trace object, or a bare array of events."""
    return document if isinstance(document, list) else document["traceEvents"]


def ns(value: Any) -> int | None:
    """Microseconds as written (number, Decimal or string) to integer ns, exact to the ns
    (digits below it rounded half up, as real torch_npu durations carry 14 decimals)."""
    if value is None:
        return None
    return int((Decimal(str(value)) * 1000).to_integral_value(rounding=ROUND_HALF_UP))
