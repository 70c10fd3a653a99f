"""Cross-rank benchmark: our whole cross-rank analysis against msprof-analyze's cluster
analysis, on the same rank folders, in the same run.

Inputs: the 4-rank Qwen3 capture (``../shared/fixtures/ascend-cluster/
msinsight_st_qwen3_4rank_pp2_dp2``: torch_npu's simplified text export, TP1 PP2 DP2), and
synthetic jobs of ``--ranks`` ranks built from it: rank r is rank r % 4's folder with its
step_trace_time values scaled by (1 + (r // 4) / 1000), its own profiler_info_r.json, and a
profiler_metadata.json of a TP1 PP2 DP(n/2) job of n ranks (pipeline groups {i, i + n/2},
two data-parallel groups); at 4 ranks, the fixture's own. Each folder's analysis.db is
left out, so that msprof-analyze runs in text mode (with it, it runs in DB mode and
writes no stage rows).

Ours, timed: ``open_store`` of a fresh store, ``ingest_job`` of the job's folder, then
``cross_rank`` of the job (every cross-rank table: rank_step_breakdown, slow_rank_causes,
collective_waits, slow_ranks, slow_rank_advice, rank_clock_offsets, with the gap checks).
A second row of ours times the tables alone, of a job already in the store, from a fresh
``open_store`` (what a later ``mcprof ranks`` pays: the store's reason to be is to ask
again without reading the profiler's files again). Baseline: ``msprof-analyze cluster -m
all -d <copy>`` as a user runs it (its process included; ours are timed after the imports),
on a fresh copy of the same folders each time. Each is repeated ``--repeat`` times; the
table shows the median and the spread (min-max) of the wall times, msprof-analyze's median
over each median, and the time per rank.

Goal: ours >= 10x faster than msprof-analyze at the fixture's size and at 64 ranks.

    .venv/bin/python bench/cross_rank.py [--ranks 4 16 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from multicore_profiler.analysis.cross_rank import cross_rank
from multicore_profiler.ingest.jobs import ingest_job
from multicore_profiler.storage.store import open_store

QWEN3 = (
    Path(__file__).resolve().parents[2]
    / "shared/fixtures/ascend-cluster/msinsight_st_qwen3_4rank_pp2_dp2"
)
GOAL = 10.0
MSPROF = Path(sys.executable).with_name("msprof-analyze")


def scaled_steps(source: Path, target: Path, factor: float) -> None:
    """``step_trace_time.csv`` with every time scaled by ``factor``."""
    with source.open(newline="") as file:
        rows = list(csv.reader(file))
    header, body = rows[0], rows[1:]
    timed = {i for i, name in enumerate(header) if name not in ("Device_id", "Step")}
    with target.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        for row in body:
            writer.writerow(
                [f"{float(v) * factor!r}" if i in timed else v for i, v in enumerate(row)]
            )


def parallel_metadata(rank: int, ranks: int) -> dict:
    """A TP1 PP2 DP(ranks/2) job's profiler_metadata.json, as rank ``rank`` writes it."""
    half = ranks // 2
    groups = {"group_name_0": {"group_name": "default_group", "group_rank": rank,
                               "global_ranks": list(range(ranks))}}  # fmt: skip
    for i in range(half):
        if rank in (i, i + half):
            groups[f"group_name_pp{i}"] = {
                "group_name": "pp", "group_rank": int(rank >= half), "global_ranks": [i, i + half]
            }  # fmt: skip
    stage = list(range(half)) if rank < half else list(range(half, ranks))
    groups["group_name_dp"] = {"group_name": "dp", "group_rank": stage.index(rank),
                               "global_ranks": stage}  # fmt: skip
    return {
        "distributed_args": {
            "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 2,
            "data_parallel_size": half, "context_parallel_size": 1,
            "expert_model_parallel_size": 1, "sequence_parallel": False, "rank": rank,
            "world_size": ranks,
        },
        "parallel_group_info": groups,
    }  # fmt: skip


def build_job(root: Path, ranks: int) -> Path:
    """A job of ``ranks`` rank folders under ``root`` (see the module's doc)."""
    job = root / f"job{ranks}"
    for rank in range(ranks):
        source = QWEN3 / f"rank_{rank % 4}_ascend_pt"
        folder = job / f"rank_{rank}_ascend_pt"
        output = folder / "ASCEND_PROFILER_OUTPUT"
        output.mkdir(parents=True)
        for name in ("communication.json", "communication_matrix.json"):
            shutil.copyfile(source / "ASCEND_PROFILER_OUTPUT" / name, output / name)
        scaled_steps(
            source / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv",
            output / "step_trace_time.csv",
            1 + (rank // 4) / 1000,
        )
        info = json.loads((source / f"profiler_info_{rank % 4}.json").read_text())
        info["rank_id"] = str(rank)
        (folder / f"profiler_info_{rank}.json").write_text(json.dumps(info))
        metadata = parallel_metadata(rank, ranks) if ranks != 4 else None
        if metadata is None:
            shutil.copyfile(source / "profiler_metadata.json", folder / "profiler_metadata.json")
        else:
            (folder / "profiler_metadata.json").write_text(json.dumps(metadata))
    return job


def ours(job: Path, scratch: Path) -> float:
    """Wall seconds of a fresh store, the job's ingest and every cross-rank table."""
    store_dir = scratch / "store"
    start = time.perf_counter()
    with open_store(store_dir, create=True) as store:
        loaded = ingest_job(store, [job], job="bench")
        report = cross_rank(store, jobs=["bench"])
    took = time.perf_counter() - start
    if len(loaded) != report.rank_step_breakdown.column("type").to_pylist().count("rank"):
        raise SystemExit(f"ours: {len(loaded)} ranks loaded, but not a breakdown row each")
    shutil.rmtree(store_dir)
    return took


def ours_again(job: Path, scratch: Path) -> float:
    """Wall seconds of every cross-rank table of a job already in a store, from a fresh
    ``open_store`` (as a later ``mcprof ranks`` pays): the ingest is outside the timing."""
    store_dir = scratch / "store"
    with open_store(store_dir, create=True) as store:
        ingest_job(store, [job], job="bench")
    start = time.perf_counter()
    with open_store(store_dir) as store:
        cross_rank(store, jobs=["bench"])
    took = time.perf_counter() - start
    shutil.rmtree(store_dir)
    return took


def msprof(job: Path, scratch: Path) -> float:
    """Wall seconds of ``msprof-analyze cluster -m all`` on a fresh copy of the job."""
    copy = scratch / "copy"
    shutil.copytree(job, copy)
    start = time.perf_counter()
    done = subprocess.run(
        [str(MSPROF), "cluster", "-m", "all", "-d", str(copy)],
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - start
    produced = copy / "cluster_analysis_output" / "cluster_step_trace_time.csv"
    if done.returncode != 0 or not produced.is_file():
        raise SystemExit(f"msprof-analyze failed ({done.returncode}): {done.stderr[-2000:]}")
    shutil.rmtree(copy)
    return took


def repeated(measure: Callable[[Path, Path], float], job: Path, repeat: int) -> list[float]:
    """``repeat`` wall times of ``measure``, each in a fresh scratch directory."""
    times = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="mcprof-bench-") as scratch:
            times.append(measure(job, Path(scratch)))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not QWEN3.is_dir():
        raise SystemExit(f"the fixture is not here: {QWEN3}")
    print(
        "ranks  what                                   median s (min-max)   "
        "msprof-analyze / it  ms/rank"
    )
    with tempfile.TemporaryDirectory(prefix="mcprof-ranks-") as root:
        for ranks in args.ranks:
            job = build_job(Path(root), ranks)
            theirs = repeated(msprof, job, args.repeat)
            base = statistics.median(theirs)
            for what, times in (
                ("msprof-analyze cluster -m all", theirs),
                ("ours: ingest + every table", repeated(ours, job, args.repeat)),
                ("ours: every table of a stored job", repeated(ours_again, job, args.repeat)),
            ):
                median = statistics.median(times)
                print(
                    f"{ranks:>5}  {what:<36}  {median:>8.3f} ({min(times):.3f}-{max(times):.3f})"
                    f"  {base / median:>17.1f}x  {median / ranks * 1e3:>7.2f}"
                )
    print(f"goal: ours >= {GOAL:.0f}x faster than msprof-analyze cluster -m all")


if __name__ == "__main__":
    main()
