"""Analysis benchmark: where a kernel's time goes, for every invocation of 5 M records.

1. ``core_breakdown`` + ``critical_path`` of every invocation of the simulated MoE run
   (32 experts x 30 tiles on 24 AIC and 48 AIV workers, about 10.6 k records a launch,
   with its task graph), every row fetched as Arrow, in records/s. Baseline, measured in
   the same run: networkx's longest path over the same graph (HTA's method: a DiGraph
   built from the task edges, weighted by record durations, then
   ``dag_longest_path_length``), per invocation, on a sample of the invocations (the whole
   5 M-record graph does not fit in networkx's memory on this machine). Goal >= 20x.
2. A what-if sweep, 5 stages x 6 speed-ups, over one invocation of about 20 k records
   (64 experts x 30 tiles on 64 AIC and 48 AIV workers): the whole ``speedup_curves``
   call (its SQL included) and the replay alone. Goal < 1 s.
3. The real experiment (tests/what_if_experiment.py): the CPU reference kernel captured
   without and with 200 us more per GMM1 task; the what-if's prediction against the
   measured median makespan, over 4 alternating rounds of 8 launches each. Goal: error
   <= 10 %.

    .venv/bin/python bench/analyze.py [--records 5000000] [--repeat 3] [--sample 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import networkx as nx
from export import CONFIG_ID, fill, seconds_of, spread
from ingest import store_launches

from multicore_profiler import open_store, speedup_curves
from multicore_profiler.analysis import replay, what_if
from multicore_profiler.analysis.selection import RecordSelection
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from what_if_experiment import run_experiment

_EDGES = """
SELECT invocation_id,
       src_core_type * 100000 + src_block_id * 1000 + src_record_index AS src,
       src_end_cycle - src_start_cycle AS weight,
       dst_core_type * 100000 + dst_block_id * 1000 + dst_record_index AS dst
FROM task_edges WHERE run_id = $1 AND invocation_id < $2
"""


def ours(store: Store) -> None:
    """Every row of both views, as Arrow."""
    store.sql("SELECT * FROM core_breakdown")
    store.sql("SELECT * FROM critical_path")


def networkx_longest_paths(store: Store, run_id: str, sample: int) -> int:
    """Build each sampled invocation's DiGraph from its edges and take its longest path;
    return the records (nodes) covered."""
    edges = store.sql(_EDGES, [run_id, sample]).to_pydict()
    graphs: dict[int, nx.DiGraph] = {}
    for invocation, src, weight, dst in zip(
        edges["invocation_id"], edges["src"], edges["weight"], edges["dst"], strict=True
    ):
        graph = graphs.get(invocation)
        if graph is None:
            graph = graphs[invocation] = nx.DiGraph()
        graph.add_edge(src, dst, weight=weight)
    nodes = 0
    for graph in graphs.values():
        nx.dag_longest_path_length(graph)
        nodes += graph.number_of_nodes()
    return nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sample", type=int, default=8, help="invocations networkx walks")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        store = open_store(Path(scratch) / "store")
        run_id, records = fill(store, args.records)

        seconds = seconds_of(lambda: ours(store), args.repeat)
        ours_rate = [records / s for s in seconds]
        sampled: list[int] = []
        nx_seconds = seconds_of(
            lambda: sampled.append(networkx_longest_paths(store, run_id, args.sample)),
            args.repeat,
        )
        nx_rate = [sampled[0] / s for s in nx_seconds]
        ratio = [o / n for o, n in zip(ours_rate, nx_rate, strict=True)]
        print(f"1. breakdown + critical path, {records:,} records, {args.repeat} repeats")
        millions = [r / 1e6 for r in ours_rate]
        print(f"   ours:     seconds {spread(seconds)}; M records/s {spread(millions)}")
        print(
            f"   networkx: {args.sample} invocations ({sampled[0]:,} records): seconds "
            f"{spread(nx_seconds)}; M records/s {spread([r / 1e6 for r in nx_rate])}"
        )
        print(f"   ratio ours / networkx: {spread(ratio)} (goal >= 20)")

        kernel = SimulatedMoeKernel(
            experts=64, tiles=30, aic_workers=64, aiv_workers=48, aic_slots=64
        )
        sweep_run = store_launches(
            store,
            kernel,
            1,
            label="bench-sweep",
            config_id=CONFIG_ID,
            tasks=kernel.tasks_table(CONFIG_ID),
        )
        selection = RecordSelection(run=sweep_run, invocation=0)
        whole = seconds_of(lambda: speedup_curves(store, selection), args.repeat)
        rows = store.sql("SELECT * FROM replay_records WHERE run_id = $1", [sweep_run])
        graph = replay.prepare(rows)
        alone = seconds_of(lambda: what_if.speedup_curves(graph), args.repeat)
        print(
            f"2. what-if sweep, 5 stages x 6 speed-ups, one invocation of {rows.num_rows:,} records"
        )
        print(f"   speedup_curves (SQL + replay): seconds {spread(whole)} (goal < 1)")
        print(f"   replay alone:                  seconds {spread(alone)}")

        errors = []
        for attempt in range(args.repeat):
            store_path = Path(scratch) / f"experiment{attempt}"
            result = run_experiment(open_store(store_path), launches=8, rounds=4)
            errors.append(result.error)
            print(
                f"3. real experiment {attempt + 1}: baseline {result.baseline_ns / 1e6:.3f} ms, "
                f"predicted {result.predicted_ns / 1e6:.3f} ms, measured "
                f"{result.measured_ns / 1e6:.3f} ms: error {result.error:.1%}"
            )
        print(f"   prediction error: {spread(errors)} (goal <= 0.10)")


if __name__ == "__main__":
    main()
