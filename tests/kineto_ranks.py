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


def nccl_trace(target: Path, *, rank: int, kernels: list[tuple[str, int, int, dict]]) -> Path:
    """Write a small kineto trace of rank ``rank`` to ``target``: one step annotation
    (ProfilerStep#7, 0-10 ms) launching each kernel of ``kernels`` (name, ts µs, dur µs,
    args such as ``Process Group Name`` and ``Seq``) on stream 7; return ``target``."""
    events: list[dict] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1,
         "ts": 0, "dur": 10_000},
    ]  # fmt: skip
    for correlation, (name, ts, dur, args) in enumerate(kernels, start=1):
        events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": 1 + correlation, "dur": 1, "args": {"correlation": correlation}}
        )  # fmt: skip
        events.append(
            {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
             "args": {"correlation": correlation, "stream": 7, "device": 0, **args}}
        )  # fmt: skip
    trace = {"distributedInfo": {"backend": "nccl", "rank": rank}, "traceEvents": events}
    target.write_text(json.dumps(trace))
    return target
