"""torch_npu's profiler output folders (``*_ascend_pt``): what each says of its rank.

A rank's folder holds ``profiler_info_N.json`` (its rank), ``profiler_metadata.json``
(the job's ``distributed_args`` and ``parallel_group_info``) and, under
``ASCEND_PROFILER_OUTPUT``, the trace (``trace_view.json``) and msprof's own per-rank
tables: ``step_trace_time.csv`` and ``communication.json``. ``read_rank_folder`` reads
them into a ``RankFolder``: the trace's path where there is one, and a ``RankContext``
holding the rest as the profiler wrote it, the tables as rows (times in the units msprof
writes, named by them), so that SQL can set them beside what the store computes.
"""

from __future__ import annotations

import csv
import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from multicore_profiler.errors import TraceFormatError
from multicore_profiler.ingest.outer_trace import RankContext

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
"""The folder of a rank's exported results."""
TRACES = ("trace_view.json", "trace_view.json.gz")
"""A rank's trace, as torch_npu writes it (and as it is found gzipped)."""
_INFO = re.compile(r"^profiler_info(?:_(\d+))?\.json$")

STEP_COLUMNS = {
    "Computing": "computing_us",
    "Communication(Not Overlapped)": "communication_not_overlapped_us",
    "Overlapped": "overlapped_us",
    "Communication": "communication_us",
    "Free": "free_us",
    "Stage": "stage_us",
    "Bubble": "bubble_us",
    "Communication(Not Overlapped and Exclude Receive)": (
        "communication_not_overlapped_exclude_receive_us"
    ),
    "Preparing": "preparing_us",
}
"""``step_trace_time.csv``'s columns (µs) and their names in the stored rows."""
_TIME_INFO = {
    "Start Timestamp(us)": "start_us",
    "Elapse Time(ms)": "elapse_ms",
    "Transit Time(ms)": "transit_ms",
    "Wait Time(ms)": "wait_ms",
    "Synchronization Time(ms)": "sync_ms",
    "Idle Time(ms)": "idle_ms",
    "Wait Time Ratio": "wait_ratio",
    "Synchronization Time Ratio": "sync_ratio",
}
"""``communication.json``'s ``Communication Time Info`` and the stored names."""
_BANDWIDTH_INFO = {
    "Transit Size(MB)": "size_mb",
    "Transit Time(ms)": "time_ms",
    "Bandwidth(GB/s)": "bandwidth_gbps",
    "Large Packet Ratio": "large_packet_ratio",
    "Size Distribution": "size_distribution",
}
"""``Communication Bandwidth Info`` per transport and the stored names."""


@dataclass(frozen=True)
class RankFolder:
    """One rank's output folder: its rank, its trace (``None`` in a simplified export
    without one) and what the folder says beside the trace."""

    path: Path
    rank: int | None
    trace: Path | None
    context: RankContext


def is_rank_folder(path: Path) -> bool:
    """Whether ``path`` is one rank's output folder."""
    return path.is_dir() and (
        (path / OUTPUT_DIR).is_dir() or any(_INFO.match(p.name) for p in path.iterdir())
    )


def rank_folders(path: Path) -> list[Path]:
    """The rank folders ``path`` names: itself, or those it holds (one per rank)."""
    if is_rank_folder(path):
        return [path]
    found = sorted(child for child in path.iterdir() if is_rank_folder(child))
    if not found:
        raise TraceFormatError(
            f"{path}: neither a profiler output folder (a *_ascend_pt folder holding "
            f"{OUTPUT_DIR} or profiler_info_N.json) nor a folder holding one per rank"
        )
    return found


def _json(path: Path) -> Any:
    """A JSON file's value; refused with its path when it is not JSON."""
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise TraceFormatError(f"{path}: cannot read it as JSON: {exc}") from None


def _info_rank(folder: Path) -> int | None:
    """The rank ``profiler_info_N.json`` gives (its ``rank_id``, else the N of its name)."""
    infos = [(p, _INFO.match(p.name)) for p in sorted(folder.iterdir())]
    infos = [(p, m) for p, m in infos if m]
    if len(infos) > 1:
        names = ", ".join(p.name for p, _ in infos)
        raise TraceFormatError(f"{folder}: several profiler_info files ({names}): one per rank")
    if not infos:
        return None
    path, match = infos[0]
    info = _json(path)
    given = info.get("rank_id") if isinstance(info, dict) else None
    if given is not None and str(given).lstrip("-").isdigit() and int(given) >= 0:
        return int(given)
    return int(match.group(1)) if match.group(1) else None


def _parallel(folder: Path) -> tuple[dict[str, Any] | None, int | None]:
    """The job's parallel layout from ``profiler_metadata.json`` and the rank it names."""
    path = folder / "profiler_metadata.json"
    if not path.is_file():
        return None, None
    metadata = _json(path)
    if not isinstance(metadata, dict):
        raise TraceFormatError(f"{path}: not a JSON object")
    parallel = {
        key: metadata[key]
        for key in ("distributed_args", "parallel_group_info")
        if isinstance(metadata.get(key), dict)
    }
    rank = parallel.get("distributed_args", {}).get("rank")
    return parallel or None, rank if isinstance(rank, int) and rank >= 0 else None


def _number(text: str, path: Path, column: str) -> float | None:
    """A csv cell as a number (empty: ``None``); refused with its place otherwise."""
    if text.strip() == "":
        return None
    try:
        return float(text)
    except ValueError:
        raise TraceFormatError(f"{path}: column {column!r} holds {text!r}, not a number") from None


def _step_rows(path: Path) -> tuple[list[dict[str, Any]], int | None]:
    """``step_trace_time.csv``'s rows and the device its ``Device_id`` names."""
    with path.open(newline="", encoding="utf-8-sig") as file:
        reader = csv.DictReader(file)
        header = reader.fieldnames or []
        missing = [c for c in STEP_COLUMNS if c != "Preparing" and c not in header]
        if missing:
            raise TraceFormatError(f"{path}: not msprof's step_trace_time (no {missing[0]!r})")
        rows, devices = [], set()
        for line in reader:
            row: dict[str, Any] = {"step": (line.get("Step") or "").strip() or None}
            for column, name in STEP_COLUMNS.items():
                row[name] = _number(line.get(column) or "", path, column)
            if (line.get("Device_id") or "").strip().isdigit():
                devices.add(int(line["Device_id"]))
            rows.append(row)
    if len(devices) > 1:
        raise TraceFormatError(f"{path}: several Device_id values {sorted(devices)} for one rank")
    return rows, devices.pop() if devices else None


def _communication_rows(path: Path) -> Iterator[dict[str, Any]]:
    """``communication.json``'s ops (``op@group`` keys; not ``Total Op Info``) as rows."""
    steps = _json(path)
    if not isinstance(steps, dict):
        raise TraceFormatError(f"{path}: not msprof's communication.json (not an object)")
    for step, kinds in steps.items():
        for kind, ops in (kinds or {}).items():
            for key, op in (ops or {}).items():
                if key == "Total Op Info":
                    continue
                name, at, group = key.rpartition("@")
                times = op.get("Communication Time Info") if isinstance(op, dict) else None
                if not at or not isinstance(times, dict):
                    raise TraceFormatError(f"{path}: {step}/{kind}/{key} is not an op@group entry")
                row = {"step": step, "type": kind, "op_name": name, "group_name": group}
                row.update({to: times.get(of) for of, to in _TIME_INFO.items()})
                row["bandwidth"] = {
                    transport: {to: info.get(of) for of, to in _BANDWIDTH_INFO.items()}
                    for transport, info in (op.get("Communication Bandwidth Info") or {}).items()
                }
                yield row


_DB_STEP_COLUMNS = {
    "computing": "computing_us",
    "communication_not_overlapped": "communication_not_overlapped_us",
    "overlapped": "overlapped_us",
    "communication": "communication_us",
    "free": "free_us",
    "stage": "stage_us",
    "bubble": "bubble_us",
    "communication_not_overlapped_and_exclude_receive": (
        "communication_not_overlapped_exclude_receive_us"
    ),
    "preparing": "preparing_us",
}
"""``analysis.db``'s ``StepTraceTime`` columns and the stored names (as the csv's)."""
_DB_TIME_COLUMNS = {
    "start_timestamp": "start_us",
    "elapse_time": "elapse_ms",
    "transit_time": "transit_ms",
    "wait_time": "wait_ms",
    "synchronization_time": "sync_ms",
    "idle_time": "idle_ms",
}
"""``analysis.db``'s ``CommAnalyzerTime`` columns and the stored names (as the json's)."""


def _query(path: Path, sql: str) -> list[dict[str, Any]]:
    """The rows of a query of an SQLite file, opened read-only and immutable (a plain
    read-only open of a WAL-mode file writes side files next to it); none where the file
    lacks the query's table."""
    try:
        with closing(
            sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro&immutable=1", uri=True)
        ) as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute(sql)]
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise TraceFormatError(f"{path}: cannot read it as msprof's database: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise TraceFormatError(f"{path}: cannot read it as msprof's database: {exc}") from None


def _db_outputs(output: Path) -> tuple[dict[str, Any], int | None, int | None]:
    """msprof's tables of a DB export: ``StepTraceTime`` and ``CommAnalyzerTime`` of
    ``analysis.db``, and ``COMMUNICATION_OP`` of ``ascend_pytorch_profiler_N.db`` (each op's
    exact start and end, its step from ``STEP_TIME``); and the rank and device its
    ``RANK_DEVICE_MAP`` names."""
    outputs: dict[str, Any] = {}
    analysis = output / "analysis.db"
    if analysis.is_file():
        steps = _query(analysis, "SELECT * FROM StepTraceTime")
        if steps:
            outputs["step_trace_time"] = [
                {
                    "step": str(row["step"]),
                    **{to: row.get(of) for of, to in _DB_STEP_COLUMNS.items()},
                }
                for row in steps
            ]
        times = _query(analysis, "SELECT * FROM CommAnalyzerTime")
    else:
        times = []
    ops: dict[str, dict[str, Any]] = {
        row["hccl_op_name"]: {
            "step": row["step"],
            "type": row["type"],
            "op_name": row["hccl_op_name"],
            "group_name": row["group_name"],
            **{to: row[of] for of, to in _DB_TIME_COLUMNS.items()},
        }
        for row in times
    }
    rank = device = None
    profiler = sorted(output.glob("ascend_pytorch_profiler*.db"))
    if profiler:
        for row in _query(
            profiler[0],
            "SELECT o.startNs AS start_ns, o.endNs AS end_ns, n.value AS op_name, "
            "g.value AS group_name, s.id AS step FROM COMMUNICATION_OP o "
            "JOIN STRING_IDS n ON n.id = o.opName JOIN STRING_IDS g ON g.id = o.groupName "
            "LEFT JOIN STEP_TIME s ON o.startNs >= s.startNs AND o.startNs < s.endNs "
            "ORDER BY o.startNs",
        ):
            step = f"step{row['step']}" if row["step"] is not None else None
            op = ops.setdefault(
                row["op_name"],
                {"step": step, "op_name": row["op_name"], "group_name": row["group_name"]},
            )
            op.update(start_ns=row["start_ns"], end_ns=row["end_ns"])
        mapped = _query(profiler[0], "SELECT rankId, deviceId FROM RANK_DEVICE_MAP")
        if len(mapped) == 1:
            rank, device = mapped[0]["rankId"], mapped[0]["deviceId"]
    if ops:
        outputs["communication"] = list(ops.values())
    return outputs, rank, device


def read_rank_folder(folder: Path) -> RankFolder:
    """What one rank's output folder holds. The rank comes from ``profiler_info_N.json``,
    else ``profiler_metadata.json``; the two must agree. Refused with the folder named when
    it holds neither a trace nor msprof's tables, or its files contradict each other."""
    output = folder / OUTPUT_DIR
    info_rank = _info_rank(folder)
    parallel, metadata_rank = _parallel(folder)
    trace = next((output / name for name in TRACES if (output / name).is_file()), None)
    outputs: dict[str, Any] = {}
    device = None
    if (output / "step_trace_time.csv").is_file():
        outputs["step_trace_time"], device = _step_rows(output / "step_trace_time.csv")
    if (output / "communication.json").is_file():
        outputs["communication"] = list(_communication_rows(output / "communication.json"))
    db_rank = None
    if not outputs and output.is_dir():
        outputs, db_rank, db_device = _db_outputs(output)
        device = device if device is not None else db_device
    if trace is None and not outputs:
        raise TraceFormatError(
            f"{folder}: holds neither {' nor '.join(TRACES)} nor msprof's step_trace_time.csv "
            f"or communication.json under {OUTPUT_DIR}, as text or in its analysis.db and "
            "ascend_pytorch_profiler_N.db"
        )
    ranks = {r for r in (info_rank, metadata_rank, db_rank) if r is not None}
    if len(ranks) > 1:
        raise TraceFormatError(
            f"{folder}: its files name several ranks {sorted(ranks)} (profiler_info, "
            "profiler_metadata.json, RANK_DEVICE_MAP)"
        )
    rank = ranks.pop() if ranks else None
    if rank is None and trace is None:
        raise TraceFormatError(
            f"{folder}: no rank: neither profiler_info_N.json nor profiler_metadata.json names it"
        )
    return RankFolder(folder, rank, trace, RankContext(device, parallel, outputs or None))
