"""Checks a Chrome Trace Event Format trace against what its viewers accept.

The rules are those of Perfetto's JSON importer (ui.perfetto.dev, trace_processor) and of the
legacy chrome://tracing importer (catapult), so a trace that passes `check_trace` opens in both
with every slice on its row and every flow arrow drawn between the slices it was meant for.

Facts the rules rest on (from the importers' sources):

* Perfetto keeps one slice stack per thread (pid, tid). A complete event that starts inside the
  top slice but ends after it is dropped (or moved to an overflow track in newer versions).
* Perfetto parses ts and dur from their decimal text into whole nanoseconds, truncating digits
  past the third decimal of a microsecond; nesting is decided on those integers.
* Perfetto processes events sorted by ts; at one ts, complete events with a duration come first,
  longest first, and the rest (zero-length slices, instants, flows) follow in file order.
  chrome://tracing builds the slice tree sorting by ts and then by file order only.
* A flow 's', 't' or an 'f' with bp "e" is bound by Perfetto to the top of the thread's slice
  stack: the slice (or thread instant) that started last before it. chrome://tracing binds it to
  the innermost slice whose closed interval holds ts.
* An 'f' without bp is bound by Perfetto to the next slice that starts on the thread after it;
  chrome://tracing takes the first slice, by (ts, file order), that starts after ts or at ts and
  later in the file, and treats cats containing "input" or "ipc.flow" as bp "e".
* Perfetto keys a flow by (cat, name, id) and reads a string id as hexadecimal; chrome://tracing
  keys it by id alone, as a JavaScript value (integers above 2**53 lose precision).
* pids and tids are unsigned 32-bit in Perfetto; larger values wrap.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import os
import re
import zlib
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["EXPORT_HEAD", "Trace", "check_chrome_files", "check_trace", "load_trace"]

Trace = dict[str, Any] | list[Any]

UINT32_MAX = 2**32 - 1
JS_SAFE_INT = 2**53
INT64_MAX = 2**63 - 1

METADATA_NAMES = frozenset(
    {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}
)
THREAD_METADATA = frozenset({"thread_name", "thread_sort_index"})
FLOW_PHASES = frozenset({"s", "t", "f"})
INSTANT_PHASES = frozenset({"i", "I"})
HEX_ID = re.compile(r"(?:0[xX])?[0-9a-fA-F]+")


class _Slice(NamedTuple):
    """One slice on a thread track: a complete event or a thread-scoped instant."""

    ts: int | float
    neg_dur: int | float  # sort key: at one ts, longer slices first (Perfetto's order)
    idx: int
    start: int | Decimal  # ts and ts + dur in ns, exactly as the JSON text says
    end: int | Decimal
    ts_ns: int
    dur_ns: int
    lossy: bool  # ts or dur has digits past whole nanoseconds
    is_complete: bool


class _Flow(NamedTuple):
    """One flow event ('s', 't' or 'f')."""

    idx: int
    ph: str
    track: tuple[int, int]
    ts: int | float
    cat: str
    name: str
    id: int | str
    bp: str | None


def check_trace(trace: Trace) -> None:
    """Raise AssertionError naming the event index and the problem if `trace` would not open
    correctly in Perfetto and chrome://tracing; return None when it would."""
    events = _trace_events(trace)
    checker = _Checker(events)
    checker.scan()
    checker.check_tracks()
    checker.check_flows()
    checker.check_metadata()
    _check_serializable(trace, events)


EXPORT_HEAD = b'{"schemaVersion":1,"displayTimeUnit":"ns","traceEvents":[\n'
"""How every trace of the Chrome JSON writer (``export_chrome_trace``) begins."""


def check_chrome_files(root: str | os.PathLike[str]) -> list[Path]:
    """Check every ``*.json`` and ``*.json.gz`` under `root` (recursively) that the Chrome JSON
    writer wrote (it begins with ``EXPORT_HEAD``), raising AssertionError with the file's path
    for one that would not open correctly; return the paths checked."""
    paths = []
    for path in sorted(Path(root).rglob("*.json*")):
        if not path.name.endswith((".json", ".json.gz")) or not path.is_file():
            continue
        if not _written_by_exporter(path):
            continue
        try:
            check_trace(load_trace(path))
        except AssertionError as exc:
            raise AssertionError(f"{path}: {exc}") from exc
        paths.append(path)
    return paths


def _written_by_exporter(path: Path) -> bool:
    """Whether `path` opens with ``EXPORT_HEAD``, plain or gzipped. A file whose opening
    cannot be read (a broken gzip stream: a fuzzed input trace, say) is not an export."""
    with path.open("rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open if gzipped else open)(path, "rb") as fh:
            return fh.read(len(EXPORT_HEAD)) == EXPORT_HEAD
    except (OSError, EOFError, zlib.error):
        return False


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace from a .json or .json.gz file (gzip is recognised by its magic bytes).

    NaN and Infinity, which Python's json accepts but JSON and Perfetto do not, are rejected.
    """
    path = Path(path)
    with path.open("rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    with opener(path, "rt", encoding="utf-8") as fh:
        try:
            return json.load(fh, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"{path}: not valid JSON: {exc}") from exc


def _reject_constant(name: str) -> Any:
    raise AssertionError(f"trace holds {name}, which is not JSON and which Perfetto rejects")


def _trace_events(trace: Trace) -> list[Any]:
    if isinstance(trace, list):
        return trace
    if not isinstance(trace, dict):
        raise AssertionError(
            f"trace top level must be a JSON array or object, not {type(trace).__name__}"
        )
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise AssertionError("trace object must hold a 'traceEvents' list")
    if "displayTimeUnit" in trace and trace["displayTimeUnit"] not in ("ms", "ns"):
        raise AssertionError(
            f"displayTimeUnit must be 'ms' or 'ns', not {trace['displayTimeUnit']!r}"
            " (chrome://tracing refuses the whole trace otherwise)"
        )
    if "metadata" in trace and not isinstance(trace["metadata"], dict):
        raise AssertionError("top-level 'metadata' must be an object")
    return events


def _check_serializable(trace: Trace, events: list[Any]) -> None:
    """Strict JSON (no NaN/Infinity, only JSON types), as json.dump would write it."""
    try:
        json.dumps(trace, allow_nan=False)
    except (TypeError, ValueError) as exc:
        for idx, event in enumerate(events):
            try:
                json.dumps(event, allow_nan=False)
            except (TypeError, ValueError) as inner:
                raise AssertionError(
                    f"event #{idx} ({_describe(event)}): not strict JSON: {inner}"
                ) from inner
        raise AssertionError(f"trace is not strict JSON outside traceEvents: {exc}") from exc


def _describe(event: Any) -> str:
    if not isinstance(event, dict):
        return type(event).__name__
    return f"ph={event.get('ph')!r}, name={event.get('name')!r}"


def _is_int(value: Any) -> bool:
    """A JSON integer: int, not bool (nor a numpy integer, which json.dump refuses)."""
    return type(value) is int


def _is_number(value: Any) -> bool:
    """A finite JSON number: int or float, not bool, NaN or infinity."""
    kind = type(value)
    return kind is int or (kind is float and math.isfinite(value))


def _to_ns(value: int | float) -> tuple[int, int | Decimal]:
    """Microseconds to nanoseconds twice: truncated to a whole number the way Perfetto reads the
    JSON text (the decimal point moves three places, further digits are dropped), and exactly,
    as that text says (a Decimal only when digits were dropped)."""
    if type(value) is int:
        ns = value * 1000
        return ns, ns
    text = repr(value)  # what json.dump writes
    if "e" in text or "E" in text:
        exact = Decimal(text).scaleb(3)
        ns = int(exact)
        return ns, ns if exact == ns else exact
    whole, _, frac = text.partition(".")
    if len(frac) <= 3:
        ns = int(whole + frac.ljust(3, "0"))
        return ns, ns
    ns = int(whole + frac[:3])
    return ns, ns if frac[3:].strip("0") == "" else Decimal(text).scaleb(3)


def _us(ns: int | Decimal) -> str:
    """Nanoseconds shown as the microseconds a trace is written in."""
    text = format(Decimal(ns).scaleb(-3), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


class _Checker:
    """Collects tracks, flows and metadata in one pass, then checks them."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events
        self.tracks: dict[tuple[int, int], list[_Slice]] = {}
        self.flows: list[_Flow] = []
        self.metadata: dict[tuple[str, int, int | None], int] = {}
        self.first_x_of_pid: dict[int, int] = {}
        self.first_x_of_track: dict[tuple[int, int], int] = {}
        self.sorted_tracks: dict[tuple[int, int], list[_Slice]] = {}
        self.track_keys: dict[tuple[int, int], list[tuple[Any, Any, int]]] = {}

    def fail(self, idx: int, problem: str) -> None:
        raise AssertionError(f"event #{idx} ({_describe(self.events[idx])}): {problem}")

    # -- pass 1: every event on its own -------------------------------------------------------

    def scan(self) -> None:
        for idx, event in enumerate(self.events):
            if not isinstance(event, dict):
                raise AssertionError(
                    f"event #{idx}: must be a JSON object, not {type(event).__name__}"
                )
            ph = event.get("ph")
            if not isinstance(ph, str):
                self.fail(idx, "needs a string 'ph'")
            if ph == "X":
                self.scan_complete(idx, event)
            elif ph == "M":
                self.scan_metadata(idx, event)
            elif ph in FLOW_PHASES:
                self.scan_flow(idx, event, ph)
            elif ph in INSTANT_PHASES:
                self.scan_instant(idx, event)
            elif ph == "C":
                self.scan_counter(idx, event)
            else:
                self.fail(idx, f"unsupported phase {ph!r} (allowed: X, M, s, t, f, i, I, C)")

    def require_str(self, idx: int, event: dict[str, Any], key: str) -> str:
        value = event.get(key)
        if not isinstance(value, str):
            self.fail(idx, f"'{key}' must be a string, not {value!r}")
        return value

    def require_id(self, idx: int, event: dict[str, Any], key: str) -> int:
        value = event.get(key)
        if not _is_int(value) or not 0 <= value <= UINT32_MAX:
            self.fail(
                idx,
                f"'{key}' must be an integer in 0..2**32-1 (Perfetto reads it as uint32),"
                f" not {value!r}",
            )
        return value

    def require_ts(self, idx: int, event: dict[str, Any], key: str = "ts") -> int | float:
        value = event.get(key)
        if not _is_number(value):
            self.fail(idx, f"'{key}' must be a finite JSON number, not {value!r}")
        return value

    def check_optional(self, idx: int, event: dict[str, Any]) -> None:
        if "cat" in event and not isinstance(event["cat"], str):
            self.fail(idx, f"'cat' must be a string, not {event['cat']!r}")
        if "args" in event and not isinstance(event["args"], dict):
            self.fail(idx, f"'args' must be an object, not {event['args']!r}")

    def to_ns(self, idx: int, key: str, value: int | float) -> tuple[int, int | Decimal]:
        ns, exact = _to_ns(value)
        if abs(ns) > INT64_MAX:
            self.fail(idx, f"'{key}'={value!r} us does not fit Perfetto's int64 nanoseconds")
        return ns, exact

    def add_slice(
        self, idx: int, event: dict[str, Any], dur: int | float, is_complete: bool
    ) -> None:
        ts = self.require_ts(idx, event)
        pid = self.require_id(idx, event, "pid")
        tid = self.require_id(idx, event, "tid")
        ts_ns, ts_exact = self.to_ns(idx, "ts", ts)
        dur_ns, dur_exact = self.to_ns(idx, "dur", dur)
        if abs(ts_ns + dur_ns) > INT64_MAX:
            self.fail(idx, "ts + dur does not fit Perfetto's int64 nanoseconds")
        track = (pid, tid)
        lossy = isinstance(ts_exact, Decimal) or isinstance(dur_exact, Decimal)
        end = ts_exact + dur_exact
        self.tracks.setdefault(track, []).append(
            _Slice(ts, -dur, idx, ts_exact, end, ts_ns, dur_ns, lossy, is_complete)
        )
        if is_complete:
            self.first_x_of_pid.setdefault(pid, idx)
            self.first_x_of_track.setdefault(track, idx)

    def scan_complete(self, idx: int, event: dict[str, Any]) -> None:
        self.require_str(idx, event, "name")
        dur = event.get("dur")
        if not _is_number(dur) or dur < 0:
            self.fail(idx, f"'dur' must be a finite JSON number >= 0, not {dur!r}")
        self.check_optional(idx, event)
        self.add_slice(idx, event, dur, is_complete=True)

    def scan_instant(self, idx: int, event: dict[str, Any]) -> None:
        self.require_str(idx, event, "name")
        self.check_optional(idx, event)
        scope = event.get("s", "t")
        if scope not in ("g", "p", "t"):
            self.fail(idx, f"instant scope 's' must be 'g', 'p' or 't', not {scope!r}")
        if scope == "t":  # a zero-length slice on its thread, in both viewers
            self.add_slice(idx, event, 0, is_complete=False)
        else:
            self.require_ts(idx, event)
            self.require_id(idx, event, "pid")
            self.require_id(idx, event, "tid")

    def scan_counter(self, idx: int, event: dict[str, Any]) -> None:
        self.require_str(idx, event, "name")
        self.require_ts(idx, event)
        self.require_id(idx, event, "pid")
        if "tid" in event:
            self.require_id(idx, event, "tid")
        if "cat" in event and not isinstance(event["cat"], str):
            self.fail(idx, f"'cat' must be a string, not {event['cat']!r}")
        args = event.get("args")
        if not isinstance(args, dict) or not args:
            self.fail(idx, "counter needs a non-empty 'args' object of series values")
        for series, value in args.items():
            if not _is_number(value):
                self.fail(idx, f"counter series {series!r} must be a finite number, not {value!r}")

    def scan_metadata(self, idx: int, event: dict[str, Any]) -> None:
        name = event.get("name")
        if name not in METADATA_NAMES:
            self.fail(idx, f"metadata name must be one of {sorted(METADATA_NAMES)}, not {name!r}")
        pid = self.require_id(idx, event, "pid")
        tid = self.require_id(idx, event, "tid") if name in THREAD_METADATA else None
        if "ts" in event:
            self.require_ts(idx, event)
        args = event.get("args")
        if not isinstance(args, dict):
            self.fail(idx, f"metadata needs an 'args' object, not {args!r}")
        if name.endswith("_name"):
            value = args.get("name")
            if not isinstance(value, str) or not value:
                self.fail(idx, f"args.name must be a non-empty string, not {value!r}")
        elif name.endswith("_sort_index"):
            value = args.get("sort_index")
            if not _is_int(value):
                self.fail(idx, f"args.sort_index must be an integer, not {value!r}")
        else:  # process_labels: chrome://tracing splits args.labels on commas
            value = args.get("labels")
            if not isinstance(value, str):
                self.fail(idx, f"args.labels must be a string, not {value!r}")
        key = (name, pid, tid)
        if key in self.metadata:
            where = f"pid {pid}" if tid is None else f"pid {pid} tid {tid}"
            self.fail(idx, f"second {name} for {where} (first is event #{self.metadata[key]})")
        self.metadata[key] = idx

    def scan_flow(self, idx: int, event: dict[str, Any], ph: str) -> None:
        name = self.require_str(idx, event, "name")
        cat = self.require_str(idx, event, "cat")
        flow_id = event.get("id")
        if _is_int(flow_id):
            if not 0 <= flow_id < JS_SAFE_INT:
                self.fail(
                    idx,
                    f"flow id {flow_id} must be in 0..2**53-1 (chrome://tracing reads ids as"
                    " JavaScript numbers)",
                )
        elif isinstance(flow_id, str):
            if not HEX_ID.fullmatch(flow_id) or int(flow_id, 16) > 2**64 - 1:
                self.fail(
                    idx,
                    f"string flow id {flow_id!r} must be a 64-bit hexadecimal number"
                    " (Perfetto parses string ids as hex and drops the flow otherwise)",
                )
        else:
            self.fail(idx, f"flow 'id' must be an integer or a hex string, not {flow_id!r}")
        ts = self.require_ts(idx, event)
        pid = self.require_id(idx, event, "pid")
        tid = self.require_id(idx, event, "tid")
        bp = event.get("bp")
        if "bp" in event and bp != "e":
            self.fail(idx, f"binding point 'bp' must be 'e' when present, not {bp!r}")
        if "args" in event and not isinstance(event["args"], dict):
            self.fail(idx, f"'args' must be an object, not {event['args']!r}")
        self.flows.append(_Flow(idx, ph, (pid, tid), ts, cat, name, flow_id, bp))

    # -- pass 2: slices on each thread ---------------------------------------------------------

    def check_tracks(self) -> None:
        for track in sorted(self.tracks):
            slices = sorted(self.tracks[track])  # (ts, -dur, idx): Perfetto's processing order
            self.sorted_tracks[track] = slices
            self.track_keys[track] = [(s.ts, s.neg_dur, s.idx) for s in slices]
            self.check_same_ts_order(slices)
            clash = _first_partial_overlap((s.start, s.end, s) for s in slices)
            if clash is not None:
                outer, inner = clash
                self.fail(
                    inner.idx,
                    f"[{_us(inner.start)}, {_us(inner.end)}] partially overlaps event"
                    f" #{outer.idx} ({_describe(self.events[outer.idx])})"
                    f" [{_us(outer.start)}, {_us(outer.end)}] on pid"
                    f" {track[0]} tid {track[1]}: slices on one thread must nest or be disjoint",
                )
            if any(s.lossy for s in slices):
                self.check_ns_nesting(track, slices)

    def check_same_ts_order(self, slices: list[_Slice]) -> None:
        """At one ts, chrome://tracing makes the earlier event in the file the parent."""
        group_ts: Any = None
        level_dur: Any = None
        level_max = longer_max = -1
        for s in slices:
            if not s.is_complete:
                continue
            if s.ts != group_ts:
                group_ts, level_dur, level_max, longer_max = s.ts, s.neg_dur, s.idx, -1
                continue
            if s.neg_dur != level_dur:
                longer_max = max(longer_max, level_max)
                level_dur, level_max = s.neg_dur, s.idx
            else:
                level_max = max(level_max, s.idx)
            if longer_max > s.idx:
                self.fail(
                    s.idx,
                    f"starts at ts={s.ts} like the longer slice #{longer_max} but comes before"
                    " it in the file; chrome://tracing breaks same-ts ties by file order, so"
                    " the enclosing slice must be written first",
                )

    def check_ns_nesting(self, track: tuple[int, int], slices: list[_Slice]) -> None:
        by_ns = sorted(slices, key=lambda s: (s.ts_ns, -s.dur_ns, s.idx))
        clash = _first_partial_overlap((s.ts_ns, s.ts_ns + s.dur_ns, s) for s in by_ns)
        if clash is None:
            return
        first, second = clash
        self.fail(
            second.idx,
            f"partially overlaps event #{first.idx} on pid {track[0]} tid {track[1]} once"
            " Perfetto truncates ts and dur to whole nanoseconds"
            f" ([{second.ts_ns}, {second.ts_ns + second.dur_ns}] ns vs"
            f" [{first.ts_ns}, {first.ts_ns + first.dur_ns}] ns); write ts and dur with at most"
            " three decimals",
        )

    # -- pass 3: flows -------------------------------------------------------------------------

    def check_flows(self) -> None:
        starts: dict[tuple[str, str, type, int | str], _Flow] = {}
        by_js_id: dict[str, int] = {}
        by_perfetto_id: dict[tuple[str, str, int], int] = {}
        for flow in self.flows:
            if flow.ph != "s":
                continue
            js_id = flow.id if isinstance(flow.id, str) else str(flow.id)
            perfetto_id = (flow.cat, flow.name, _perfetto_id(flow.id))
            if js_id in by_js_id:
                self.fail(
                    flow.idx,
                    f"duplicate flow id {flow.id!r}: flow start #{by_js_id[js_id]} uses it too"
                    " (chrome://tracing keys flows by id alone, Perfetto never reuses one)",
                )
            if perfetto_id in by_perfetto_id:
                self.fail(
                    flow.idx,
                    f"duplicate flow: flow start #{by_perfetto_id[perfetto_id]} has the same"
                    f" cat, name and id once Perfetto reads id {flow.id!r} as hex",
                )
            by_js_id[js_id] = by_perfetto_id[perfetto_id] = flow.idx
            starts[_flow_key(flow)] = flow
        ends: dict[int, _Flow] = {}
        for flow in self.flows:
            if flow.ph == "s":
                continue
            start = starts.get(_flow_key(flow))
            if start is None:
                self.fail(
                    flow.idx,
                    f"flow {'end' if flow.ph == 'f' else 'step'} without a flow start ('s' with"
                    f" cat={flow.cat!r}, name={flow.name!r}, id={flow.id!r})",
                )
            if (flow.ts, flow.idx) < (start.ts, start.idx):
                self.fail(
                    flow.idx,
                    f"comes before its flow start #{start.idx} (ts {flow.ts} < {start.ts}, or"
                    " equal ts and earlier in the file); both viewers drop it",
                )
            if flow.ph == "f":
                if start.idx in ends:
                    self.fail(
                        flow.idx,
                        f"second flow end for flow start #{start.idx} (first is"
                        f" #{ends[start.idx].idx})",
                    )
                ends[start.idx] = flow
        for flow in self.flows:
            if flow.ph == "s" and flow.idx not in ends:
                self.fail(
                    flow.idx,
                    f"flow start without a flow end ('f' with cat={flow.cat!r},"
                    f" name={flow.name!r}, id={flow.id!r})",
                )
        for flow in self.flows:
            if flow.ph == "t":
                end = ends[starts[_flow_key(flow)].idx]
                if (flow.ts, flow.idx) > (end.ts, end.idx):
                    self.fail(flow.idx, f"flow step comes after its flow end #{end.idx}")
        for flow in self.flows:
            self.check_binding(flow)

    def check_binding(self, flow: _Flow) -> None:
        slices = self.sorted_tracks.get(flow.track, [])
        keys = self.track_keys.get(flow.track, [])
        where = f"pid {flow.track[0]} tid {flow.track[1]}"
        position = bisect.bisect_left(keys, (flow.ts, 0, flow.idx))
        if flow.ph != "f" or flow.bp == "e":
            if position == 0:
                self.fail(
                    flow.idx,
                    f"binds to no slice: nothing on {where} has started by ts={flow.ts}",
                )
            bound = slices[position - 1]
            if _to_ns(flow.ts)[1] > bound.end:
                self.fail(
                    flow.idx,
                    f"binds to no enclosing slice: Perfetto attaches it to the slice that started"
                    f" last on {where}, event #{bound.idx} [{_us(bound.start)}, {_us(bound.end)}],"
                    f" which ended before ts={flow.ts}",
                )
            return
        if "input" in flow.cat or "ipc.flow" in flow.cat:
            self.fail(
                flow.idx,
                f"cat {flow.cat!r} makes chrome://tracing bind this flow end to its enclosing"
                " slice while Perfetto binds it to the next one; add bp 'e'",
            )
        perfetto = slices[position] if position < len(slices) else None
        if perfetto is None:
            self.fail(
                flow.idx,
                f"binds to no slice: no slice starts on {where} after ts={flow.ts}"
                " (without bp 'e' a flow end binds to the next slice)",
            )
        if _catapult_next_slice(slices, keys, flow) is not perfetto:
            self.fail(
                flow.idx,
                f"ambiguous flow end: a slice starts on {where} at its ts={flow.ts} later in"
                " the file, which chrome://tracing binds but Perfetto skips; use bp 'e' or"
                " write the flow end after that slice",
            )

    # -- pass 4: names for every process and thread with slices --------------------------------

    def check_metadata(self) -> None:
        for pid, idx in sorted(self.first_x_of_pid.items(), key=lambda item: item[1]):
            if ("process_name", pid, None) not in self.metadata:
                self.fail(idx, f"pid {pid} has slices but no process_name metadata event")
        for (pid, tid), idx in sorted(self.first_x_of_track.items(), key=lambda item: item[1]):
            if ("thread_name", pid, tid) not in self.metadata:
                self.fail(idx, f"pid {pid} tid {tid} has slices but no thread_name metadata event")


def _flow_key(flow: _Flow) -> tuple[str, str, type, int | str]:
    return (flow.cat, flow.name, type(flow.id), flow.id)


def _perfetto_id(flow_id: int | str) -> int:
    return int(flow_id, 16) if isinstance(flow_id, str) else flow_id


def _first_partial_overlap(
    items: Iterable[tuple[Any, Any, _Slice]],
) -> tuple[_Slice, _Slice] | None:
    """Sweep (start, end, slice) sorted by start, longest first: a slice must end by the end of
    the innermost slice still open when it starts. Return (open, offending) slices or None."""
    open_ends: list[Any] = []
    open_slices: list[_Slice] = []
    for start, end, item in items:
        while open_ends and open_ends[-1] <= start:
            open_ends.pop()
            open_slices.pop()
        if open_ends and end > open_ends[-1]:
            return open_slices[-1], item
        open_ends.append(end)
        open_slices.append(item)
    return None


def _catapult_next_slice(slices: list[_Slice], keys: list[Any], flow: _Flow) -> _Slice | None:
    """The slice chrome://tracing binds a flow end without bp to: the first, by (ts, file
    order), that starts after ts, or at ts and later in the file than the flow end."""
    lo = bisect.bisect_left(keys, (flow.ts, -math.inf))
    hi = bisect.bisect_left(keys, (flow.ts, math.inf))
    same_ts_later = [s for s in slices[lo:hi] if s.idx > flow.idx]
    if same_ts_later:
        return min(same_ts_later, key=lambda s: s.idx)
    if hi == len(slices):
        return None
    next_ts = slices[hi].ts
    group_end = bisect.bisect_left(keys, (next_ts, math.inf))
    return min(slices[hi:group_end], key=lambda s: s.idx)
