"""Writes a small torch_npu-profiler-shaped ``trace_view.json`` for the fusion tests.

Layout facts followed (checked against the real torch_npu trace in
``tests/data/torchnpu_advisor_trace_view.json.gz``, the Ascend msprof/PyTorch-profiler timeline
documentation, and the field names the Ascend mstt parsers read):

* the file is a bare JSON array of Chrome trace events; there is no ``traceEvents`` object;
* every ``ts`` is a string of absolute epoch microseconds with exactly three decimals; ``dur`` is
  a number of microseconds;
* lanes are named by ``process_name`` metadata: "Python" (label CPU), "CANN" (label CPU, pid =
  host pid * 100 + 2 as in the real trace) and "Ascend Hardware" (pid 800, label NPU), whose
  threads are streams: tid = stream id, ``thread_name`` "Stream <id>";
* a framework op is a ``cpu_op`` named ``aclnn<Op>`` on the Python thread; it is launched on the
  dequeue thread (``Dequeue@aclnn<Op>``, cat ``dequeue``) through ``AscendCL@aclnn<Op>`` in the
  CANN process (args Mode ACL_NN, level acl, connection_id);
* device tasks have no ``cat``, are named ``aclnn<Op>_<Kernel>_<OpType>`` and carry args "Model Id",
  "Task Type" (AI_CORE, AI_CPU, MIX_AIC, ...), "Stream Id", "Task Id", "Batch Id", "Subtask Id",
  "connection_id";
* ``async_npu`` flows (name ``torch_to_npu``, ``bp`` "e") run from the cpu_op's pid/tid/ts to the
  device task's pid/tid/ts, and their numeric ``id`` is the device task's start in ns (> 2**53);
* ``HostToDevice`` flows run from the AscendCL launch to the device task; their ``id`` is a string,
  ``(device connection_id << 32) | 0xFFFFFFFF`` in the real trace.

Stress added on purpose: the first MegaKernel task has ``"cat": null``, the last MegaKernel
HostToDevice id is above 2**64, and unrelated tasks (``Cast`` on AI_CORE, an AI_CPU task on a
second stream) are interleaved so that launch i is not device event i.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

DEVICE_PID = 800
HOST_PID = 21356
DEQUEUE_TID = 21400
CANN_PID = HOST_PID * 100 + 2
MK_STREAM, AICPU_STREAM = 3, 7
_U32 = 0xFFFFFFFF


def _ns(us: str) -> int:
    """Exact ns from a decimal string of microseconds (at most 3 decimals)."""
    ns = Decimal(us) * 1000
    if ns != ns.to_integral_value():
        raise ValueError(f"{us!r} has more than 3 decimals")
    return int(ns)


def _us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def _meta(name: str, pid: int, tid: int, key: str, value: Any) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {key: value}}


def _x(name: str, pid: int, tid: int, ts_ns: int, dur_ns: int, **extra: Any) -> dict[str, Any]:
    event = {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": _us(ts_ns)}
    return event | {"dur": dur_ns / 1000} | extra


def _flow(ph: str, cat: str, name: str, fid: int | str, pid: int, tid: int, ts: str) -> dict:
    head = {"ph": ph, "bp": "e", "name": name, "id": fid, "cat": cat}
    return head | {"pid": pid, "tid": tid, "ts": ts}


def _record(event: dict[str, Any], ts_ns: int, dur_ns: int) -> dict[str, Any]:
    keep = {k: event[k] for k in ("name", "pid", "tid", "ts")}
    return keep | {"dur": _us(dur_ns), "ts_ns": ts_ns, "dur_ns": dur_ns}


def write_npu_trace(
    path: Path,
    *,
    kernel_name: str = "HyperMegaMoe",
    launches: int = 3,
    kernel_us: tuple[str, ...] | None = None,
    base_ts: str = "1704161511420306.491",
    gz: bool = False,
) -> dict[str, Any]:
    """Write the trace to ``path`` (gzip-compressed if ``gz``) and describe what was written.

    ``device_kernels`` / ``host_ops`` list the MegaKernel device tasks / ``aclnn<kernel_name>``
    cpu_ops in launch order; their ``ts`` is the exact string written and ``dur`` the exact
    duration as a 3-decimal string (the JSON ``dur`` is the nearest float).
    """
    if kernel_us is not None and len(kernel_us) != launches:
        raise ValueError("kernel_us needs one duration per launch")
    durs = (
        [_ns(u) for u in kernel_us] if kernel_us else [412_337 + 9_871 * i for i in range(launches)]
    )
    base = _ns(base_ts)
    ev: list[dict[str, Any]] = []
    for pid, name, label, sort in (
        (HOST_PID, "Python", "CPU", 0),
        (CANN_PID, "CANN", "CPU", 2),
        (DEVICE_PID, "Ascend Hardware", "NPU", 8),
    ):
        ev += [_meta("process_name", pid, 0, "name", name)]
        ev += [_meta("process_labels", pid, 0, "labels", label)]
        ev += [_meta("process_sort_index", pid, 0, "sort_index", sort)]
    for pid, tid in ((HOST_PID, HOST_PID), (HOST_PID, DEQUEUE_TID), (CANN_PID, DEQUEUE_TID)):
        ev += [_meta("thread_name", pid, tid, "name", f"Thread {tid}")]
        ev += [_meta("thread_sort_index", pid, tid, "sort_index", tid)]
    for s in (MK_STREAM, AICPU_STREAM):
        ev += [_meta("thread_name", DEVICE_PID, s, "name", f"Stream {s}")]
        ev += [_meta("thread_sort_index", DEVICE_PID, s, "sort_index", s)]

    mk_kernel = f"{kernel_name}AiCore_{kernel_name}"
    plan: list[tuple[str, str, str, int, int, int]] = []  # op, kernel, type, stream, dur, mk no.
    for i in range(launches):
        if i % 2 == 0:
            plan.append(("Cast", "CastAiCore_Cast", "AI_CORE", MK_STREAM, 3_210, -1))
        plan.append((kernel_name, mk_kernel, "MIX_AIC", MK_STREAM, durs[i], i))
        if i == 0:
            plan.append(("Nonzero", "NonZeroAiCpu_NonZero", "AI_CPU", AICPU_STREAM, 150_500, -1))
    host_ops: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    free = {MK_STREAM: base, AICPU_STREAM: base}
    h = base + 50_000
    cpu_args = {"Sequence number": -1, "Fwd thread id": 0}
    for n, (op, kern, ttype, stream, dur, mk) in enumerate(plan):
        conn = 2 * n
        dev = max(h + 40_000, free[stream])
        free[stream] = dev + dur + 2_000
        host = _x(f"aclnn{op}", HOST_PID, HOST_PID, h, 18_250, cat="cpu_op", args=cpu_args)
        deq = _x(f"Dequeue@aclnn{op}", HOST_PID, DEQUEUE_TID, h + 5_000, 30_000, cat="dequeue")
        deq["args"] = {"correlation_id": n}
        acl_args = {"Thread Id": DEQUEUE_TID, "Mode": "ACL_NN", "level": "acl", "id": f"aclnn{op}"}
        acl_args |= {"item_id": "0", "connection_id": conn + 1}
        acl = _x(f"AscendCL@aclnn{op}", CANN_PID, DEQUEUE_TID, h + 8_000, 12_345, args=acl_args)
        task_args = {"Model Id": _U32, "Task Type": ttype, "Stream Id": stream, "Task Id": 100 + n}
        task_args |= {"Batch Id": 0, "Subtask Id": _U32, "connection_id": conn}
        task = _x(f"aclnn{op}_{kern}", DEVICE_PID, stream, dev, dur, args=task_args)
        if mk == 0:
            task["cat"] = None
        h2d = (conn << 32) | _U32
        h2d_id = str(h2d + 2**64 if mk == launches - 1 else h2d)
        dts = task["ts"]
        ev += [host, deq, acl, task]
        h2d_name = f"HostToDevice{h2d_id}"
        ev += [
            _flow("s", "async_npu", "torch_to_npu", dev, HOST_PID, HOST_PID, host["ts"]),
            _flow("f", "async_npu", "torch_to_npu", dev, DEVICE_PID, stream, dts),
            _flow("s", "HostToDevice", h2d_name, h2d_id, CANN_PID, DEQUEUE_TID, _us(h + 9_000)),
            _flow("f", "HostToDevice", h2d_name, h2d_id, DEVICE_PID, stream, dts),
        ]
        if mk >= 0:
            host_ops.append(_record(host, h, 18_250))
            kernels.append(_record(task, dev, dur))
        h += 100_000
    step = _x("ProfilerStep#1", HOST_PID, HOST_PID, base, h - base, cat="cpu_op", args=cpu_args)
    ev.insert(0, step)

    data = json.dumps(ev).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return {
        "events": len(ev),
        "device_events": len(plan),
        "device_kernels": kernels,
        "host_ops": host_ops,
        "device_pid": DEVICE_PID,
        "device_tids": [MK_STREAM, AICPU_STREAM],
        "max_device_tid": AICPU_STREAM,
        "host_pid": HOST_PID,
        "cann_pid": CANN_PID,
    }
