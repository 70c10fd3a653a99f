"""The record analyses on hand-built invocations: core_breakdown, core_imbalance,
wait_attribution, wait_blockers, critical_path and its summary, and analyze()'s static
bound and what-if, each against values worked out by hand from the records below.

The counter runs at 1 GHz, so a cycle is a nanosecond and every expected time reads off
the records directly.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from golden import AIC, AIV, TRIGGER, WAIT, Slot, pack
from task_graphs import tasks_table

from multicore_profiler import analyze, what_if
from multicore_profiler.abi import BufferLayout
from multicore_profiler.analysis.selection import RecordSelection
from multicore_profiler.errors import AnalysisError, ArgumentError, SelectorError
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

RUN = "analyses-run"
CONFIG = "analyses-config"
LAYOUT = BufferLayout(aic_slots=1, aiv_slots=3, aic_capacity=16, aiv_capacity=16)
DISPATCH, GMM1, SWIGLU, COMBINE = 1, 2, 3, 5
STAGES = {DISPATCH: "Dispatch", GMM1: "GMM1", SWIGLU: "SwiGLU", COMBINE: "Combine"}
E0, E1, E2 = 0, 1, 2


def buffer() -> bytearray:
    """AIC/0 computes GMM1 tasks 1 and 2, each triggering an event (E1 at 210, E2 at 305),
    with a 20 ns gap between them. AIV/0 waits for E1 (task 3, released 5 ns after the
    trigger), computes SwiGLU, waits for E2 (task 4, again 5 ns after), computes Combine
    until 400, the invocation's end. AIV/1 dispatches (task 6, E0 at 112), then task 5
    waits for E0 from 140: released before it began. AIV/2 is idle (an all-zero slot)."""
    return pack(
        1,
        3,
        16,
        16,
        [
            Slot(
                AIC,
                0,
                100,
                [
                    (100, 200, GMM1, 1, 0, 0),
                    (200, 210, TRIGGER, 1, 0, 0),
                    (230, 300, GMM1, 2, 1, 0),
                    (300, 305, TRIGGER, 2, 1, 0),
                ],
            ),
            Slot(
                AIV,
                0,
                100,
                [
                    (120, 215, WAIT, 3, 0, 0),
                    (215, 260, SWIGLU, 3, 0, 0),
                    (260, 310, WAIT, 4, 0, 0xFFFFFFFF),
                    (310, 400, COMBINE, 4, 0, 0xFFFFFFFF),
                ],
            ),
            Slot(
                AIV,
                1,
                100,
                [
                    (105, 110, DISPATCH, 6, 0, 0),
                    (110, 112, TRIGGER, 6, 0, 0),
                    (140, 141, WAIT, 5, 1, 0),
                    (141, 180, SWIGLU, 5, 1, 0),
                ],
            ),
        ],
    )


def tasks() -> pa.Table:
    ids = [1, 2, 3, 4, 5, 6]
    return tasks_table(
        CONFIG,
        "AnalysesMoe",
        task_id=ids,
        desc_id=[GMM1, GMM1, SWIGLU, COMBINE, SWIGLU, DISPATCH],
        core_type=[AIC, AIC, AIV, AIV, AIV, AIV],
        worker=[0, 0, 0, 0, 1, 1],
        wait_event=[-1, -1, E1, E2, E0, -1],
        wait_count=[0, 0, 1, 1, 1, 0],
        trigger_event=[E1, E2, -1, -1, -1, E0],
        stage_task_index=[0, 1, 0, 0, 1, 0],
        owner_id=[0, 0, 0, 0xFFFFFFFF, 0, 0],
    )


@pytest.fixture
def analysed(store: Store) -> Store:
    """Invocation 0 with its task graph; invocation 1, the same records, of a kernel that
    handed over none."""
    run = RunInfo.begin(run_id=RUN)
    store.write_run(run)
    for invocation, config in ((0, CONFIG), (1, None)):
        ingest_buffers(
            store,
            [buffer()],
            LAYOUT,
            frequency_hz=1e9,
            run_id=RUN,
            kernel=KernelInfo(kernel_name="AnalysesMoe", stage_names=STAGES, config_id=config),
            launches=Launches(step=invocation, first_invocation_id=invocation),
        )
    store.write_tasks(RUN, tasks())
    store.write_run(run.finish())
    return store


BREAKDOWN = """SELECT core, block_id, makespan_ns, compute_ns, wait_ns, trigger_ns, control_ns,
                      front_gap_ns, gap_ns, tail_gap_ns
               FROM core_breakdown WHERE invocation_id = $1 ORDER BY core_type, block_id"""


@pytest.mark.parametrize("invocation", [0, 1])
def test_core_breakdown_lays_each_core_on_the_makespan(analysed: Store, invocation: int) -> None:
    rows = [tuple(r.values()) for r in analysed.sql(BREAKDOWN, [invocation]).to_pylist()]
    # core, block, makespan, compute, wait, trigger, control, front gap, gaps, tail gap
    assert rows == [
        ("AIC", 0, 300, 170, 0, 15, 0, 0, 20, 95),
        ("AIV", 0, 300, 135, 145, 0, 0, 20, 0, 0),
        ("AIV", 1, 300, 44, 1, 2, 0, 5, 28, 220),
    ]
    assert all(sum(row[3:]) == row[2] for row in rows)
    shares = analysed.sql(
        "SELECT compute_share, tail_gap_share FROM core_breakdown "
        "WHERE invocation_id = 0 AND core = 'AIV' AND block_id = 1"
    ).to_pylist()
    assert shares == [{"compute_share": 44 / 300, "tail_gap_share": 220 / 300}]


def test_core_breakdown_counts_overlapping_records_once(store: Store) -> None:
    overlapping = pack(
        1, 0, 16, 16, [Slot(AIC, 0, 0, [(0, 100, GMM1, 1, 0, 0), (50, 120, GMM1, 2, 1, 0)])]
    )
    ingest_buffers(
        store,
        [overlapping],
        BufferLayout(aic_slots=1, aiv_slots=0, aic_capacity=16, aiv_capacity=16),
        frequency_hz=1e9,
        run_id="overlap-run",
        new_run=RunInfo.begin(run_id="overlap-run"),
    )
    row = store.sql(
        "SELECT makespan_ns, compute_ns, gap_ns, tail_gap_ns FROM core_breakdown"
    ).to_pylist()
    assert row == [{"makespan_ns": 120, "compute_ns": 120, "gap_ns": 0, "tail_gap_ns": 0}]


def test_core_imbalance_flags_a_spread_over_five_percent(analysed: Store) -> None:
    rows = analysed.sql(
        """SELECT core, cores, busiest_block_id, max_busy_ns, min_busy_ns, mean_busy_ns,
                  imbalance, imbalanced
           FROM core_imbalance WHERE invocation_id = 0 ORDER BY core_type"""
    ).to_pylist()
    # AIC/0 is busy 170 + 15; AIV/0 135; AIV/1 44 + 2. The idle AIV/2 is not counted.
    assert rows == [
        {
            "core": "AIC",
            "cores": 1,
            "busiest_block_id": 0,
            "max_busy_ns": 185,
            "min_busy_ns": 185,
            "mean_busy_ns": 185.0,
            "imbalance": 0.0,
            "imbalanced": False,
        },
        {
            "core": "AIV",
            "cores": 2,
            "busiest_block_id": 0,
            "max_busy_ns": 135,
            "min_busy_ns": 46,
            "mean_busy_ns": 90.5,
            "imbalance": 1 - 90.5 / 135,
            "imbalanced": True,
        },
    ]


def test_wait_attribution_charges_each_wait_to_its_releasing_trigger(analysed: Store) -> None:
    rows = analysed.sql(
        """SELECT invocation_id, consumer_block_id, consumer_task_id, consumer_stage, wait_ns,
                  attributed, producer_task_id, producer_stage, producer_core,
                  producer_block_id, waited, release_latency_ns
           FROM wait_attribution ORDER BY invocation_id, consumer_block_id, consumer_task_id"""
    ).to_pylist()
    assert [tuple(r.values()) for r in rows] == [
        (0, 0, 3, "SwiGLU", 95, True, 1, "GMM1", "AIC", 0, True, 5),
        (0, 0, 4, "Combine", 50, True, 2, "GMM1", "AIC", 0, True, 5),
        # Released at 112, before the wait began at 140: no release latency to speak of.
        (0, 1, 5, "SwiGLU", 1, True, 6, "Dispatch", "AIV", 1, False, None),
        # Without a task graph, the stage comes from the task's compute record.
        (1, 0, 3, "SwiGLU", 95, False, None, None, None, None, None, None),
        (1, 0, 4, "Combine", 50, False, None, None, None, None, None, None),
        (1, 1, 5, "SwiGLU", 1, False, None, None, None, None, None, None),
    ]
    blockers = analysed.sql(
        """SELECT consumer_stage, producer_stage, producer_core, attributed, waits,
                  total_wait_ns, p50_latency_ns
           FROM wait_blockers ORDER BY attributed DESC, consumer_stage, producer_stage"""
    ).to_pylist()
    assert [tuple(r.values()) for r in blockers] == [
        ("Combine", "GMM1", "AIC", True, 1, 50, 5.0),
        ("SwiGLU", "Dispatch", "AIV", True, 1, 1, None),
        ("SwiGLU", "GMM1", "AIC", True, 1, 95, 5.0),
        ("Combine", None, None, False, 1, 50, None),
        ("SwiGLU", None, None, False, 2, 96, None),
    ]


PATH = """SELECT seq, core, block_id, kind, stage, task_id, record_index, start_cycle, dur_ns,
                 makespan_ns
          FROM critical_path WHERE invocation_id = $1 ORDER BY seq"""


def path(store: Store, invocation: int) -> list[tuple]:
    return [tuple(r.values())[:-1] for r in store.sql(PATH, [invocation]).to_pylist()]


def test_critical_path_crosses_waits_to_the_triggers_that_bound_them(analysed: Store) -> None:
    # Back from Combine (ends last): its wait was bound by GMM1 task 2's trigger (5 ns of
    # release latency), so the walk goes on at AIC/0 and down its records to the start.
    assert path(analysed, 0) == [
        (0, "AIC", 0, "compute", "GMM1", 1, 0, 100, 100),
        (1, "AIC", 0, "trigger", "GMM1", 1, 1, 200, 10),
        (2, "AIC", 0, "core_wait", None, None, None, 210, 20),
        (3, "AIC", 0, "compute", "GMM1", 2, 2, 230, 70),
        (4, "AIC", 0, "trigger", "GMM1", 2, 3, 300, 5),
        (5, "AIV", 0, "data_wait", "Combine", 4, 2, 305, 5),
        (6, "AIV", 0, "compute", "Combine", 4, 3, 310, 90),
    ]
    summary = analysed.sql(
        """SELECT stage, kind, pieces, dur_ns, share FROM critical_path_summary
           WHERE invocation_id = 0 ORDER BY dur_ns DESC, kind"""
    ).to_pylist()
    assert [tuple(r.values()) for r in summary] == [
        ("GMM1", "compute", 2, 170, 170 / 300),
        ("Combine", "compute", 1, 90, 90 / 300),
        (None, "core_wait", 1, 20, 20 / 300),
        ("GMM1", "trigger", 2, 15, 15 / 300),
        ("Combine", "data_wait", 1, 5, 5 / 300),
    ]


def test_critical_path_without_a_task_graph_stays_on_the_last_core(analysed: Store) -> None:
    assert path(analysed, 1) == [
        (0, "AIV", 0, "front_gap", None, None, None, 100, 20),
        (1, "AIV", 0, "wait", "SwiGLU", 3, 0, 120, 95),
        (2, "AIV", 0, "compute", "SwiGLU", 3, 1, 215, 45),
        (3, "AIV", 0, "wait", "Combine", 4, 2, 260, 50),
        (4, "AIV", 0, "compute", "Combine", 4, 3, 310, 90),
    ]


def test_a_release_latency_beyond_the_tolerance_is_not_crossed(analysed: Store) -> None:
    analysed.configure("critical_path_tolerance", 3)
    assert [row[3] for row in path(analysed, 0)] == [
        "front_gap",
        "wait",
        "compute",
        "wait",
        "compute",
    ]
    with pytest.raises(ArgumentError, match="whole number of cycles"):
        analysed.configure("critical_path_tolerance", -1)


def tie_buffer(extra_last: bool) -> bytearray:
    """AIV/0's wait for E1 begins, and ends, exactly when AIC/0's trigger ends (110): a tie
    the walk gives to the release. With ``extra_last``, AIC/0 also ends at 200, tying the
    last record: the lowest core type wins."""
    aic = [(0, 100, GMM1, 1, 0, 0), (100, 110, TRIGGER, 1, 0, 0)]
    if extra_last:
        aic.append((110, 200, GMM1, 2, 1, 0))
    return pack(
        1,
        3,
        16,
        16,
        [
            Slot(AIC, 0, 0, aic),
            Slot(
                AIV,
                0,
                0,
                [(0, 110, SWIGLU, 7, 0, 0), (110, 110, WAIT, 3, 0, 0), (110, 200, SWIGLU, 3, 0, 0)],
            ),
        ],
    )


def test_ties_go_to_the_release_and_to_the_lowest_core(analysed: Store) -> None:
    for invocation, extra_last in ((2, False), (3, True)):
        ingest_buffers(
            analysed,
            [tie_buffer(extra_last)],
            LAYOUT,
            frequency_hz=1e9,
            run_id=RUN,
            kernel=KernelInfo(kernel_name="AnalysesMoe", stage_names=STAGES, config_id=CONFIG),
            launches=Launches(step=invocation, first_invocation_id=invocation),
        )
    assert [row[:5] + row[-1:] for row in path(analysed, 2)] == [
        (0, "AIC", 0, "compute", "GMM1", 100),
        (1, "AIC", 0, "trigger", "GMM1", 10),
        (2, "AIV", 0, "data_wait", "SwiGLU", 0),
        (3, "AIV", 0, "compute", "SwiGLU", 90),
    ]
    assert [row[:5] + row[-1:] for row in path(analysed, 3)] == [
        (0, "AIC", 0, "compute", "GMM1", 100),
        (1, "AIC", 0, "trigger", "GMM1", 10),
        (2, "AIC", 0, "compute", "GMM1", 90),
    ]


def test_analyze_gives_the_static_bound_the_fidelity_and_the_shares(analysed: Store) -> None:
    result = analyze(analysed, RecordSelection(run=RUN))
    rows = result.invocations.select(
        [
            "invocation_id",
            "makespan_ns",
            "critical_path_ns",
            "path_tiles",
            "static_bound_ns",
            "slack_ns",
            "fidelity_error",
            "faithful",
        ]
    ).to_pylist()
    # The static bound of invocation 0: no gaps or latencies, waits take no time of their
    # own: AIC/0 ends GMM1 task 2's trigger at 285, so Combine runs 285..375. Without a
    # task graph there are no release edges: the bound is the busiest core's work, AIC/0's.
    assert [tuple(r.values()) for r in rows] == [
        (0, 300, 300, True, 275, 25, 0.0, True),
        (1, 300, 300, True, 185, 115, 0.0, True),
    ]
    shares = result.critical_shares.to_pylist()
    assert [(r["stage"], r["kind"], r["dur_ns"]) for r in shares] == [
        ("Combine", "compute", 180),
        ("GMM1", "compute", 170),
        ("SwiGLU", "wait", 95),
        ("Combine", "wait", 50),
        ("SwiGLU", "compute", 45),
        (None, "core_wait", 20),
        (None, "front_gap", 20),
        ("GMM1", "trigger", 15),
        ("Combine", "data_wait", 5),
    ]
    assert sum(r["share"] for r in shares) == pytest.approx(1.0)


def test_what_if_replays_a_faster_stage(analysed: Store) -> None:
    predicted = what_if(analysed, RecordSelection(run=RUN, invocation=0), ["GMM1*0.5"])
    # GMM1 halves: AIC/0 runs 100..150, trigger to 160, (gap 20) 180..215, trigger to 220;
    # AIV/0's waits end 5 ns after: 165 and 225, and Combine runs 225..315.
    assert predicted.select(["predicted_makespan_ns", "ratio"]).to_pylist() == [
        {"predicted_makespan_ns": 215, "ratio": 215 / 300}
    ]
    with pytest.raises(AnalysisError, match="GMM3"):
        what_if(analysed, RecordSelection(run=RUN), ["GMM3*0.5"])
    with pytest.raises(SelectorError, match=f"^run {RUN} has no invocation 9$"):
        analyze(analysed, RecordSelection(run=RUN, invocation=9))


def test_a_selection_query_may_read_views_the_analysis_does_not(analysed: Store) -> None:
    """The analysis's cursor installs its own modules and those its selection's query
    names (``run_summary`` and ``stage_stats`` are none of the analysis's)."""
    query = (
        "SELECT r.* FROM records_ns r JOIN run_summary USING (run_id) "
        "WHERE r.invocation_id = 0 AND run_id IN (SELECT run_id FROM stage_stats)"
    )
    rows = analyze(analysed, RecordSelection(query=query)).invocations
    assert rows.select(["invocation_id", "makespan_ns"]).to_pylist() == [
        {"invocation_id": 0, "makespan_ns": 300}
    ]


def test_the_analysis_views_install_when_a_query_names_them(store: Store) -> None:
    installed = (
        "SELECT count(*) AS n FROM duckdb_views() "
        "WHERE view_name IN ('core_breakdown', 'wait_attribution', 'replay_records')"
    )
    assert store.sql(installed).to_pylist() == [{"n": 0}]  # named in strings only
    assert store.sql("SELECT count(*) AS n FROM core_breakdown").to_pylist() == [{"n": 0}]
    assert store.sql(installed).to_pylist() == [{"n": 1}]
