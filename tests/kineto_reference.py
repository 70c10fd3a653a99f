"""Plain-Python reference (test oracle) for the step and segment numbers of a Chrome trace.

Reads a PyTorch profiler (kineto) trace or a torch_npu ``trace_view.json`` with json/gzip and
``decimal`` only, and recomputes what the SQL step views compute, so tests can compare exactly.
Rules, in brief:

- Times are integer ns: round-half-up(Decimal(µs) * 1000); ``ts`` may be a number or a string;
  a missing ``dur`` is 0. pid, tid and flow ids are compared as the raw JSON values (exact).
- Device op: ``ph == "X"`` and cat kernel/gpu_memcpy/gpu_memset or ``args["Task Type"]``; its id
  is its index in the event array; its interval is [ts, ts + dur).
- Launch point of an op: the lowest-index host ``X`` event (not a device op, not
  gpu_user_annotation) with the same ``args.correlation``; failing that, the ``s`` event of each
  ``f`` event (same cat and id) that lands on the op's pid/tid inside [start, end] and whose
  latest-starting op at or before it (lowest index on ties) is this op.
- Step annotation: a host ``X`` event whose name matches the pattern. A launch belongs to the
  latest-starting annotation of its pid/tid that started at or before it (highest index on
  ties), if that one is still open (ts <= launch <= ts + dur).
- Steps: annotations with own ops, starting at their earliest own op, ordered by (start,
  annotation ts, annotation index), each ending where the next starts; the last is dropped.
- Per step (and family): ops starting in [start, end) give launches and summed dur; busy is the
  union of all op intervals clipped to the step. Segments are the gaps between collective islands.
"""

from __future__ import annotations

import gzip
import json
import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

DEFAULT_STEP_PATTERN = r"^ProfilerStep#(?P<step>\d+)$"
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
Event = dict[str, Any]


@dataclass(frozen=True)
class Op:
    index: int
    name: str
    cat: str | None
    pid: Any
    tid: Any
    start_ns: int
    end_ns: int
    correlation: Any


@dataclass(frozen=True)
class Step:
    index: int
    name: str  # annotation name
    annotation_index: int
    start_ns: int
    end_ns: int
    own_launches: int


@dataclass(frozen=True)
class Segment:
    start_ns: int
    end_ns: int
    launches: int
    kernel_ns: int
    busy_ns: int
    families: tuple[str, ...]


def ns(value: Any) -> int:
    """Microseconds (number or numeric string) to integer ns, rounding half up."""
    return int((Decimal(str(value)) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def load_events(path: Path) -> list[Event]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f, parse_float=Decimal, parse_int=Decimal)
    return data["traceEvents"] if isinstance(data, dict) else data


def _args(e: Event) -> dict[str, Any]:
    return e.get("args") or {}


def is_device_op(e: Event) -> bool:
    return e.get("ph") == "X" and (e.get("cat") in DEVICE_CATS or "Task Type" in _args(e))


def device_ops(events: list[Event]) -> list[Op]:
    ops = []
    for i, e in enumerate(events):
        if is_device_op(e):
            start = ns(e["ts"])
            end = start + ns(e.get("dur", 0))
            corr = _args(e).get("correlation")
            ops.append(Op(i, e.get("name", ""), e.get("cat"), e["pid"], e["tid"], start, end, corr))
    return ops


def launch_points(events: list[Event], ops: list[Op]) -> dict[int, list[tuple[Any, Any, int]]]:
    """{op index: [(pid, tid, ts_ns) of each launch point]} (ops without any are absent)."""
    by_correlation: dict[Any, Event] = {}
    for e in events:
        host = e.get("ph") == "X" and not is_device_op(e) and e.get("cat") != "gpu_user_annotation"
        corr = _args(e).get("correlation")
        if host and corr is not None and corr not in by_correlation:
            by_correlation[corr] = e  # first seen = lowest index
    points: dict[int, list[tuple[Any, Any, int]]] = defaultdict(list)
    for op in ops:
        host = by_correlation.get(op.correlation) if op.correlation is not None else None
        if host is not None:
            points[op.index].append((host["pid"], host["tid"], ns(host["ts"])))

    # Flow links, only for ops that got no correlation link.
    correlated = set(points)
    flow_starts: dict[tuple[Any, Any], list[Event]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "s" and "id" in e:
            flow_starts[(e.get("cat"), e["id"])].append(e)
    lanes: dict[tuple[Any, Any], list[Op]] = defaultdict(list)
    for op in sorted(ops, key=lambda o: (o.start_ns, o.index)):
        lanes[(op.pid, op.tid)].append(op)
    lane_starts = {key: [o.start_ns for o in lane] for key, lane in lanes.items()}
    for e in events:
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") != "f" or "id" not in e or key not in lanes:
            continue
        ts, starts = ns(e["ts"]), lane_starts[key]
        k = bisect_right(starts, ts) - 1  # the last op with start <= ts ...
        if k < 0:
            continue
        op = lanes[key][bisect_left(starts, starts[k])]  # ... the lowest index among equal starts
        if ts <= op.end_ns and op.index not in correlated:
            for s in flow_starts.get((e.get("cat"), e["id"]), []):
                points[op.index].append((s["pid"], s["tid"], ns(s["ts"])))
    return points


def own_ops(events: list[Event], pattern: str = DEFAULT_STEP_PATTERN) -> dict[int, list[Op]]:
    """{annotation index: its own ops} for the step annotations that have any."""
    regex = re.compile(pattern)
    annotations: dict[tuple[Any, Any], list[tuple[int, int, int]]] = defaultdict(list)
    for i, e in enumerate(events):
        if (
            e.get("ph") == "X"
            and "Task Type" not in _args(e)
            and e.get("cat") not in DEVICE_CATS | {"gpu_user_annotation"}
            and regex.search(e.get("name", ""))
        ):
            annotations[(e["pid"], e["tid"])].append((ns(e["ts"]), i, ns(e.get("dur", 0))))
    for lane in annotations.values():
        lane.sort()  # by (ts, index): the last one with ts <= t is the latest (highest index)

    ops = device_ops(events)
    points = launch_points(events, ops)
    own: dict[int, list[Op]] = defaultdict(list)
    for op in ops:
        owners = set()
        for pid, tid, ts in points.get(op.index, []):
            lane = annotations.get((pid, tid), [])
            k = bisect_right(lane, (ts, len(events))) - 1  # the latest with start <= ts
            if k >= 0 and lane[k][0] <= ts <= lane[k][0] + lane[k][2]:
                owners.add(lane[k][1])
        for a in owners:
            own[a].append(op)
    return own


def steps(events: list[Event], pattern: str = DEFAULT_STEP_PATTERN) -> list[Step]:
    own = own_ops(events, pattern)
    found = sorted((min(o.start_ns for o in ops), ns(events[a]["ts"]), a) for a, ops in own.items())
    return [
        Step(k, events[a]["name"], a, start, found[k + 1][0], len(own[a]))
        for k, (start, _, a) in enumerate(found[:-1])
    ]


def merged(intervals: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The union of the intervals clipped to [lo, hi), as disjoint non-empty sorted intervals."""
    out: list[tuple[int, int]] = []
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if a >= b:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def union_ns(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    return sum(b - a for a, b in merged(intervals, lo, hi))


def _totals(ops: list[Op], lo: int, hi: int) -> tuple[int, int, int]:
    """(launches, kernel_ns, busy_ns) of the ops over [lo, hi)."""
    launched = [o for o in ops if lo <= o.start_ns < hi]
    busy = union_ns([(o.start_ns, o.end_ns) for o in ops], lo, hi)
    return len(launched), sum(o.end_ns - o.start_ns for o in launched), busy


def step_totals(
    events: list[Event], steps: list[Step], family_of: Callable[[str], str] | None = None
) -> dict[tuple[int, str], tuple[int, int, int]]:
    """{(step index, family): (launches, kernel_ns, busy_ns)} for every family with launches or
    busy time in the step; with family_of=None every op is family "*"."""
    by_family: dict[str, list[Op]] = defaultdict(list)
    for op in device_ops(events):
        by_family[family_of(op.name) if family_of else "*"].append(op)
    out: dict[tuple[int, str], tuple[int, int, int]] = {}
    for step in steps:
        for family, ops in by_family.items():
            totals = _totals(ops, step.start_ns, step.end_ns)
            if totals[0] or totals[2]:
                out[(step.index, family)] = totals
    return out


def segments(
    events: list[Event],
    steps: list[Step],
    family_of: Callable[[str], str],
    is_collective: Callable[[str], bool] = lambda family: family == "collective",
) -> dict[int, list[Segment]]:
    """{step index: the gaps between collective islands, with their non-collective work}."""
    ops = device_ops(events)
    collective = [o for o in ops if is_collective(family_of(o.name))]
    compute = [o for o in ops if not is_collective(family_of(o.name))]
    out: dict[int, list[Segment]] = {}
    for step in steps:
        islands = merged([(o.start_ns, o.end_ns) for o in collective], step.start_ns, step.end_ns)
        gaps, cursor = [], step.start_ns
        for a, b in islands:
            if a > cursor:
                gaps.append((cursor, a))
            cursor = max(cursor, b)
        if step.end_ns > cursor:
            gaps.append((cursor, step.end_ns))
        out[step.index] = []
        for lo, hi in gaps:
            launches, kernel_ns, busy_ns = _totals(compute, lo, hi)
            families = sorted({family_of(o.name) for o in compute if lo <= o.start_ns < hi})
            out[step.index].append(Segment(lo, hi, launches, kernel_ns, busy_ns, tuple(families)))
    return out
