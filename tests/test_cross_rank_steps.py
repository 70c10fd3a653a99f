"""The steps of a job's ranks side by side (``cross_rank.steps``): ``rank_steps``,
``rank_step_breakdown`` (msprof-analyze's cluster_step_trace_time), ``slow_rank_advice`` (its
advisor's slow-rank rule), ``slow_rank_causes`` and ``rank_gaps``.

Checked against msprof-analyze itself: its cluster analysis run here on a copy of the Qwen3
4-rank capture, its advisor run here on its own 8-rank unit-test input, the cluster csv of
msinsight's 16-rank test data, and each ImageNet rank's step_trace_time.csv; then small jobs
built here with round numbers for each rule.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from shared_fixtures import shared_fixture

from multicore_profiler.ingest.ascend_output import STEP_COLUMNS
from multicore_profiler.ingest.jobs import ingest_job
from multicore_profiler.ingest.outer_trace import RankContext, ingest_outputs, ingest_trace
from multicore_profiler.storage.store import Store

QWEN3 = "ascend-cluster/msinsight_st_qwen3_4rank_pp2_dp2"
SERVER_16 = "ascend-cluster/msinsight_server_ut_16rank_pp2/cluster_analysis_output"
ADVISOR_8 = "ascend-cluster/msprof_analyze_advisor_8rank"

NS_COLUMNS = {us[: -len("_us")] + "_ns": column for column, us in STEP_COLUMNS.items()}
"""rank_step_breakdown's time columns and the csv columns msprof writes them in (µs)."""
PARALLEL_COLUMNS = {"dp_index": "DP Index", "pp_index": "PP Index", "tp_index": "TP Index"}
"""rank_step_breakdown's parallel indices and msprof's csv columns ("NA" for none)."""


def rows(store: Store, query: str, params: Any = None) -> list[dict[str, Any]]:
    return store.sql(query, params).to_pylist()


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8-sig") as handle:
        return list(csv.DictReader(handle))


def ns(text: str) -> int | None:
    """A csv cell of µs in ns, as rank_steps converts them (empty: None)."""
    return round(float(text) * 1000) if text.strip() else None


def msprof_index(text: str) -> list[int]:
    """msprof's Index cell ("0", "(0, 1)") as rank_step_breakdown's index."""
    return [int(part) for part in text.strip("()").split(",") if part.strip()]


def msprof_row(line: Mapping[str, str]) -> dict[str, Any]:
    """A cluster_step_trace_time.csv row in rank_step_breakdown's columns."""
    row: dict[str, Any] = {
        "step": int(line["Step"]) if line["Step"] else None,
        "type": line["Type"],
        "index": msprof_index(line["Index"]),
    }
    row.update({name: ns(line[column]) if column in line else None
                for name, column in NS_COLUMNS.items()})  # fmt: skip
    for name, column in PARALLEL_COLUMNS.items():
        value = line.get(column, "NA")
        row[name] = None if value == "NA" else int(value)
    return row


def step_rows(lines: list[Mapping[str, str]]) -> list[dict[str, Any]]:
    """Cluster csv rows as a rank's profiler_outputs step_trace_time rows (µs)."""
    return [
        {"step": line["Step"] or None}
        | {
            name: float(line[column]) if column in line else None
            for column, name in STEP_COLUMNS.items()
        }
        for line in lines
    ]


def breakdown(store: Store, job: str) -> list[dict[str, Any]]:
    return rows(
        store,
        "SELECT * EXCLUDE (job_id) FROM rank_step_breakdown WHERE job_id = ? ORDER BY ALL",
        [job],
    )


# msprof-analyze's cluster analysis of the Qwen3 capture ---------------------------------


@pytest.fixture(scope="module")
def qwen3_cluster_csv(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
    """msprof-analyze's cluster_step_trace_time.csv of the Qwen3 capture, computed here on a
    copy without analysis.db (with one, it runs in DB mode and writes no stage rows)."""
    copy = tmp_path_factory.mktemp("qwen3") / "job"
    shutil.copytree(shared_fixture(QWEN3), copy, ignore=shutil.ignore_patterns("analysis.db"))
    entry = "from msprof_analyze.cli.entrance import msprof_analyze_cli; msprof_analyze_cli()"
    subprocess.run(
        [sys.executable, "-c", entry, "cluster", "-m", "all", "-d", str(copy)],
        check=True, capture_output=True,
    )  # fmt: skip
    return read_csv(copy / "cluster_analysis_output" / "cluster_step_trace_time.csv")


@pytest.fixture
def qwen3(store: Store) -> Store:
    ingest_job(store, [shared_fixture(QWEN3)], job="qwen3")
    return store


def test_rank_step_breakdown_is_msprof_analyzes_cluster_step_trace_time(
    qwen3: Store, qwen3_cluster_csv: list[dict[str, str]]
) -> None:
    expected = sorted(
        (msprof_row(line) for line in qwen3_cluster_csv),
        key=lambda r: (r["step"], r["type"], r["index"]),
    )
    assert breakdown(qwen3, "qwen3") == expected
    # The numbers themselves: stage 0 (ranks 0, 1) waits on stage 1's longer computing.
    stages = {tuple(r["index"]): r for r in expected if r["type"] == "stage"}
    assert stages.keys() == {(0, 1), (2, 3)}
    assert stages[(0, 1)]["communication_ns"] == 441_708_380  # 441708.38 µs, rank 1's
    assert stages[(0, 1)]["computing_ns"] == 231_290_100  # rank 0's
    assert stages[(2, 3)]["computing_ns"] == 401_131_700  # 401131.70 µs, rank 3's
    assert stages[(2, 3)]["free_ns"] == 147_520_200
    assert stages[(2, 3)]["preparing_ns"] == 278_750
    indices = [(r["index"], r["dp_index"], r["pp_index"], r["tp_index"])
               for r in expected if r["type"] == "rank"]  # fmt: skip
    assert indices == [([0], 0, 0, 0), ([1], 1, 0, 0), ([2], 0, 1, 0), ([3], 1, 1, 0)]


def test_rank_steps_keep_each_ranks_device_apart_from_its_rank(qwen3: Store) -> None:
    got = rows(qwen3, "SELECT rank, step, device, basis FROM rank_steps ORDER BY rank")
    assert got == [
        {"rank": 0, "step": 13, "device": 0, "basis": "msprof"},
        {"rank": 1, "step": 13, "device": 1, "basis": "msprof"},
        {"rank": 2, "step": 13, "device": 4, "basis": "msprof"},
        {"rank": 3, "step": 13, "device": 5, "basis": "msprof"},
    ]
    ranks = rows(qwen3, "SELECT index FROM rank_step_breakdown WHERE type = 'rank' ORDER BY ALL")
    assert [r["index"] for r in ranks] == [[0], [1], [2], [3]]
    assert rows(qwen3, "SELECT * FROM rank_gaps") == []


def test_slow_rank_causes_name_the_slowest_rank_against_the_median(qwen3: Store) -> None:
    # Step time is Stage + Preparing: rank 3's 810150.25 + 278.75 µs is the longest.
    (got,) = rows(qwen3, "SELECT * EXCLUDE (source_id) FROM slow_rank_causes")
    assert got == {
        "job_id": "qwen3", "step": 13, "ranks": 4, "rank": 3, "step_ns": 810_429_000,
        # medians of the four ranks: the mean of the two middle values
        "median_step_ns": (809_992_250 + 810_228_500) / 2,
        "recoverable_ns": 810_429_000 - (809_992_250 + 810_228_500) / 2,
        "computing_excess_ns": 401_131_700 - (231_290_100 + 400_448_260) / 2,
        "free_excess_ns": 147_520_200 - (136_819_560 + 147_520_200) / 2,
        "preparing_excess_ns": 278_750 - (205_000 + 206_250) / 2,
        "communication_not_overlapped_excess_ns": 261_498_440 - (277_649_660 + 420_174_260) / 2,
    }  # fmt: skip


# msprof-analyze's 16-rank cluster csv: stage rows are the column-wise max of their ranks ---


def test_stage_rows_are_the_columnwise_max_of_the_16_rank_cluster_csv(store: Store) -> None:
    # The csv's ranks loaded as msprof tables alone, with the Megatron layout TP1 PP2 DP8 the
    # two stages (0..7) and (8..15) come from: pipeline groups [r, r + 8], data-parallel
    # groups [0..7] and [8..15]. (Its communication_group.json holds those groups, but names
    # none of them: the parallel_group_info written here names them.)
    folder = shared_fixture(SERVER_16)
    lines = read_csv(folder / "cluster_step_trace_time.csv")
    groups = {f"pp{r}": {"group_name": "pp", "global_ranks": [r, r + 8]} for r in range(8)}
    groups |= {f"dp{s}": {"group_name": "dp", "global_ranks": list(range(8 * s, 8 * s + 8))}
               for s in range(2)}  # fmt: skip
    args = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 2,
            "data_parallel_size": 8, "world_size": 16}  # fmt: skip
    parallel = {"distributed_args": args, "parallel_group_info": groups}
    for line in lines:
        if line["Type"] == "rank":
            context = RankContext(parallel=parallel, outputs={"step_trace_time": step_rows([line])})
            rank = int(line["Index"])
            ingest_outputs(store, [(folder, rank, context)], job="server16")
    expected = [msprof_row(line) | {"dp_index": None, "pp_index": None, "tp_index": None}
                for line in lines]  # fmt: skip
    for row in expected:
        if row["type"] == "rank":
            rank = row["index"][0]
            row.update(dp_index=rank % 8, pp_index=rank // 8, tp_index=0)
    assert breakdown(store, "server16") == sorted(
        expected, key=lambda r: (r["step"], r["type"], r["index"])
    )
    stage_1 = next(r for r in expected if r["index"] == list(range(8, 16)))
    assert (stage_1["bubble_ns"], stage_1["preparing_ns"]) == (195_498_280, None)


# msprof-analyze advisor's slow-rank rule on its own unit-test input ----------------------


def test_slow_rank_advice_is_the_advisors_on_its_8_rank_input(store: Store, tmp_path: Path) -> None:
    folder = shared_fixture(ADVISOR_8)
    lines = [line for line in read_csv(folder / "cluster_step_trace_time.csv")
             if line["Type"] == "rank"]  # fmt: skip
    for line in lines:
        context = RankContext(outputs={"step_trace_time": step_rows([line])})
        ingest_outputs(store, [(folder, int(line["Index"]), context)], job="advisor")
    got = {r["dimension"]: r for r in rows(store, "SELECT * FROM slow_rank_advice")}

    # The advisor itself, on a copy laid out as it reads it.
    from msprof_analyze.advisor.advisor_backend.cluster_advice.slow_rank_advice import (
        SlowRankAdvice,
    )

    shutil.copytree(folder, tmp_path / "cluster_analysis_output")
    advice = SlowRankAdvice(str(tmp_path)).run()
    message = "".join(
        f"{name} has some issues in the cluster, because the max difference of {name} time "
        f"has reached {round(got[name]['spread_ns'] / 1e6, 3)}ms. \n"
        for name in ("Computing", "Communication", "Free") if got[name]["flagged"]
    )  # fmt: skip
    assert (
        message
        == advice["bottleneck"]
        == (
            "Communication has some issues in the cluster, because the max difference of "
            "Communication time has reached 622.989ms. \nFree has some issues in the cluster, "
            "because the max difference of Free time has reached 595.773ms. \n"
        )
    )
    for rank, (computing, communication, free, _) in advice["data"].items():
        (mine,) = rows(
            store,
            "SELECT computing_ns, communication_not_overlapped_ns, free_ns FROM rank_steps "
            "WHERE job_id = 'advisor' AND rank = ?",
            [rank],
        )
        assert list(mine.values()) == [round(x * 1000) for x in (computing, communication, free)]
    assert {name: (r["max_ranks"], r["min_ranks"], r["spread_ns"], r["flagged"])
            for name, r in got.items()} == {
        "Computing": ([4], [3], 81_662_200 - 80_077_270, False),
        "Communication": ([5], [1], 756_374_860 - 133_385_977, True),
        "Free": ([1], [5], 1_488_610_059 - 892_836_900, True),
    }  # fmt: skip
    assert got["Free"]["step"] is None  # the csv has no Step
    assert got["Free"]["ranks"] == 8
    assert got["Free"]["mean_step_ns"] == 13_709_889_022 / 8


# The ImageNet 2-rank traces: rank rows from the traces (basis 'trace') -------------------


def test_rank_rows_from_traces_are_each_ranks_step_trace_time(store: Store) -> None:
    for rank in (0, 1):
        trace = f"ascend/torchnpu_imagenet_2025_L1_rank{rank}_trace_view.json.gz"
        ingest_trace(store, shared_fixture(trace), rank=rank, job="imagenet")
    got = breakdown(store, "imagenet")
    assert [(r["type"], r["index"], r["step"]) for r in got] == [
        ("rank", [0], 50), ("rank", [1], 50),
    ]  # fmt: skip
    for row in got:
        path = f"ascend/torchnpu_imagenet_2025_L1_rank{row['index'][0]}_step_trace_time.csv"
        (line,) = read_csv(shared_fixture(path))
        for name, column in NS_COLUMNS.items():
            assert abs(row[name] - ns(line[column])) <= 1000, (row["index"], column)
    assert [
        [r[name] for name in NS_COLUMNS] + [r["dp_index"], r["pp_index"], r["tp_index"]]
        for r in got
    ] == [
        [8_873_740, 101_963_205, 4_028_673, 105_991_878, 25_744_064, 136_581_009, 0,
         101_963_205, 17_902_502, None, None, None],
        [8_878_280, 96_359_053, 4_016_233, 100_375_286, 26_675_283, 131_912_616, 0,
         96_359_053, 20_433_190, None, None, None],
    ]  # fmt: skip
    bases = rows(store, "SELECT DISTINCT basis, device FROM rank_steps")
    assert bases == [{"basis": "trace", "device": None}]


# Hand-built jobs: each rule with round numbers ----------------------------------------

US = 1000
"""ns per µs."""


def rank_outputs(
    store: Store,
    job: str,
    rank: int,
    steps: Mapping[int, tuple[int, int, int, int]],
    parallel: Mapping[str, Any] | None = None,
) -> None:
    """A rank of msprof's tables alone: per step (Computing, Communication(Not Overlapped),
    Free, Preparing) in µs, nothing overlapped, no bubble; Stage their sum but Preparing."""
    lines = [
        {"step": str(step), "computing_us": c, "communication_not_overlapped_us": n,
         "overlapped_us": 0.0, "communication_us": n, "free_us": f, "stage_us": c + n + f,
         "bubble_us": 0.0, "communication_not_overlapped_exclude_receive_us": n,
         "preparing_us": p}
        for step, (c, n, f, p) in steps.items()
    ]  # fmt: skip
    context = RankContext(parallel=parallel, outputs={"step_trace_time": lines})
    ingest_outputs(store, [(f"/{job}/rank{rank}", rank, context)], job=job)


def layout(args: Mapping[str, Any], groups: Mapping[str, list[int]]) -> dict[str, Any]:
    """A parallel layout: distributed_args and groups named by their pg name (key: name
    and a counter)."""
    info = {
        f"group_{i}": {"group_name": name.rstrip("0123456789"), "global_ranks": ranks}
        for i, (name, ranks) in enumerate(groups.items())
    }
    return {"distributed_args": dict(args), "parallel_group_info": info}


TWO_STAGES = layout(
    {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 2,
     "data_parallel_size": 1, "world_size": 2},
    {"default": [0, 1], "pp": [0, 1], "tp0": [0], "tp1": [1]},
)  # fmt: skip
"""Two ranks, one per pipeline stage."""


def test_two_ranks_each_its_own_stage(store: Store) -> None:
    rank_outputs(store, "two", 0, {1: (100, 300, 50, 10)}, TWO_STAGES)
    rank_outputs(store, "two", 1, {1: (300, 100, 40, 20)}, TWO_STAGES)
    got = breakdown(store, "two")
    assert [(r["type"], r["index"], r["computing_ns"], r["free_ns"], r["preparing_ns"],
             r["dp_index"], r["pp_index"], r["tp_index"]) for r in got] == [
        ("rank", [0], 100 * US, 50 * US, 10 * US, 0, 0, 0),
        ("rank", [1], 300 * US, 40 * US, 20 * US, 0, 1, 0),
        ("stage", [0], 100 * US, 50 * US, 10 * US, None, None, None),
        ("stage", [1], 300 * US, 40 * US, 20 * US, None, None, None),
    ]  # fmt: skip
    advice = {r["dimension"]: r for r in rows(store, "SELECT * FROM slow_rank_advice")}
    # mean step (100 + 300 + 50 + 300 + 100 + 40) / 2 = 445 µs; 5 % of it is 22.25 µs.
    assert {name: (r["spread_ns"], r["mean_step_ns"], r["flagged"])
            for name, r in advice.items()} == {
        "Computing": (200 * US, 445 * US, True),
        "Communication": (200 * US, 445 * US, True),
        "Free": (10 * US, 445 * US, False),
    }  # fmt: skip
    assert (advice["Computing"]["max_ranks"], advice["Computing"]["min_ranks"]) == ([1], [0])
    # Both ranks' steps take 460 µs (Stage + Preparing): the tie goes to the lower rank.
    (causes,) = rows(store, "SELECT * FROM slow_rank_causes")
    assert (causes["rank"], causes["step_ns"], causes["recoverable_ns"]) == (0, 460 * US, 0)
    assert (
        causes["computing_excess_ns"], causes["communication_not_overlapped_excess_ns"],
        causes["free_excess_ns"], causes["preparing_excess_ns"],
    ) == (-100 * US, 100 * US, 5 * US, -5 * US)  # fmt: skip


FOUR_RANKS = layout(
    {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 2,
     "data_parallel_size": 2, "world_size": 4},
    {"default": [0, 1, 2, 3], "pp0": [0, 2], "pp1": [1, 3], "dp0": [0, 1], "dp1": [2, 3]},
)  # fmt: skip
"""Qwen3's layout: TP1 PP2 DP2, stages (0, 1) and (2, 3)."""


def test_a_stage_with_a_rank_absent_keeps_its_ranks_and_the_gap_names_it(store: Store) -> None:
    for rank in (0, 2, 3):
        rank_outputs(store, "three", rank, {5: (100 + rank, 200, 30, 1)}, FOUR_RANKS)
    stages = rows(
        store,
        "SELECT index, computing_ns FROM rank_step_breakdown WHERE type = 'stage' ORDER BY ALL",
    )
    assert stages == [
        {"index": [0, 1], "computing_ns": 100 * US},
        {"index": [2, 3], "computing_ns": 103 * US},
    ]
    indices = rows(store, "SELECT * FROM rank_parallel_indices ORDER BY rank")
    assert [(r["rank"], r["dp_index"], r["pp_index"], r["tp_index"]) for r in indices] == [
        (0, 0, 0, 0), (2, 0, 1, 0), (3, 1, 1, 0),
    ]  # fmt: skip
    assert rows(store, "SELECT * FROM rank_gaps") == [
        {
            "job_id": "three", "kind": "absent_rank", "rank": 1, "step": None,
            "source_id": None,
            "detail": "rank 1 of job three is not in the store, though its parallel_group_info "
            "groups default, dp, pp list it and its world_size 4 counts it",
        }
    ]  # fmt: skip


def test_ranks_in_no_stage_make_the_empty_stage_as_msprofs_unnamed_one(store: Store) -> None:
    # Rank 2 is in no group of the job's two stages: msprof-analyze's stage "()" holds it. Its
    # three ranks are more than the layout's world of two: msprof writes no DP/PP/TP index.
    rank_outputs(store, "extra", 0, {1: (100, 300, 50, 10)}, TWO_STAGES)
    rank_outputs(store, "extra", 1, {1: (300, 100, 40, 20)}, TWO_STAGES)
    rank_outputs(store, "extra", 2, {1: (200, 200, 60, 30)})
    got = breakdown(store, "extra")
    assert [(r["type"], r["index"], r["computing_ns"], r["dp_index"]) for r in got] == [
        ("rank", [0], 100 * US, None), ("rank", [1], 300 * US, None),
        ("rank", [2], 200 * US, None), ("stage", [], 200 * US, None),
        ("stage", [0], 100 * US, None), ("stage", [1], 300 * US, None),
    ]  # fmt: skip
    # Every rank the layout lists (0 and 1) is in the store: no gap.
    assert rows(store, "SELECT * FROM rank_gaps") == []


def test_mismatched_steps_are_gaps_and_compared_where_present(store: Store) -> None:
    rank_outputs(store, "uneven", 0, {1: (10, 20, 30, 1), 2: (11, 20, 30, 1)})
    rank_outputs(store, "uneven", 1, {2: (12, 20, 30, 1), 3: (13, 20, 30, 1)})
    gaps = rows(store, "SELECT kind, rank, step, detail FROM rank_gaps ORDER BY rank")
    source = {r["rank"]: r["source_id"] for r in rows(store, "SELECT * FROM trace_sources")}
    assert gaps == [
        {"kind": "missing_step", "rank": 0, "step": 3,
         "detail": f"rank 0 (source {source[0]}) has no step 3, "
         "which ranks [1] of job uneven have"},
        {"kind": "missing_step", "rank": 1, "step": 1,
         "detail": f"rank 1 (source {source[1]}) has no step 1, "
         "which ranks [0] of job uneven have"},
    ]  # fmt: skip
    # No pipeline groups: rank rows only, each step with the ranks it has.
    assert [(r["step"], r["type"], r["index"]) for r in breakdown(store, "uneven")] == [
        (1, "rank", [0]), (2, "rank", [0]), (2, "rank", [1]), (3, "rank", [1]),
    ]  # fmt: skip
    advice = rows(store, "SELECT step, ranks FROM slow_rank_advice WHERE dimension = 'Free'")
    assert sorted(advice, key=lambda r: r["step"]) == [
        {"step": 1, "ranks": 1}, {"step": 2, "ranks": 2}, {"step": 3, "ranks": 1},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        {"tensor_model_parallel_size": 2, "data_parallel_size": 2, "world_size": 4},
        {"pipeline_model_parallel_size": 2, "data_parallel_size": 2, "world_size": 4},
        {"tensor_model_parallel_size": 0, "data_parallel_size": 4, "world_size": 4},
        {"tensor_model_parallel_size": 4, "world_size": 4, "rank": 3, "sequence_parallel": True},
        {"data_parallel_size": 4, "context_parallel_size": 2, "world_size": 4},
        {"data_parallel_size": 2, "expert_model_parallel_size": 4, "world_size": 2},
        {"data_parallel_size": 4, "world_size": 8},
        {"data_parallel_size": 2, "world_size": 2},
        {"data_parallel_size": "4", "world_size": 4},
        {"data_parallel_size": None, "world_size": 4},
    ],
)
def test_parallel_indices_are_msprofs_parallel_strategy(store: Store, args: dict[str, Any]) -> None:
    from msprof_analyze.cluster_analyse.cluster_utils.parallel_strategy_calculator import (
        ParallelStrategyCalculator,
    )

    try:
        expected = ParallelStrategyCalculator(**args).run()
    except Exception:  # msprof-analyze logs it and writes no index
        expected = None
    for rank in range(4):
        rank_outputs(store, "job", rank, {0: (rank + 1, 2, 3, 4)}, {"distributed_args": args})
    got = rows(store, "SELECT * FROM rank_parallel_indices ORDER BY rank")
    # msprof-analyze writes none when the layout has fewer ranks than the job (and fails on a
    # rank past it).
    usable = expected is not None and len(expected) >= 4
    assert [(r["dp_index"], r["pp_index"], r["tp_index"]) for r in got] == [
        tuple(expected[rank]) if usable and expected[rank] else (None, None, None)
        for rank in range(4)
    ]
