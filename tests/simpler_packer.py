"""Writers of simpler's chip swimlane artefacts, as its producers lay them out (see
``multicore_profiler/ingest/import_simpler.py``): ``chip_swimlane_records.json``,
``deps.json`` (u64 values as strings) and the merged Perfetto JSON's AICore View. Also a
large synthetic records file for the benchmark, and a plain decode baseline."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson


def task_token(ring: int, local: int) -> int:
    """simpler's 64-bit task id: the ring above the 32-bit local id."""
    return ring << 32 | local


def records_document(
    core_types: Sequence[str],
    rows: Sequence[Sequence[int | str]],
    *,
    clock_freq_hz: int | None = 50_000_000,
    level: int = 1,
) -> dict[str, Any]:
    """A ``chip_swimlane_records.json`` document: ``rows`` are ``aicore_tasks`` rows
    ``[core_id, task_token_raw, reg_task_id, start, end, (receive_to_start, (run_epoch))]``."""
    metadata: dict[str, Any] = {
        "runtime": "tensormap_and_ringbuffer",
        "num_cores": len(core_types),
        "core_types": list(core_types),
    }
    if clock_freq_hz is not None:
        metadata["clock_freq_hz"] = clock_freq_hz
    return {
        "chip_swimlane_level": level,
        "metadata": metadata,
        "aicore_tasks": [list(r) for r in rows],
        "scheduler_tasks": {"producer": "aicpu", "records": []},
    }


def deps_document(
    tasks: dict[int, Sequence[int]], edges: Sequence[tuple[int, int]]
) -> dict[str, Any]:
    """A ``deps.json``: each task's kernel ids (AIC, AIV0, AIV1), and (pred, succ) edges;
    u64 values as strings, as dep_gen writes them."""
    return {
        "runtime": "tensormap_and_ringbuffer",
        "tasks": [
            {"task_id": str(t), "scope": "auto", "kernel_ids": list(k), "block_num": 1, "args": []}
            for t, k in tasks.items()
        ],
        "tensors": [],
        "edges": [
            {"pred": str(p), "succ": str(s), "arg": 0, "source": "tensormap", "flags": ["wait"]}
            for p, s in edges
        ],
    }


def merged_document(
    tasks: Sequence[tuple[str, int, int, int, float, float]],
    edges: Sequence[tuple[int, int]] = (),
) -> dict[str, Any]:
    """A merged swimlane's AICore View: ``tasks`` are (kernel name, func id, task id, core
    id, ts µs, dur µs), on tracks named ``AIC_n`` (core < 24) or ``AIV_n``; each edge
    (pred index, succ index) a ``dependency`` flow bound to the two slices by their ``id``."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "AICore View"}}
    ]
    for core in sorted({t[3] for t in tasks}):
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": 1,
                "tid": 10000 + 10 * core,
                "args": {"name": f"{'AIC' if core < 24 else 'AIV'}_{core}"},
            }
        )
    for n, (name, func, task, core, ts, dur) in enumerate(tasks):
        label = f"r{task >> 32}t{task & 0xFFFFFFFF}"
        events.append(
            {
                "args": {
                    "event-hint": f"Task:{label}, FuncId:{func}, CoreId:{core}",
                    "duration-us": dur,
                    "taskId": task,
                },
                "cat": "event",
                "id": n,
                "name": f"{name}({label})",
                "ph": "X",
                "pid": 1,
                "tid": 10000 + 10 * core,
                "ts": ts,
                "dur": dur,
            }
        )
    for flow, (pred, succ) in enumerate(edges):
        p, s = tasks[pred], tasks[succ]
        events.append(
            {
                "cat": "flow",
                "id": flow,
                "name": "dependency",
                "ph": "s",
                "pid": 1,
                "tid": 10000 + 10 * p[3],
                "ts": p[4] + p[5],
                "bind_id": pred,
            }
        )
        events.append(
            {
                "cat": "flow",
                "id": flow,
                "name": "dependency",
                "ph": "f",
                "pid": 1,
                "tid": 10000 + 10 * s[3],
                "ts": s[4],
                "bp": "e",
                "bind_id": succ,
            }
        )
    return {"traceEvents": events}


def perf_swimlane_document(
    tasks: Sequence[tuple[int, int, int, str, float, float, Sequence[int]]],
) -> dict[str, Any]:
    """The early ``perf_swimlane_*.json``: ``tasks`` are (task id, func id, core id, core
    type, start µs, end µs, fanout task ids)."""
    return {
        "version": 1,
        "tasks": [
            {
                "task_id": t, "func_id": f, "core_id": c, "core_type": kind,
                "start_time_us": s, "end_time_us": e, "duration_us": e - s,
                "kernel_ready_time_us": s, "fanout": list(out), "fanout_count": len(out),
            }
            for t, f, c, kind, s, e, out in tasks
        ],
    }  # fmt: skip


def write_json(path: Path, document: Any) -> Path:
    path.write_bytes(orjson.dumps(document))
    return path


def write_synthetic(path: Path, records: int, *, cores: int = 72, seed: int = 0) -> int:
    """A large ``chip_swimlane_records.json`` of ``records`` AICore tasks (24 AIC cores,
    then AIV, each running its tasks back to back on the 50 MHz counter); returns the
    number of records written."""
    rng = np.random.default_rng(seed)
    core = np.arange(records, dtype=np.int64) % cores
    per_core = np.arange(records, dtype=np.int64) // cores
    duration = rng.integers(50, 5000, records)
    gap = rng.integers(10, 200, records)
    order = np.lexsort((per_core, core))
    start = np.empty(records, np.int64)
    span = (duration + gap)[order]
    ends = np.cumsum(span)
    firsts = np.r_[True, core[order][1:] != core[order][:-1]]
    base = np.maximum.accumulate(np.where(firsts, ends - span, 0))
    start[order] = 1_000_000 + ends - span - base
    rows = np.stack(
        [
            core,
            np.arange(records),
            per_core,
            start,
            start + duration,
            gap // 2,
            np.zeros(records, np.int64),
        ],
        axis=1,
    )
    types = ["aic" if c < 24 else "aiv" for c in range(cores)]
    write_json(path, records_document(types, rows.tolist(), level=2))
    return records


def numpy_decode(path: Path) -> dict[str, np.ndarray]:
    """The plain baseline: parse the file and hold ``aicore_tasks`` as numpy columns, with no
    mapping to the store (what any importer costs at least)."""
    rows = np.array(orjson.loads(path.read_bytes())["aicore_tasks"], np.uint64)
    names = (
        "core_id",
        "task_token_raw",
        "reg_task_id",
        "start",
        "end",
        "receive_to_start",
        "run_epoch",
    )
    return {name: rows[:, i] for i, name in enumerate(names[: rows.shape[1]])}
