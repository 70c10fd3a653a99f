"""``clock_sanity``, ``clock_violations`` and ``clock_offsets`` on hand-built invocations.

The expected values are worked out by hand from the records below (1 GHz: a cycle is a ns).

Invocation 0 ("skewed") chains three release edges around the cores, each with 10 cycles
of slack on a true clock, and AIV/1's clock is 30 cycles ahead: its wait, compute and
trigger records read 30 more. AIV/2 runs a task with no events (no edge). So
- AIC/0 -> AIV/0 (task 1's trigger ends 1110, task 2's wait 1120): slack 10;
- AIV/0 -> AIV/1 (1210, 1250 as skewed): slack 40;
- AIV/1 -> AIC/0 (1340 as skewed, task 4's wait ends 1320): slack -20, a contradiction of
  20 ns at both cores.
The offsets (x[src] - x[dst] <= slack; AIC/0 the reference): AIV/1 moves back 20, its
interval [-50, -20] (through AIV/0 and AIC/0: 40 + 10; and directly: -20) holds the true
-30; AIV/0 stays at 0 in [-10, 20]; AIV/2 is unconstrained.

Invocation 1 ("cycle") has two edges that contradict each other: AIV/0's wait ends 10
before AIC/0's trigger and AIC/0's wait 5 before AIV/0's: no offsets satisfy both.

Invocation 2 ("disorder") has no task graph's events: AIC/0's second record overlaps its
first, its third starts before the second started; AIV/0 only overlaps; AIV/1's entry
cycle comes 5 after its first record.
"""

from __future__ import annotations

import pytest
from golden import AIC, AIV, GMM1, TRIGGER, WAIT, Slot, pack
from task_graphs import tasks_table

from multicore_profiler.abi import BufferLayout
from multicore_profiler.analysis.clock_offsets import correct_clocks, solve
from multicore_profiler.errors import ClockError
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

RUN = "clocks-run"
LAYOUT = BufferLayout(aic_slots=1, aiv_slots=3, aic_capacity=16, aiv_capacity=16)
SKEW = 30


def skewed() -> bytearray:
    s = SKEW
    return pack(
        1,
        3,
        16,
        16,
        [
            Slot(
                AIC,
                0,
                1000,
                [
                    (1000, 1100, GMM1, 1, 0, 0),
                    (1100, 1110, TRIGGER, 1, 0, 0),
                    (1110, 1320, WAIT, 4, 3, 0),
                    (1320, 1400, GMM1, 4, 3, 0),
                ],
            ),
            Slot(
                AIV,
                0,
                1000,
                [
                    (1000, 1120, WAIT, 2, 1, 0),
                    (1120, 1200, GMM1, 2, 1, 0),
                    (1200, 1210, TRIGGER, 2, 1, 0),
                ],
            ),
            Slot(
                AIV,
                1,
                1000 + s,
                [
                    (1000 + s, 1220 + s, WAIT, 3, 2, 0),
                    (1220 + s, 1300 + s, GMM1, 3, 2, 0),
                    (1300 + s, 1310 + s, TRIGGER, 3, 2, 0),
                ],
            ),
            Slot(AIV, 2, 1000, [(1000, 1050, GMM1, 5, 4, 0)]),
        ],
    )


def contradictory() -> bytearray:
    return pack(
        1,
        3,
        16,
        16,
        [
            Slot(
                AIC,
                0,
                1000,
                [
                    (1000, 1090, GMM1, 1, 0, 0),
                    (1090, 1100, TRIGGER, 1, 0, 0),
                    (1100, 1195, WAIT, 4, 3, 0),
                    (1195, 1250, GMM1, 4, 3, 0),
                ],
            ),
            Slot(
                AIV,
                0,
                1000,
                [
                    (1000, 1090, WAIT, 2, 1, 0),
                    (1090, 1190, GMM1, 2, 1, 0),
                    (1190, 1200, TRIGGER, 2, 1, 0),
                ],
            ),
        ],
    )


def disorder() -> bytearray:
    return pack(
        1,
        3,
        16,
        16,
        [
            Slot(
                AIC,
                0,
                1000,
                [
                    (1000, 1100, GMM1, 11, 0, 0),
                    (1050, 1150, GMM1, 12, 1, 0),
                    (1040, 1160, GMM1, 13, 2, 0),
                ],
            ),
            Slot(AIV, 0, 1000, [(1000, 1100, GMM1, 14, 0, 0), (1090, 1200, GMM1, 15, 1, 0)]),
            Slot(AIV, 1, 1005, [(1000, 1100, GMM1, 16, 0, 0)]),
        ],
    )


def graph(config: str):
    """Tasks 1 -> 2 -> 3 -> 4 through events 1, 2 and 3 (each once); task 5 stands alone.
    The contradictory invocation runs tasks 1, 2 and 4 of it, task 4 waiting on event 2."""
    return tasks_table(
        config,
        "ClockMoe",
        task_id=[1, 2, 3, 4, 5],
        desc_id=[GMM1] * 5,
        core_type=[AIC, AIV, AIV, AIC, AIV],
        worker=[0, 0, 1, 0, 2],
        wait_event=[-1, 1, 2, 3 if config == "chain" else 2, -1],
        wait_count=[0, 1, 1, 1, 0],
        trigger_event=[1, 2, 3, -1, -1],
    )


LOOP_RUN = "clocks-loop"


@pytest.fixture
def clocks_store(store: Store) -> Store:
    """The skewed and the disordered invocations (0 and 2) in one run, the contradictory
    one (1) in another."""
    for run_id, invocations in (
        (RUN, ((0, skewed(), "chain"), (2, disorder(), None))),
        (LOOP_RUN, ((1, contradictory(), "loop"),)),
    ):
        run = RunInfo.begin(run_id=run_id)
        store.write_run(run)
        for invocation, data, config in invocations:
            ingest_buffers(
                store,
                [data],
                LAYOUT,
                frequency_hz=1e9,
                run_id=run_id,
                kernel=KernelInfo(kernel_name="ClockMoe", config_id=config),
                launches=Launches(step=invocation, first_invocation_id=invocation),
            )
        if config is not None or run_id == RUN:
            store.write_tasks(run_id, graph("chain" if run_id == RUN else "loop"))
        store.write_run(run.finish())
    return store


def sanity(store: Store, invocation: int) -> list[tuple]:
    return [
        tuple(r.values())
        for r in store.sql(
            'SELECT core, block_id, causality_violations, max_violation_ns, "overlaps", '
            "backwards, late_entry_ns, verdict FROM clock_sanity WHERE invocation_id = ? "
            "ORDER BY core_type, block_id",
            [invocation],
        ).to_pylist()
    ]


def test_a_skewed_core_contradicts_causality_at_both_ends_of_its_edge(
    clocks_store: Store,
) -> None:
    assert sanity(clocks_store, 0) == [
        ("AIC", 0, 1, 20.0, 0, 0, 0.0, "contradicted"),
        ("AIV", 0, 0, None, 0, 0, 0.0, "ok"),
        ("AIV", 1, 1, 20.0, 0, 0, 0.0, "contradicted"),
        ("AIV", 2, 0, None, 0, 0, 0.0, "ok"),
    ]
    (violation,) = clocks_store.sql(
        "SELECT kind, src_core, src_block_id, src_task_id, dst_core, dst_block_id, "
        "dst_task_id, event, violation_cycles, violation_ns, beyond_tolerance "
        "FROM clock_violations WHERE invocation_id = 0"
    ).to_pylist()
    assert violation == {
        "kind": "release",
        "src_core": "AIV",
        "src_block_id": 1,
        "src_task_id": 3,
        "dst_core": "AIC",
        "dst_block_id": 0,
        "dst_task_id": 4,
        "event": 3,
        "violation_cycles": 20,
        "violation_ns": 20.0,
        "beyond_tolerance": True,
    }


def test_the_tolerance_decides_the_verdict_not_the_count(clocks_store: Store) -> None:
    clocks_store.configure("clock_tolerance", 20)
    assert [row[2:] for row in sanity(clocks_store, 0)][::2] == [
        (1, 20.0, 0, 0, 0.0, "ok"),
        (1, 20.0, 0, 0, 0.0, "ok"),
    ]
    clocks_store.configure("clock_tolerance", 19)
    assert sanity(clocks_store, 0)[0][-1] == "contradicted"


def test_overlaps_backward_starts_and_a_late_entry_on_one_core(clocks_store: Store) -> None:
    assert sanity(clocks_store, 2) == [
        ("AIC", 0, 0, None, 1, 1, 0.0, "backwards"),
        ("AIV", 0, 0, None, 1, 0, 0.0, "overlapping"),
        ("AIV", 1, 0, None, 0, 0, 5.0, "late_entry"),
    ]


def offsets(store: Store, run_id: str) -> list[tuple]:
    return [
        tuple(r.values())
        for r in store.sql(
            "SELECT invocation_id, core, block_id, offset_ns, low_ns, high_ns, constrained, "
            "edges FROM clock_offsets ORDER BY invocation_id, core_type, block_id",
            runs=[run_id],
        ).to_pylist()
    ]


def test_offsets_move_the_skewed_core_back_within_an_interval_holding_its_skew(
    clocks_store: Store,
) -> None:
    assert offsets(clocks_store, RUN) == [
        (0, "AIC", 0, 0.0, 0.0, 0.0, True, 2),
        (0, "AIV", 0, 0.0, -10.0, 20.0, True, 2),
        (0, "AIV", 1, -20.0, -50.0, -20.0, True, 2),
        (0, "AIV", 2, 0.0, None, None, False, 0),
        # No edges at all: every core unconstrained, none moved.
        (2, "AIC", 0, 0.0, None, None, False, 0),
        (2, "AIV", 0, 0.0, None, None, False, 0),
        (2, "AIV", 1, 0.0, None, None, False, 0),
    ]


def test_a_cycle_of_contradictions_is_an_error_naming_its_edges(clocks_store: Store) -> None:
    with pytest.raises(ClockError) as caught:
        offsets(clocks_store, LOOP_RUN)
    assert str(caught.value) == (
        "the records of 1 invocation(s) contradict causality around a cycle of edges that no "
        "per-core clock offset can satisfy (so no offsets are given): run clocks-loop rank 0 "
        "invocation 1: AIC/0 -> AIV/0 (release: task 2's wait recorded 10 cycles before task "
        "1's end), AIV/0 -> AIC/0 (release: task 4's wait recorded 5 cycles before task 2's "
        "end)"
    )


def test_the_correction_removes_every_violation_and_says_what_it_moved(
    clocks_store: Store,
) -> None:
    moved = correct_clocks(clocks_store, [RUN])
    assert moved.select(["invocation_id", "core", "block_id", "offset_cycles"]).to_pylist() == [
        {"invocation_id": 0, "core": "AIV", "block_id": 1, "offset_cycles": -20}
    ]
    assert sanity(clocks_store, 0)[2] == ("AIV", 1, 0, None, 0, 0, 0.0, "ok")
    shifted = clocks_store.sql(
        "SELECT start_cycle FROM aligned_records WHERE invocation_id = 0 AND core_type = 2 "
        "AND block_id = 1 ORDER BY record_index"
    )["start_cycle"].to_pylist()
    assert shifted == [1010, 1230, 1310]
    # The raw records keep what was recorded; removing the correction restores the views.
    assert clocks_store.sql(
        "SELECT min(start_cycle) AS s FROM records WHERE invocation_id = 0 AND block_id = 1 "
        "AND core_type = 2"
    )["s"].to_pylist() == [1030]
    clocks_store.configure("clock_correction", None)
    assert sanity(clocks_store, 0)[2][-1] == "contradicted"


def test_solve_alone_on_a_chain_a_cycle_and_a_lone_core() -> None:
    import numpy as np

    inv = np.array([0, 0, 0, 1, 1])
    src = np.array([0, 1, 2, 3, 4])
    dst = np.array([1, 2, 0, 4, 3])
    slack = np.array([10, 40, -20, -10, -5])
    found = solve(inv, src, dst, slack)
    assert list(found.cycles) == [1]
    assert sorted(found.cycles[1]) == [3, 4]
    assert found.offset[:3].tolist() == [0, 0, -20]


def test_check_clocks_reports_each_run_and_fails_on_a_contradiction(
    clocks_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    from multicore_profiler.cli import main

    report = clocks_store.check(clocks=True)
    assert not report.ok
    assert report.clocks.select(
        ["run_id", "contradicted_edges", "max_violation_ns", "largest_offset_ns"]
    ).to_pylist() == [
        {
            "run_id": "clocks-loop",
            "contradicted_edges": 2,
            "max_violation_ns": 10.0,
            "largest_offset_ns": None,
        },
        {
            "run_id": "clocks-run",
            "contradicted_edges": 1,
            "max_violation_ns": 20.0,
            "largest_offset_ns": 20.0,
        },
    ]
    status = main(["check", "--clocks", "--run", RUN, "--store", str(clocks_store.root)])
    out = capsys.readouterr()
    assert status == 1
    assert out.out.splitlines() == [
        "run clocks-run: clocks: NOT OK: 2 invocation(s), 7 core(s); 1 causal edge(s) "
        "contradicted (1 beyond 0 ns, the largest 20 ns); frequency not checked (no host "
        "launch times); largest estimated offset 20 ns on 1 core(s)",
        "run clocks-run: clocks: 1 causal edge(s) in 1 invocation(s) contradict causality "
        "beyond the tolerance of 0 ns (a wait or dependent task recorded before what "
        "released it ended), the largest by 20 ns: the cores' clocks disagree (see "
        "clock_violations and clock_offsets; --clock-correction applies the offsets)",
        "run clocks-run: clocks: 1 core(s) recorded records that run backwards (a record "
        "starting before the previous one on its core, or ending before it starts): the "
        "counter went back (see clock_sanity)",
        "run clocks-run: clocks: 1 core(s) recorded their entry cycle after their first "
        "record (see clock_sanity)",
        "run clocks-run: clocks: 1 core(s) with one writer recorded overlapping records "
        "(see clock_sanity)",
    ]
    assert out.err.strip().endswith("4 problem(s) in the clocks of 1 run(s)")
    tolerant = ["check", "--clocks", "--clock-tolerance", "20", "--store"]
    assert main([*tolerant, str(clocks_store.root), "--run", RUN]) == 1  # backwards still
