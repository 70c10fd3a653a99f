"""Comparisons of run sets: a slowdown injected into one stage of the simulated MegaKernel is
found there and nowhere else, two runs of the same code differ nowhere, and the command
line's formats and exit statuses."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from simulated_runs import write_run
from test_kernels import write_moe_trace

from multicore_profiler import cli
from multicore_profiler.errors import ExportError, SelectorError
from multicore_profiler.export.compare_plot import plot_comparison
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.store import Store


def verdicts(comparison) -> dict[tuple, str]:
    by = comparison.by
    return {tuple(r[c] for c in by): r["verdict"] for r in comparison.rows.to_pylist()}


def test_two_runs_of_the_same_code_differ_nowhere(runs: Store) -> None:
    comparison = runs.compare("commit:base", "commit:same")
    assert comparison.base_ids == ("run-base0001-1", "run-base0001-2")
    assert comparison.head_ids == ("run-same0002-3",)
    assert set(verdicts(comparison).values()) == {"unchanged"}
    assert len(comparison.rows) == 13  # 5 stages x compute, 4 x wait and trigger, Combine wait
    assert not comparison.regressed
    assert comparison.warnings == ()


def test_a_slowdown_is_found_in_its_stage_only(runs: Store) -> None:
    comparison = runs.compare("commit:base", "commit:slow")
    found = {key: v for key, v in verdicts(comparison).items() if v != "unchanged"}
    assert found == {("SimulatedMegaMoe", "SwiGLU", "compute"): "regressed"}
    assert comparison.regressed
    rows = {(r["stage"], r["phase"]): r for r in comparison.rows.to_pylist()}
    swiglu = rows["SwiGLU", "compute"]
    # Medians and counts as the store computes them.
    medians = runs.sql(
        """SELECT run_id LIKE 'run-slow%' AS head, count(*) AS n,
                  quantile_cont(dur_ns, 0.5) AS median, quantile_cont(dur_ns, 0.9) AS p90
           FROM records_ns WHERE stage = 'SwiGLU' AND phase = 'compute'
               AND (run_id LIKE 'run-base%' OR run_id LIKE 'run-slow%')
           GROUP BY ALL ORDER BY head"""
    ).to_pylist()
    assert (swiglu["base_count"], swiglu["head_count"]) == (1024, 512)
    assert (swiglu["base_median_ns"], swiglu["head_median_ns"]) == (
        medians[0]["median"],
        medians[1]["median"],
    )
    assert (swiglu["base_p90_ns"], swiglu["head_p90_ns"]) == (medians[0]["p90"], medians[1]["p90"])
    assert swiglu["change"] == medians[1]["median"] / medians[0]["median"] - 1
    # The injected 25% lies in the 99% interval; the test is far past chance.
    assert swiglu["change_low"] < 0.25 < swiglu["change_high"]
    assert swiglu["p_value"] < 1e-50
    # Most time added per invocation first: 64 SwiGLU tasks a launch, each slower.
    assert comparison.rows["stage"][0].as_py() == "SwiGLU"
    assert swiglu["impact_ns"] == (swiglu["head_median_ns"] - swiglu["base_median_ns"]) * 64


def test_a_speedup_is_found_with_what_it_shortens(runs: Store) -> None:
    comparison = runs.compare("commit:base", "commit:fast")
    found = {key: v for key, v in verdicts(comparison).items() if v != "unchanged"}
    # SwiGLU's tasks wait for their GMM1 tile, which now ends sooner.
    assert found == {
        ("SimulatedMegaMoe", "GMM1", "compute"): "improved",
        ("SimulatedMegaMoe", "SwiGLU", "wait"): "improved",
    }
    assert not comparison.regressed
    rows = comparison.rows.to_pylist()
    gmm1 = next(r for r in rows if (r["stage"], r["phase"]) == ("GMM1", "compute"))
    assert gmm1["change_low"] < -0.2 < gmm1["change_high"]
    assert comparison.rows["stage"][-1].as_py() in ("GMM1", "SwiGLU")  # most time saved last


def test_groups_by_owner(runs: Store) -> None:
    comparison = runs.compare("commit:base", "commit:slow", by=("stage", "phase", "owner_id"))
    found = verdicts(comparison)
    # Each of the 8 experts' SwiGLU tasks (64 of them on each side's run) regressed. With
    # 104 groups tested at p < 0.01, another may pass by chance: no assertion on those.
    assert [found["SwiGLU", "compute", expert] for expert in range(8)] == ["regressed"] * 8
    assert len(found) == 13 * 8


def test_invocation_wall_times(runs: Store) -> None:
    # GMM1 runs on the AIC workers' critical path: a faster GMM1 makes launches faster.
    fast = runs.compare("commit:base", "commit:fast", level="invocations")
    assert fast.by == ("kernel_name",)
    [row] = fast.rows.to_pylist()
    assert (row["base_count"], row["head_count"], row["verdict"]) == (16, 8, "improved")
    walls = runs.sql(
        """SELECT run_id, invocation_id, max(ts_ns + dur_ns) - min(ts_ns) AS wall
           FROM records_ns WHERE run_id LIKE 'run-fast%' GROUP BY ALL"""
    )["wall"].to_numpy()
    assert row["head_median_ns"] == float(np.median(walls))
    assert row["impact_ns"] == row["head_median_ns"] - row["base_median_ns"]
    # SwiGLU runs on the AIV workers, off that path: slower SwiGLU tasks, same launches.
    slow = runs.compare("commit:base", "commit:slow", level="invocations")
    assert slow.rows["verdict"].to_pylist() == ["unchanged"]
    same = runs.compare("commit:base", "commit:same", level="invocations", by=("kernel_name",))
    assert same.rows["verdict"].to_pylist() == ["unchanged"]


def test_trace_kernels_by_family_and_name(store: Store, tmp_path) -> None:
    names = [f"ProfilerStep#{n}" for n in range(12)]
    for rank in (0, 1):
        old = write_moe_trace(tmp_path / f"old{rank}.json", rank=rank, names=names)
        new = write_moe_trace(
            tmp_path / f"new{rank}.json", rank=rank, names=names, all_reduce_extra_us=7
        )
        ingest_trace(store, old, label="old")
        ingest_trace(store, new, label="new")
    comparison = store.compare("label:old", "label:new", level="kernels", by=("family", "name"))
    found = {key: v for key, v in verdicts(comparison).items() if v != "unchanged"}
    assert found == {("collective", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"): "regressed"}
    row = comparison.rows.to_pylist()[0]
    assert (row["base_count"], row["head_count"]) == (24, 24)
    assert (row["base_median_ns"], row["head_median_ns"]) == (20_000, 27_000)
    assert row["change"] == 27_000 / 20_000 - 1
    assert row["impact_ns"] == 7_000 * 12  # per trace: 12 all-reduces, 7 us each
    assert len(comparison.base_ids) == len(comparison.head_ids) == 2
    by_family = store.compare("label:old", "label:new", level="kernels")
    assert verdicts(by_family)["collective",] == "unchanged"  # 20 -> 27 and 30 -> 30 mixed


def test_new_and_gone_groups_and_comparability(store: Store) -> None:
    write_run(store, SimulatedMoeKernel(), seed=1, commit="aaaa")
    write_run(store, SimulatedMoeKernel(frequency_hz=100e6), seed=2, commit="bbbb", name="Next")
    comparison = store.compare("commit:aaaa", "commit:bbbb", by=("kernel_name", "phase"))
    assert verdicts(comparison) == {
        ("SimulatedMegaMoe", "compute"): "gone",
        ("SimulatedMegaMoe", "trigger"): "gone",
        ("SimulatedMegaMoe", "wait"): "gone",
        ("Next", "compute"): "new",
        ("Next", "trigger"): "new",
        ("Next", "wait"): "new",
    }
    assert comparison.warnings == (
        "base and head differ in frequency (Hz): base 50000000.0; head 100000000.0",
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base": "commit:base", "head": "commit:base0001"}, "share runs"),
        ({"base": "commit:base", "head": "commit:nope"}, "selects none"),
        (
            {"base": "commit:base", "head": "commit:slow", "by": ("colour",)},
            "cannot group records by",
        ),
        ({"base": "commit:base", "head": "commit:slow", "metric": "energy"}, "unknown metric"),
        ({"base": "commit:base", "head": "commit:slow", "level": "layers"}, "unknown level"),
        (
            {"base": "commit:base", "head": "commit:slow", "level": "kernels"},
            "traces have no commit or branch",
        ),
        ({"base": "commit:base", "head": "commit:slow", "alpha": 0}, "alpha must be in (0, 1)"),
    ],
)
def test_bad_comparisons(runs: Store, kwargs: dict, message: str) -> None:
    with pytest.raises(SelectorError, match=message.replace("(", r"\(").replace(")", r"\)")):
        runs.compare(**kwargs)


def test_cli_compare_formats_and_exit_statuses(capsys, runs: Store, tmp_path) -> None:
    store = str(runs.root)
    base = ["compare", "--store", store, "--base", "commit:base"]
    assert cli.main([*base, "--head", "commit:same", "--fail-on-regression"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mcprof compare: 13 unchanged (change of the median above 5%")
    assert cli.main([*base, "--head", "commit:slow", "--fail-on-regression"]) == 1
    assert "1 regressed, 12 unchanged" in capsys.readouterr().out
    assert cli.main([*base, "--head", "commit:slow"]) == 0  # no gate asked for
    capsys.readouterr()
    assert cli.main([*base, "--head", "commit:slow", "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out.splitlines()
    assert markdown[0] == (
        "**mcprof compare**: 1 regressed, 12 unchanged (change of the median "
        "above 5%, Mann-Whitney p < 0.01)"
    )
    assert markdown[2] == "base `commit:base` (2 run(s)), head `commit:slow` (1 run(s))"
    assert markdown[4].startswith("| kernel_name | stage | phase | base median (us) |")
    assert markdown[6].startswith("| SimulatedMegaMoe | SwiGLU | compute |")
    assert markdown[6].endswith("| **regressed** | " + markdown[6].rsplit("| ", 1)[1])
    output = tmp_path / "c.json"
    assert cli.main([*base, "--head", "commit:slow", "--format", "json", "-o", str(output)]) == 0
    document = json.loads(output.read_text())
    assert document["counts"] == {
        "regressed": 1, "improved": 0, "unchanged": 12, "new": 0, "gone": 0
    }  # fmt: skip
    assert document["head"] == {"selector": "commit:slow", "runs": ["run-slow0003-4"]}
    assert document["groups"][0]["stage"] == "SwiGLU"
    assert cli.main([*base, "--head", "commit:slow", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "kernel_name,stage,phase,base_count,head_count,base_median_ns,head_median_ns,"
        "base_p90_ns,head_p90_ns,change,change_low,change_high,p_value,verdict,impact_ns"
    )
    # Usage errors are 2, never 1 (which a CI gate reads as a regression).
    assert cli.main([*base, "--head", "commit:nope", "--fail-on-regression"]) == 2
    assert "selects none" in capsys.readouterr().err
    assert cli.main([*base, "--head", "commit:slow", "--by", "colour"]) == 2
    with pytest.raises(SystemExit) as caught:
        cli.main(["compare", "--store", store, "--base", "commit:base"])
    assert caught.value.code == 2
    capsys.readouterr()
    level = ["--level", "invocations", "--format", "csv"]
    assert cli.main([*base, "--head", "commit:fast", *level, "--fail-on-regression"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("kernel_name,base_count,head_count,")
    assert lines[1].startswith("SimulatedMegaMoe,16,8,")
    assert lines[1].split(",")[-2] == "improved"


def test_plot_of_a_comparison(runs: Store, tmp_path, capsys) -> None:
    comparison = runs.compare("commit:base", "commit:slow")
    picture = plot_comparison(comparison, tmp_path / "c.png")
    data = picture.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    # 10 x (1.2 + 0.45 x 13 groups) inches at 110 dpi.
    assert (width, height) == (1100, int((1.2 + 0.45 * 13) * 110))
    assert not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(ExportError, match="'xyz' is not an image format"):
        plot_comparison(comparison, tmp_path / "c.xyz")
    store = str(runs.root)
    svg = tmp_path / "c.svg"
    code = cli.main(
        ["compare", "--store", store, "--base", "commit:base", "--head", "commit:slow",
         "--plot", str(svg), "--format", "csv"]
    )  # fmt: skip
    assert code == 0
    assert svg.read_text().count("SwiGLU / compute") == 1
    assert f"mcprof: picture: {svg}" in capsys.readouterr().err
