"""The cross-rank views (records.kernel_ranks) on hand-built jobs of 2 and 4 ranks whose
ranks run the same invocation with known skews, against values worked out by hand.

Every invocation is one shape, at 1 GHz (a cycle is a nanosecond), from its anchor ``a``:
AIC/0 computes Dispatch for 10 and triggers for 2 from ``a + late``, then GMM1 for ``g``
and triggers E1 for 2; AIV/0 waits on E1 from ``a``, released 3 after GMM1's trigger ends,
then computes Combine for ``c``. Its critical path: Dispatch compute 10 and trigger 2,
GMM1 compute g and trigger 2, Combine data_wait 3 and compute c, after a front gap of
``late``. So the makespan is late + 17 + g + c, and per stage: Dispatch 12, GMM1 g + 2,
Combine c + 3, the gaps (stage NULL) late.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from golden import AIC, AIV, TRIGGER, WAIT, Slot, pack
from task_graphs import tasks_table

from multicore_profiler import cli
from multicore_profiler.abi import BufferLayout
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

JOB4, JOB2 = "ranks-job4", "ranks-job2"
CONFIG = "ranks-config"
KERNEL, OTHER = "RankMoe", "OtherMoe"
LAYOUT = BufferLayout(aic_slots=1, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
DISPATCH, GMM1, COMBINE = 1, 2, 5
STAGES = {DISPATCH: "Dispatch", GMM1: "GMM1", COMBINE: "Combine"}
E0, E1 = 0, 1


def invocation(anchor: int, g: int, c: int, late: int = 0) -> bytearray:
    """One invocation of the module docstring's shape: GMM1 computes for ``g``, Combine for
    ``c``, AIC starts ``late`` after the anchor."""
    a = anchor + late
    triggered = a + 12 + g + 2
    return pack(
        1,
        1,
        16,
        16,
        [
            Slot(
                AIC,
                0,
                anchor,
                [
                    (a, a + 10, DISPATCH, 1, 0, 0),
                    (a + 10, a + 12, TRIGGER, 1, 0, 0),
                    (a + 12, a + 12 + g, GMM1, 2, 0, 0),
                    (a + 12 + g, triggered, TRIGGER, 2, 0, 0),
                ],
            ),
            Slot(
                AIV,
                0,
                anchor,
                [
                    (anchor, triggered + 3, WAIT, 3, 0, 0),
                    (triggered + 3, triggered + 3 + c, COMBINE, 3, 0, 0),
                ],
            ),
        ],
    )


def tasks(rank: int) -> pa.Table:
    return tasks_table(
        CONFIG,
        KERNEL,
        task_id=[1, 2, 3],
        desc_id=[DISPATCH, GMM1, COMBINE],
        core_type=[AIC, AIC, AIV],
        worker=[0, 0, 0],
        wait_event=[-1, -1, E1],
        wait_count=[0, 0, 1],
        trigger_event=[E0, E1, -1],
        rank=rank,
    )


# Per job, rank and step: each invocation's (anchor, g, c, late), in the order ingested
# (its invocation ids); each rank's counter starts elsewhere.
JOBS: dict[str, dict[tuple[int, int], list[tuple[int, int, int, int]]]] = {
    JOB4: {
        # step 0, order 0: rank 1's GMM1 30 longer and Combine 5 shorter, rank 2's
        # Combine 10 longer; order 1: ranks 0 (GMM1) and 2 (Combine) both 10 longer.
        (0, 0): [(1_000, 100, 50, 0), (2_000, 110, 50, 0)],
        (1, 0): [(1_000, 130, 45, 0), (2_000, 100, 50, 0)],
        # Rank 2 launched order 1 first by id: its order is by anchor.
        (2, 0): [(402_000, 100, 60, 0), (401_000, 100, 60, 0)],
        (3, 0): [(1_000, 100, 50, 0), (2_000, 100, 50, 0)],
        # Step 1: rank 3 is missing; only rank 0 runs a second invocation.
        (0, 1): [(10_000, 100, 50, 0), (11_000, 100, 50, 0)],
        (1, 1): [(10_000, 100, 50, 0)],
        (2, 1): [(510_000, 100, 70, 0)],
    },
    JOB2: {
        # Rank 1: Combine 70 longer and AIC 4 late.
        (0, 0): [(1_000, 100, 50, 0)],
        (1, 0): [(7_000, 100, 120, 4)],
        # Step 1: rank 1 runs another kernel (KERNELS): nothing aligns.
        (0, 1): [(10_000, 100, 50, 0)],
        (1, 1): [(20_000, 100, 50, 0)],
    },
}
KERNELS = {(JOB2, 1, 1): OTHER}
"""The kernel of a job's rank and step where it is not ``KERNEL``."""


@pytest.fixture
def jobs(store: Store) -> Store:
    """The two jobs of ``JOBS``, each a run of all its ranks, with their task graphs."""
    for job, launches in JOBS.items():
        run = RunInfo.begin(run_id=job)
        store.write_run(run)
        for (rank, step), shapes in launches.items():
            ingest_buffers(
                store,
                [invocation(*shape) for shape in shapes],
                LAYOUT,
                frequency_hz=1e9,
                run_id=job,
                kernel=KernelInfo(
                    kernel_name=KERNELS.get((job, rank, step), KERNEL),
                    stage_names=STAGES,
                    config_id=CONFIG,
                ),
                launches=Launches(rank=rank, step=step),
            )
        for rank in sorted({rank for rank, _ in launches}):
            store.write_tasks(job, tasks(rank))
        store.write_run(run.finish())
    return store


def rows(store: Store, query: str) -> list[tuple]:
    return [tuple(row.values()) for row in store.sql(query).to_pylist()]


def test_each_rank_invocation_has_its_makespan_kinds_and_top_stage(jobs: Store) -> None:
    assert rows(
        jobs,
        """SELECT job_id, step, invocation_order, rank, kernel_name, direction, invocation_id,
                  makespan_ns, top_stage, top_stage_ns
           FROM kernel_rank_invocations ORDER BY job_id DESC, step, invocation_order, rank""",
    ) == [
        (JOB4, 0, 0, 0, KERNEL, "forward", 0, 167, "GMM1", 102),
        (JOB4, 0, 0, 1, KERNEL, "forward", 0, 192, "GMM1", 132),
        (JOB4, 0, 0, 2, KERNEL, "forward", 1, 177, "GMM1", 102),
        (JOB4, 0, 0, 3, KERNEL, "forward", 0, 167, "GMM1", 102),
        (JOB4, 0, 1, 0, KERNEL, "forward", 1, 177, "GMM1", 112),
        (JOB4, 0, 1, 1, KERNEL, "forward", 1, 167, "GMM1", 102),
        (JOB4, 0, 1, 2, KERNEL, "forward", 0, 177, "GMM1", 102),
        (JOB4, 0, 1, 3, KERNEL, "forward", 1, 167, "GMM1", 102),
        (JOB4, 1, 0, 0, KERNEL, "forward", 2, 167, "GMM1", 102),
        (JOB4, 1, 0, 1, KERNEL, "forward", 2, 167, "GMM1", 102),
        (JOB4, 1, 0, 2, KERNEL, "forward", 2, 187, "GMM1", 102),
        (JOB4, 1, 1, 0, KERNEL, "forward", 3, 167, "GMM1", 102),
        # Combine 123 outweighs GMM1 102 on the slow rank of the 2-rank job.
        (JOB2, 0, 0, 0, KERNEL, "forward", 0, 167, "GMM1", 102),
        (JOB2, 0, 0, 1, KERNEL, "forward", 0, 241, "Combine", 123),
        (JOB2, 1, 0, 0, KERNEL, "forward", 1, 167, "GMM1", 102),
        (JOB2, 1, 0, 1, OTHER, "forward", 1, 167, "GMM1", 102),
    ]
    shares = jobs.sql(
        f"""SELECT compute_share, trigger_share, control_share, wait_share, data_wait_share,
                   core_wait_share, front_gap_share
            FROM kernel_rank_invocations
            WHERE job_id = '{JOB2}' AND step = 0 AND rank = 1"""
    ).to_pylist()
    # compute 10 + 100 + 120, triggers 2 + 2, data_wait 3, front gap 4, of 241.
    assert shares == [
        {
            "compute_share": 230 / 241,
            "trigger_share": 4 / 241,
            "control_share": 0.0,
            "wait_share": 0.0,
            "data_wait_share": 3 / 241,
            "core_wait_share": 0.0,
            "front_gap_share": 4 / 241,
        }
    ]


def test_the_spread_names_the_slowest_rank_and_what_the_median_would_recover(
    jobs: Store,
) -> None:
    assert rows(
        jobs,
        """SELECT job_id, step, invocation_order, kernel_name, direction, ranks, max_ns,
                  median_ns, min_ns, spread_ns, slowest_rank, recoverable_ns
           FROM kernel_rank_spread ORDER BY job_id DESC, step, invocation_order, kernel_name""",
    ) == [
        # 167 167 177 192: the lower median is the 2nd.
        (JOB4, 0, 0, KERNEL, "forward", 4, 192, 167, 167, 25, 1, 25),
        # 167 167 177 177: ranks 0 and 2 tie, the lower is the slowest.
        (JOB4, 0, 1, KERNEL, "forward", 4, 177, 167, 167, 10, 0, 10),
        # Rank 3 is missing: 167 167 187 over 3 ranks.
        (JOB4, 1, 0, KERNEL, "forward", 3, 187, 167, 167, 20, 2, 20),
        (JOB4, 1, 1, KERNEL, "forward", 1, 167, 167, 167, 0, 0, 0),
        # Of 2 ranks the median is the faster.
        (JOB2, 0, 0, KERNEL, "forward", 2, 241, 167, 167, 74, 1, 74),
        # Different kernels at the same order are not compared.
        (JOB2, 1, 0, OTHER, "forward", 1, 167, 167, 167, 0, 1, 0),
        (JOB2, 1, 0, KERNEL, "forward", 1, 167, 167, 167, 0, 0, 0),
    ]


def test_the_steps_sum_each_rank_and_the_recoverable_time(jobs: Store) -> None:
    assert rows(
        jobs,
        """SELECT job_id, step, ranks, max_ns, median_ns, min_ns, slowest_rank, excess_ns,
                  recoverable_ns
           FROM kernel_rank_steps ORDER BY job_id DESC, step""",
    ) == [
        # Ranks 0..3: 167+177, 192+167, 177+177, 167+167; recoverable 25 + 10.
        (JOB4, 0, 4, 359, 344, 334, 1, 15, 35),
        # Rank 0 ran two invocations (334), ranks 1 and 2 one (167, 187): rank 0 is slowest
        # by its extra invocation, which no other rank waits for (recoverable 20 + 0).
        (JOB4, 1, 3, 334, 187, 167, 0, 147, 20),
        (JOB2, 0, 2, 241, 167, 167, 1, 74, 74),
        (JOB2, 1, 2, 167, 167, 167, 0, 0, 0),
    ]
    # Scoped to one job, as ``mcprof query --run`` scopes every view.
    scoped = jobs.sql("SELECT job_id, step FROM kernel_rank_steps ORDER BY step", runs=[JOB2])
    assert scoped.to_pylist() == [{"job_id": JOB2, "step": 0}, {"job_id": JOB2, "step": 1}]


def test_the_slow_ranks_stages_are_ranked_by_their_excess_over_the_others(
    jobs: Store,
) -> None:
    assert rows(
        jobs,
        """SELECT job_id, step, invocation_order, ranks, slowest_rank, excess_rank, stage,
                  slow_ns, median_other_ns, excess_ns
           FROM kernel_slow_rank_stages
           ORDER BY job_id DESC, step, invocation_order, excess_rank""",
    ) == [
        # Rank 1: GMM1 132 against 102 102 102; Combine 48 against 53 53 63.
        (JOB4, 0, 0, 4, 1, 1, "GMM1", 132, 102, 30),
        (JOB4, 0, 0, 4, 1, 2, "Dispatch", 12, 12, 0),
        (JOB4, 0, 0, 4, 1, 3, "Combine", 48, 53, -5),
        # Rank 0: GMM1 112 against 102 102 102; Combine 53 against 53 53 63.
        (JOB4, 0, 1, 4, 0, 1, "GMM1", 112, 102, 10),
        (JOB4, 0, 1, 4, 0, 2, "Combine", 53, 53, 0),
        (JOB4, 0, 1, 4, 0, 3, "Dispatch", 12, 12, 0),
        # Rank 2: Combine 73 against 53 53. (Order 1, of rank 0 alone, has no row.)
        (JOB4, 1, 0, 3, 2, 1, "Combine", 73, 53, 20),
        (JOB4, 1, 0, 3, 2, 2, "Dispatch", 12, 12, 0),
        (JOB4, 1, 0, 3, 2, 3, "GMM1", 102, 102, 0),
        # Rank 1: Combine 123 against 53, and its front gap 4 against none.
        (JOB2, 0, 0, 2, 1, 1, "Combine", 123, 53, 70),
        (JOB2, 0, 0, 2, 1, 2, None, 4, 0, 4),
        (JOB2, 0, 0, 2, 1, 3, "Dispatch", 12, 12, 0),
        (JOB2, 0, 0, 2, 1, 4, "GMM1", 102, 102, 0),
    ]


def test_the_gaps_name_the_ranks_an_invocation_lacks(jobs: Store) -> None:
    assert rows(
        jobs,
        """SELECT job_id, step, invocation_order, kernel_name, direction, missing_ranks
           FROM kernel_rank_gaps ORDER BY job_id, step, invocation_order, kernel_name""",
    ) == [
        (JOB2, 1, 0, OTHER, "forward", [0]),
        (JOB2, 1, 0, KERNEL, "forward", [1]),
        (JOB4, 1, 0, KERNEL, "forward", [3]),
        (JOB4, 1, 1, KERNEL, "forward", [1, 2, 3]),
    ]


def test_mcprof_ranks_shows_a_runs_ranks_and_warns_of_the_missing(jobs: Store, capsys) -> None:
    assert cli.main(["ranks", "--store", jobs.uri, "--run", JOB4, "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"mcprof: warning: run {JOB4} step 1: invocation 0 ({KERNEL}) has no records of rank(s) 3",
        f"mcprof: warning: run {JOB4} step 1: invocation 1 ({KERNEL}) has no records of "
        "rank(s) 1, 2, 3",
    ]
    tables = json.loads(captured.out)["tables"]
    assert [
        (r["step"], r["slowest_rank"], r["excess_ns"], r["recoverable_ns"])
        for r in tables["kernel_rank_steps"]
    ] == [(0, 1, 15, 35), (1, 0, 147, 20)]
    # Each aligned invocation's top stage: the stage that makes its slowest rank slow.
    assert [
        (r["step"], r["invocation_order"], r["slowest_rank"], r["stage"], r["excess_ns"])
        for r in tables["kernel_slow_rank_stages"]
    ] == [(0, 0, 1, "GMM1", 30), (0, 1, 0, "GMM1", 10), (1, 0, 2, "Combine", 20)]
    assert tables["rank_step_breakdown"] == []
