"""Command-line benchmark: start-up of ``mcprof``, and device buffers to a standalone trace
from the command line against hyper-parallel's host code, in fresh processes.

Data: 8 launch buffers of the simulated MoE MegaKernel (32 experts x 52 tiles on 24 AIC
and 48 AIV workers, capacities planned uncapped as hyper-parallel's newer generation does:
146,944 records), written as files; a small store holding one of them for ``mcprof runs``.

Measured in fresh processes, the compared calls interleaved, ``--repeat`` times each after
an untimed first round; medians and [min-max], ratios per repeat:

* ``mcprof --help`` and ``mcprof runs`` on the small store. Goals: <= 0.15 s and <= 0.3 s.
  ``--before PATH`` (a checkout of an earlier version) runs its commands beside ours as the
  baseline.
* The seed's first flow: ``mcprof trace-buffer`` (one process, through a temporary
  store) and ``mcprof ingest-buffer`` into a new store then ``mcprof export`` of its run
  (two processes: time summed, peak RSS the larger; with ``--before``, the earlier
  version's too), each to Chrome JSON, against a parse + ``json.dump`` in the shape of
  hyper-parallel's host exporter (``upstream`` below: each record unpacked into a dict,
  an event dict per record, sorted, dumped). Goal: >= 5x faster, peak RSS <= the
  baseline's.

``mcprof`` refuses pandas (``no_pandas``: pyarrow would import it on its first conversion
of a value, here where the dev extras' HTA and msprof-analyze install it), so its processes
run as in a base install (``make demo``'s, without pandas); an earlier version given with
``--before`` may import it.

Every process may cache the bytecode it compiles (under a scratch directory, whatever
``PYTHONDONTWRITEBYTECODE`` says), as an installed package has its bytecode: the timed
rounds, after the first, compile nothing.

    .venv/bin/python bench/cli.py [--repeat 5] [--before /path/to/old/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FREQUENCY_MHZ = 50
SLOTS = (24, 48)
HEADER = struct.Struct("<QIIIIII32x")
RECORD = struct.Struct("<QQIIII")
CORE_NAMES = {1: "AIC", 2: "AIV"}
BYTECODE = Path(tempfile.gettempdir()) / "mcprof-bench-cli-bytecode"
"""Where the processes cache their bytecode, one folder per tree."""


def upstream(files: list[str], capacities: tuple[int, int], output: str) -> None:
    """Parse the buffers and dump the trace as hyper-parallel's host code does: every
    slot header and record unpacked into a dict, every record's event a dict, the events
    sorted by start, ``json.dump``."""
    records = []
    for invocation, file in enumerate(files):
        data = Path(file).read_bytes()
        offset = 0
        for slots, capacity in zip(SLOTS, capacities, strict=True):
            for _ in range(slots):
                entry, count, _dropped, core, block, _cap, _reserved = HEADER.unpack_from(
                    data, offset
                )
                body = data[offset + 64 : offset + 64 + count * RECORD.size]
                for start, end, desc, task, index, owner in RECORD.iter_unpack(body):
                    records.append(
                        {
                            "invocation": invocation,
                            "core_type": core,
                            "block_id": block,
                            "entry_cycle": entry,
                            "start_cycle": start,
                            "end_cycle": end,
                            "desc_id": desc,
                            "task_id": task,
                            "stage_task_index": index,
                            "owner_id": owner,
                        }
                    )
                offset += 64 + capacity * RECORD.size
    anchor = min(r["start_cycle"] for r in records)
    events = [
        {
            "name": f"Stage_{r['desc_id']:#x}",
            "cat": "MegaKernelInternal",
            "ph": "X",
            "pid": 0,
            "tid": f"MegaKernel/{CORE_NAMES[r['core_type']]}/{r['block_id']}",
            "ts": (r["start_cycle"] - anchor) / FREQUENCY_MHZ,
            "dur": (r["end_cycle"] - r["start_cycle"]) / FREQUENCY_MHZ,
            "args": {
                "invocation_id": r["invocation"],
                "core_type": CORE_NAMES[r["core_type"]],
                "block_id": r["block_id"],
                "task_id": r["task_id"],
                "stage_task_index": r["stage_task_index"],
                "owner_id": r["owner_id"],
                "start_cycle": r["start_cycle"],
                "end_cycle": r["end_cycle"],
                "core_entry_cycle": r["entry_cycle"],
            },
        }
        for r in sorted(records, key=lambda r: (r["start_cycle"], r["core_type"], r["block_id"]))
    ]
    trace = {"traceEvents": events, "megaKernelCycleTrace": {"recordCount": len(records)}}
    with open(output, "w") as out:
        json.dump(trace, out)


def write_buffers(folder: Path) -> tuple[list[str], tuple[int, int]]:
    """The 8 launch buffers as files in ``folder``; their slot capacities (AIC, AIV)."""
    import numpy as np

    from multicore_profiler.abi import BufferLayout, CoreType
    from multicore_profiler.kernels.synthetic import SimulatedMoeKernel

    kernel = SimulatedMoeKernel(experts=32, tiles=52, aiv_workers=48)
    kernel.layout = BufferLayout.plan(
        kernel.queues[CoreType.AIC],
        kernel.queues[CoreType.AIV],
        aic_slots=SLOTS[0],
        aiv_slots=SLOTS[1],
        generation="b",
    )
    launches = kernel.launches(np.random.default_rng(0), 8, start_cycle=10**6, period=10**7)
    files = []
    for i, launch in enumerate(launches):
        files.append(str(folder / f"launch{i}.bin"))
        launch.tofile(files[-1])
    return files, (kernel.layout.aic_capacity, kernel.layout.aiv_capacity)


def measured_buffers(folder: Path) -> tuple[list[str], tuple[int, int]]:
    """``write_buffers`` in a process of its own. This process imports neither numpy nor
    the package, so that its memory stays small: a child's peak RSS (``ru_maxrss``) counts
    the memory of the process it was forked from until it runs its own program."""
    done = subprocess.run(
        [sys.executable, __file__, "--write-buffers", str(folder)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    files, capacities = json.loads(done.stdout)
    return files, (capacities[0], capacities[1])


def run(command: list[str], tree: Path) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MiB) and CPU seconds (user + system: what a loaded machine
    inflates least) of one fresh process running ``command``, with ``tree`` first on the
    import path."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(BYTECODE / tree.name)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    began = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, cwd=tree)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(command)}")
    return seconds, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def mcprof(*args: str) -> list[str]:
    """The command line of ``mcprof ARGS`` (what the console script runs)."""
    return [sys.executable, "-m", "multicore_profiler.cli", *args]


def spread(values: list[float], unit: str = "s", digits: int = 2) -> str:
    """``median [min-max]``."""
    return (
        f"{statistics.median(values):.{digits}f} {unit} "
        f"[{min(values):.{digits}f}-{max(values):.{digits}f}]"
    )


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--repeat", type=int, default=5)
    options.add_argument("--before", type=Path, help="a checkout of an earlier version")
    options.add_argument("--upstream", nargs="+", help=argparse.SUPPRESS)
    options.add_argument("--write-buffers", type=Path, help=argparse.SUPPRESS)
    given = options.parse_args()
    if given.upstream:  # the baseline's own process: AIC_CAP AIV_CAP OUTPUT FILE...
        aic, aiv, output, *files = given.upstream
        upstream(files, (int(aic), int(aiv)), output)
        return
    if given.write_buffers:  # a process of its own: see measured_buffers
        print(json.dumps(write_buffers(given.write_buffers)))
        return
    trees = {"ours": ROOT} | ({"before": given.before.resolve()} if given.before else {})
    with tempfile.TemporaryDirectory(prefix="mcprof-bench-cli-") as scratch:
        folder = Path(scratch)
        files, capacities = measured_buffers(folder)
        layout = [
            "--aic-slots", str(SLOTS[0]), "--aiv-slots", str(SLOTS[1]),
            "--aic-capacity", str(capacities[0]), "--aiv-capacity", str(capacities[1]),
            "--freq-mhz", str(FREQUENCY_MHZ),
        ]  # fmt: skip
        small = str(folder / "small-store")
        run(mcprof("ingest-buffer", files[0], "--store", small, *layout), ROOT)

        startup: dict[str, dict[str, list[tuple[float, float, float]]]] = {}
        flow: dict[str, list[tuple[float, float, float]]] = {}
        for repeat in range(given.repeat + 1):
            for name, tree in trees.items():
                for command, args in (("--help", ["--help"]), ("runs", ["runs", "--store", small])):
                    measured = run(mcprof(*args), tree)
                    if repeat:
                        startup.setdefault(command, {}).setdefault(name, []).append(measured)
            out = str(folder / "upstream.json")
            timed = {
                "upstream": run(
                    [sys.executable, __file__, "--upstream", *map(str, capacities), out, *files],
                    ROOT,
                ),
            } | {
                f"trace-buffer, {name}": run(
                    mcprof("trace-buffer", *files, *layout, "-o", str(folder / "one.json")), tree
                )
                for name, tree in trees.items()
            }
            for name, tree in trees.items():
                store = folder / f"flow-store-{name}"
                shutil.rmtree(store, ignore_errors=True)
                ingest = run(mcprof("ingest-buffer", *files, "--store", str(store), *layout), tree)
                export = run(
                    mcprof("export", "--store", str(store), "-o", str(folder / "two.json")), tree
                )
                timed[f"two commands, {name}"] = (
                    ingest[0] + export[0],
                    max(ingest[1], export[1]),
                    ingest[2] + export[2],
                )
                timed[f"  of which ingest-buffer, {name}"] = ingest
                timed[f"  of which export, {name}"] = export
            if repeat:
                for name, measured in timed.items():
                    flow.setdefault(name, []).append(measured)

    print(f"fresh processes, {given.repeat} interleaved repeats: median [min-max]")
    goals = {"--help": 0.15, "runs": 0.3}
    for command, by_tree in startup.items():
        print(f"mcprof {command} (goal <= {goals[command]} s):")
        for name, measured in by_tree.items():
            print(
                f"  {name}: {spread([m[0] for m in measured])}, "
                f"CPU {spread([m[2] for m in measured])}"
            )
        if "before" in by_tree:
            pairs = list(zip(by_tree["before"], by_tree["ours"], strict=True))
            print(
                f"  faster than before: {spread([b[0] / o[0] for b, o in pairs], 'x', 1)}, "
                f"CPU {spread([b[2] / o[2] for b, o in pairs], 'x', 1)}"
            )
    print("buffers -> trace, 8 buffers, 146,944 records (goal >= 5x, peak RSS <= upstream's):")
    for name, measured in flow.items():
        print(
            f"  {name}: {spread([m[0] for m in measured])}, "
            f"CPU {spread([m[2] for m in measured])}, "
            f"peak RSS {spread([m[1] for m in measured], 'MiB', 0)}"
        )
    for name, measured in flow.items():
        if name != "upstream" and not name.startswith(" "):
            pairs = list(zip(flow["upstream"], measured, strict=True))
            print(
                f"  speed-up of {name}: {spread([u[0] / o[0] for u, o in pairs], 'x')}, "
                f"CPU {spread([u[2] / o[2] for u, o in pairs], 'x')}"
            )


if __name__ == "__main__":
    main()
