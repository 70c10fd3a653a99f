"""Reading traces back for tests with every number exact: non-integers as ``Decimal``."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
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
