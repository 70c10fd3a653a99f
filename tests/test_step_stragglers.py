"""``step_stragglers`` (who holds each step back: the last arrival at its collectives, set
beside the longest step) and ``communication_totals`` (msprof's "Total Op Info" per rank,
group and step), on the real captures, against msprof's own totals and the waits of
``collective_waits``."""

from __future__ import annotations

import json

import pytest
from shared_fixtures import shared_fixture

from multicore_profiler.ingest.jobs import ingest_job
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.storage.store import Store

QWEN3 = "ascend-cluster/msinsight_st_qwen3_4rank_pp2_dp2"
DB_L1 = "ascend-cluster/msinsight_imagenet_2rank_dp_db/level1"
TEXT = "ascend-cluster/msinsight_imagenet_2rank_dp_text/level{}/rank{}_ascend_pt"
TRACE = "ascend/torchnpu_imagenet_2025_L{}_rank{}_trace_view.json.gz"


def stragglers(store: Store) -> list[tuple]:
    return [
        tuple(row.values())
        for row in store.sql(
            """SELECT job_id, step, ranks, last_arrival_rank, last_arrival_wait_ns,
                      most_waiting_rank, most_wait_ns, waited_for_ns, slowest_rank,
                      slowest_step_ns, recoverable_ns
               FROM step_stragglers ORDER BY job_id"""
        ).to_pylist()
    ]


def test_the_last_arrival_and_the_longest_step(store: Store) -> None:
    ingest_job(store, [shared_fixture(QWEN3)], job="qwen3")
    ingest_job(store, [shared_fixture(DB_L1)], job="imagenet")
    assert stragglers(store) == [
        # Rank 1 arrived last (it waited 5 081 ns); rank 0 waited 3 522 991 ns for it, and
        # its step is the longest: 1.7 ms over the median, all of it that wait.
        ("imagenet", 50, 2, 1, 5_081, 0, 3_522_991, 3_517_910, 0, 150_289_215, 1_732_102.5),
        # The second pipeline stage's rank 3 arrives last and has the longest step; the
        # first stage's ranks wait for it (waits 318 340 040 + 339 938 620 + 175 781 800
        # + 159 695 100 less 4 x 159 695 100).
        ("qwen3", 13, 4, 3, 159_695_100, 1, 339_938_620, 354_975_160, 3, 810_429_000, 318_625.0),
    ]


@pytest.mark.parametrize("level", [1, 2])
def test_totals_are_msprofs_total_op_info(store: Store, level: int) -> None:
    for rank in (0, 1):
        ingest_trace(store, shared_fixture(TRACE.format(level, rank)), rank=rank, job="traced")
    ingest_job(store, [shared_fixture(TEXT.format(level, r)) for r in (0, 1)], job="msprof")
    for rank in (0, 1):
        output = shared_fixture(TEXT.format(level, rank)) / "ASCEND_PROFILER_OUTPUT"
        (steps,) = json.loads((output / "communication.json").read_text()).values()
        total = steps["collective"]["Total Op Info"]["Communication Time Info"]
        for job in ("traced", "msprof"):
            (got,) = store.sql(
                "SELECT * FROM communication_totals WHERE job_id = $1 AND rank = $2", [job, rank]
            ).to_pylist()
            assert (got["step"], got["ops"]) == (50, 4)
            fields = {"elapse_ns": "Elapse Time(ms)", "transit_ns": "Transit Time(ms)",
                      "wait_ns": "Wait Time(ms)", "sync_ns": "Synchronization Time(ms)",
                      "idle_ns": "Idle Time(ms)"}  # fmt: skip
            for column, name in fields.items():
                # msprof's per-op times are rounded to the ns each, then summed.
                assert abs(got[column] - total[name] * 1e6) <= 4, (job, rank, column)
            assert got["wait_ratio"] == total["Wait Time Ratio"], (job, rank)
            assert got["sync_ratio"] == total["Synchronization Time Ratio"], (job, rank)


def test_totals_of_a_qwen3_rank_per_group(store: Store) -> None:
    ingest_job(store, [shared_fixture(QWEN3)], job="qwen3")
    got = store.sql(
        """SELECT group_name, ops, elapse_ns, wait_ns, sync_ns, idle_ns, wait_ratio
           FROM communication_totals WHERE rank = 0 ORDER BY group_name"""
    ).to_pylist()
    # The p2p ops of the pipeline group (hash 3985310405473756128): communication.json's
    # p2p Total Op Info: Elapse 313.8778 ms, Wait = Synchronization 158.50548 ms, Idle
    # 155.37232 ms, Wait Time Ratio 1.0.
    (p2p,) = [row for row in got if row["group_name"] == "3985310405473756128"]
    assert p2p == {
        "group_name": "3985310405473756128", "ops": 3, "elapse_ns": 313_877_800,
        "wait_ns": 158_505_480, "sync_ns": 158_505_480, "idle_ns": 155_372_320,
        "wait_ratio": 1.0,
    }  # fmt: skip
    assert sum(row["ops"] for row in got) == 15
