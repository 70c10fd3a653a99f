"""The pids of a timeline's processes: one per (run, rank), never shared, whatever the ranks
(0 to 2^31-1) and however many runs, in the Chrome JSON and the Perfetto trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from golden import AIC, GMM1, Slot, pack
from perfetto_checker import read_perfetto_trace
from trace_checker import check_trace, load_trace

from multicore_profiler.abi import BufferLayout
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.export.perfetto_trace import export_perfetto_trace
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

LAYOUT = BufferLayout(aic_slots=1, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
TOP_RANK = 2**31 - 1


def runs_of_ranks(store: Store, ranks_of_runs: list[list[int]]) -> list[str]:
    """One run per list, oldest first, with one invocation (one GMM1 record) per rank."""
    ids = []
    for number, ranks in enumerate(ranks_of_runs):
        run = RunInfo.begin(run_id=f"run-{number}", label=f"run{number}")
        store.write_run(run)
        for rank in ranks:
            buffer = pack(1, 1, 16, 16, [Slot(AIC, 0, 100, [(110, 160, GMM1, 1, 0, 0)])])
            ingest_buffers(
                store,
                [buffer],
                LAYOUT,
                frequency_hz=50e6,
                run_id=run.run_id,
                launches=Launches(rank=rank),
            )
        store.write_run(run.finish())
        ids.append(run.run_id)
    return ids


def json_processes(path: Path) -> dict[int, str]:
    """Each pid of the JSON trace and its process's name; each pid's slices are on it."""
    trace = load_trace(path)
    check_trace(trace)
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert len([e for e in events if e["name"] == "process_name"]) == len(names)
    assert {e["pid"] for e in events if e["ph"] == "X"} == set(names)
    return names


@pytest.mark.parametrize(
    ("ranks", "pids"),
    [
        # Ranks below 100000: run position x 100000 + rank.
        ([[0, 7], [0]], [100_000, 100_007, 200_000]),
        # Rank 100000 of the first run was pid 200000, as was rank 0 of the second.
        ([[0, 100_000], [0]], [1, 2, 3]),
        # The largest rank in two runs: 100000 + 2^31-1 would pass a 32-bit pid.
        ([[TOP_RANK], [TOP_RANK]], [1, 2]),
    ],
)
def test_every_process_has_its_own_pid(
    store: Store, tmp_path: Path, ranks: list[list[int]], pids: list[int]
) -> None:
    run_ids = runs_of_ranks(store, ranks)
    described = [(run, rank) for run, of_run in zip(run_ids, ranks, strict=True) for rank in of_run]
    exported = export_chrome_trace(store, tmp_path / "t.json", run=run_ids)
    processes = exported.metadata["processes"]
    assert [(p["runId"], p["rank"], p["pid"]) for p in processes] == [
        (run, rank, pid) for (run, rank), pid in zip(described, pids, strict=True)
    ]
    names = json_processes(tmp_path / "t.json")
    assert sorted(names) == pids
    assert [names[pid] for pid in pids] == [
        f"MegaKernel rank {rank} device 0 (run{run_ids.index(run)})" for run, rank in described
    ]
    perfetto = export_perfetto_trace(store, tmp_path / "t.pftrace", run=run_ids)
    assert perfetto.metadata["processes"] == processes
    trace = read_perfetto_trace(tmp_path / "t.pftrace")
    roots = sorted(
        (t for t in trace.tracks.values() if t.parent_uuid is None),
        key=lambda t: t.sibling_order_rank or 0,
    )
    assert [(r.name, [c.name for c in trace.children(r.uuid)]) for r in roots] == [
        (names[pid], ["AIC/0"]) for pid in pids
    ]
    assert len(trace.slices) == 2 * len(pids)  # an invocation slice and its record, each


def test_one_run_keeps_the_rank_as_pid(store: Store, tmp_path: Path) -> None:
    (run_id,) = runs_of_ranks(store, [[0, 100_000, TOP_RANK]])
    exported = export_chrome_trace(store, tmp_path / "t.json", run=run_id)
    assert [p["pid"] for p in exported.metadata["processes"]] == [0, 100_000, TOP_RANK]
    assert sorted(json_processes(tmp_path / "t.json")) == [0, 100_000, TOP_RANK]
