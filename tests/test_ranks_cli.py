"""``mcprof ranks`` and ``cross_rank``: the cross-rank tables of a job as a table, Markdown,
CSV and JSON, the warnings naming what a job lacks, and the refusals. The job is the 4-rank
Qwen3 capture (TP1 PP2 DP2); the expected values are msprof-analyze's (see
test_cross_rank_steps and test_cross_rank_communication, which check the views)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared_fixtures import shared_fixture

from multicore_profiler import cli
from multicore_profiler.analysis.cross_rank import cross_rank
from multicore_profiler.errors import AnalysisError
from multicore_profiler.ingest.jobs import ingest_job
from multicore_profiler.storage.store import Store

QWEN3 = "ascend-cluster/msinsight_st_qwen3_4rank_pp2_dp2"


@pytest.fixture
def qwen3(store: Store) -> Store:
    ingest_job(store, [shared_fixture(QWEN3)], job="qwen3")
    return store


def test_the_json_document_holds_every_table(qwen3: Store, capsys, tmp_path: Path) -> None:
    out = tmp_path / "ranks.json"
    assert cli.main(["ranks", "--store", qwen3.uri, "--format", "json", "-o", str(out)]) == 0
    assert capsys.readouterr().err == ""
    document = json.loads(out.read_text())
    assert (document["jobs"], document["runs"], document["warnings"]) == (["qwen3"], [], [])
    tables = document["tables"]
    (straggler,) = tables["step_stragglers"]
    assert (straggler["last_arrival_rank"], straggler["most_waiting_rank"]) == (3, 1)
    (slowest,) = tables["slow_rank_causes"]
    # Rank 3's step: stage 810 150 250 + preparing 278 750 ns; the median of the four
    # ranks' 810 228 500, 809 636 750, 809 992 250 and 810 429 000 is 810 110 375.
    assert (slowest["rank"], slowest["step_ns"], slowest["recoverable_ns"]) == (
        3, 810_429_000, 318_625,
    )  # fmt: skip
    assert [(r["type"], r["index"]) for r in tables["rank_step_breakdown"]] == [
        ("rank", [0]), ("rank", [1]), ("rank", [2]), ("rank", [3]),
        ("stage", [0, 1]), ("stage", [2, 3]),
    ]  # fmt: skip
    assert [r["dimension"] for r in tables["slow_rank_advice"]] == ["Communication", "Computing"]
    assert [(r["rank"], r["wait_ns"]) for r in tables["collective_waits"]] == [
        (0, 318_340_040), (1, 339_938_620), (2, 175_781_800), (3, 159_695_100),
    ]  # fmt: skip
    assert [r["votes"] for r in tables["slow_ranks"]] == [0, 0, 0, 0]
    assert [r["rank"] for r in tables["rank_clock_offsets"]] == [0, 1, 2, 3]
    assert "kernel_rank_steps" not in tables  # no MegaKernel run asked for


def test_the_table_and_markdown_show_the_tables_with_rows(qwen3: Store, capsys) -> None:
    assert cli.main(["ranks", "--store", qwen3.uri, "--step", "13"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "mcprof ranks: jobs qwen3; MegaKernel runs none"
    titles = [line for line in lines if line.endswith(":") and not line.startswith(" ")]
    assert titles == [
        "Who holds each step back: the last arrival at its collectives:",
        "Slowest rank of each step, and where its extra time went:",
        "Step time breakdown per rank and pipeline stage:",
        "Communication per rank and step: waiting for the last arrival:",
        "Slow-rank votes (Dixon test per collective):",
        "Advisor: dimensions whose spread across ranks exceeds 5% of a step:",
        "Clock offsets per rank (collective ends aligned; not applied):",
    ]
    stage = next(line for line in lines if "[2, 3]" in line).split()
    assert stage[:5] == ["qwen3", "13", "stage", "[2,", "3]"]
    assert stage[5] == "401131.700"  # stage (2, 3) Computing, us
    assert cli.main(["ranks", "--store", qwen3.uri, "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("**mcprof ranks: jobs qwen3; MegaKernel runs none**\n")
    assert "### Step time breakdown per rank and pipeline stage\n" in markdown
    # A step no rank has: only the job's clock offsets, which hold for every step.
    assert cli.main(["ranks", "--store", qwen3.uri, "--step", "12"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.endswith(":")] == [
        "Clock offsets per rank (collective ends aligned; not applied):"
    ]


def test_a_store_without_a_job_of_two_ranks_says_so(store: Store, capsys) -> None:
    ingest_job(store, [shared_fixture(f"{QWEN3}/rank_0_ascend_pt")], job="alone")
    assert cli.main(["ranks", "--store", store.uri]) == 0
    assert capsys.readouterr().out == (
        "mcprof ranks: jobs none; MegaKernel runs none\n\n"
        "(no cross-rank rows: a job needs two ranks or more)\n"
    )


def test_csv_holds_each_table_after_its_name(qwen3: Store, capsys) -> None:
    assert cli.main(["ranks", "--store", qwen3.uri, "--format", "csv"]) == 0
    out = capsys.readouterr().out
    names = [line[2:] for line in out.splitlines() if line.startswith("# ")]
    assert names == [
        "step_stragglers", "slow_rank_causes", "rank_step_breakdown", "collective_waits",
        "slow_ranks", "slow_rank_advice", "rank_clock_offsets",
    ]  # fmt: skip
    assert "\nqwen3,3,13,159695100,101803340,23,0\n" in out  # collective_waits of rank 3


def test_a_rank_missing_from_the_job_is_warned_of(store: Store, capsys) -> None:
    folder = shared_fixture(QWEN3)
    ingest_job(store, [folder / f"rank_{r}_ascend_pt" for r in (0, 1, 2)], job="partial")
    report = cross_rank(store)
    assert report.warnings == (
        "rank 3 of job partial is not in the store, though its parallel_group_info groups "
        "default_group, dp, dp_cp, embd, mp, pp list it and its world_size 4 counts it",
    )
    assert cli.main(["ranks", "--store", store.uri, "--format", "json"]) == 0
    assert capsys.readouterr().err == f"mcprof: warning: {report.warnings[0]}\n"


def test_an_unknown_job_and_a_table_written_to_a_file_are_refused(
    qwen3: Store, capsys, tmp_path: Path
) -> None:
    with pytest.raises(AnalysisError, match=r"no job 'nope' in .* \(its jobs: qwen3\)"):
        cross_rank(qwen3, jobs=["nope"])
    assert cli.main(["ranks", "--store", qwen3.uri, "--job", "nope"]) == 1
    assert "no job 'nope'" in capsys.readouterr().err
    out = str(tmp_path / "t.txt")
    assert cli.main(["ranks", "--store", qwen3.uri, "-o", out]) == 1
    assert "--format table prints to the terminal" in capsys.readouterr().err
