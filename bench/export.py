"""Export benchmark: a Chrome Trace of 5 million records, against the straightforward way.

The store holds launches of the simulated MoE MegaKernel (32 experts x 30 tiles on 24
AIC and 48 AIV workers: about 10.6 k records a launch, a third of them waits released
by a trigger) with its task graph, so the trace carries dependency arrows as well.

Baseline, measured in the same run on the first step of the same store: query the
records with their names, build a dict per event, ``json.dump`` the trace. Goals:
``export_chrome_trace`` >= 10x the baseline's events/s and >= 3 M events/s; peak RSS of a
process that opens the store and exports the whole run under 600 MB at 5 M records.

    .venv/bin/python bench/export.py [--records 5000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ingest import best, store_launches

from multicore_profiler.abi import NO_OWNER
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.store import Store, open_store

CONFIG_ID = "simulated-moe"


def fill(store: Store, records: int) -> tuple[str, int]:
    """A run of about ``records`` records; return its id and its exact record count."""
    kernel = SimulatedMoeKernel(experts=32, tiles=30, aic_workers=24, aiv_workers=48)
    count = -(-records // kernel.records_per_launch)
    tasks = kernel.tasks_table(CONFIG_ID)
    run_id = store_launches(
        store, kernel, count, label="bench-export", config_id=CONFIG_ID, tasks=tasks
    )
    return run_id, count * kernel.records_per_launch


def baseline(store: Store, run_id: str, step: int, path: Path) -> int:
    """The straightforward exporter: one dict per event, then ``json.dump``."""
    rows = store.sql(
        """SELECT r.*, i.anchor_cycle, i.frequency_hz, i.device, i.direction,
                  stage_name(i.stage_names, r.desc_id) AS name,
                  c.entry_cycle AS core_entry_cycle
           FROM records r
           JOIN invocations i USING (run_id, rank, invocation_id, write_id)
           JOIN cores c USING (run_id, rank, invocation_id, write_id, core_type, block_id)
           WHERE r.run_id = $1 AND r.step = $2""",
        [run_id, step],
    ).to_pylist()
    events = []
    for row in rows:
        mhz = row["frequency_hz"] / 1e6
        args = {
            "rank": row["rank"],
            "device_id": row["device"],
            "core_type": row["core_type"],
            "block_id": row["block_id"],
            "task_id": row["task_id"],
            "desc_id": row["desc_id"],
            "stage_task_index": row["stage_task_index"],
            "task_number": row["stage_task_index"] + 1,
            "start_cycle": row["start_cycle"],
            "end_cycle": row["end_cycle"],
            "core_entry_cycle": row["core_entry_cycle"],
            "invocation_id": row["invocation_id"],
            "step": row["step"],
            "direction": row["direction"],
        }
        if row["owner_id"] != NO_OWNER:
            args["owner_id"] = row["owner_id"]
        events.append(
            {
                "name": row["name"],
                "cat": "MegaKernelInternal",
                "ph": "X",
                "pid": row["rank"],
                "tid": row["core_type"] * 1000 + row["block_id"],
                "ts": (row["start_cycle"] - row["anchor_cycle"]) / mhz,
                "dur": (row["end_cycle"] - row["start_cycle"]) / mhz,
                "args": args,
            }
        )
    with open(path, "w") as sink:
        json.dump({"traceEvents": events}, sink)
    return len(events)


_CHILD = """
import sys, time
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.storage.store import open_store
began = time.perf_counter()
trace = export_chrome_trace(open_store(sys.argv[1]), sys.argv[2], run=sys.argv[3])
seconds = time.perf_counter() - began
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(trace.events, seconds, int(status["VmHWM"].split()[0]) * 1024)
"""
"""VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec."""


def peak_rss(store: Path, run_id: str, out: Path) -> tuple[int, float, int]:
    """Events, seconds and peak resident bytes of a fresh process that opens the store
    and exports the whole run (the store's own opening included)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(store), str(out), run_id],
        capture_output=True,
        text=True,
        check=True,
    )
    events, seconds, peak = done.stdout.split()
    return int(events), float(seconds), int(peak)


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    result = fn()
    return best(fn, repeat), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as scratch:
        root = Path(scratch)
        store = open_store(root / "store")
        began = time.perf_counter()
        run_id, records = fill(store, args.records)
        print(
            f"store: {records:,} records of {run_id} in {time.perf_counter() - began:.1f} s, "
            f"{os.cpu_count()} CPUs"
        )
        out = root / "trace.json"

        small_records = store.sql(
            "SELECT count(*) AS n FROM records WHERE run_id = $1 AND step = 0", [run_id]
        )["n"][0].as_py()
        base_s, base_events = timed(lambda: baseline(store, run_id, 0, out), 1)
        ours_small_s, small = timed(
            lambda: export_chrome_trace(store, out, run=run_id, step=0), args.repeat
        )
        full_s, full = timed(lambda: export_chrome_trace(store, out, run=run_id), args.repeat)
        size = out.stat().st_size
        detailed_s, _ = timed(
            lambda: export_chrome_trace(store, out, run=run_id, detailed_task_names=True),
            args.repeat,
        )
        gz = root / "trace.json.gz"
        gz_s, _ = timed(lambda: export_chrome_trace(store, gz, run=run_id), 1)

        base_rate = base_events / base_s
        small_rate = small.events / ours_small_s
        print(
            f"baseline, dict per event + json.dump, step 0 ({small_records:,} records): "
            f"{base_s:6.2f} s {base_rate / 1e6:5.2f} M events/s"
        )
        print(
            f"export_chrome_trace, step 0 ({small.events:,} events incl. "
            f"{2 * small.flows:,} flow): {ours_small_s:6.2f} s {small_rate / 1e6:5.2f} M events/s"
        )
        full_rate = full.events / full_s
        print(
            f"export_chrome_trace, whole run ({full.records:,} records, {full.events:,} events, "
            f"{size / 1e9:.2f} GB): {full_s:6.2f} s {full_rate / 1e6:5.2f} M events/s "
            f"({full.records / full_s / 1e6:.2f} M records/s)"
        )
        print(
            f"  detailed names: {detailed_s:6.2f} s; gzipped: {gz_s:6.2f} s "
            f"({gz.stat().st_size / 1e6:.0f} MB)"
        )
        events, seconds, peak = peak_rss(root / "store", run_id, out)
        print(
            f"fresh process, whole run: {events / seconds / 1e6:.2f} M events/s, "
            f"peak RSS {peak / 2**20:.0f} MB (goal < 600 MB at 5 M records)"
        )
        print(
            f"ratio to baseline (same step): {small_rate / base_rate:.1f}x (goal >= 10); "
            f"whole run {full_rate / 1e6:.2f} M events/s (goal >= 3)"
        )


if __name__ == "__main__":
    main()
