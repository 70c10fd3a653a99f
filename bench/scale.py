"""Scale benchmark: a per-stage aggregate over a store of many runs, and over one run.

Builds a store of ``--runs`` runs x ``--records`` records (default 200 x 500 k = 100 M
records) from the simulated MoE MegaKernel: one run's steps are simulated and decoded
once, and every run writes the same rows under its own run id, ten steps each. Then:

- the ``stage_stats`` view over every run of the big store;
- the same view for one run of the big store, filtered (``WHERE run_id = ...``) and
  scoped (``Store.sql(..., runs=[run])``, which lists and reads that run's files only);
- baseline, measured in the same run: that run alone in a store of its own.

Goal: the one-run query on the big store within 1.5x of the one-run store, whatever
the big store holds (partition pruning: DuckDB opens no file of another run).

With ``--cli``, every query is an ``mcprof query`` of its own, in a fresh process, as
users run it (each a new ``Store``, which trusts the files the store's record of
verified files vouches for: ``storage.verified``), timed in versions compared in
interleaved pairs: ``record`` (as shipped), ``unrecorded`` (no record: every file a query
reads natively is checked, as before the record), ``unverified`` (no check at all:
DuckDB's own ``read_parquet`` over the same files, the floor). Goals:

- one run of the big store (``--run``, and ``WHERE run_id``) within 1.2x of the one-run
  store;
- the whole-store aggregate within 1.1x of ``unverified``;
- after ``--new-runs`` (1,000) small runs arrive, the first command checks only their
  files.

    .venv/bin/python bench/scale.py [--runs 200] [--records 500000] [--repeat 5] [--dir D]
    .venv/bin/python bench/scale.py --cli [--runs 200] [--records 100000] [--new-runs 1000]

With ``--remote``, the store is on S3 (moto's server on loopback), and
one run's ``WHERE run_id`` query, the first of a new ``Store``, is timed pinned to its
run (as shipped: only its files listed) against the same query with the whole store
listed (the baseline: ``Store._read_plan`` pinning nothing), alternating in one process.
Then the same query with the tables that commit nothing listed at once (as shipped)
against one after another (the baseline: ``catalog._at_once`` calling them in turn).
``--latency-ms`` makes the server wait that long before it answers each request, as a
real object store's round trip does (loopback answers in well under a millisecond).

    .venv/bin/python bench/scale.py --remote [--runs 80] [--records 5000] [--repeat 5]
        [--latency-ms 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from multicore_profiler.ingest.decode import decode_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches, step_tables
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage import catalog
from multicore_profiler.storage.catalog import RACY_NS
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store, open_store

STEPS = 10
START = datetime(2026, 11, 1, tzinfo=timezone.utc)


def one_run(records: int) -> list[tuple[pa.Table, pa.Table, pa.Table]]:
    """The (invocations, cores, records) of each step of a run of about ``records``."""
    kernel = SimulatedMoeKernel()
    per_step = max(1, round(records / STEPS / kernel.records_per_launch))
    rng = np.random.default_rng(0)
    base = kernel.launches(rng, 8, start_cycle=10**6, period=10**6)
    info = KernelInfo(
        kernel_name=kernel.kernel_name,
        owner_label=kernel.owner_label,
        stage_names=kernel.stage_names,
        soc="Ascend910B4",
    )
    steps = []
    for step in range(STEPS):
        batch = np.resize(base, (per_step, base.shape[1]))
        decoded = decode_buffers(batch, kernel.layout, frequency_hz=kernel.frequency_hz)
        launches = Launches(step=step, first_invocation_id=step * per_step)
        steps.append(step_tables(decoded, info, launches))
    return steps


def write(store: Store, run_id: str, index: int, steps: list[tuple[pa.Table, ...]]) -> None:
    run = RunInfo(run_id, START + timedelta(hours=index), commit=f"{index:08x}", label="scale")
    store.write_run(run)
    for step, (invocations, cores, records) in enumerate(steps):
        store.write_step(run_id, step, invocations=invocations, cores=cores, records=records)
    store.write_run(run.finish())


def timed(
    store: Store, query: str, repeat: int, runs: list[str] | None = None
) -> tuple[float, int]:
    """Median seconds of ``query`` (after one warm-up) and its row count."""
    rows = store.sql(query, runs=runs).num_rows
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        store.sql(query, runs=runs)
        times.append(time.perf_counter() - began)
    return statistics.median(times), rows


RUNNER = """
import sys
from multicore_profiler.storage import store
mode, checked = sys.argv[1], []
if mode != "record":
    store.VerifiedRecord = lambda root: None
if mode == "unverified":
    store.Store._verify = lambda self, spec, path: self._verified.__setitem__(path, True)
read = store.read_verified
store.read_verified = lambda *args, **kwargs: checked.append(1) or read(*args, **kwargs)
from multicore_profiler.cli import main
code = main(sys.argv[2:])
print(len(checked), file=sys.stderr)
sys.exit(code)
"""
"""``python -c RUNNER MODE ARGS...``: ``mcprof ARGS...`` in one of the three versions
(see the module's docstring); prints the number of files it checked to standard error."""


def command(mode: str, store: Path, *args: str) -> tuple[float, int]:
    """Seconds of ``mcprof query --store STORE ARGS...`` in a fresh process (interpreter
    start and imports included), and the number of files it checked."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    argv = [sys.executable, "-c", RUNNER, mode, "query", "--store", str(store), *args]
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    spent = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(f"{' '.join(argv[3:])} failed: {done.stderr}")
    return spent, int(done.stderr.split()[-1])


def spread(values: list[float], unit: str = "") -> str:
    """``median [min-max]`` of ``values``."""
    return f"{statistics.median(values):.2f}{unit} [{min(values):.2f}-{max(values):.2f}]"


def compared(
    name: str, cases: dict[str, tuple[str, Path, tuple[str, ...]]], repeat: int
) -> dict[str, list[float]]:
    """Run each case (mode, store, query args) ``repeat`` times, interleaved, each repeat
    starting with the next case (no case always follows the same one); print and return
    each one's seconds, in repeat order."""
    times: dict[str, list[float]] = {case: [] for case in cases}
    checked: dict[str, set[int]] = {case: set() for case in cases}
    names = list(cases)
    for index in range(repeat):
        for case in names[index % len(names) :] + names[: index % len(names)]:
            mode, store, args = cases[case]
            seconds, files = command(mode, store, *args)
            times[case].append(seconds)
            checked[case].add(files)
    print(name)
    for case, seconds in times.items():
        files = "/".join(str(n) for n in sorted(checked[case]))
        print(f"  {case:<34} {spread(seconds, ' s')} ({files} file(s) checked)")
    return times


def ratio(name: str, times: dict[str, list[float]], of: str, to: str, goal: float) -> None:
    """Print the per-repeat ratios ``of / to``: median [min-max], against ``goal``."""
    ratios = [a / b for a, b in zip(times[of], times[to], strict=True)]
    verdict = "met" if statistics.median(ratios) <= goal else "NOT met"
    print(f"  {name}: {of} / {to} = {spread(ratios, 'x')} (goal <= {goal}x: {verdict})")


def cli_mode(args: argparse.Namespace, root: Path, target: str) -> None:
    """The ``--cli`` measurements (see the module's docstring)."""
    big, one = root / "big", root / "one"
    everything = "SELECT * FROM stage_stats ORDER BY ALL"
    only = f"SELECT * FROM stage_stats WHERE run_id = '{target}' ORDER BY ALL"
    time.sleep(RACY_NS / 1e9)  # files checked this soon after their write are not recorded
    for store in (big, one):
        seconds, files = command("record", store, "--format", "csv", everything)
        print(f"first command on {store.name}, every file checked: {seconds:.2f} s ({files})")
    scoped = ("--format", "csv", "--run", target, everything)
    filtered = ("--format", "csv", only)
    for mode in ("record", "unrecorded"):
        times = compared(
            f"one run, {mode}:",
            {
                "big store, --run": (mode, big, scoped),
                "one-run store, --run": (mode, one, scoped),
                "big store, WHERE run_id": (mode, big, filtered),
                "one-run store, WHERE run_id": (mode, one, filtered),
            },
            args.repeat,
        )
        ratio("--run", times, "big store, --run", "one-run store, --run", 1.2)
        ratio("WHERE run_id", times, "big store, WHERE run_id", "one-run store, WHERE run_id", 1.2)
    whole = ("--format", "csv", everything)
    for mode in ("record", "unrecorded"):  # a pair at a time: no third command between
        cases = {m: (m, big, whole) for m in (mode, "unverified")}
        times = compared(f"stage_stats, all {args.runs} runs:", cases, max(2, args.repeat // 2))
        ratio("whole store", times, mode, "unverified", 1.1)
    small = one_run(1)[:1]
    began = time.perf_counter()
    with open_store(big) as store:
        for index in range(args.new_runs):
            write(store, f"new-{index:04d}", args.runs + index, small)
    print(f"{args.new_runs} new runs of {small[0][2].num_rows} records written in ", end="")
    print(f"{time.perf_counter() - began:.1f} s")
    time.sleep(RACY_NS / 1e9)
    seconds, files = command("record", big, *whole)
    new = sum(1 for _ in big.glob("*/run_id=new-*/**/*.parquet"))
    print(f"first command after them: {seconds:.2f} s, {files} file(s) checked ", end="")
    print(f"(the new runs hold {new} data file(s))")
    cases = {m: (m, big, whole) for m in ("record", "unverified")}
    times = compared(f"stage_stats, all {args.runs + args.new_runs} runs:", cases, 4)
    ratio("whole store", times, "record", "unverified", 1.1)


def remote_mode(args: argparse.Namespace, steps: list[tuple[pa.Table, ...]]) -> None:
    """The ``--remote`` measurement (see the module's docstring)."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer
    from werkzeug.serving import WSGIRequestHandler

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    answer = WSGIRequestHandler.run_wsgi

    def late(handler: WSGIRequestHandler) -> None:
        time.sleep(args.latency_ms / 1000)
        answer(handler)

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    try:
        boto3.client("s3").create_bucket(Bucket="scale")
        uri = "s3://scale/store"
        with open_store(uri, create=True) as store:
            for index in tqdm(range(args.runs), desc="writing runs", unit="run", disable=None):
                write(store, f"run-{index:04d}", index, steps)
        WSGIRequestHandler.run_wsgi = late  # type: ignore[method-assign]
        only = f"SELECT * FROM stage_stats WHERE run_id = 'run-{args.runs // 2:04d}' ORDER BY ALL"
        pinned = (
            "one run, WHERE run_id",
            only,
            Store,
            "_read_plan",
            {"whole store listed": lambda *_: (None, False), "pinned to its run": None},
        )
        at_once = (
            "one run, WHERE run_id",
            only,
            catalog,
            "_at_once",
            {
                "one after another": lambda calls: [call() for call in calls],
                "committed tables at once": None,
            },
        )
        for name, query, owner, attribute, modes in (pinned, at_once):
            timed_swaps(uri, name, query, owner, attribute, modes, args)
    finally:
        WSGIRequestHandler.run_wsgi = answer  # type: ignore[method-assign]
        server.stop()


def timed_swaps(
    uri: str,
    name: str,
    query: str,
    owner: object,
    attribute: str,
    modes: dict[str, Any],
    args: argparse.Namespace,
) -> None:
    """Time ``query``, the first of a new ``Store`` on ``uri``, with ``owner.attribute``
    swapped for each mode's function (None: as shipped), alternating; print the times
    and the ratio of the first mode's to the last's, pair by pair."""
    shipped = getattr(owner, attribute)
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    answers = {}
    try:
        for repeat in range(args.repeat + 1):
            for mode, function in modes.items():
                setattr(owner, attribute, shipped if function is None else function)
                with open_store(uri) as fresh:
                    began = time.perf_counter()
                    answers[mode] = fresh.sql(query)
                    if repeat:
                        times[mode].append(time.perf_counter() - began)
    finally:
        setattr(owner, attribute, shipped)
    first, *_, last = modes
    assert answers[first].equals(answers[last])
    print(
        f"{name}, a new Store's first query, {args.runs} runs on S3 (moto, "
        f"{args.latency_ms:g} ms a request):"
    )
    for mode, seconds in times.items():
        print(f"  {mode:26s} {spread(seconds, ' s')}")
    ratios = [a / b for a, b in zip(times[first], times[last], strict=True)]
    print(f"  {first} / {last} = {spread(ratios, 'x')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--records", type=int, default=500_000, help="records per run")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="where the stores go (default: a temp dir)")
    parser.add_argument("--cli", action="store_true", help="time fresh mcprof processes")
    parser.add_argument("--new-runs", type=int, default=1000, help="--cli: runs that arrive")
    parser.add_argument("--remote", action="store_true", help="a store on S3 (a moto server)")
    parser.add_argument(
        "--latency-ms", type=float, default=0.0, help="--remote: the server's wait per request"
    )
    args = parser.parse_args()
    steps = one_run(args.records)
    if args.remote:
        remote_mode(args, steps)
        return
    per_run = sum(t[2].num_rows for t in steps)
    with tempfile.TemporaryDirectory(prefix="mcprof-scale-", dir=args.dir) as scratch:
        root = Path(scratch)
        target = f"run-{args.runs // 2:04d}"
        began = time.perf_counter()
        with open_store(root / "big") as big:
            for index in tqdm(range(args.runs), desc="writing runs", unit="run", disable=None):
                write(big, f"run-{index:04d}", index, steps)
        written = time.perf_counter() - began
        with open_store(root / "one") as one:
            write(one, target, args.runs // 2, steps)
        total = args.runs * per_run
        print(f"store: {args.runs} runs x {per_run:,} records = {total:,} records")
        print(f"written in {written:.1f} s ({total / written / 1e6:.1f} M records/s)")
        if args.cli:
            cli_mode(args, root, target)
            return
        everything = "SELECT * FROM stage_stats ORDER BY ALL"
        only = f"SELECT * FROM stage_stats WHERE run_id = '{target}' ORDER BY ALL"
        with open_store(root / "big") as big, open_store(root / "one") as one:
            all_s, all_rows = timed(big, everything, max(1, args.repeat // 2))
            big_s, big_rows = timed(big, only, args.repeat)
            scoped_s, scoped_rows = timed(big, everything, args.repeat, runs=[target])
            one_s, one_rows = timed(one, only, args.repeat)
            assert big_rows == scoped_rows == one_rows, (big_rows, scoped_rows, one_rows)
            expected = one.sql(only)
            assert big.sql(only).equals(expected), "the two stores disagree"
            assert big.sql(everything, runs=[target]).equals(expected), "scoping disagrees"
        print(
            f"stage_stats, all {args.runs} runs:          {all_s * 1e3:9.1f} ms ({all_rows} rows)"
        )
        print(f"  one run of the big store, WHERE run_id: {big_s * 1e3:9.1f} ms ({big_rows} rows)")
        print(f"  one run of the big store, runs=[run]:   {scoped_s * 1e3:9.1f} ms")
        print(f"  the one-run store:                      {one_s * 1e3:9.1f} ms (baseline)")
        for what, seconds in (("WHERE run_id", big_s), ("runs=[run]", scoped_s)):
            ratio = seconds / one_s
            verdict = "met" if ratio <= 1.5 else "NOT met"
            print(f"one run ({what}), big / one-run store: {ratio:.2f}x (goal <= 1.5x: {verdict})")


if __name__ == "__main__":
    main()
