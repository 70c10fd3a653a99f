"""Fuse benchmark: ingest a 1 GB kineto trace and fuse MegaKernel invocations into it.

The outer trace repeats the events of a real kineto trace (the A100 training fixture: 108,936
events, 6,080 device kernels) K times until it reaches ``--size-gb``, every ``ts`` shifted by
K x (fixture span + 10 ms) in exact integer microseconds, and every flow ``id``, ``correlation``
and ``External id`` by K x 10^d so that links stay within their repetition. The repetitions are
written as text, in the fixture's own pretty-printed kineto layout. The MegaKernel side is a
run of ``--invocations`` launches (default 8) of the simulated MoE MegaKernel (32 experts x
52 tiles on 48 AIC and 48 AIV workers: 18,368 records a launch, 146,944 for 8), exported
to a standalone Chrome trace; invocation i aligns to the i-th NCCL SendRecv device kernel.
The scale case is measured twice: with that trace file as the MegaKernel side, and with the
run in its store (a store selection, which the fuser reads as a ``Timeline``).

Every measured piece of work runs in a fresh process, so its peak RSS is its own (``VmHWM``:
``ru_maxrss`` of a child spawned by ``vfork`` carries the parent's peak); wall times are the best
of ``--repeat`` runs, measured inside the process (imports excluded, in the RSS).

Baseline, in the same run on the same file: ``json.load`` + ``json.dump``. Goal: ingest
(``ingest_trace`` into a fresh store) + fuse (``merge_chrome_traces`` with that store) faster
than the baseline, with peak RSS under 1.5 GB. Scale reference: hyper-parallel's merger takes
about 7 s and 870 MB to fuse 8 invocations (147 k events) into a 216 k-event A100 trace (the
fixture doubled here); goal 10x faster with a third of the memory.

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
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURE = Path("/work/shared/fixtures/kineto/a100_training_rank0.json.gz")
KERNEL_PATTERN = r"^ncclKernel_SendRecv"
GAP_US = 10_000
HYPER_PARALLEL_S, HYPER_PARALLEL_MB = 7.0, 870.0
MIB = 1024 * 1024

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
    from export import CONFIG_ID, task_graph
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
        tasks=task_graph(kernel),
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

        return {"wall": 0.0, "api": [ingest_trace.__name__, merge_chrome_traces.__name__]}
    if kind == "baseline":
        trace, out = paths
        began = time.perf_counter()
        with open(trace, encoding="utf-8") as source:
            doc = json.load(source)
        loaded = time.perf_counter()
        with open(out, "w", encoding="utf-8") as sink:
            json.dump(doc, sink)
        done = time.perf_counter()
        return {
            "load": loaded - began,
            "dump": done - loaded,
            "wall": done - began,
            "events": len(doc["traceEvents"]),
        }
    from multicore_profiler import ingest_trace, merge_chrome_traces, open_store

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
        "aligned": len(report.get("invocations", [])),
        "counts": report.get("counts"),
        "out_bytes": Path(merged.path).stat().st_size,
    }


def measure(kind: str, *paths: str | Path) -> tuple[dict[str, Any], float]:
    """Run ``child(kind, *paths)`` in a fresh interpreter; return its result and peak RSS (MiB)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", kind, *map(str, paths)]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the {kind} process failed (exit {done.returncode}); see above")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result, result["rss"]


def repeated(
    kind: str, repeat: int, scratch: list[Path], *paths: str | Path
) -> tuple[dict[str, Any], float]:
    """Best of ``repeat`` fresh processes (by wall time) and the highest peak RSS among them;
    ``scratch`` paths are removed after each run."""
    results, peak = [], 0.0
    for _ in range(repeat):
        result, rss = measure(kind, *paths)
        results.append(result)
        peak = max(peak, rss)
        for path in scratch:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    return min(results, key=lambda r: r["wall"]), peak


def row(work: str, wall: float, size: int, events: int, rss: float | None, base: Any) -> str:
    """One line of the table; ``base`` is the baseline's (wall, rss) or None."""
    rss_text = f"{rss:8.0f}" if rss is not None else f"{'-':>8}"
    ratio = ""
    if base is not None:
        ratio = f"{base[0] / wall:6.2f}x"
        if rss is not None:
            ratio += f"  {rss / base[1]:5.2f}"
    return (
        f"{work:<34} {wall:8.2f} {size / 1e6 / wall:8.0f} {events / 1e6 / wall:8.2f} "
        f"{rss_text}  {ratio}"
    )


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
    """Generate the traces, then measure the baseline, ours and the scale comparison."""
    template = load_template(args.fixture, args.kernel_pattern)
    per_repetition = template.body_bytes + 3
    fixed = len((template.head + template.tail).encode()) + 3
    repetitions = max(1, math.ceil((args.size_gb * 1e9 - fixed) / per_repetition))
    if template.matching * repetitions < args.invocations:
        raise SystemExit(f"only {template.matching} kernels a repetition match the pattern")
    print(
        f"fixture {args.fixture.name}: {template.events:,} events, {template.kernels:,} "
        f"device kernels, {template.matching} matching {args.kernel_pattern!r}; {os.cpu_count()} "
        f"CPUs"
    )

    big = root / "outer.json"
    began = time.perf_counter()
    size = write_trace(template, big, repetitions)
    generated = time.perf_counter() - began
    events = template.events * repetitions
    print(
        f"outer trace: {repetitions} repetitions, {events:,} events, {size / 1e9:.3f} GB "
        f"(fixture's pretty-printed layout) in {generated:.1f} s ({size / 1e6 / generated:.0f} "
        f"MB/s)"
    )
    doubled = root / "outer_x2.json"
    doubled_size = write_trace(template, doubled, 2)

    began = time.perf_counter()
    mega_kernel, records, mk_events, mk_store, run_id = build_mega_kernel_trace(
        root, args.invocations
    )
    print(
        f"MegaKernel trace: {args.invocations} invocations, {records:,} records, "
        f"{mk_events:,} events, {mega_kernel.stat().st_size / 1e6:.0f} MB in "
        f"{time.perf_counter() - began:.1f} s"
    )

    _, floor_rss = measure("floor")
    out = root / "out.json"
    store = root / "store"
    base, base_rss = repeated("baseline", args.repeat, [out], big, out)
    assert base["events"] == events, (base["events"], events)
    print(
        f"baseline: json.load {base['load']:.2f} s + json.dump {base['dump']:.2f} s, "
        f"peak RSS {base_rss:.0f} MiB (import floor of ours: {floor_rss:.0f} MiB)"
    )

    ours, ours_rss = repeated(
        "ours", args.repeat, [out, store], big, mega_kernel, out, store, args.kernel_pattern
    )
    scale, scale_rss = repeated(
        "ours", args.repeat, [out, store], doubled, mega_kernel, out, store, args.kernel_pattern
    )
    selection, selection_rss = repeated(
        "selection",
        args.repeat,
        [out, store],
        doubled,
        mk_store,
        run_id,
        out,
        store,
        args.kernel_pattern,
    )
    for name, result in (("ours", ours), ("scale", scale), ("store selection", selection)):
        print(
            f"{name}: ingest {result['ingest']:.2f} s + fuse {result['fuse']:.2f} s; "
            f"{result['events']:,} events ingested (new={result['new']}), "
            f"{result['aligned']} invocations fused, output {result['out_bytes'] / 1e6:.0f} MB, "
            f"counts {result['counts']}, peak RSS after ingest {result['rss_ingest']:.0f} MiB"
        )

    pair = (base["wall"], base_rss)
    print()
    print(
        f"{'work':<34} {'wall s':>8} {'MB/s':>8} {'M ev/s':>8} {'RSS MiB':>8}  "
        f"speedup  RSS ratio (vs baseline, best of {args.repeat})"
    )
    print(row("baseline json.load + json.dump", base["wall"], size, events, base_rss, None))
    print(row("ours ingest_trace", ours["ingest"], size, events, None, pair))
    print(row("ours merge_chrome_traces", ours["fuse"], size, events, None, pair))
    print(row("ours ingest + fuse", ours["wall"], size, events, ours_rss, pair))
    hyper = (HYPER_PARALLEL_S, HYPER_PARALLEL_MB)
    doubled_events = 2 * template.events
    print(
        row(
            "scale: 2x fixture ingest + fuse",
            scale["wall"],
            doubled_size,
            doubled_events,
            scale_rss,
            hyper,
        )
    )
    print(
        row(
            "scale, from the store: ingest+fuse",
            selection["wall"],
            doubled_size,
            doubled_events,
            selection_rss,
            hyper,
        )
    )
    print(
        row(
            "  of which merge_chrome_traces",
            selection["fuse"],
            doubled_size,
            doubled_events,
            None,
            hyper,
        )
    )
    print(
        f"{'hyper-parallel merger (reference)':<34} {HYPER_PARALLEL_S:8.2f} "
        f"{doubled_size / 1e6 / HYPER_PARALLEL_S:8.0f} "
        f"{doubled_events / 1e6 / HYPER_PARALLEL_S:8.2f} {HYPER_PARALLEL_MB:8.0f}"
    )
    print()
    speedup = base["wall"] / ours["wall"]
    print(
        f"goal 1: faster than json.load + json.dump with peak RSS < 1.5 GB: {speedup:.2f}x, "
        f"{ours_rss:.0f} MiB -> {'met' if speedup > 1 and ours_rss < 1536 else 'NOT met'}"
    )
    scale_speedup = HYPER_PARALLEL_S / scale["wall"]
    fraction = scale_rss / HYPER_PARALLEL_MB
    met = scale_speedup >= 10 and fraction <= 1 / 3
    print(
        f"goal 2: 10x faster than hyper-parallel with a third of its memory: {scale_speedup:.1f}x, "
        f"{fraction:.2f} of its memory -> {'met' if met else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
