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
from collections.abc import Iterator
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


def read_rank_folder(folder: Path) -> RankFolder:
    """What one rank's output folder holds. The rank comes from ``profiler_info_N.json``,
    else ``profiler_metadata.json``; the two must agree. Refused with the folder named when
    it holds neither a trace nor msprof's tables, or its files contradict each other."""
    output = folder / OUTPUT_DIR
    info_rank = _info_rank(folder)
    parallel, metadata_rank = _parallel(folder)
    if info_rank is not None and metadata_rank is not None and info_rank != metadata_rank:
        raise TraceFormatError(
            f"{folder}: profiler_info says rank {info_rank}, profiler_metadata.json's "
            f"distributed_args rank {metadata_rank}"
        )
    trace = next((output / name for name in TRACES if (output / name).is_file()), None)
    outputs: dict[str, Any] = {}
    device = None
    if (output / "step_trace_time.csv").is_file():
        outputs["step_trace_time"], device = _step_rows(output / "step_trace_time.csv")
    if (output / "communication.json").is_file():
        outputs["communication"] = list(_communication_rows(output / "communication.json"))
    if trace is None and not outputs:
        raise TraceFormatError(
            f"{folder}: holds neither {' nor '.join(TRACES)} nor msprof's step_trace_time.csv "
            f"or communication.json under {OUTPUT_DIR} (a DB-only export is not read: export "
            "text as well)"
        )
    rank = info_rank if info_rank is not None else metadata_rank
    if rank is None and trace is None:
        raise TraceFormatError(
            f"{folder}: no rank: neither profiler_info_N.json nor profiler_metadata.json names it"
        )
    return RankFolder(folder, rank, trace, RankContext(device, parallel, outputs or None))
