"""simpler (hw-native-sys/simpler, Ascend) chip swimlane captures into the store.

Three artefacts, told apart by content:
- ``chip_swimlane_records.json`` (raw): ``metadata`` (``clock_freq_hz``, ``core_types``)
  and ``aicore_tasks`` rows ``[core_id, task_token_raw, reg_task_id, start, end,
  receive_to_start, run_epoch]`` (7 columns at HEAD, 6 before ``run_epoch``, 5 in v2
  files), cycles of the chip's system counter, u64 values as numbers or strings. Each
  ``run_epoch`` is one launch. Its dependency edges come from ``deps.json`` (``--deps``).
- ``merged_swimlane.json`` (swimlane_converter's Perfetto JSON): the "AICore View"
  process's task slices (``args.taskId``, ``FuncId`` in ``event-hint``) on tracks named
  ``AIC_n`` / ``AIV_n``, and ``dependency`` flows whose ``bind_id`` name the task slices.
  Times are µs; they become cycles of the 50 MHz a2a3 counter (or ``--freq-mhz``) and must
  lie on its tick.
- the early ``perf_swimlane_*.json`` (``{"version": 1, "tasks": [...]}``, per task
  ``task_id``, ``func_id``, ``core_id``, ``core_type``, ``start_time_us``, ``end_time_us``
  and the runtime's own ``fanout`` list of successors): µs as in the merged swimlane.
- the ``fully_distributed_within_core`` engine's swimlane JSON: per slice ``args``
  ``{task_id, func_id, core, mc, name}``, tid 0/1/2 = AIC/AIV0/AIV1; times are µs of the
  host's steady clock, kept as ns (1 GHz).

Each AICore task becomes one compute record of its core (``block_id`` = the core id,
``core_type`` AIC/AIV), ``desc_id`` = its func id, ``task_id`` = the low 32 bits (the local
id) of simpler's 64-bit task id; a launch where two tasks share a local id is refused. A
producer's dependency edges become the launch's task graph: a ``tasks`` row per task whose
``depends_on`` lists its predecessors (see ``storage/schema.py``), never wait records.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from itertools import chain
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pyarrow as pa

from multicore_profiler.abi import NO_OWNER, CoreType
from multicore_profiler.errors import ImportFormatError
from multicore_profiler.ingest.imported import ImportedInvocation, phase_column
from multicore_profiler.ingest.imports import ImportOptions
from multicore_profiler.ingest.mapped_file import MappedFile
from multicore_profiler.storage.schema import TASKS

A2A3_HZ = 50e6
"""The a2a3 system counter, which merged swimlane µs were converted from."""
HOST_NS_HZ = 1e9
"""The dist engine's host ``steady_clock`` µs, kept as ns."""
NO_FUNC = 0xFFFF
"""``desc_id`` of a task whose func id the file does not say (raw records without deps)."""
CHUNK = 1 << 20
ROWS_CHUNK_BYTES = 4 << 20
"""``aicore_tasks`` text decoded at once: its rows are Python lists only a chunk at a time."""
_LOW32 = np.uint64(0xFFFFFFFF)
_CORE_TYPES = {"aic": CoreType.AIC, "aiv": CoreType.AIV}
_TRACK = re.compile(r"^(AIC|AIV)_(\d+)$")
_FUNC = re.compile(r"FuncId:\s*(-?\d+)")
_SUFFIX = re.compile(r"\([^()]*\)$")


def read(path: Path, options: ImportOptions) -> Iterator[ImportedInvocation]:
    """The launches of one simpler artefact (see the module's docstring)."""
    source = str(path)
    streamed = _streamed_records(path, source, options)
    if streamed is not None:
        yield from _raw_launches(*streamed, source, options)
        return
    document = load_json(path)
    if isinstance(document, dict) and "aicore_tasks" in document:
        meta = _raw_meta(document.get("metadata"), source, options)
        rows = _task_rows(document["aicore_tasks"], source)
        yield from _raw_launches(*meta, rows, source, options)
    elif isinstance(document, dict) and document.get("version") == 1 and "tasks" in document:
        yield _fanout_launch(document["tasks"], source, options)
    elif isinstance(document, dict) and "edges" in document and "tasks" in document:
        raise ImportFormatError(
            f"{source}: is a deps.json (a task graph, no timing); give it "
            "with --deps beside its chip_swimlane_records.json"
        )
    else:
        events = _events(document, source)
        if any(_args(e).keys() >= {"task_id", "func_id", "core"} for e in events):
            yield _dist_launch(events, source, options)
        else:
            yield _merged_launch(events, source, options)


def load_json(path: Path) -> Any:
    """The parsed document; ``ImportFormatError`` naming the byte where it breaks."""
    data = path.read_bytes()
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as error:
        at = len(error.doc[: error.pos].encode()) if isinstance(error.doc, str) else error.pos
        raise ImportFormatError(
            f"{path}: not valid JSON at byte {at} of {len(data)}: {error.msg}"
        ) from None


def _events(document: Any, source: str) -> list[dict[str, Any]]:
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ImportFormatError(
            f"{source}: no simpler artefact: neither aicore_tasks (chip_swimlane_records.json) "
            "nor a traceEvents list (merged_swimlane.json, dist engine swimlane)"
        )
    return events


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


# --- raw chip_swimlane_records.json ----------------------------------------------------


class _RawHead(msgspec.Struct):
    """A raw file's top level, its ``aicore_tasks`` left as text (its other keys skipped)."""

    metadata: Any = None
    aicore_tasks: msgspec.Raw = msgspec.Raw()


_HEAD = msgspec.json.Decoder(_RawHead)
_ROWS = msgspec.json.Decoder(list[list[int | str]])


def _streamed_records(
    path: Path, source: str, options: ImportOptions
) -> tuple[list[str], float, np.ndarray] | None:
    """A raw file's core types, frequency and ``aicore_tasks`` rows, read from a memory
    map with the rows decoded a chunk of text at a time (``ROWS_CHUNK_BYTES``, cut after a
    row's ``]``: a cut inside a string leaves the chunk undecodable), so that memory holds
    the rows as numbers, not the file nor a Python object per value. None where the file
    is no raw file, or anything in it is off: the whole-document reader then reads it (and
    names what is wrong)."""
    if path.stat().st_size == 0:
        return None
    mapped = MappedFile(path)
    try:
        head = _HEAD.decode(mapped.array(np.uint8).data)
    except msgspec.MsgspecError:
        return None
    mapped.release()
    text = memoryview(head.aicore_tasks)
    if len(text) < 2 or text[0] != ord("[") or text[-1] != ord("]"):
        return None
    meta = _raw_meta(head.metadata, source, options)
    body = np.frombuffer(text, np.uint8)[1:-1]
    tables, at = [], 0
    while at < len(body):
        cut, size = 0, ROWS_CHUNK_BYTES
        while not cut:  # after the window's last "]" (the rest at the end; none: widen it)
            ends = np.flatnonzero(body[at : at + size] == ord("]"))
            if at + size >= len(body):
                cut = len(body)
            elif len(ends):
                cut = at + int(ends[-1]) + 1
            size *= 2
        try:
            rows = _ROWS.decode(b"[" + body[at:cut].tobytes().lstrip(b" \t\r\n,") + b"]")
        except msgspec.MsgspecError:
            return None
        mapped.release()
        if rows:
            tables.append(_task_rows(rows, source))
            if tables[-1].shape[1] != tables[0].shape[1]:
                return None  # rows of two widths: the whole-document reader names them
        at = cut
    if not tables:
        return None
    table = np.concatenate(tables)
    tables.clear()
    return (*meta, table)


def _raw_meta(meta: Any, source: str, options: ImportOptions) -> tuple[list[str], float]:
    """A raw file's core types (one per core id) and the counter's frequency."""
    meta = meta or {}
    types = meta.get("core_types")
    if not isinstance(types, list) or any(t not in _CORE_TYPES for t in types):
        raise ImportFormatError(f"{source}: metadata.core_types must list 'aic'/'aiv' per core")
    frequency = options.frequency_hz or meta.get("clock_freq_hz")
    if frequency is None:
        raise ImportFormatError(f"{source}: metadata has no clock_freq_hz; give --freq-mhz")
    return types, float(frequency)


def _task_rows(rows: Any, source: str) -> np.ndarray:
    """``aicore_tasks`` rows (all of 5, 6 or 7 columns) as a ``uint64`` matrix."""
    if not isinstance(rows, list) or not rows:
        raise ImportFormatError(f"{source}: aicore_tasks holds no task")
    widths = {len(r) if isinstance(r, list) else -1 for r in rows}
    if len(widths) != 1 or next(iter(widths)) not in (5, 6, 7):
        raise ImportFormatError(
            f"{source}: aicore_tasks rows must all have 5, 6 or 7 columns, found {sorted(widths)}"
        )
    return _u64_rows(rows, next(iter(widths)), source)


def _raw_launches(
    types: list[str], frequency: float, table: np.ndarray, source: str, options: ImportOptions
) -> Iterator[ImportedInvocation]:
    core = table[:, 0]
    if int(core.max()) >= len(types):
        at = int(np.argmax(core >= len(types)))
        raise ImportFormatError(
            f"{source}: aicore_tasks row {at}: core {int(core[at])} is beyond core_types "
            f"({len(types)} cores)"
        )
    core_type = np.array([int(_CORE_TYPES[t]) for t in types], np.uint8)[core.astype(np.int64)]
    epochs = table[:, 6] if table.shape[1] == 7 else np.zeros(len(table), np.uint64)
    by_key = np.lexsort((table[:, 2], core, epochs))
    same = (np.diff(epochs[by_key]) == 0) & (np.diff(core[by_key]) == 0)
    same &= np.diff(table[by_key, 2].astype(np.int64)) == 0
    if same.any():
        e, c, r = (int(v[by_key[np.argmax(same)]]) for v in (epochs, core, table[:, 2]))
        raise ImportFormatError(
            f"{source}: aicore_tasks has 2 rows of core {c}, reg_task_id {r} (run_epoch {e}); "
            "the join key must be unique"
        )
    graph = _deps(options.dependencies) if options.dependencies is not None else None
    launches = _distinct(epochs)
    for epoch in launches:
        rows_of = np.flatnonzero(epochs == epoch) if len(launches) > 1 else slice(None)
        part = table[rows_of]  # one launch: a view, not a copy
        task64 = part[:, 1]
        desc = np.full(len(part), NO_FUNC, np.uint32)
        names: dict[int, str] = {NO_FUNC: "aicore_task"}
        edges = None
        if graph is not None:
            desc = _funcs(graph, task64, core_type[rows_of], options.dependencies)
            names = {}
            edges = graph.edges
        yield _launch(
            source=f"{source} (run_epoch {int(epoch)})" if table.shape[1] == 7 else source,
            producer_format="chip_swimlane_records",
            frequency=float(frequency),
            core_type=core_type[rows_of],
            block_id=core[rows_of].astype(np.uint32),
            start=part[:, 3],
            end=part[:, 4],
            task64=task64,
            desc=desc,
            names=names,
            edges=edges,
            options=options,
        )


def _u64_rows(rows: list[Any], width: int, source: str) -> np.ndarray:
    """The rows as a ``uint64`` matrix: straight from the ints where all are ints, else
    (u64 values written as strings) through numpy's own parsing."""
    try:
        flat = np.fromiter(chain.from_iterable(rows), np.uint64, count=len(rows) * width)
    except (ValueError, OverflowError, TypeError):
        try:
            return np.array(rows, dtype=np.uint64)
        except (ValueError, OverflowError, TypeError) as error:
            raise ImportFormatError(
                f"{source}: aicore_tasks holds a non-u64 value: {error}"
            ) from None
    return flat.reshape(len(rows), width)


class _Graph:
    """deps.json: task ids with their kernel ids (AIC, AIV0, AIV1), and edges (pred, succ)."""

    def __init__(self, tasks: dict[int, list[int]], edges: np.ndarray) -> None:
        self.tasks = tasks
        self.edges = edges


def _deps(path: Path) -> _Graph:
    document = load_json(path)
    if not isinstance(document, dict) or not isinstance(document.get("edges"), list):
        raise ImportFormatError(f"{path}: no deps.json: it has no edges list")
    try:
        tasks = {
            int(t["task_id"]): [int(k) for k in t.get("kernel_ids", [])]
            for t in document.get("tasks", [])
        }
        edges = np.array(
            [(int(e["pred"]), int(e["succ"])) for e in document["edges"]], np.uint64
        ).reshape(-1, 2)
    except (KeyError, TypeError, ValueError) as error:
        raise ImportFormatError(f"{path}: a task or edge lacks its ids: {error!r}") from None
    return _Graph(tasks, edges)


def _funcs(
    graph: _Graph, task64: np.ndarray, core_type: np.ndarray, path: Path | None
) -> np.ndarray:
    """Each record's func id: its task's kernel id for its core type in deps.json (AIC:
    kernel_ids[0], AIV: the first of kernel_ids[1:] that is set), as swimlane_converter
    resolves it."""
    out = np.empty(len(task64), np.uint32)
    for i, (task, kind) in enumerate(zip(task64.tolist(), core_type.tolist(), strict=True)):
        kernels = graph.tasks.get(task)
        if kernels is None:
            raise ImportFormatError(f"{path}: names no task {task}, which ran on the AICores")
        options = kernels[:1] if kind == CoreType.AIC else [k for k in kernels[1:] if k >= 0][:1]
        if not options or not 0 <= options[0] < NO_FUNC:
            raise ImportFormatError(f"{path}: task {task} has no kernel id for its core type")
        out[i] = options[0]
    return out


# --- merged_swimlane.json ------------------------------------------------------------


def _merged_launch(
    events: list[dict[str, Any]], source: str, options: ImportOptions
) -> ImportedInvocation:
    processes = {
        e.get("pid"): _args(e).get("name")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    aicore = [pid for pid, name in processes.items() if name == "AICore View"]
    if not aicore:
        raise ImportFormatError(
            f"{source}: no simpler artefact: no AICore View process and no dist engine tasks"
        )
    tracks = {
        (e.get("pid"), e.get("tid")): _args(e).get("name")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    slices = [
        (n, e)
        for n, e in enumerate(events)
        if e.get("ph") == "X" and e.get("pid") == aicore[0] and "taskId" in _args(e)
    ]
    if not slices:
        raise ImportFormatError(f"{source}: the AICore View holds no task")
    kinds, cores, funcs, names = [], [], [], {}
    for n, event in slices:
        match = _TRACK.match(str(tracks.get((event.get("pid"), event.get("tid")))))
        if match is None:
            raise ImportFormatError(
                f"{source}: event {n}: its track {event.get('tid')} is named neither "
                "AIC_n nor AIV_n"
            )
        kinds.append(int(CoreType[match[1]]))
        cores.append(int(match[2]))
        func = _FUNC.search(str(_args(event).get("event-hint", "")))
        func_id = int(func[1]) if func is not None and int(func[1]) >= 0 else NO_FUNC
        if func_id > NO_FUNC:
            raise ImportFormatError(f"{source}: event {n}: func id {func_id} is beyond 0xFFFF")
        name = _SUFFIX.sub("", str(event.get("name", ""))) or "aicore_task"
        if names.setdefault(func_id, name) != name:
            raise ImportFormatError(
                f"{source}: event {n}: func id {func_id} is named {name!r} and {names[func_id]!r}"
            )
        funcs.append(func_id)
    task64 = _u64([_args(e)["taskId"] for _, e in slices], source, "taskId")
    frequency = options.frequency_hz or A2A3_HZ
    start = _ticks(
        np.array([e.get("ts") for _, e in slices], np.float64), frequency, source, slices, "ts"
    )
    dur = _ticks(
        np.array([e.get("dur") for _, e in slices], np.float64), frequency, source, slices, "dur"
    )
    by_event = {e["id"]: t for (_, e), t in zip(slices, task64.tolist(), strict=True) if "id" in e}
    by_event.update(
        (e["id"], int(_args(e)["taskId"]))
        for e in events
        if e.get("ph") == "X" and "id" in e and "taskId" in _args(e)
    )
    edges = _flow_edges(events, by_event, source)
    if options.dependencies is not None:
        edges = _deps(options.dependencies).edges
    return _launch(
        source=source,
        producer_format="merged_swimlane",
        frequency=frequency,
        core_type=np.array(kinds, np.uint8),
        block_id=np.array(cores, np.uint32),
        start=start,
        end=start + dur,
        task64=task64,
        desc=np.array(funcs, np.uint32),
        names=names,
        edges=edges,
        options=options,
    )


def _flow_edges(
    events: list[dict[str, Any]], by_event: Mapping[int, int], source: str
) -> np.ndarray | None:
    """The (pred, succ) task ids of the ``dependency`` flows: each flow's start binds its
    predecessor's slice, its finish its successor's (``bind_id`` = the slice's ``id``).
    None where the file has no dependency flow."""
    ends: dict[tuple[Any, str], int] = {}
    pairs = []
    for n, event in enumerate(events):
        if event.get("name") != "dependency" or event.get("ph") not in ("s", "f"):
            continue
        bound = by_event.get(event.get("bind_id"))
        if bound is None:
            raise ImportFormatError(
                f"{source}: event {n}: dependency flow {event.get('id')} binds "
                f"{event.get('bind_id')!r}, which is no task slice"
            )
        other = ends.pop((event.get("id"), "f" if event["ph"] == "s" else "s"), None)
        if other is None:
            ends[(event.get("id"), event["ph"])] = bound
        else:
            pairs.append((bound, other) if event["ph"] == "s" else (other, bound))
    if ends:
        flow, ph = next(iter(ends))
        raise ImportFormatError(f"{source}: dependency flow {flow} has a '{ph}' and no partner")
    return np.array(pairs, np.uint64).reshape(-1, 2) if pairs else None


# --- early perf_swimlane (version 1, per-task fanout) --------------------------------


def _fanout_launch(tasks: Any, source: str, options: ImportOptions) -> ImportedInvocation:
    if not isinstance(tasks, list) or not tasks:
        raise ImportFormatError(f"{source}: tasks holds no task")
    try:
        task64 = _u64([t["task_id"] for t in tasks], source, "task_id")
        kinds = np.array([int(_CORE_TYPES[t["core_type"]]) for t in tasks], np.uint8)
        cores = np.array([t["core_id"] for t in tasks], np.int64)
        funcs = np.array([t["func_id"] for t in tasks], np.int64)
        begin = np.array([t["start_time_us"] for t in tasks], np.float64)
        finish = np.array([t["end_time_us"] for t in tasks], np.float64)
        edges = [(int(t["task_id"]), int(s)) for t in tasks for s in t.get("fanout", [])]
    except (KeyError, TypeError, ValueError) as error:
        raise ImportFormatError(f"{source}: a task lacks or misstates {error}") from None
    if (cores < 0).any() or ((funcs < 0) | (funcs >= NO_FUNC)).any():
        at = int(np.argmax((cores < 0) | (funcs < 0) | (funcs >= NO_FUNC)))
        raise ImportFormatError(f"{source}: task {at}: core or func id out of range")
    frequency = options.frequency_hz or A2A3_HZ
    where = [(n, None) for n in range(len(tasks))]
    start = _ticks(begin, frequency, source, where, "start_time_us")
    end = _ticks(finish, frequency, source, where, "end_time_us")
    return _launch(
        source=source,
        producer_format="perf_swimlane",
        frequency=frequency,
        core_type=kinds,
        block_id=cores.astype(np.uint32),
        start=start,
        end=end,
        task64=task64,
        desc=funcs.astype(np.uint32),
        names={},
        edges=np.array(edges, np.uint64).reshape(-1, 2),
        options=options,
    )


# --- dist engine swimlane ------------------------------------------------------------


def _dist_launch(
    events: list[dict[str, Any]], source: str, options: ImportOptions
) -> ImportedInvocation:
    slices = [(n, e) for n, e in enumerate(events) if e.get("ph") == "X"]
    if not slices:
        raise ImportFormatError(f"{source}: the dist engine swimlane holds no task")
    try:
        tid = np.array([e["tid"] for _, e in slices], np.int64)
        core = np.array([_args(e)["core"] for _, e in slices], np.int64)
        func = np.array([_args(e)["func_id"] for _, e in slices], np.int64)
        task = [_args(e)["task_id"] for _, e in slices]
    except (KeyError, TypeError, ValueError) as error:
        raise ImportFormatError(f"{source}: a task slice lacks {error}") from None
    if ((tid < 0) | (tid > 2)).any() or (core < 0).any() or ((func < 0) | (func >= NO_FUNC)).any():
        at = int(np.argmax((tid < 0) | (tid > 2) | (core < 0) | (func < 0) | (func >= NO_FUNC)))
        raise ImportFormatError(
            f"{source}: event {slices[at][0]}: tid {tid[at]} (0/1/2 = AIC/AIV0/AIV1), core "
            f"{core[at]} or func id {func[at]} out of range"
        )
    names = {}
    for (_, event), f in zip(slices, func.tolist(), strict=True):
        names.setdefault(f, str(_args(event).get("name") or f"f{f}"))
    frequency = options.frequency_hz or HOST_NS_HZ
    start = _ticks(
        np.array([e.get("ts") for _, e in slices], np.float64), frequency, source, slices, "ts"
    )
    dur = _ticks(
        np.array([e.get("dur") for _, e in slices], np.float64), frequency, source, slices, "dur"
    )
    return _launch(
        source=source,
        producer_format="dist_swimlane",
        frequency=frequency,
        core_type=np.where(tid == 0, int(CoreType.AIC), int(CoreType.AIV)).astype(np.uint8),
        block_id=core.astype(np.uint32),
        start=start,
        end=start + dur,
        task64=_u64(task, source, "task_id"),
        desc=func.astype(np.uint32),
        names=names,
        edges=_deps(options.dependencies).edges if options.dependencies is not None else None,
        options=options,
    )


# --- shared --------------------------------------------------------------------------


def _u64(values: list[Any], source: str, what: str) -> np.ndarray:
    try:
        return np.array(values, np.uint64)
    except (ValueError, OverflowError, TypeError) as error:
        raise ImportFormatError(f"{source}: a {what} is no u64: {error}") from None


def _ticks(
    us: np.ndarray, frequency: float, source: str, slices: list[tuple[int, Any]], what: str
) -> np.ndarray:
    """µs as counter ticks, exactly: each value must be a whole number of ticks (within a
    thousandth of a tick, the float noise of the converter's own division)."""
    ticks = us * (frequency / 1e6)
    whole = np.rint(ticks)
    off = ~np.isfinite(ticks) | (np.abs(ticks - whole) > 1e-3) | (whole < 0)
    if off.any():
        at = int(np.argmax(off))
        raise ImportFormatError(
            f"{source}: event {slices[at][0]}: {what} {float(us[at])!r} µs is not a whole "
            f"number of ticks of the {frequency / 1e6:g} MHz counter ({1e6 / frequency:g} µs); "
            "give the counter's frequency (--freq-mhz)"
        )
    return whole.astype(np.uint64)


def _launch(
    *,
    source: str,
    producer_format: str,
    frequency: float,
    core_type: np.ndarray,
    block_id: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    task64: np.ndarray,
    desc: np.ndarray,
    names: Mapping[int, str],
    edges: np.ndarray | None,
    options: ImportOptions,
) -> ImportedInvocation:
    """One launch's compute records (and its task graph, where edges are known)."""
    if len(start) == 0:
        raise ImportFormatError(f"{source}: holds no AICore task")
    task_id = _local_ids(task64, source)
    order = np.lexsort((task_id, end, start, block_id, core_type))
    core_key = core_type.astype(np.uint64) << np.uint64(32) | block_id.astype(np.uint64)
    record_index = _rank_within(core_key, order)
    stage_order = np.lexsort((block_id, core_type, start, desc))
    stage_task_index = _rank_within(desc.astype(np.uint64), stage_order)
    config_id = None
    tasks = None
    if edges is not None:
        config_id, tasks = _graph(
            task64, task_id, desc, core_type, block_id, start, edges, source, options
        )

    def chunks() -> Iterator[pa.Table]:
        """The records in core order, ``CHUNK`` rows at a time (made as the writer asks)."""
        for at in range(0, len(order), CHUNK):
            rows = order[at : at + CHUNK]
            yield pa.table(
                {
                    "core_type": pa.array(core_type[rows], pa.uint8()),
                    "block_id": pa.array(block_id[rows], pa.uint32()),
                    "record_index": pa.array(record_index[rows], pa.uint32()),
                    "start_cycle": pa.array(start[rows], pa.uint64()),
                    "end_cycle": pa.array(end[rows], pa.uint64()),
                    "desc_id": pa.array(desc[rows], pa.uint32()),
                    "task_id": pa.array(task_id[rows], pa.uint32()),
                    "stage_task_index": pa.array(stage_task_index[rows], pa.uint32()),
                    "owner_id": pa.array(np.full(len(rows), NO_OWNER, np.uint32)),
                    "phase": phase_column(np.zeros(len(rows), np.int8)),
                }
            )

    return ImportedInvocation(
        kernel_name=options.kernel_name or "simpler",
        frequency_hz=frequency,
        producer="simpler",
        producer_format=producer_format,
        records=chunks(),
        source=source,
        clock_domain="shared",
        stage_names={**names, **options.names},
        rank=options.rank or 0,
        config_id=config_id,
        tasks=tasks,
    )


def _local_ids(task64: np.ndarray, source: str) -> np.ndarray:
    """The low 32 bits of each 64-bit task id; refused where two distinct ids share them."""
    distinct = _distinct(task64)
    low = distinct & _LOW32
    shared = np.sort(low)
    twice = np.flatnonzero(shared[1:] == shared[:-1])
    if twice.size:
        clash = distinct[low == shared[twice[0]]][:2]
        raise ImportFormatError(
            f"{source}: tasks {int(clash[0])} and {int(clash[1])} share the local id "
            f"{int(clash[0]) & 0xFFFFFFFF}; the store's 32-bit task id cannot tell them apart"
        )
    return (task64 & _LOW32).astype(np.uint32)


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending: by a sort (``np.unique`` hashes, 18x slower on 2 M
    distinct u64 in numpy 2.4)."""
    ordered = np.sort(values)
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]]


def _rank_within(group: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each row's position among the rows of its group, in ``order`` (sorted by group)."""
    ranked = np.empty(len(order), np.int64)
    sorted_group = group[order]
    starts = np.flatnonzero(np.r_[True, sorted_group[1:] != sorted_group[:-1]])
    sizes = np.diff(np.r_[starts, len(order)])
    ranked[order] = np.arange(len(order)) - np.repeat(starts, sizes)
    return ranked


def _graph(
    task64: np.ndarray,
    task_id: np.ndarray,
    desc: np.ndarray,
    core_type: np.ndarray,
    block_id: np.ndarray,
    start: np.ndarray,
    edges: np.ndarray,
    source: str,
    options: ImportOptions,
) -> tuple[str, pa.Table]:
    """The launch's task graph as ``tasks`` rows (each task's ``depends_on``): edges checked
    to name recorded tasks and to make no cycle."""
    edges = np.unique(edges, axis=0)
    known = _distinct(task64)
    missing = edges[~np.isin(edges, known)]
    if missing.size:
        raise ImportFormatError(
            f"{source}: the dependency edges name task {int(missing[0])} "
            f"(local id {int(missing[0]) & 0xFFFFFFFF}), which has no AICore record"
        )
    _acyclic(edges, source)
    first = np.lexsort((start, task64))
    first = first[np.r_[True, task64[first][1:] != task64[first][:-1]]]
    ids = task_id[first]
    pred = (edges[:, 0] & _LOW32).astype(np.uint32)
    succ = (edges[:, 1] & _LOW32).astype(np.uint32)
    by_succ = np.lexsort((pred, succ))
    order = np.argsort(ids, kind="stable")
    ids, first = ids[order], first[order]
    position = np.searchsorted(ids, succ[by_succ])
    offsets = np.searchsorted(position, np.arange(len(ids) + 1))
    depends_on = pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(pred[by_succ], pa.uint32())
    )
    digest = hashlib.blake2b(digest_size=8)
    digest.update(ids.tobytes())
    digest.update(np.stack([pred, succ], axis=1).tobytes())
    config_id = f"simpler-{digest.hexdigest()}"
    count = len(ids)
    tasks = pa.table(
        {
            "rank": pa.array(np.full(count, options.rank or 0, np.int32)),
            "config_id": pa.array([config_id] * count, pa.string()),
            "kernel_name": pa.array([options.kernel_name or "simpler"] * count, pa.string()),
            "task_id": pa.array(ids, pa.uint32()),
            "task_type": pa.array(desc[first], pa.uint32()),
            "desc_id": pa.array(desc[first], pa.uint32()),
            "stage_task_index": pa.array(np.zeros(count, np.uint32)),
            "owner_id": pa.array(np.full(count, NO_OWNER, np.uint32)),
            "core_type": pa.array(core_type[first], pa.uint8()),
            "worker": pa.array(block_id[first], pa.uint32()),
            "wait_event": pa.array(np.full(count, -1, np.int32)),
            "wait_count": pa.array(np.zeros(count, np.uint32)),
            "trigger_event": pa.array(np.full(count, -1, np.int32)),
            "tiling_position": pa.array(np.zeros(count, np.uint32)),
            "input_position": pa.array(np.zeros(count, np.uint32)),
            "depends_on": depends_on,
        },
        schema=TASKS.schema,
    )
    return config_id, tasks


def _acyclic(edges: np.ndarray, source: str) -> None:
    """Refuse edges that make a cycle, naming the edges left once every task that can be
    ordered is (those on or behind a cycle)."""
    left = edges
    while len(left):
        has_pred = np.isin(left[:, 0], left[:, 1])
        if has_pred.all():
            shown = ", ".join(f"{int(p)} -> {int(s)}" for p, s in left[:8])
            more = f" and {len(left) - 8} more" if len(left) > 8 else ""
            raise ImportFormatError(
                f"{source}: the dependency edges make a cycle, among {shown}{more}"
            )
        left = left[has_pred]
