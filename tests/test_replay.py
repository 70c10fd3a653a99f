"""The what-if replay engine and the static bound (analysis/replay.py): hand-built invocations
with exact makespans, and random DAG workloads from a simple simulator written here."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import duckdb
import networkx as nx
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multicore_profiler.analysis import replay as replay_module
from multicore_profiler.analysis.changes import parse_change
from multicore_profiler.analysis.replay import (
    SCHEMA,
    prepare,
    replay,
    replay_records,
    static_bound,
)
from multicore_profiler.analysis.what_if import what_if
from multicore_profiler.errors import AnalysisError

AIC, AIV = 1, 2
NO_OWNER = 0xFFFFFFFF


@dataclass
class Rec:
    """One record of a hand-built or simulated invocation."""

    core: tuple[int, int]
    phase: str
    stage: str | None
    task: int
    start: int
    end: int
    wait_event: int | None = None
    wait_count: int | None = None
    trigger_event: int | None = None
    owner: int = NO_OWNER
    index: int = 0
    src: Rec | None = field(default=None, repr=False)


def compute(core, stage, task, start, end, owner=NO_OWNER):
    return Rec(core, "compute", stage, task, start, end, owner=owner)


def wait(core, task, start, end, event=None, count=None):
    return Rec(core, "wait", None, task, start, end, wait_event=event, wait_count=count)


def trigger(core, task, start, end, event=None):
    return Rec(core, "trigger", None, task, start, end, trigger_event=event)


def releaser(recs: list[Rec], w: Rec) -> Rec | None:
    """The trigger that released a wait in the observation: the wait_count-th trigger of its
    event by (end, start, task), as the task_edges view picks it."""
    if w.wait_event is None or not w.wait_count:
        return None
    triggers = sorted(
        (r for r in recs if r.phase == "trigger" and r.trigger_event == w.wait_event),
        key=lambda r: (r.end, r.start, r.task),
    )
    return triggers[w.wait_count - 1] if len(triggers) >= w.wait_count else None


def table(
    invocations: list[list[Rec]],
    *,
    run: str = "r",
    rank: int = 0,
    frequency: float = 1e9,
    anchor: int = 0,
) -> pa.Table:
    """The replay's input table: one row per record, record indexes in the order given per
    core."""
    rows = []
    for invocation, recs in enumerate(invocations):
        counts: dict[tuple[int, int], int] = {}
        for r in recs:
            r.index = counts.get(r.core, 0)
            counts[r.core] = r.index + 1
        for r in recs:
            rows.append(
                {
                    "run_id": run,
                    "rank": rank,
                    "invocation_id": invocation,
                    "write_id": 7,
                    "core_type": r.core[0],
                    "block_id": r.core[1],
                    "record_index": r.index,
                    "phase": r.phase,
                    "stage": r.stage,
                    "owner_id": r.owner,
                    "task_id": r.task,
                    "start_cycle": r.start,
                    "end_cycle": r.end,
                    "frequency_hz": frequency,
                    "anchor_cycle": anchor,
                    "wait_event": r.wait_event,
                    "wait_count": r.wait_count,
                    "trigger_event": r.trigger_event,
                }
            )
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def cross_released() -> list[Rec]:
    """Two cores, each wait released by a trigger on the other core."""
    c, v = (AIC, 0), (AIV, 0)
    return [
        compute(c, "A", 0, 0, 100),
        trigger(c, 0, 100, 110, event=0),
        wait(v, 1, 5, 120, event=0, count=1),
        compute(v, "B", 1, 125, 225),
        trigger(v, 1, 225, 230, event=1),
        wait(c, 2, 115, 240, event=1, count=1),
        compute(c, "A", 2, 240, 300),
    ]


def released_early() -> list[Rec]:
    """A wait that waited (latency 10) and one released before it began (own time 3)."""
    c, v = (AIC, 0), (AIV, 0)
    return [
        compute(c, "P", 0, 0, 50),
        trigger(c, 0, 50, 60, event=0),
        compute(c, "P", 1, 60, 100),
        trigger(c, 1, 100, 104, event=1),
        wait(v, 2, 10, 70, event=0, count=1),
        compute(v, "Q", 2, 70, 200),
        wait(v, 3, 200, 203, event=1, count=1),
        compute(v, "Q", 3, 205, 215),
    ]


def ties() -> list[Rec]:
    """Two triggers of one event ending together; waits for the first and the second."""
    return [
        compute((AIC, 0), "A", 0, 0, 40),
        trigger((AIC, 0), 0, 40, 50, event=0),
        compute((AIC, 1), "A", 1, 0, 45),
        trigger((AIC, 1), 1, 45, 50, event=0),
        wait((AIV, 0), 2, 0, 55, event=0, count=1),
        compute((AIV, 0), "B", 2, 55, 75),
        wait((AIV, 1), 3, 0, 57, event=0, count=2),
        compute((AIV, 1), "B", 3, 57, 67),
    ]


def no_graph() -> list[Rec]:
    """No task graph; AIV block 3 the only AIV core with records (blocks 0-2 idle)."""
    return [
        compute((AIC, 0), "A", 0, 10, 60),
        wait((AIC, 0), 1, 60, 90),
        compute((AIC, 0), "A", 1, 95, 100),
        compute((AIV, 3), "C", 2, 0, 30),
    ]


def overlapping() -> list[Rec]:
    """Records overlapping on one core (the second starts 10 cycles before the first ends)."""
    return [
        compute((AIC, 0), "A", 0, 0, 100),
        compute((AIC, 0), "B", 1, 90, 150),
        compute((AIV, 0), "C", 2, 0, 20),
    ]


def predicted(recs: list[Rec], *changes: str) -> int:
    graph = prepare(table([recs]))
    return what_if(graph, changes).column("predicted_makespan_ns")[0].as_py()


def test_cross_released_replay_reproduces_then_predicts_scale_and_shift():
    graph = prepare(table([cross_released()]))
    row = replay(graph).to_pylist()[0]
    assert row == {
        "run_id": "r",
        "rank": 0,
        "invocation_id": 0,
        "write_id": 7,
        "observed_makespan_ns": 300,
        "replayed_makespan_ns": 300,
        "fidelity_error": 0.0,
        "faithful": True,
        "predicted_makespan_ns": 300,
        "ratio": 1.0,
    }
    # A halved: AIV's wait ends at the trigger (60) + its latency 10, B runs 75-175,
    # AIC's wait ends at 180 + 10, the last A runs 190-220.
    assert predicted(cross_released(), "A*0.5") == 220
    # B 50 ns longer: its trigger ends at 280, AIC's wait at 290, the last A at 350.
    assert predicted(cross_released(), "B+50") == 350
    # In order: B takes (100 + 50) / 2 = 75, its trigger ends at 205, the last A at 275.
    assert predicted(cross_released(), "B+50", "B*0.5") == 275
    ends = replay_records(graph, [parse_change("A*0.5")])
    assert ends.column("start_cycle").to_pylist() == [0, 50, 65, 190, 5, 75, 175]
    assert ends.column("end_cycle").to_pylist() == [50, 60, 190, 220, 70, 175, 180]
    assert ends.column("record_index").to_pylist() == [0, 1, 2, 3, 0, 1, 2]


def test_cross_released_static_bound():
    bound = static_bound(prepare(table([cross_released()]))).to_pylist()[0]
    # A 100 + trigger 10 + B 100 + trigger 5 + A 60, every gap and wait 0.
    assert bound["makespan_ns"] == 300
    assert bound["static_bound_ns"] == 275
    assert bound["slack_ns"] == 25
    assert bound["slack_share"] == pytest.approx(25 / 300)


def test_wait_released_before_it_began_keeps_its_own_time_and_the_median_latency():
    graph = prepare(table([released_early()]))
    assert replay(graph).column("replayed_makespan_ns").to_pylist() == [215]
    # P four times longer: the second wait (own time 3) is now released by the trigger at
    # 374 plus the invocation's median latency 10: 384; Q runs 386-396.
    assert predicted(released_early(), "P*4") == 396
    # Q halved: the second wait starts at 135 and keeps its own 3 cycles; Q runs 140-145.
    assert predicted(released_early(), "Q*0.5") == 145


def test_ties_pick_the_count_th_smallest_replayed_end():
    graph = prepare(table([ties()]))
    assert replay(graph).column("replayed_makespan_ns").to_pylist() == [75]
    # Task 1's compute 45 * 0.5 = 22.5 rounds (half to even) to 22: its trigger ends at 27
    # and now releases the count-1 wait (27 + 5), the count-2 wait still ends at 50 + 7.
    assert predicted(ties(), "task=1*0.5") == 67
    # Task 0 20 cycles longer: the count-1 wait takes task 1's trigger (50), count-2 task
    # 0's (70): B runs 77-87.
    assert predicted(ties(), "task=0+20") == 87
    bound = static_bound(graph).to_pylist()[0]
    assert bound["static_bound_ns"] == 70  # A 40 + trigger 10 + B 20 (the observed edges)


def test_invocation_without_task_graph_and_idle_cores():
    graph = prepare(table([no_graph()]))
    assert replay(graph).column("replayed_makespan_ns").to_pylist() == [100]
    # AIC compute doubled: 10-110, the wait keeps its 30, the gap 5, 10 more: 155.
    assert predicted(no_graph(), "AIC*2") == 155
    assert predicted(no_graph(), "AIV*2") == 100
    bound = static_bound(graph).to_pylist()[0]
    assert (bound["static_bound_ns"], bound["slack_ns"]) == (55, 45)


def test_overlapping_records_keep_their_negative_gap():
    graph = prepare(table([overlapping()]))
    assert replay(graph).column("replayed_makespan_ns").to_pylist() == [150]
    assert predicted(overlapping(), "A*0.5") == 100
    # A takes no time: B starts 10 cycles before A's start, at -10.
    assert predicted(overlapping(), "A*0") == 60
    assert static_bound(graph).column("slack_ns").to_pylist() == [-10]


def test_cycle_is_refused_naming_the_invocation():
    c, v = (AIC, 0), (AIV, 0)
    recs = [
        wait(c, 0, 0, 20, event=1, count=1),
        trigger(c, 0, 20, 25, event=0),
        wait(v, 1, 0, 10, event=0, count=1),
        trigger(v, 1, 10, 15, event=1),
    ]
    with pytest.raises(AnalysisError, match=r"cycle.*run r rank 3 invocation 0"):
        prepare(table([recs], rank=3))


def test_event_triggered_downstream_of_its_wait_is_a_cycle():
    recs = [
        compute((AIV, 0), "A", 0, 0, 10),
        trigger((AIV, 0), 0, 10, 12, event=0),
        wait((AIC, 0), 1, 0, 15, event=0, count=1),
        trigger((AIC, 0), 1, 15, 17, event=0),
    ]
    with pytest.raises(AnalysisError, match="dependency cycle"):
        prepare(table([recs]))


def test_several_invocations_and_ns_from_cycles():
    # 50 MHz: 20 ns a cycle, the anchor 1000 cycles before the records.
    shifted = [[_shift(r, 1000) for r in recs] for recs in (cross_released(), ties())]
    graph = prepare(table(shifted, frequency=50e6, anchor=0))
    result = what_if(graph, ["A*0.5"])
    assert result.column("invocation_id").to_pylist() == [0, 1]
    assert result.column("observed_makespan_ns").to_pylist() == [6000, 1500]
    # The tie invocation with A halved: the triggers end at 30 and 27 (22.5 rounds to 22);
    # the count-1 wait at 27 + 5, its B at 52 cycles: 1040 ns.
    assert result.column("predicted_makespan_ns").to_pylist() == [4400, 1040]
    assert static_bound(graph).column("static_bound_ns").to_pylist() == [5500, 1400]


def test_ns_points_round_half_away_from_zero_as_the_sql_views():
    # 400 MHz: 2.5 ns a cycle. ns(1) = 3 (not 2), ns(4) = 10: the makespan is 7 ns.
    recs = [compute((AIC, 0), "A", 0, 1, 4)]
    graph = prepare(table([recs], frequency=4e8))
    assert replay(graph).column("observed_makespan_ns").to_pylist() == [7]
    rng = np.random.default_rng(7)
    cycles = rng.integers(-(10**12), 10**12, 200)
    anchor = int(rng.integers(0, 10**6))
    frequency = 3.7e7
    expected = duckdb.execute(
        "SELECT list(round((c::HUGEINT - ?) * (1e9 / ?))::BIGINT) FROM unnest(?) t(c)",
        [anchor, frequency, cycles.tolist()],
    ).fetchone()[0]
    got, outside = replay_module._ns(cycles, np.int64(anchor), np.float64(frequency))
    assert got.tolist() == expected
    assert not outside.any()


def test_unfaithful_replay_predicts_nothing():
    # A wait that ends before it starts (a clock glitch) cannot be reproduced: replayed it
    # ends at its start, 19, and the compute after it ends at 47 instead of 30.
    recs = [
        compute((AIC, 0), "A", 0, 0, 10),
        trigger((AIC, 0), 0, 10, 20, event=0),
        wait((AIV, 0), 1, 19, 2, event=0, count=1),
        compute((AIV, 0), "B", 1, 2, 30),
    ]
    graph = prepare(table([recs]))
    row = what_if(graph, ["A*2"]).to_pylist()[0]
    assert row["replayed_makespan_ns"] == 47
    assert row["fidelity_error"] == pytest.approx(17 / 30)
    assert row["faithful"] is False
    assert row["predicted_makespan_ns"] is None
    assert row["ratio"] is None
    with pytest.raises(AnalysisError, match=r"run r rank 0 invocation 0 \(error 56.7%\)"):
        what_if(graph, ["A*2"], strict=True)


def test_bad_tables_are_refused():
    with pytest.raises(AnalysisError, match="no records"):
        prepare(table([[]]))
    with pytest.raises(AnalysisError, match="wait_count"):
        prepare(table([cross_released()]).drop_columns(["wait_count"]))
    bad = table([[Rec((AIC, 0), "sleep", None, 0, 0, 1)]])
    with pytest.raises(AnalysisError, match="phase 'sleep'"):
        prepare(bad)
    wide = table([cross_released()])
    wide = wide.set_column(4, "core_type", pa.array([300] * wide.num_rows, pa.int64()))
    with pytest.raises(AnalysisError, match="do not fit the replay's columns"):
        prepare(wide)
    with pytest.raises(AnalysisError, match=r"frequency 0\.0 Hz"):
        prepare(table([cross_released()], frequency=0.0))


def _shift(r: Rec, cycles: int) -> Rec:
    return Rec(
        r.core,
        r.phase,
        r.stage,
        r.task,
        r.start + cycles,
        r.end + cycles,
        r.wait_event,
        r.wait_count,
        r.trigger_event,
        r.owner,
    )


# A simple simulator: tasks in a global order, each on a random core, waiting (maybe) on an
# event whose triggers have all happened, computing, triggering (maybe) an event. An event
# takes triggers until it is closed; only closed events are waited on, so the records form
# a DAG in which every wait's event has all its triggers upstream.

STAGES = ("S0", "S1", "S2")


def simulate(rnd: random.Random, tasks: int, cores: int, *, overlap: bool) -> list[Rec]:
    """An invocation's records, in an order in which every record follows its dependencies."""
    core_ids = [(AIC if i % 2 == 0 else AIV, i // 2) for i in range(cores)]
    clock = {core: rnd.randint(0, 10) for core in core_ids}
    started: set[tuple[int, int]] = set()
    open_events: dict[int, list[Rec]] = {}
    closed: dict[int, list[Rec]] = {}
    recs: list[Rec] = []

    def place(r: Rec) -> Rec:
        started.add(r.core)
        clock[r.core] = r.end
        recs.append(r)
        return r

    def begin(core: tuple[int, int]) -> int:
        if core not in started:
            return clock[core]
        return clock[core] + rnd.randint(-3 if overlap else 0, 5)

    for task in range(tasks):
        core = rnd.choice(core_ids)
        if closed and rnd.random() < 0.6:
            event = rnd.choice(sorted(closed))
            count = rnd.randint(1, len(closed[event]))
            start = begin(core)
            src = sorted(closed[event], key=lambda r: (r.end, r.start, r.task))[count - 1]
            end = max(start + rnd.randint(0, 4), src.end + rnd.randint(0, 6))
            place(Rec(core, "wait", None, task, start, end, event, count, src=src))
        elif rnd.random() < 0.2:
            start = begin(core)
            place(Rec(core, "wait", None, task, start, start + rnd.randint(0, 9)))
        start = begin(core)
        stage = rnd.choice(STAGES)
        owner = rnd.randint(0, 3)
        place(Rec(core, "compute", stage, task, start, start + rnd.randint(0, 40), owner=owner))
        if rnd.random() < 0.7:
            if open_events and rnd.random() < 0.5:
                event = rnd.choice(sorted(open_events))
            else:
                event = len(open_events) + len(closed)
                open_events[event] = []
            start = begin(core)
            r = place(Rec(core, "trigger", None, task, start, start + rnd.randint(0, 3)))
            r.trigger_event = event
            open_events[event].append(r)
        for event in sorted(open_events):
            if rnd.random() < 0.4:
                closed[event] = open_events.pop(event)
    for core in sorted(started):
        if rnd.random() < 0.3:
            start = begin(core)
            place(Rec(core, "terminate", None, tasks, start, start + rnd.randint(0, 2)))
    return recs


def workloads(*, overlap: bool | None = None) -> st.SearchStrategy[list[list[Rec]]]:
    """One to three simulated invocations; with overlapping records on a core, or not, or
    either (``None``)."""
    return st.builds(
        lambda rnd, tasks, cores, count: [
            simulate(rnd, tasks, cores, overlap=rnd.random() < 0.5 if overlap is None else overlap)
            for _ in range(count)
        ],
        st.randoms(use_true_random=False),
        st.integers(1, 30),
        st.integers(1, 5),
        st.integers(1, 3),
    )


def longest_path(recs: list[Rec]) -> int:
    """networkx's longest path through the invocation's DAG: a record is an edge from its
    in-node to its out-node weighing its duration (0 for a wait); core order and release
    (observed trigger -> wait) edges, and a source before every core's first record, weigh 0."""
    graph = nx.DiGraph()
    previous: dict[tuple[int, int], Rec] = {}
    for r in recs:
        graph.add_edge(
            ("in", id(r)), ("out", id(r)), weight=0 if r.phase == "wait" else r.end - r.start
        )
        before = previous.get(r.core)
        graph.add_edge(("out", id(before)) if before else "source", ("in", id(r)), weight=0)
        previous[r.core] = r
        if r.src is not None:
            graph.add_edge(("out", id(r.src)), ("in", id(r)), weight=0)
    return nx.dag_longest_path_length(graph)


@settings(max_examples=100, deadline=None)
@given(workloads())
def test_replay_reproduces_every_record_and_static_bound_is_networkx_longest_path(invocations):
    graph = prepare(table(invocations, run="run-a", rank=1))
    records = replay_records(graph)
    expected = sorted(
        (i, r.core, r.index, r.start, r.end) for i, recs in enumerate(invocations) for r in recs
    )
    got = sorted(
        zip(
            records.column("invocation_id").to_pylist(),
            zip(
                records.column("core_type").to_pylist(),
                records.column("block_id").to_pylist(),
                strict=True,
            ),
            records.column("record_index").to_pylist(),
            records.column("start_cycle").to_pylist(),
            records.column("end_cycle").to_pylist(),
            strict=True,
        )
    )
    assert got == expected
    result = replay(graph)
    assert result.column("replayed_makespan_ns") == result.column("observed_makespan_ns")
    assert set(result.column("fidelity_error").to_pylist()) == {0.0}
    observed = [max(r.end for r in recs) - min(r.start for r in recs) for recs in invocations]
    assert result.column("observed_makespan_ns").to_pylist() == observed
    bound = static_bound(graph)
    paths = [longest_path(recs) for recs in invocations]
    assert bound.column("static_bound_ns").to_pylist() == paths
    assert bound.column("slack_ns").to_pylist() == [
        m - p for m, p in zip(observed, paths, strict=True)
    ]


def test_chunks_and_scenario_batches_give_the_same_answers(monkeypatch):
    rnd = random.Random(20)
    invocations = [simulate(rnd, 25, 4, overlap=True) for _ in range(6)]
    changes = ["S0*0.5", "S1+7", "AIV&owner=1-2*1.5"]
    whole = what_if(prepare(table(invocations)), changes)
    bound = static_bound(prepare(table(invocations)))
    monkeypatch.setattr(replay_module, "_CHUNK_RECORDS", 40)
    monkeypatch.setattr(replay_module, "_CELLS", 1)
    graph = prepare(table(invocations))
    assert len(graph.chunks) > 2
    assert what_if(graph, changes) == whole
    assert static_bound(graph) == bound
