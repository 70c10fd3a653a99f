"""Comparisons at level ``critical``: each invocation's share of its makespan on the critical
path per stage. A slower GMM1 holds more of the path (regressed), identical code changes
nothing, a stage that joins the path is compared against the zeros of the base's
invocations, and the command line's formats and exit statuses.

The runs are the simulated MoE kernel's with its task graph (``tasks_table``); the
expected samples are worked out from the
``critical_path_summary`` view's rows, not from the comparison's SQL.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from simulated_runs import write_run

from multicore_profiler import cli, open_store
from multicore_profiler.analysis.compare import Comparison
from multicore_profiler.errors import SelectorError
from multicore_profiler.export.compare_text import comparison_markdown, comparison_table
from multicore_profiler.kernels.synthetic import GMM1, SWIGLU, SimulatedMoeKernel
from multicore_profiler.storage.store import Store

CONFIG = "simulated-moe"
KERNEL = "SimulatedMegaMoe"


def write_graphed_run(store: Store, kernel: SimulatedMoeKernel, *, seed: int, commit: str) -> str:
    """``write_run`` with the kernel's task graph."""
    return write_run(store, kernel, seed=seed, commit=commit, config_id=CONFIG)


@pytest.fixture(scope="module")
def graphed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """Base: two runs of the default kernel. Same: another run of it. Slow: GMM1 tasks take
    40 us instead of 25. Swiglu: SwiGLU tasks take 60 us instead of 4."""
    with open_store(tmp_path_factory.mktemp("critical") / "store") as store:
        write_graphed_run(store, SimulatedMoeKernel(), seed=1, commit="base0001")
        write_graphed_run(store, SimulatedMoeKernel(), seed=2, commit="base0001")
        write_graphed_run(store, SimulatedMoeKernel(), seed=3, commit="same0002")
        write_graphed_run(
            store, SimulatedMoeKernel(stage_us={GMM1: 40.0}), seed=4, commit="slow0003"
        )
        write_graphed_run(
            store, SimulatedMoeKernel(stage_us={SWIGLU: 60.0}), seed=5, commit="swiglu04"
        )
        yield store


def expected_shares(store: Store, commit: str, stage: str, kind: str | None = None) -> np.ndarray:
    """Each invocation's share of its makespan on the critical path held by ``stage`` (and
    ``kind``), sorted: its pieces' ns over the makespan, 0 where it has none."""
    rows = store.sql(
        """SELECT s.run_id, s.invocation_id, s.stage, s.kind, s.dur_ns, s.makespan_ns
           FROM critical_path_summary s JOIN runs r USING (run_id)
           WHERE r.commit LIKE $commit || '%'""",
        {"commit": commit},
    ).to_pylist()
    held: dict[tuple, int] = defaultdict(int)
    makespans = {}
    for row in rows:
        invocation = (row["run_id"], row["invocation_id"])
        makespans[invocation] = row["makespan_ns"]
        if row["stage"] == stage and kind in (None, row["kind"]):
            held[invocation] += row["dur_ns"]
    return np.sort([held[invocation] / span for invocation, span in makespans.items()])


def verdicts(comparison) -> dict[tuple, str]:
    by = comparison.by
    return {tuple(r[c] for c in by): r["verdict"] for r in comparison.rows.to_pylist()}


def test_a_slower_gmm1_holds_more_of_the_critical_path(graphed: Store) -> None:
    comparison = graphed.compare("commit:base", "commit:slow", level="critical")
    assert (comparison.by, comparison.metric, comparison.unit) == (
        ("kernel_name", "stage"),
        "share",
        "share",
    )
    # Shares add up to 1 per invocation: what GMM1 takes, GMM2 (the other stage of the
    # AIC workers' path) gives.
    assert {key: v for key, v in verdicts(comparison).items() if v != "unchanged"} == {
        (KERNEL, "GMM1"): "regressed",
        (KERNEL, "GMM2"): "improved",
    }
    assert comparison.regressed
    assert comparison.summary() == (
        "1 regressed, 1 improved, 2 unchanged "
        "(change of the median share above 5 points, Mann-Whitney p < 0.01)"
    )
    base = expected_shares(graphed, "base", "GMM1")
    head = expected_shares(graphed, "slow", "GMM1")
    assert (base.size, head.size) == (16, 8)  # one sample per invocation
    samples = comparison.samples[KERNEL, "GMM1"]
    assert np.array_equal(samples[False], base)
    assert np.array_equal(samples[True], head)
    gmm1 = comparison.rows.to_pylist()[0]  # most share added first
    assert gmm1["stage"] == "GMM1"
    assert (gmm1["base_count"], gmm1["head_count"]) == (16, 8)
    assert (gmm1["base_median_share"], gmm1["head_median_share"]) == (
        float(np.median(base)),
        float(np.median(head)),
    )
    assert (gmm1["base_p90_share"], gmm1["head_p90_share"]) == (
        float(np.quantile(base, 0.9)),
        float(np.quantile(head, 0.9)),
    )
    # The change is in points of the share, not relative; its interval holds it.
    assert gmm1["change"] == float(np.median(head) - np.median(base))
    assert 0.05 < gmm1["change_low"] < gmm1["change"] < gmm1["change_high"]
    assert gmm1["p_value"] < 1e-4  # 16 against 8 invocations, all apart
    assert gmm1["impact_share"] == gmm1["change"]  # one kernel: every invocation has one
    assert comparison.rows.column_names[2:] == [
        "base_count", "head_count", "base_median_share", "head_median_share",
        "base_p90_share", "head_p90_share", "change", "change_low", "change_high",
        "p_value", "verdict", "impact_share",
    ]  # fmt: skip


def test_identical_code_changes_no_share(graphed: Store) -> None:
    comparison = graphed.compare("commit:base", "commit:same", level="critical")
    assert set(verdicts(comparison)) == {
        (KERNEL, stage) for stage in ("Dispatch", "GMM1", "GMM2", "Combine")
    }
    assert set(verdicts(comparison).values()) == {"unchanged"}
    assert not comparison.regressed
    by_kind = graphed.compare("commit:base", "commit:same", level="critical", by=("stage", "kind"))
    assert set(verdicts(by_kind).values()) == {"unchanged"}
    assert len(by_kind.rows) == 11  # the (stage, kind) pairs on the paths


def test_by_kind_and_a_stage_that_joins_the_path(graphed: Store) -> None:
    by_kind = graphed.compare("commit:base", "commit:slow", level="critical", by=("stage", "kind"))
    assert verdicts(by_kind)["GMM1", "compute"] == "regressed"
    assert np.array_equal(
        by_kind.samples["GMM1", "compute"][True],
        expected_shares(graphed, "slow", "GMM1", "compute"),
    )
    # SwiGLU 15 times slower is on the head's paths and on none of the base's: there each
    # invocation holds a share of 0 (a change in points, not "new").
    joined = graphed.compare("commit:base", "commit:swiglu", level="critical")
    swiglu = next(r for r in joined.rows.to_pylist() if r["stage"] == "SwiGLU")
    base = expected_shares(graphed, "base", "SwiGLU")
    head = expected_shares(graphed, "swiglu", "SwiGLU")
    assert not base.any()
    assert head.all()
    assert np.array_equal(joined.samples[KERNEL, "SwiGLU"][False], base)
    assert (swiglu["base_count"], swiglu["base_median_share"], swiglu["verdict"]) == (
        16,
        0.0,
        "regressed",
    )
    assert swiglu["change"] == float(np.median(head))


def test_a_side_without_its_task_graph_is_warned_of(store: Store) -> None:
    write_graphed_run(store, SimulatedMoeKernel(), seed=1, commit="aaaa")
    write_run(store, SimulatedMoeKernel(), seed=2, commit="bbbb")  # no task graph
    comparison = store.compare("commit:aaaa", "commit:bbbb", level="critical")
    assert comparison.warnings == (
        "base and head differ in whether the kernel handed over its task graph: "
        "base true; head false",
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"by": ("phase",)}, "cannot group critical by"),
        ({"metric": "duration"}, "level critical compares share, not duration"),
        ({"threshold": 1.0}, "a share changes by less than 1"),
    ],
)
def test_bad_critical_comparisons(graphed: Store, kwargs: dict, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        graphed.compare("commit:base", "commit:slow", level="critical", **kwargs)


def test_cli_compare_critical(capsys, graphed: Store, tmp_path: Path) -> None:
    base = ["compare", "--store", str(graphed.root), "--base", "commit:base", "--level", "critical"]
    csv = ["--format", "csv", "--fail-on-regression"]
    assert cli.main([*base, "--head", "commit:same", *csv]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 + 4  # the header, 4 stages
    assert cli.main([*base, "--head", "commit:slow", *csv]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "kernel_name,stage,base_count,head_count,base_median_share,head_median_share,"
        "base_p90_share,head_p90_share,change,change_low,change_high,p_value,verdict,"
        "impact_share"
    )
    assert lines[1].startswith("SimulatedMegaMoe,GMM1,16,8,")
    assert lines[1].split(",")[-2] == "regressed"
    output = tmp_path / "c.json"
    args = ["--head", "commit:slow", "--format", "json", "-o", str(output), "--threshold", "0.2"]
    assert cli.main([*base, *args]) == 0
    document = json.loads(output.read_text())
    assert (document["metric"], document["threshold"]) == ("share", 0.2)
    assert document["counts"]["regressed"] == 0  # GMM1 gained about 12 points, not 20
    assert document["groups"][0]["stage"] == "GMM1"
    assert cli.main([*base, "--head", "commit:slow", "--threshold", "2"]) == 2
    assert "a share changes by less than 1" in capsys.readouterr().err


def share_comparison() -> Comparison:
    """A hand-made comparison at level critical: GMM1 gained 12 points, GMM2 lost 10."""
    rows = pa.table(
        {
            "stage": ["GMM1", "GMM2"],
            "base_count": [16, 16],
            "head_count": [8, 8],
            "base_median_share": [0.515, 0.398],
            "head_median_share": [0.635, 0.298],
            "base_p90_share": [0.535, 0.423],
            "head_p90_share": [0.644, 0.31],
            "change": [0.12, -0.1],
            "change_low": [0.097, -0.124],
            "change_high": [0.146, -0.083],
            "p_value": [2.7e-06, 2.7e-06],
            "verdict": ["regressed", "improved"],
            "impact_share": [0.12, -0.1],
        }
    )
    return Comparison(
        rows=rows,
        base_ids=("run-a", "run-b"),
        head_ids=("run-c",),
        base="commit:aaaa",
        head="commit:bbbb",
        by=("stage",),
        level="critical",
        metric="share",
        threshold=0.05,
        alpha=0.01,
        warnings=(),
        samples={},
    )


def test_shares_render_in_percent_and_points() -> None:
    assert comparison_markdown(share_comparison()) == (
        "**mcprof compare**: 1 regressed, 1 improved (change of the median share above 5 "
        "points, Mann-Whitney p < 0.01)\n"
        "\n"
        "base `commit:aaaa` (2 run(s)), head `commit:bbbb` (1 run(s))\n"
        "\n"
        "| stage | base median (share) | head median (share) | change | interval | p | verdict "
        "| added (per invocation) |\n"
        "|---|---|---|---|---|---|---|---|\n"
        "| GMM1 | 51.5% | 63.5% | +12.0 pts | +9.7 pts .. +14.6 pts | 2.7e-06 "
        "| **regressed** | +12.0 pts |\n"
        "| GMM2 | 39.8% | 29.8% | -10.0 pts | -12.4 pts .. -8.3 pts | 2.7e-06 | improved "
        "| -10.0 pts |\n"
    )
    table = comparison_table(share_comparison())
    assert table.column_names == [
        "stage", "base_n", "head_n", "base_pct", "head_pct", "change", "interval", "p",
        "verdict", "added_pts_per_invocation",
    ]  # fmt: skip
    assert table.to_pylist()[0] == {
        "stage": "GMM1", "base_n": 16, "head_n": 8, "base_pct": 51.5, "head_pct": 63.5,
        "change": "+12.0 pts", "interval": "+9.7 .. +14.6 pts", "p": "2.7e-06",
        "verdict": "regressed", "added_pts_per_invocation": 12.0,
    }  # fmt: skip


def test_cli_compare_critical_table_and_markdown(
    capsys, monkeypatch: pytest.MonkeyPatch, graphed: Store
) -> None:
    monkeypatch.setenv("COLUMNS", "240")  # the box table shows every column
    base = ["compare", "--store", str(graphed.root), "--base", "commit:base", "--level", "critical"]
    assert cli.main([*base, "--head", "commit:slow"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mcprof compare: 1 regressed, 1 improved, 2 unchanged (change of")
    assert "base_pct" in out
    assert cli.main([*base, "--head", "commit:slow", "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out.splitlines()
    assert markdown[4].startswith("| kernel_name | stage | base median (share) |")
    assert markdown[6].startswith("| SimulatedMegaMoe | GMM1 | 51.5% | 63.3% | +11.7 pts |")
