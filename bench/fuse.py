"""Fuse benchmark: ingest a kineto trace and fuse MegaKernel invocations into it, against
``json`` doing the same job, side by side in the same run.

The outer traces repeat the events of a real kineto trace (the A100 training fixture: 108,936
events, 6,080 device kernels) K times, every ``ts`` shifted by K x (fixture span + 10 ms) in
exact integer microseconds, and every flow ``id``, ``correlation`` and ``External id`` by
K x 10^d so that links stay within their repetition; the repetitions are written as text, in
the fixture's own pretty-printed kineto layout. The MegaKernel side is a run of
``--invocations`` launches (default 8) of the simulated MoE MegaKernel (32 experts x 52 tiles
on 48 AIC and 48 AIV workers: 18,368 records a launch, 146,944 for 8), exported to a standalone
Chrome trace file; invocation i aligns to the i-th NCCL SendRecv device kernel.

Two cases, each with its baseline measured in the same run, interleaved round by round:

* hyper-parallel-sized: the outer trace is the fixture doubled (217,872 events), the MegaKernel
  side its trace file. Baseline (what hyper-parallel's merger does): ``json.load`` of both
  files + ``outer["traceEvents"].extend(mk["traceEvents"])`` + ``json.dump`` to a file. Ours:
  ``ingest_trace`` into a fresh store + ``merge_chrome_traces`` of the outer and MegaKernel trace
  files with that store. Goal: >= 10x faster, with <= 1/3 of the baseline's peak RSS. Also shown,
  without a goal: the same fusion with the run in its store as the MegaKernel side (a store
  selection, which the fuser reads as a ``Timeline``).
* ``--size-gb`` (default 1 GB): the outer trace has as many repetitions as reach that size, the
  MegaKernel side is the same file. Baseline: ``json.load`` + ``json.dump`` of the outer trace.
  Ours as above (its trace read by a worker process per idle core, ``trace_workers``), and
  again with the trace read by one process and by a worker per core
  (``MCPROF_TRACE_WORKERS``), to show how ingest scales with workers.
  Goal: >= 10x faster, with peak RSS < 1.5 GB, the workers' counted in (each worker's peak
  is ``ru_maxrss`` of the children, which can carry the reading process's peak when it
  started them: an upper bound).

Every measured piece of work runs in a fresh process, so its peak RSS is its own (``VmHWM``:
``ru_maxrss`` of a child spawned by ``vfork`` carries the parent's peak); the highest of the
``--repeat`` processes is shown. Times are measured inside the process (imports excluded, in the
RSS): each stage's median, best and [min-max] of ``--repeat`` rounds; speedups are the median
[min-max] of each round's baseline / ours. MB/s of every stage = the case's input text bytes
(outer trace + MegaKernel trace file) / the stage's seconds.

    .venv/bin/python bench/fuse.py [--size-gb 1.0] [--repeat 3] [--invocations 8]
                                   [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[2] / "shared/fixtures/kineto/a100_training_rank0.json.gz"
"""The real A100 fixture, where it lies: ``../shared/fixtures`` beside the checkout."""
KERNEL_PATTERN = r"^ncclKernel_SendRecv"
GAP_US = 10_000

_NUMBER = re.compile(r'"(ts|id|correlation|External id)": (\d+)')


@dataclass(frozen=True)
class Template:
    """The fixture's text cut around the numbers a repetition shifts."""

    head: str
    tail: str
    literals: list[str]
    values: Any  # numpy int64 array, one per number
    step: Any  # numpy int64 array: the shift of each number per repetition
    events: int
    kernels: int
    matching: int
    body_bytes: int


def load_template(fixture: Path, pattern: str) -> Template:
    """Read the fixture once and cut its ``traceEvents`` text around ts and id numbers."""
    import numpy as np

    opener = gzip.open if fixture.suffix == ".gz" else open
    with opener(fixture, "rt", encoding="utf-8") as source:
        raw = source.read()
    doc = json.loads(raw)
    if list(doc)[-1] != "traceEvents":
        raise SystemExit(f"{fixture}: traceEvents must be the last top-level field")
    events = doc["traceEvents"]
    start = raw.index("[", raw.index('"traceEvents"')) + 1
    end = raw.rindex("]")
    body = raw[start:end].strip()

    expected = {"ts": 0, "id": 0, "correlation": 0, "External id": 0}
    first, last, top_id = math.inf, -math.inf, 0
    kernels = matching = 0
    regex = re.compile(pattern)
    for event in events:
        args = event.get("args", {})
        numbers = [(key, event.get(key)) for key in ("ts", "id")]
        numbers += [(key, args.get(key)) for key in ("correlation", "External id")]
        for key, value in numbers:
            if isinstance(value, int):
                expected[key] += 1
                top_id = max(top_id, value) if key != "ts" else top_id
        if isinstance(event.get("ts"), int):
            first = min(first, event["ts"])
            last = max(last, event["ts"] + event.get("dur", 0))
        if event.get("cat") == "kernel":
            kernels += 1
            matching += bool(regex.search(event.get("name", "")))

    literals, values, kinds, position = [], [], [], 0
    for match in _NUMBER.finditer(body):
        literals.append(body[position : match.start(2)])
        values.append(int(match.group(2)))
        kinds.append(match.group(1))
        position = match.end(2)
    literals.append(body[position:])
    found = {key: kinds.count(key) for key in expected}
    if found != expected:
        raise SystemExit(f"{fixture}: numbers found in the text {found} != parsed {expected}")

    period = int(last - first) + GAP_US
    id_stride = 10 ** len(str(top_id))
    return Template(
        head=raw[:start],
        tail=raw[end:],
        literals=literals,
        values=np.array(values, np.int64),
        step=np.array([period if kind == "ts" else id_stride for kind in kinds], np.int64),
        events=len(events),
        kernels=kernels,
        matching=matching,
        body_bytes=len(body.encode()),
    )


def repetition(template: Template, index: int) -> str:
    """The events of repetition ``index``: the fixture's text with shifted numbers."""
    numbers = (template.values + index * template.step).tolist()
    parts: list[str] = [""] * (2 * len(numbers) + 1)
    parts[0::2] = template.literals
    parts[1::2] = map(str, numbers)
    return "".join(parts)


def write_trace(template: Template, path: Path, repetitions: int) -> int:
    """Stream ``repetitions`` repetitions of the fixture's events to ``path``; return its size."""
    with open(path, "w", encoding="utf-8", newline="") as sink:
        sink.write(template.head)
        for index in range(repetitions):
            sink.write(",\n  " if index else "\n  ")
            sink.write(repetition(template, index))
        sink.write("\n  " + template.tail)
    return path.stat().st_size


def build_mega_kernel_trace(root: Path, invocations: int) -> tuple[Path, int, int, Path, str]:
    """A store with one run of ``invocations`` simulated MoE launches and their task graph,
    exported to a standalone trace; return its path, its record count, its event count, the
    store and the run."""
    from export import CONFIG_ID
    from ingest import store_launches

    from multicore_profiler import export_chrome_trace, open_store
    from multicore_profiler.kernels.synthetic import SimulatedMoeKernel

    kernel = SimulatedMoeKernel(
        experts=32, tiles=52, aic_workers=48, aiv_workers=48, aic_slots=48, aiv_slots=48
    )
    store_dir = root / "mega-kernel-store"
    store = open_store(store_dir)
    run_id = store_launches(
        store,
        kernel,
        invocations,
        label="bench-fuse",
        config_id=CONFIG_ID,
        tasks=kernel.tasks_table(CONFIG_ID),
    )
    exported = export_chrome_trace(store, root / "mega_kernel.json", run=run_id)
    records = invocations * kernel.records_per_launch
    assert exported.records == records, (exported.records, records)
    return exported.path, exported.records, exported.events, store_dir, run_id


def peak_rss() -> float:
    """This process's peak RSS in MiB (``VmHWM``; ``ru_maxrss`` where there is no /proc)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(kind: str, *paths: str) -> dict[str, Any]:
    """The work of one measured process; its result goes to stdout as one JSON line."""
    if kind == "floor":
        from multicore_profiler import ingest_trace, merge_chrome_traces

        return {"api": [ingest_trace.__name__, merge_chrome_traces.__name__]}
    if kind == "json":
        # json.load of every trace, the others' events appended to the first's, json.dump.
        *traces, out = paths
        began = time.perf_counter()
        docs = []
        for trace in traces:
            with open(trace, encoding="utf-8") as source:
                docs.append(json.load(source))
        loaded = time.perf_counter()
        doc = docs[0]
        for other in docs[1:]:
            doc["traceEvents"].extend(other["traceEvents"])
        merged = time.perf_counter()
        with open(out, "w", encoding="utf-8") as sink:
            json.dump(doc, sink)
        done = time.perf_counter()
        return {
            "load": loaded - began,
            "merge": merged - loaded,
            "dump": done - merged,
            "wall": done - began,
            "events": len(doc["traceEvents"]),
        }
    from multicore_profiler import ingest_trace, merge_chrome_traces, open_store

    if kind.startswith("ours-"):  # ours, the trace read by that many processes
        os.environ["MCPROF_TRACE_WORKERS"] = kind.removeprefix("ours-")
        kind = "ours"

    # "ours": the MegaKernel side is its exported trace file; "selection": the run in its
    # store, which the fuser reads as a store selection.
    if kind == "selection":
        trace, mk_store, run_id, out, store_dir, pattern = paths
        selection = {"run": run_id}
        mega_kernel: Any = open_store(mk_store, create=False)
    else:
        trace, mega_kernel, out, store_dir, pattern = paths
        selection = {}
    store = open_store(store_dir)
    began = time.perf_counter()
    source = ingest_trace(store, trace)
    ingested = time.perf_counter()
    rss_ingest = peak_rss()
    merged = merge_chrome_traces(
        trace, mega_kernel, out, store=store, kernel_pattern=pattern, **selection
    )
    done = time.perf_counter()
    report = merged.report
    return {
        "ingest": ingested - began,
        "fuse": done - ingested,
        "wall": done - began,
        "events": source.events,
        "new": source.new,
        "rss_ingest": rss_ingest,
        "rss_worker": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "aligned": len(report.get("invocations", [])),
        "counts": report.get("counts"),
        "out_bytes": Path(merged.path).stat().st_size,
    }


def measure(kind: str, *paths: str | Path) -> dict[str, Any]:
    """Run ``child(kind, *paths)`` in a fresh interpreter; return its result, with its peak
    RSS (MiB) as ``rss``."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", kind, *map(str, paths)]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the {kind} process failed (exit {done.returncode}); see above")
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Job:
    """One kind of measured process: its ``child`` arguments and the paths it leaves behind."""

    kind: str
    paths: tuple[str | Path, ...]
    scratch: tuple[Path, ...]


def rounds(repeat: int, jobs: list[Job]) -> list[list[dict[str, Any]]]:
    """Each job's results of ``repeat`` rounds, the jobs of a round back to back in fresh
    processes; scratch paths are removed after each process."""
    results: list[list[dict[str, Any]]] = [[] for _ in jobs]
    for _ in range(repeat):
        for job, runs in zip(jobs, results, strict=True):
            runs.append(measure(job.kind, *job.paths))
            for path in job.scratch:
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
    return results


def times(runs: list[dict[str, Any]], key: str) -> str:
    """``median, best [min-max]`` seconds of ``key`` over the runs."""
    values = [run[key] for run in runs]
    extent = f"[{min(values):.3f}-{max(values):.3f}]"
    return f"{statistics.median(values):7.3f} {min(values):7.3f} {extent:<17}"


def rate(runs: list[dict[str, Any]], key: str, size: int) -> str:
    """MB/s of the median ``key`` seconds for ``size`` bytes."""
    return f"{size / 1e6 / statistics.median(run[key] for run in runs):8.0f}"


def ratio(numerators: list[float], denominators: list[float]) -> list[float]:
    """Each round's ratio (the processes of a round ran back to back)."""
    return [a / b for a, b in zip(numerators, denominators, strict=True)]


def spread(values: list[float]) -> str:
    """``median [min-max]``."""
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


Row = tuple[str, list[dict[str, Any]], str, str | None]
"""A table row: its label, the runs, the time key and the peak RSS key (if shown)."""


def baseline_rows(runs: list[dict[str, Any]], loaded: str, *, merged: bool) -> list[Row]:
    """The rows of the json baseline in a case's table: load, (extend,) dump, total."""
    rows: list[Row] = [(f"baseline json.load {loaded}", runs, "load", None)]
    if merged:
        rows.append(("baseline traceEvents.extend", runs, "merge", None))
    rows.append(("baseline json.dump", runs, "dump", None))
    return [*rows, ("baseline total", runs, "wall", "rss")]


def ours_rows(runs: list[dict[str, Any]]) -> list[Row]:
    """The rows of ours in a case's table: ingest, fuse, total."""
    return [
        ("ours ingest_trace", runs, "ingest", "rss_ingest"),
        ("ours merge_chrome_traces (fuse write)", runs, "fuse", None),
        ("ours total", runs, "wall", "rss"),
    ]


def table(
    title: str, size: int, rows: list[tuple[str, list[dict[str, Any]], str, str | None]]
) -> None:
    """Print one case's stages: ``rows`` of (stage, its runs, the key of its seconds, the key
    of the peak RSS shown on its line or None)."""
    print(f"\n{title}")
    print(
        f"  {'stage':<46} {'median':>7} {'best':>7} {'[min-max] s':<17} {'MB/s':>8} "
        f"{'peak RSS MiB':>12}"
    )
    for stage, runs, key, peak in rows:
        rss = f"{max(run[peak] for run in runs):12.0f}" if peak else f"{'':>12}"
        print(f"  {stage:<46} {times(runs, key)} {rate(runs, key, size)} {rss}")


def speedup_line(
    name: str, base: list[dict[str, Any]], ours: list[dict[str, Any]]
) -> tuple[float, float]:
    """Print ours vs the baseline; return the median speedup and the peak RSS ratio."""
    speedups = ratio([run["wall"] for run in base], [run["wall"] for run in ours])
    best = min(run["wall"] for run in base) / min(run["wall"] for run in ours)
    base_rss = max(run["rss"] for run in base)
    ours_rss = max(run["rss"] for run in ours)
    print(
        f"  {name}: speedup {spread(speedups)}x (best vs best {best:.2f}x); peak RSS "
        f"{ours_rss:.0f} / {base_rss:.0f} MiB = {ours_rss / base_rss:.2f} of the baseline's"
    )
    return statistics.median(speedups), ours_rss / base_rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="outer trace size (1e9 B)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--invocations", type=int, default=8)
    parser.add_argument("--workdir", type=Path, help="where the temporary directory goes")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--kernel-pattern", default=KERNEL_PATTERN)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps({**child(*args.child), "rss": peak_rss()}))
        return

    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    root = Path(
        tempfile.mkdtemp(prefix="mcprof-fuse-", dir=args.workdir or os.environ.get("TMPDIR"))
    )
    try:
        bench(args, root)
    finally:
        if args.keep:
            print(f"files kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def bench(args: argparse.Namespace, root: Path) -> None:
    """Generate the traces, then measure both cases against their baselines."""
    template = load_template(args.fixture, args.kernel_pattern)
    per_repetition = template.body_bytes + 3
    fixed = len((template.head + template.tail).encode()) + 3
    repetitions = max(2, math.ceil((args.size_gb * 1e9 - fixed) / per_repetition))
    if template.matching * 2 < args.invocations:
        raise SystemExit(f"only {template.matching} kernels a repetition match the pattern")
    print(
        f"fixture {args.fixture.name}: {template.events:,} events, {template.kernels:,} "
        f"device kernels, {template.matching} matching {args.kernel_pattern!r}; {os.cpu_count()} "
        f"CPUs, load average {os.getloadavg()[0]:.2f} at the start"
    )

    big = root / "outer.json"
    began = time.perf_counter()
    size = write_trace(template, big, repetitions)
    generated = time.perf_counter() - began
    events = template.events * repetitions
    print(
        f"outer trace: {repetitions} repetitions, {events:,} events, {size / 1e6:,.0f} MB "
        f"(fixture's pretty-printed layout) in {generated:.1f} s ({size / 1e6 / generated:.0f} "
        "MB/s)"
    )
    doubled = root / "outer_x2.json"
    doubled_size = write_trace(template, doubled, 2)
    doubled_events = 2 * template.events
    print(
        f"hyper-parallel-sized outer trace: 2 repetitions, {doubled_events:,} events, "
        f"{doubled_size / 1e6:,.0f} MB"
    )

    began = time.perf_counter()
    mega_kernel, records, mk_events, mk_store, run_id = build_mega_kernel_trace(
        root, args.invocations
    )
    mk_size = mega_kernel.stat().st_size
    print(
        f"MegaKernel trace: {args.invocations} invocations, {records:,} records, "
        f"{mk_events:,} events, {mk_size / 1e6:,.0f} MB in {time.perf_counter() - began:.1f} s"
    )
    from multicore_profiler.ingest.trace_workers import cores as trace_cores

    cores = trace_cores()
    floor_rss = measure("floor")["rss"]
    print(
        f"every stage: median, best [min-max] of {args.repeat} rounds, each process fresh; "
        f"import floor of ours: {floor_rss:.0f} MiB peak RSS"
    )

    out, store = root / "out.json", root / "store"
    pattern = args.kernel_pattern
    ours_paths = (mega_kernel, out, store, pattern)
    hyper_base, hyper, selection = rounds(
        args.repeat,
        [
            Job("json", (doubled, mega_kernel, out), (out,)),
            Job("ours", (doubled, *ours_paths), (out, store)),
            Job("selection", (doubled, mk_store, run_id, out, store, pattern), (out, store)),
        ],
    )
    big_base, ours, alone, every = rounds(
        args.repeat,
        [
            Job("json", (big, out), (out,)),
            Job("ours", (big, *ours_paths), (out, store)),
            Job("ours-1", (big, *ours_paths), (out, store)),
            Job(f"ours-{cores}", (big, *ours_paths), (out, store)),
        ],
    )
    for runs, expected in (
        (hyper_base, doubled_events + mk_events),
        (big_base, events),
        (hyper, doubled_events),
        (selection, doubled_events),
        (ours, events),
        (alone, events),
        (every, events),
    ):
        assert all(run["events"] == expected for run in runs), (runs[0]["events"], expected)
    for name, runs in (
        ("hyper-parallel-sized", hyper),
        ("store selection", selection),
        (f"{size / 1e9:.1f} GB", ours),
    ):
        run = runs[0]
        assert all(r["aligned"] == args.invocations for r in runs), run["aligned"]
        print(
            f"{name}: {run['events']:,} outer events ingested (new={run['new']}), "
            f"{run['aligned']} invocations fused, output {run['out_bytes'] / 1e6:,.0f} MB, "
            f"counts {run['counts']}, peak RSS after ingest "
            f"{max(r['rss_ingest'] for r in runs):.0f} MiB"
        )

    hyper_size = doubled_size + mk_size
    table(
        f"hyper-parallel-sized: 2x fixture ({doubled_size / 1e6:,.0f} MB) + MegaKernel trace "
        f"({mk_size / 1e6:,.0f} MB) = {hyper_size / 1e6:,.0f} MB of input text",
        hyper_size,
        [
            *baseline_rows(hyper_base, "outer + MegaKernel trace", merged=True),
            *ours_rows(hyper),
            ("ours, MegaKernel from its store: ingest_trace", selection, "ingest", None),
            ("  merge_chrome_traces (fuse write)", selection, "fuse", None),
            ("  total", selection, "wall", "rss"),
        ],
    )
    hyper_speedup, hyper_rss = speedup_line("ours vs baseline", hyper_base, hyper)
    speedup_line("from the store vs baseline", hyper_base, selection)

    big_size = size + mk_size
    table(
        f"{size / 1e9:.1f} GB: outer trace ({size / 1e6:,.0f} MB) + MegaKernel trace "
        f"({mk_size / 1e6:,.0f} MB) = {big_size / 1e6:,.0f} MB of input text",
        big_size,
        [
            *baseline_rows(big_base, "outer trace", merged=False),
            *ours_rows(ours),
            ("ours, the trace read by 1 process: ingest_trace", alone, "ingest", "rss_ingest"),
            ("  merge_chrome_traces (fuse write)", alone, "fuse", None),
            ("  total", alone, "wall", "rss"),
            (f"ours, read by {cores} workers: ingest_trace", every, "ingest", "rss_ingest"),
            ("  merge_chrome_traces (fuse write)", every, "fuse", None),
            ("  total", every, "wall", "rss"),
        ],
    )
    big_speedup, _ = speedup_line("ours (trace workers by default) vs baseline", big_base, ours)
    speedup_line("ours, 1 process reading the trace, vs baseline", big_base, alone)
    speedup_line(f"ours, {cores} workers reading the trace, vs baseline", big_base, every)
    scaling = ratio([run["ingest"] for run in alone], [run["ingest"] for run in every])
    worker_rss = max(run["rss_worker"] for run in every)
    print(
        f"  ingest on {cores} workers vs 1 process: {spread(scaling)}x faster "
        f"({size / 1e6 / statistics.median(r['ingest'] for r in every):.0f} vs "
        f"{size / 1e6 / statistics.median(r['ingest'] for r in alone):.0f} MB/s); each worker's "
        f"peak RSS at most {worker_rss:.0f} MiB, beside the reading process's"
    )
    ours_rss = max(run["rss"] for run in ours) + cores * max(run["rss_worker"] for run in ours)

    print(
        f"\ngoals (median speedup of the rounds, highest peak RSS; load average now "
        f"{os.getloadavg()[0]:.2f}):"
    )
    met = hyper_speedup >= 10 and hyper_rss <= 1 / 3
    print(
        f"  hyper-parallel-sized: >= 10x json.load x2 + extend + json.dump with <= 1/3 of its "
        f"peak RSS: {hyper_speedup:.2f}x, {hyper_rss:.2f} -> {'met' if met else 'NOT met'}"
    )
    met = big_speedup >= 10 and ours_rss < 1536
    print(
        f"  {size / 1e9:.1f} GB: >= 10x json.load + json.dump with peak RSS < 1.5 GB (the "
        f"reading process's and its {cores} workers' together): "
        f"{big_speedup:.2f}x, {ours_rss:.0f} MiB -> {'met' if met else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
