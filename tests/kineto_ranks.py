"""Copies of a kineto trace as other ranks of its job, with known clock and duration skews."""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path


def nccl_kernels(events: list[dict]) -> list[int]:
    """The indexes of a trace's NCCL kernels, in order of start (then of the file)."""
    found = [
        i
        for i, event in enumerate(events)
        if event.get("cat") == "kernel" and event.get("name", "").startswith("nccl")
    ]
    return sorted(found, key=lambda i: (events[i]["ts"], i))


def rank_copy(
    source: Path,
    target: Path,
    *,
    rank: int,
    shift_us: int = 0,
    stretch_us: Mapping[int, int] | None = None,
) -> Path:
    """Write ``source`` (a gzipped kineto trace) to ``target`` as rank ``rank``: its
    ``distributedInfo.rank`` set, every event's ``ts`` ``shift_us`` later, and the NCCL
    kernel numbered j (``nccl_kernels`` order) ``stretch_us[j]`` µs longer; return
    ``target``."""
    trace = json.loads(gzip.decompress(source.read_bytes()))
    trace["distributedInfo"]["rank"] = rank
    events = trace["traceEvents"]
    kernels = nccl_kernels(events)
    for j, extra in (stretch_us or {}).items():
        events[kernels[j]]["dur"] += extra
    for event in events:
        if "ts" in event:
            event["ts"] += shift_us
    target.write_bytes(gzip.compress(json.dumps(trace).encode(), compresslevel=1))
    return target
