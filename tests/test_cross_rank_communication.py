"""Communication across the ranks of a job (cross_rank.communication): the ops, their
collective instances, msprof-analyze's wait / transmit split and slow-rank vote, and the
ranks' clock offsets, on hand-built ranks, real torch_npu cluster captures and copies of a
kineto trace with known skews."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from kineto_ranks import nccl_kernels, nccl_trace, rank_copy
from shared_fixtures import shared_fixture

from multicore_profiler.ingest.ascend_output import read_rank_folder
from multicore_profiler.ingest.jobs import ingest_job
from multicore_profiler.ingest.outer_trace import RankContext, ingest_outputs, ingest_trace
from multicore_profiler.storage.store import Store


def op(name: str, group: str, start_us: float, elapse_ms: float, step: str = "step3") -> dict:
    """One communication.json op as ascend_output reads it (the other fields absent)."""
    return {
        "step": step,
        "type": "collective",
        "op_name": name,
        "group_name": group,
        "start_us": start_us,
        "elapse_ms": elapse_ms,
    }


def outputs_rank(
    store: Store,
    job: str,
    rank: int,
    ops: list[dict],
    *,
    device: int | None = None,
    groups: dict[str, list[int]] | None = None,
) -> None:
    """Load a rank of ``job`` that has msprof's communication rows and no trace, with its
    device and the job's parallel_group_info (group key: global ranks)."""
    parallel = None
    if groups:
        info = {key: {"group_name": key, "global_ranks": ranks} for key, ranks in groups.items()}
        parallel = {"parallel_group_info": info}
    context = RankContext(device, parallel, {"communication": ops})
    ingest_outputs(store, [(Path(f"/{job}/rank{rank}"), rank, context)], job=job)


def rows(store: Store, query: str, *params: Any) -> list[tuple]:
    """A query's rows as tuples."""
    return [tuple(row.values()) for row in store.sql(query, list(params)).to_pylist()]


def test_two_ranks_split_wait_and_transmit_by_rank_not_device(store: Store) -> None:
    outputs_rank(
        store, "two", 0, [op("A", "g", 1000, 0.5), op("B", "g", 2000, 0.3)], device=4
    )  # fmt: skip
    outputs_rank(
        store, "two", 1, [op("A", "g", 1300, 0.21), op("B", "g", 1899.5, 0.4105)], device=5
    )  # fmt: skip
    assert rows(store, "SELECT rank, device FROM trace_sources ORDER BY rank") == [(0, 4), (1, 5)]
    assert rows(
        store,
        "SELECT rank, step, group_name, op_name, start_ns, elapse_ns, basis "
        "FROM communication_ops ORDER BY rank, start_ns",
    ) == [
        (0, 3, "g", "A", 1_000_000, 500_000, "msprof"),
        (0, 3, "g", "B", 2_000_000, 300_000, "msprof"),
        (1, 3, "g", "A", 1_300_000, 210_000, "msprof"),
        (1, 3, "g", "B", 1_899_500, 410_500, "msprof"),
    ]
    assert rows(
        store,
        "SELECT instance, rank, end_ns, dur_ns, keyed_by, group_ranks, parts, complete "
        "FROM collective_instances ORDER BY instance, rank",
    ) == [
        ("3/A", 0, 1_500_000, 500_000, "op_name", 2, 2, True),
        ("3/A", 1, 1_510_000, 210_000, "op_name", 2, 2, True),
        ("3/B", 0, 2_300_000, 300_000, "op_name", 2, 2, True),
        ("3/B", 1, 2_310_000, 410_500, "op_name", 2, 2, True),
    ]
    # A: transmit 210 µs, rank 0 waits 290; B: transmit 300 µs, rank 1 waits 110.5.
    assert rows(store, "SELECT * FROM collective_waits ORDER BY rank") == [
        ("two", 0, 3, 290_000, 510_000, 2, 0),
        ("two", 1, 3, 110_500, 510_000, 2, 0),
    ]
    # Two durations per instance: the Dixon test needs three, so nobody is voted.
    assert rows(store, "SELECT * FROM slow_ranks ORDER BY rank") == [
        ("two", 3, 0, 0),
        ("two", 3, 1, 0),
    ]
    assert rows(store, "SELECT * FROM rank_clock_offsets ORDER BY rank") == [
        ("two", 0, 0, 0, 2, 0),
        ("two", 1, 0, 10_000, 2, 0),
    ]


def test_a_group_rank_missing_leaves_its_instances_out(store: Store) -> None:
    # group_name_0 names ranks 0..2 (communication.json keys it by its hash); rank 2 never
    # ran its op X. The group "pair" is keyed by its name itself.
    groups = {"group_name_0": [0, 1, 2], "pair": [0, 1]}
    hashed = rows(store, "SELECT hccl_group_hash('group_name_0')")[0][0]
    assert hashed == "5862276093215481612"  # as the ascend-cluster README verified
    outputs_rank(store, "gap", 0, [op("X", hashed, 10, 0.004), op("W", "pair", 20, 0.003)])
    outputs_rank(store, "gap", 1, [op("X", hashed, 11, 0.002), op("W", "pair", 21, 0.001)])
    outputs_rank(store, "gap", 2, [op("V", "solo", 30, 0.001)], groups=groups)
    assert rows(
        store,
        "SELECT group_name, instance, rank, group_ranks, parts, complete "
        "FROM collective_instances ORDER BY ALL",
    ) == [
        (hashed, "3/X", 0, 3, 2, False),
        (hashed, "3/X", 1, 3, 2, False),
        ("pair", "3/W", 0, 2, 2, True),
        ("pair", "3/W", 1, 2, 2, True),
        ("solo", "3/V", 2, 1, 1, True),
    ]
    assert rows(store, "SELECT * FROM collective_waits ORDER BY rank") == [
        ("gap", 0, 3, 2000, 1000, 1, 1),
        ("gap", 1, 3, 0, 1000, 1, 1),
        ("gap", 2, 3, 0, 1000, 1, 0),
    ]
    # Rank 2 shares no complete instance with rank 0: no offset.
    assert rows(store, "SELECT * FROM rank_clock_offsets ORDER BY rank") == [
        ("gap", 0, 0, 0, 1, 0),
        ("gap", 1, 0, -1000, 1, 0),
        ("gap", 2, 0, None, 0, None),
    ]


def test_ops_that_do_not_pair_are_reported_and_left_out(store: Store) -> None:
    # Rank 0 ran C in group g, rank 1 did not, and rank 1 ran B twice.
    outputs_rank(
        store, "odd", 0,
        [op("A", "g", 0, 0.010), op("B", "g", 100, 0.020), op("C", "g", 200, 0.030)],
    )  # fmt: skip
    outputs_rank(
        store, "odd", 1,
        [op("A", "g", 5, 0.005), op("B", "g", 105, 0.015), op("B", "g", 150, 0.001)],
    )  # fmt: skip
    assert rows(
        store,
        "SELECT instance, rank, parts, complete FROM collective_instances ORDER BY ALL",
    ) == [
        ("3/A", 0, 2, True),
        ("3/A", 1, 2, True),
        ("3/B", 0, 3, False),
        ("3/B", 1, 3, False),
        ("3/B", 1, 3, False),
        ("3/C", 0, 1, False),
    ]
    assert rows(store, "SELECT * FROM collective_waits ORDER BY rank") == [
        ("odd", 0, 3, 5000, 5000, 1, 2),
        ("odd", 1, 3, 0, 5000, 1, 2),
    ]
    # slow_rank drops a group whose instances differ in their number of parts.
    assert rows(store, "SELECT * FROM slow_ranks") == []


def test_dixon_votes_for_the_shortest_duration_of_an_outlier(store: Store) -> None:
    durations_us = {  # instance: durations of ranks 0..4 (µs)
        "A": [200, 100, 205, 210, 215],  # r = 100/115 > 0.823: rank 1
        "B": [100, 150, 205, 210, 215],  # r = 50/115: no outlier
        "C": [200, 100, 200, 210, 210],  # 3 distinct durations: no test
        "D": [100, 100, 300, 301, 302],  # the shortest tied: r = 0
        "hcom_send__1": [200, 100, 205, 210, 215],  # point-to-point: not tested
    }
    step4 = [300, 300, 301, 50, 302]  # r = 250/252 > 0.823: rank 3, in step 4
    for rank in range(5):
        ops = [
            op(name, "g5", 1000 * i + rank, durations[rank] / 1000)
            for i, (name, durations) in enumerate(durations_us.items())
        ]
        ops.append(op("E", "g5", 9000 + rank, step4[rank] / 1000, step="step4"))
        outputs_rank(store, "five", rank, ops)
    assert rows(store, "SELECT step, rank, votes FROM slow_ranks ORDER BY ALL") == [
        (3, 0, 0), (3, 1, 1), (3, 2, 0), (3, 3, 0), (3, 4, 0),
        (4, 0, 0), (4, 1, 0), (4, 2, 0), (4, 3, 1), (4, 4, 0),
    ]  # fmt: skip
    assert rows(store, "SELECT dixon_critical_995(3), dixon_critical_995(100)") == [(0.994, 0.341)]


def test_over_100_ranks_three_sigma_votes(store: Store) -> None:
    # Low: rank 100 is below mean - 3 sigma. High: rank 100 is above mean + 3 sigma, so the
    # shortest duration votes, the lowest rank of the tie (rank 0).
    for rank in range(101):
        low, high = (10, 5000) if rank == 100 else (1000, 1000)
        ops = [op("Low", "wide", rank, low / 1000), op("High", "wide", 9000 + rank, high / 1000)]
        outputs_rank(store, "wide", rank, ops)
    assert rows(store, "SELECT rank, votes FROM slow_ranks WHERE votes > 0 ORDER BY ALL") == [
        (0, 1),
        (100, 1),
    ]


def test_clock_offset_is_the_median_of_end_differences(store: Store) -> None:
    # Rank 1 ends 10, 20, 31.001 and 100 µs after rank 0: median 25.5005 µs, rounded down.
    ends_us = [(100, 110), (200, 220), (300, 331.001), (400, 500)]
    for rank in (0, 1):
        ops = [
            op(f"op{i}", "g", ends[rank] - 5, 0.005) for i, ends in enumerate(ends_us)
        ]  # fmt: skip
        outputs_rank(store, "clock", rank, ops)
    assert rows(store, "SELECT * FROM rank_clock_offsets WHERE rank = 1") == [
        ("clock", 1, 0, 25_500, 4, 90_000)
    ]


def test_qwen3_groups_come_from_parallel_group_info(store: Store) -> None:
    """The 4-rank TP1 PP2 DP2 capture (outputs only; devices 0, 1, 4, 5): each group's
    ranks from profiler_metadata.json, keyed by the hash communication.json writes."""
    ingest_job(store, [shared_fixture("ascend-cluster/msinsight_st_qwen3_4rank_pp2_dp2")], job="q")
    groups = rows(
        store,
        "SELECT group_name, group_ranks, list_sort(list(DISTINCT rank)), bool_and(complete) "
        "FROM collective_instances GROUP BY ALL ORDER BY group_name",
    )
    assert ("5862276093215481612", 4, [0, 1, 2, 3], True) in groups  # default_group
    assert ("5862276106100383503", 2, [2, 3], True) in groups  # dp
    assert ("3985310405473756128", 2, [0, 2], True) in groups  # pp
    assert ("3985310379703952346", 2, [0, 2], True) in groups  # mp
    assert len(groups) == 12
    assert all(complete for *_, complete in groups)
    # hcom_allReduce__612_4_1 of the default group: 820.84, 1940.46, 1052.00, 18.08 µs.
    waits = rows(
        store,
        "SELECT rank, dur_ns - min(dur_ns) OVER () FROM collective_instances "
        "WHERE instance = '13/hcom_allReduce__612_4_1' ORDER BY rank",
    )
    assert waits == [(0, 802_760), (1, 1_922_380), (2, 1_033_920), (3, 0)]
    assert rows(store, "SELECT sum(votes) FROM slow_ranks") == [(0,)]


A100 = "kineto/a100_training_rank0.json.gz"
SHIFT_US = {0: 0, 1: 1500, 2: -250, 3: 40}
"""Each copy's clock, µs after rank 0's."""
STRETCH_US = {
    1: {20: 100, 35: 0, 9: 500},
    2: {20: 103, 35: 60, 9: 500},
    3: {20: 106, 35: 300, 9: 500},
    0: {35: 50},
}
"""Per rank, the NCCL kernels (numbered in order of start) made longer, µs."""


@pytest.fixture
def a100(store: Store, tmp_path: Path) -> Store:
    """Four ranks of the A100 training trace: copies of rank 0 with clocks shifted and
    some NCCL kernels stretched (SHIFT_US, STRETCH_US)."""
    source = shared_fixture(A100)
    paths = [
        rank_copy(
            source, tmp_path / f"rank{rank}.json.gz", rank=rank, shift_us=SHIFT_US[rank],
            stretch_us=STRETCH_US[rank],
        )
        for rank in range(4)
    ]  # fmt: skip
    ingest_job(store, paths, job="a100")
    return store


def test_kineto_ranks_with_known_skews(a100: Store) -> None:
    kernels = rows(
        a100,
        "SELECT c.step_index, p.step_number, c.event_index, c.dur_ns FROM collectives c "
        "JOIN step_periods p USING (source_id, step_index) "
        "WHERE c.rank = 0 ORDER BY c.ts_ns, c.event_index",
    )
    # The kernels of the store's steps, in order: which NCCL kernels of the file they are.
    order = rows(
        a100,
        "SELECT event_index FROM kernels WHERE rank = 0 AND family = 'collective' "
        "ORDER BY ts_ns, event_index",
    )
    number = {event: j for j, (event,) in enumerate(order)}
    assert len(nccl_kernels_of_rank0()) == len(order) == 80
    stepped = {number[event]: (step, dur) for _, step, event, dur in kernels}
    assert len(stepped) == 60
    assert {9, 20, 35} <= set(stepped)
    steps = sorted({step for step, _ in stepped.values()})
    assert steps == [550, 551, 552, 553]
    stretch = {j: [STRETCH_US[r].get(j, 0) * 1000 for r in range(4)] for j in stepped}
    expected_waits = []
    for rank in range(4):
        for step in steps:
            mine = [j for j, (s, _) in stepped.items() if s == step]
            wait = sum(stretch[j][rank] - min(stretch[j]) for j in mine)
            # Rank 0's duration less its own stretch is the file's.
            transmit = sum(stepped[j][1] - stretch[j][0] + min(stretch[j]) for j in mine)
            expected_waits.append(("a100", rank, step, wait, transmit, len(mine), 0))
    assert rows(a100, "SELECT * FROM collective_waits ORDER BY rank, step") == expected_waits
    # Kernel 20: 0, 100, 103, 106 µs longer: r = 100/106 > 0.920, rank 0 (the shortest)
    # votes. Kernel 35: 50, 0, 60, 300: r = 50/300. Kernel 9: 0, 500, 500, 500: 2 distinct.
    votes = rows(a100, "SELECT step, rank FROM slow_ranks WHERE votes > 0")
    assert votes == [(stepped[20][0], 0)]
    assert rows(a100, "SELECT sum(votes), count(*) FROM slow_ranks") == [(1, 16)]
    # Ends differ by the shift but where a kernel was stretched: the median is the shift.
    offsets = rows(a100, "SELECT rank, offset_ns, collectives, spread_ns FROM rank_clock_offsets")
    spreads = {
        r: max(e[r] - e[0] for e in stretch.values()) - min(e[r] - e[0] for e in stretch.values())
        for r in range(4)
    }
    assert sorted(offsets) == [(r, SHIFT_US[r] * 1000, 60, spreads[r]) for r in range(4)]
    assert spreads == {0: 0, 1: 550_000, 2: 500_000, 3: 500_000}


def nccl_kernels_of_rank0() -> list[int]:
    """The NCCL kernels of the A100 trace, as the test helper numbers them."""
    trace = json.loads(gzip.decompress(shared_fixture(A100).read_bytes()))
    return nccl_kernels(trace["traceEvents"])


RING = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
TREE = "ncclDevKernel_AllReduce_Sum_f32_TREE_LL(ncclDevComm*, unsigned long, ncclWork*)"


def test_kineto_collectives_pair_by_process_group_and_seq(store: Store, tmp_path: Path) -> None:
    # The two ranks chose different algorithms (kernel names) and ran group "1"'s Seq 5
    # before group "0"'s Seq 3 on rank 1 only: (process group, Seq) still pairs them.
    def pg(group: str, seq: int) -> dict:
        return {"Process Group Name": group, "Seq": seq}

    rank0 = [(RING, 100, 50, pg("0", 3)), (RING, 300, 40, pg("1", 5))]
    rank1 = [(TREE, 280, 20, pg("1", 5)), (TREE, 120, 35, pg("0", 3))]
    paths = [
        nccl_trace(tmp_path / "r0.json", rank=0, kernels=rank0),
        nccl_trace(tmp_path / "r1.json", rank=1, kernels=rank1),
    ]
    ingest_job(store, paths, job="pg")
    assert rows(
        store,
        "SELECT group_name, instance, rank, step, start_ns, end_ns, keyed_by, complete "
        "FROM collective_instances ORDER BY ALL",
    ) == [
        ("0", "seq 3", 0, 7, 100_000, 150_000, "seq", True),
        ("0", "seq 3", 1, 7, 120_000, 155_000, "seq", True),
        ("1", "seq 5", 0, 7, 300_000, 340_000, "seq", True),
        ("1", "seq 5", 1, 7, 280_000, 300_000, "seq", True),
    ]
    assert rows(store, "SELECT * FROM collective_waits ORDER BY rank") == [
        ("pg", 0, 7, 15_000 + 20_000, 35_000 + 20_000, 2, 0),
        ("pg", 1, 7, 0, 35_000 + 20_000, 2, 0),
    ]
    # Ends differ by +5 µs (seq 3) and -40 µs (seq 5): median -17.5 µs.
    assert rows(store, "SELECT * FROM rank_clock_offsets WHERE rank = 1") == [
        ("pg", 1, 0, -17_500, 2, 45_000)
    ]


DB_LEVELS = {  # README: wait r0, r1 and transmit (ns), from COMMUNICATION_OP
    0: (7_920, 4_121_202, 89_872_656),
    1: (3_522_991, 5_081, 98_585_109),
    2: (8_002, 6_258_006, 94_099_519),
}
"""The ascend-cluster README's derived cluster_time_summary values of the DB captures."""
RECIPES = ("cluster_time_summary", "slow_rank")
"""msprof-analyze's recipes the DB captures are checked against."""
_RUN_RECIPES = """
import sys
from msprof_analyze.cli.entrance import msprof_analyze_cli
for folder in sys.argv[2:]:
    for recipe in sys.argv[1].split(","):
        msprof_analyze_cli(["cluster", "-m", recipe, "-d", folder], standalone_mode=False)
"""
"""One process running every recipe on every folder: msprof-analyze imported once."""


DIXON_STRETCH_NS = {
    1: [0, 300_000, 310_000, 320_000, 330_000],  # r = 298919 / 330000 > 0.823: rank 0 votes
    3: [40_000, 0, 10_000, 20_000, 400_000],  # r = 10299 / 400000: no outlier
}
"""The 5-rank DB job: per op index k (hcom_allReduce__210_k_1), how much later each rank
0..4 ends it than the capture's rank r % 2 did."""


def writable_copy(source: Path, target: Path) -> Path:
    """``source`` copied to ``target`` with every folder and file writable (the fixtures
    are read-only, and msprof-analyze writes into its input)."""
    shutil.copytree(source, target, copy_function=shutil.copyfile)
    for folder in [target, *(p for p in target.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)
    return target


def five_db_ranks(level: Path, target: Path) -> Path:
    """A 5-rank DB job from a 2-rank one: rank r is a copy of rank r % 2 renamed as rank r
    (profiler_info_r.json and its rank_id, ascend_pytorch_profiler_r.db and its
    RANK_DEVICE_MAP), each op of DIXON_STRETCH_NS ending that much later."""
    for rank in range(5):
        folder = writable_copy(
            level / f"rank{rank % 2}_ascend_pt", target / f"rank{rank}_ascend_pt"
        )
        info = folder / f"profiler_info_{rank % 2}.json"
        text = json.loads(info.read_text())
        info.unlink()
        (folder / f"profiler_info_{rank}.json").write_text(json.dumps({**text, "rank_id": rank}))
        output = folder / "ASCEND_PROFILER_OUTPUT"
        db = (output / f"ascend_pytorch_profiler_{rank % 2}.db").rename(
            output / f"ascend_pytorch_profiler_{rank}.db"
        )
        with closing(sqlite3.connect(db)) as con, con:
            con.execute("UPDATE RANK_DEVICE_MAP SET rankId = ?", [rank])
            for k, later in DIXON_STRETCH_NS.items():
                con.execute(
                    "UPDATE COMMUNICATION_OP SET endNs = endNs + ? WHERE opName = "
                    "(SELECT id FROM STRING_IDS WHERE value = ?)",
                    [later[rank], f"hcom_allReduce__210_{k}_1"],
                )
    return target


@pytest.fixture(scope="session")
def msprof_analyze_db(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """msprof-analyze's own cluster_time_summary and slow_rank, run once on copies (it
    writes into its input) of each DB level ("level0" ...) and of a 5-rank job made from
    Level 1 ("five", five_db_ranks): per job, its folder and the rows of its
    ClusterTimeSummary and SlowRank tables (none where it wrote none)."""
    base = shared_fixture("ascend-cluster/msinsight_imagenet_2rank_dp_db")
    copies = tmp_path_factory.mktemp("msprof_analyze")
    folders = {
        f"level{level}": writable_copy(base / f"level{level}", copies / f"level{level}")
        for level in DB_LEVELS
    }
    folders["five"] = five_db_ranks(base / "level1", copies / "five")
    subprocess.run(
        [sys.executable, "-c", _RUN_RECIPES, ",".join(RECIPES), *map(str, folders.values())],
        check=True,
        capture_output=True,
        timeout=300,
    )
    found = {}
    for name, folder in folders.items():
        output = folder / "cluster_analysis_output/cluster_analysis.db"
        with closing(sqlite3.connect(output)) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
            found[name] = {
                table: db.execute(f"SELECT * FROM {table}").fetchall() if table in tables else []
                for table in ("ClusterTimeSummary", "SlowRank")
            }
        found[name]["folder"] = folder
    return found


@pytest.mark.parametrize("level", sorted(DB_LEVELS))
def test_db_captures_wait_as_msprof_analyze_says(
    store: Store, level: int, msprof_analyze_db: dict[str, dict[str, Any]]
) -> None:
    """The 2-rank ImageNet DB captures (COMMUNICATION_OP's exact times): the README's
    values, and msprof-analyze's ClusterTimeSummary rounded to the ns; no slow rank."""
    base = shared_fixture("ascend-cluster/msinsight_imagenet_2rank_dp_db")
    ingest_job(store, [base / f"level{level}"], job="db")
    wait0, wait1, transmit = DB_LEVELS[level]
    ours = rows(store, "SELECT rank, step, wait_ns, transmit_ns FROM collective_waits ORDER BY 1")
    assert ours == [(0, 50, wait0, transmit), (1, 50, wait1, transmit)]
    summary = msprof_analyze_db[f"level{level}"]["ClusterTimeSummary"]
    # rank, step, ..., communicationWaitStageTime, communicationTransmitStageTime (µs)
    theirs = [(r[0], r[1], round(r[8] * 1000), round(r[9] * 1000)) for r in summary]
    # Level 0 has no analysis.db CommAnalyzerTime, from which msprof-analyze 26.2.0 maps
    # groups to ranks: it finds no group and writes no ClusterTimeSummary at all.
    assert theirs == ([] if level == 0 else ours)
    assert msprof_analyze_db[f"level{level}"]["SlowRank"] == []
    assert rows(store, "SELECT sum(votes) FROM slow_ranks") == [(0,)]
    # Every op of a level ends 8-20 µs later on rank 1 (the README's clock skew).
    offset, spread = rows(
        store, "SELECT offset_ns, spread_ns FROM rank_clock_offsets WHERE rank = 1"
    )[0]
    assert (offset, spread) == {0: (17_942, 7_801), 1: (14_515, 5_861), 2: (15_860, 8_661)}[level]


@pytest.mark.parametrize("level", [1, 2])
def test_traced_ranks_wait_as_their_msprof_outputs_say(store: Store, level: int) -> None:
    """The 2025 ImageNet traces (hccl_op_times) and msprof's communication.json of the
    same captures (their rank folders, loaded alone as another job) give the same waits."""
    text = shared_fixture(f"ascend-cluster/msinsight_imagenet_2rank_dp_text/level{level}")
    for rank in (0, 1):
        trace = shared_fixture(
            f"ascend/torchnpu_imagenet_2025_L{level}_rank{rank}_trace_view.json.gz"
        )
        context = read_rank_folder(text / f"rank{rank}_ascend_pt").context
        ingest_trace(store, trace, rank=rank, job="traced", context=context)
    ingest_job(store, [text], job="text")
    bases = rows(
        store, "SELECT job_id, list(DISTINCT basis) FROM communication_ops GROUP BY 1 ORDER BY 1"
    )
    assert bases == [("text", ["msprof"]), ("traced", ["trace"])]
    waits = rows(
        store,
        "SELECT * EXCLUDE (job_id) FROM collective_waits WHERE job_id = 'traced' ORDER BY ALL",
    )
    assert waits == rows(
        store, "SELECT * EXCLUDE (job_id) FROM collective_waits WHERE job_id = 'text' ORDER BY ALL"
    )
    assert len(waits) == 2
    assert waits[0][:2] == (0, 50)


def test_five_db_ranks_vote_and_wait_as_msprof_analyze_says(
    store: Store, msprof_analyze_db: dict[str, dict[str, Any]]
) -> None:
    """Five ranks made of the Level 1 DB capture, two ops ending later on some ranks
    (DIXON_STRETCH_NS): msprof-analyze's slow_rank votes and cluster_time_summary."""
    five = msprof_analyze_db["five"]
    ingest_job(store, [five["folder"]], job="five")
    # SlowRank: rankId, slowAffectCount.
    assert five["SlowRank"] == [(0, 1)]
    assert rows(store, "SELECT rank, votes FROM slow_ranks WHERE votes > 0") == [(0, 1)]
    assert rows(store, "SELECT count(*) FROM slow_ranks") == [(5,)]
    summary = five["ClusterTimeSummary"]
    theirs = [(r[0], r[1], round(r[8] * 1000), round(r[9] * 1000)) for r in summary]
    ours = rows(store, "SELECT rank, step, wait_ns, transmit_ns FROM collective_waits ORDER BY 1")
    assert theirs == ours
    assert len(ours) == 5


def test_group_hash_is_msprof_analyzes_double_hash(store: Store) -> None:
    from msprof_analyze.cluster_analyse.common_func import utils

    names = ["group_name_0", "90.91.105.46%enp189s0f0_60000_0_1736407029972691", "dp组ü", ""]
    ours = rows(store, "SELECT list_transform($1, lambda n: hccl_group_hash(n))", names)
    assert ours == [([str(utils.double_hash(name)) for name in names],)]


def test_instances_are_built_again_when_ranks_are_loaded(store: Store) -> None:
    """collective_instances is a table of the store's committed traces: a rank loaded
    after a query shows in the next one."""
    outputs_rank(store, "late", 0, [op("A", "g", 0, 0.010)])
    assert rows(store, "SELECT rank, parts, complete FROM collective_instances") == [(0, 1, True)]
    outputs_rank(store, "late", 1, [op("A", "g", 1, 0.004)])
    assert rows(store, "SELECT rank, wait_ns, transmit_ns FROM collective_waits ORDER BY 1") == [
        (0, 6000, 4000),
        (1, 0, 4000),
    ]
