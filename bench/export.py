"""Export benchmark: Chrome JSON and Perfetto protobuf traces of 5 million records, side by
side, against the straightforward way.

The store holds launches of the simulated MoE MegaKernel (32 experts x 30 tiles on 24
AIC and 48 AIV workers: about 10.6 k records a launch, a third of them waits released
by a trigger) with its task graph, so the trace carries dependency arrows as well.

Baselines, measured in the same run: on the first step, query the records with their
names, build a dict per event, ``json.dump`` the trace (against ``export_chrome_trace``);
on the whole run, ``export_chrome_trace`` (against ``export_perfetto_trace``). Every
timing is the median and [min-max] of ``--repeat`` calls, the compared calls interleaved,
each after an untimed first call: every timed call writes over the previous output of its
path, as a re-export does (ext4 then writes the new file out to disk on the rename that
replaces the old one, so that a crash leaves one of them whole: the exporter starts its
pages out behind it as it writes, so the rename waits for the last ones), and the whole run
is also exported to a new path (the previous output removed, untimed), whose rename writes
nothing out. Goals: ``export_chrome_trace`` >= 10x the baseline's events/s and >= 1 M
events/s, peak RSS of a fresh process that opens the store and exports the whole run
under 500 MB; ``export_perfetto_trace`` >= 2 M track events/s, a trace of at most 1/8 of
the JSON's bytes per record, a fresh process's peak RSS under 500 MB (issue 37's rates and
JSON RSS; they had been 3 M events/s for both and 600 MB).

    .venv/bin/python bench/export.py [--records 5000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingest import store_launches

from multicore_profiler.abi import NO_OWNER
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.export.perfetto_trace import export_perfetto_trace, sidecar_path
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
from multicore_profiler.export.perfetto_trace import export_perfetto_trace
from multicore_profiler.storage.store import open_store
export = {"json": export_chrome_trace, "perfetto": export_perfetto_trace}[sys.argv[4]]
began = time.perf_counter()
trace = export(open_store(sys.argv[1]), sys.argv[2], run=sys.argv[3])
seconds = time.perf_counter() - began
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(trace.events, seconds, int(status["VmHWM"].split()[0]) * 1024)
"""
"""VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec."""


@dataclass(frozen=True)
class Fresh:
    """What a fresh process that opens the store and exports the whole run reports."""

    events: int
    seconds: float
    peak_bytes: int


def fresh_export(store: Path, run_id: str, out: Path, writer: str) -> Fresh:
    """Export the whole run with ``writer`` (``json`` or ``perfetto``) in a fresh process;
    its seconds and peak RSS include the store's own opening."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(store), str(out), run_id, writer],
        capture_output=True,
        text=True,
        check=True,
    )
    events, seconds, peak = done.stdout.split()
    return Fresh(int(events), float(seconds), int(peak))


@dataclass(frozen=True)
class Timed:
    """The seconds of each timed call of one function, and the result of its last call."""

    seconds: list[float]
    result: Any

    def rates(self, count: float) -> list[float]:
        """``count`` per second of each call."""
        return [count / seconds for seconds in self.seconds]


def timed(
    calls: Sequence[Callable[[], Any]], repeat: int, before: Callable[[], Any] | None = None
) -> list[Timed]:
    """Time ``repeat`` rounds of ``calls``, interleaved (one of each a round, so the noise
    of the machine falls on all alike), after an untimed first round that warms the caches
    and leaves the output that every timed call writes over; ``before``, untimed, runs
    before each timed call."""
    results = [call() for call in calls]
    seconds: list[list[float]] = [[] for _ in calls]
    for _ in range(repeat):
        for index, call in enumerate(calls):
            if before is not None:
                before()
            began = time.perf_counter()
            results[index] = call()
            seconds[index].append(time.perf_counter() - began)
    return [Timed(times, result) for times, result in zip(seconds, results, strict=True)]


def seconds_of(call: Callable[[], Any], repeat: int) -> list[float]:
    """The seconds of each of ``repeat`` calls of ``call`` (``timed`` of one call)."""
    return timed([call], repeat)[0].seconds


def spread(values: Sequence[float], unit: str = "", digits: int = 3) -> str:
    """``median [min-max]`` of repeats."""
    return (
        f"{statistics.median(values):.{digits}f}{unit} "
        f"[{min(values):.{digits}f}-{max(values):.{digits}f}]"
    )


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """The ratio of each repeat's pair (the calls of a round were interleaved)."""
    return [a / b for a, b in zip(numerators, denominators, strict=True)]


def verdict(what: str, measured: str, goal: str, met: bool) -> str:
    """One line of the summary."""
    return f"  {what:<72} {measured:>8}  goal {goal:<10} {'met' if met else 'NOT MET'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    repeat = args.repeat

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as scratch:
        root = Path(scratch)
        store = open_store(root / "store")
        began = time.perf_counter()
        run_id, records = fill(store, args.records)
        print(
            f"store: {records:,} records of {run_id} in {time.perf_counter() - began:.1f} s, "
            f"{os.cpu_count()} CPUs"
        )
        print(
            f"every time is the median [min-max] of {repeat} calls, after an untimed first "
            "one; each call writes over the previous output of its path, as a re-export "
            "does (ext4 writes the new file out on that rename, what the exporter has not "
            "written out behind itself), unless said to go to a new path"
        )
        out = {suffix: root / f"trace{suffix}" for suffix in (".json", ".pftrace")}
        gz = {suffix: root / f"trace{suffix}.gz" for suffix in (".json", ".pftrace")}

        small_records = store.sql(
            "SELECT count(*) AS n FROM records WHERE run_id = $1 AND step = 0", [run_id]
        )["n"][0].as_py()
        base, small = timed(
            [
                lambda: baseline(store, run_id, 0, root / "baseline.json"),
                lambda: export_chrome_trace(store, out[".json"], run=run_id, step=0),
            ],
            repeat,
        )
        base_rate = base.rates(base.result)
        small_rate = small.rates(small.result.events)
        small_ratio = ratios(small_rate, base_rate)
        print(f"\nstep 0 ({small_records:,} records), JSON:")
        print(
            f"  baseline, dict per event + json.dump: {spread(base.seconds, ' s')}, "
            f"{spread([r / 1e6 for r in base_rate])} M events/s"
        )
        print(
            f"  export_chrome_trace ({small.result.events:,} events incl. "
            f"{2 * small.result.flows:,} flow): {spread(small.seconds, ' s')}, "
            f"{spread([r / 1e6 for r in small_rate])} M events/s"
        )
        print(f"  export_chrome_trace / baseline, events/s: {spread(small_ratio, 'x', 1)}")

        json_full, proto_full = timed(
            [
                lambda: export_chrome_trace(store, out[".json"], run=run_id),
                lambda: export_perfetto_trace(store, out[".pftrace"], run=run_id),
            ],
            repeat,
        )
        size = {suffix: path.stat().st_size for suffix, path in out.items()}
        sidecar = sidecar_path(out[".pftrace"]).stat().st_size
        (detailed,) = timed(
            [
                lambda: export_chrome_trace(
                    store, out[".json"], run=run_id, detailed_task_names=True
                )
            ],
            repeat,
        )
        json_new, proto_new = timed(
            [
                lambda: export_chrome_trace(store, out[".json"], run=run_id),
                lambda: export_perfetto_trace(store, out[".pftrace"], run=run_id),
            ],
            repeat,
            before=lambda: [path.unlink() for path in out.values() if path.exists()],
        )
        json_gz, proto_gz = timed(
            [
                lambda: export_chrome_trace(store, gz[".json"], run=run_id),
                lambda: export_perfetto_trace(store, gz[".pftrace"], run=run_id),
            ],
            repeat,
        )
        gz_size = {suffix: path.stat().st_size for suffix, path in gz.items()}

        json_trace, proto_trace = json_full.result, proto_full.result
        json_rate = json_full.rates(json_trace.events)
        proto_rate = proto_full.rates(proto_trace.events)
        json_new_rate = json_new.rates(json_trace.events)
        proto_new_rate = proto_new.rates(proto_trace.events)
        print(
            f"\nwhole run ({json_trace.records:,} records), JSON vs Perfetto protobuf:"
            f"\n  {'':<24} {'export_chrome_trace':>34} {'export_perfetto_trace':>34}"
        )
        rows = [
            ("events", f"{json_trace.events:,}", f"{proto_trace.events:,} track"),
            ("seconds", spread(json_full.seconds), spread(proto_full.seconds)),
            (
                "M events/s",
                spread([r / 1e6 for r in json_rate]),
                spread([r / 1e6 for r in proto_rate]),
            ),
            (
                "M records/s",
                spread([r / 1e6 for r in json_full.rates(records)]),
                spread([r / 1e6 for r in proto_full.rates(records)]),
            ),
            ("to a new path: seconds", spread(json_new.seconds), spread(proto_new.seconds)),
            (
                "to a new path: M ev/s",
                spread([r / 1e6 for r in json_new_rate]),
                spread([r / 1e6 for r in proto_new_rate]),
            ),
            ("file MB", f"{size['.json'] / 1e6:,.0f}", f"{size['.pftrace'] / 1e6:,.0f}"),
            (
                "bytes per record",
                f"{size['.json'] / records:.1f}",
                f"{size['.pftrace'] / records:.1f}",
            ),
            ("gzipped: seconds", spread(json_gz.seconds), spread(proto_gz.seconds)),
            (
                "gzipped: file MB",
                f"{gz_size['.json'] / 1e6:,.0f}",
                f"{gz_size['.pftrace'] / 1e6:,.0f}",
            ),
            (
                "gzipped: bytes per record",
                f"{gz_size['.json'] / records:.1f}",
                f"{gz_size['.pftrace'] / records:.1f}",
            ),
            ("detailed names: seconds", spread(detailed.seconds), "-"),
        ]
        for name, json_value, proto_value in rows:
            print(f"  {name:<24} {json_value:>34} {proto_value:>34}")
        bytes_ratio = size[".json"] / size[".pftrace"]
        speed_ratio = ratios(proto_rate, json_rate)
        record_ratio = ratios(json_full.seconds, proto_full.seconds)
        print(
            f"  Perfetto / JSON: track events/s / events/s {spread(speed_ratio, 'x')}, "
            f"records/s {spread(record_ratio, 'x')}\n"
            f"  JSON bytes / protobuf bytes: {bytes_ratio:.1f}x "
            f"(gzipped {gz_size['.json'] / gz_size['.pftrace']:.1f}x); the protobuf's "
            f"sidecar {sidecar_path(out['.pftrace']).name}, {sidecar:,} bytes, not counted"
        )

        fresh: dict[str, list[Fresh]] = {"json": [], "perfetto": []}
        for _ in range(repeat):
            for writer, suffix in (("json", ".json"), ("perfetto", ".pftrace")):
                fresh[writer].append(fresh_export(root / "store", run_id, out[suffix], writer))
        peak = {writer: [run.peak_bytes / 2**20 for run in runs] for writer, runs in fresh.items()}
        print(f"\nfresh process that opens the store and exports the whole run, {repeat} each:")
        for writer, runs in fresh.items():
            print(
                f"  {writer:<8}: {spread([run.events / run.seconds / 1e6 for run in runs])} "
                f"M events/s, peak RSS (VmHWM) {spread(peak[writer], ' MB', 0)}"
            )

        print("\nsummary (median of the repeats; peak RSS: the highest):")
        median = statistics.median
        print(
            verdict(
                "export_chrome_trace / baseline events/s, step 0",
                f"{median(small_ratio):.1f}x",
                ">= 10x",
                median(small_ratio) >= 10,
            )
        )
        for where, rates in (("over its last output", json_rate), ("to a new path", json_new_rate)):
            print(
                verdict(
                    f"export_chrome_trace M events/s, whole run, {where}",
                    f"{median(rates) / 1e6:.2f}",
                    ">= 1",
                    median(rates) >= 1e6,
                )
            )
        print(
            verdict(
                "export_chrome_trace, fresh process peak RSS",
                f"{max(peak['json']):.0f} MB",
                "< 500 MB",
                max(peak["json"]) < 500,
            )
        )
        for where, rates in (
            ("over its last output", proto_rate),
            ("to a new path", proto_new_rate),
        ):
            print(
                verdict(
                    f"export_perfetto_trace M track events/s, whole run, {where}",
                    f"{median(rates) / 1e6:.2f}",
                    ">= 2",
                    median(rates) >= 2e6,
                )
            )
        print(
            verdict(
                "JSON bytes / protobuf bytes per record",
                f"{bytes_ratio:.1f}x",
                ">= 8x",
                bytes_ratio >= 8,
            )
        )
        print(
            verdict(
                "export_perfetto_trace, fresh process peak RSS",
                f"{max(peak['perfetto']):.0f} MB",
                "< 500 MB",
                max(peak["perfetto"]) < 500,
            )
        )


if __name__ == "__main__":
    main()
