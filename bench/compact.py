"""Compaction benchmark: the lock-free rewrite (remote stores) against the journaled swap.

Writes the same runs (``--ranks`` ranks x ten steps, ``--records`` records a run and
rank) twice on this machine's disk: to a local store, and to a store on a pyarrow
``SubTreeFileSystem`` over a directory, which the store treats as remote (no lock, no
rename). Then times, on each:

- the compaction (local: journaled swap; remote: rewrite and supersession commit);
- a one-run ``stage_stats`` query before it, after it, and after the vacuum that
  deletes the superseded files (remote: a second compaction, ``grace=0``).

Baseline, measured in the same run: the local store's journaled swap. Object storage
adds its own request latency; this measures what the store's code costs.

    .venv/bin/python bench/compact.py [--runs 4] [--ranks 8] [--records 250000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
from scale import one_run, timed, write

from multicore_profiler.storage.store import Store, open_store


def with_rank(steps: list[tuple[pa.Table, ...]], rank: int) -> list[tuple[pa.Table, ...]]:
    """The same steps as written by another rank."""
    return [
        tuple(
            t.set_column(
                t.schema.get_field_index("rank"), "rank", pa.repeat(rank, len(t)).cast(pa.int32())
            )
            for t in step
        )
        for step in steps
    ]


def fill(store: Store, runs: int, ranks: int, steps: list[tuple[pa.Table, ...]]) -> None:
    for index in range(runs):
        for rank in range(ranks):
            write(store, f"run-{index:04d}", index, with_rank(steps, rank))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--records", type=int, default=250_000, help="records a run and rank")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    steps = one_run(args.records)
    per_rank = sum(t[2].num_rows for t in steps)
    query = "SELECT * FROM stage_stats WHERE run_id = 'run-0000' ORDER BY ALL"
    with tempfile.TemporaryDirectory(prefix="mcprof-compact-") as scratch:
        root = Path(scratch)
        (root / "remote").mkdir()
        local = open_store(root / "local")
        subtree = pafs.SubTreeFileSystem(str(root / "remote"), pafs.LocalFileSystem())
        remote = open_store("store", filesystem=subtree)
        for store in (local, remote):
            fill(store, args.runs, args.ranks, steps)
        total = args.runs * args.ranks * per_rank
        print(
            f"stores: {args.runs} runs x {args.ranks} ranks x {per_rank:,} records "
            f"= {total:,} records, 10 steps"
        )
        times = {}
        for name, store in (("local", local), ("remote", remote)):
            before, _ = timed(store, query, args.repeat)
            began = time.perf_counter()
            report = store.compact()
            spent = time.perf_counter() - began
            after, _ = timed(store, query, args.repeat)
            vacuum = store.compact(grace=timedelta(0)) if name == "remote" else None
            vacuumed, _ = timed(store, query, args.repeat)
            times[name] = spent
            print(
                f"{name:6}: compaction {spent:6.2f} s ({report.files_before} files -> "
                f"{report.files_after}, {report.rows / spent / 1e6:.1f} M rows/s); one-run query "
                f"{before * 1e3:.0f} ms before, {after * 1e3:.0f} ms after"
                + (
                    f", {vacuumed * 1e3:.0f} ms after the vacuum ({vacuum.files_deleted} files)"
                    if vacuum
                    else ""
                )
            )
        assert local.sql(query).equals(remote.sql(query)), "the two stores disagree"
        print(f"lock-free rewrite / journaled swap: {times['remote'] / times['local']:.2f}x")


if __name__ == "__main__":
    main()
