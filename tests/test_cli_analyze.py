"""``mcprof analyze``: its summary in every format, the what-if and speed-up tables, the
curves picture, the tolerance option and its errors, on two hand-built invocations.

The store (1 GHz, so one cycle is one ns): task 1 (GMM1, AIC/0) computes and triggers
event 10, which releases task 2's wait (SwiGLU, AIV/0); task 3 (SwiGLU, AIV/1) computes
alone. Invocation 0: GMM1 [100, 140], its trigger [140, 150], task 2's wait [100, 155]
and compute [155, 185], task 3 [100, 120]. Invocation 1: the same with GMM1 20 ns longer.

Worked out by hand for invocation 0: the makespan is 185 - 100 = 85 ns. The critical
path walks back from task 2's compute (the last to end) to its wait, which its trigger
bound (it ended 5 cycles before the wait did), so it crosses to the trigger and GMM1:
GMM1 compute 40 + GMM1 trigger 10 + SwiGLU data_wait 5 + SwiGLU compute 30 = 85, it
tiles. The static bound drops the 5 ns release latency: 80, slack 5. Busy time: AIC/0
50 (alone, imbalance 0); AIV/0 30 and AIV/1 20, imbalance 1 - 25/30, flagged. Invocation
1: makespan 105, bound 100, slack 5, AIV imbalance the same. With GMM1 * 0.5 GMM1 takes
20 (invocation 1: 30) and everything after it moves up: 65 and 75 ns.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from golden import AIC, AIV, GMM1, TRIGGER, WAIT, Slot, pack

from multicore_profiler.abi import BufferLayout
from multicore_profiler.cli import main
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import open_store

RUN = "analyze-run"
CONFIG = "analyze-config"
SWIGLU = 0x30002
EVENT = 10
LAYOUT = BufferLayout(aic_slots=1, aiv_slots=2, aic_capacity=16, aiv_capacity=16)


def buffer(gmm1_ns: int) -> bytearray:
    """One invocation of the module docstring's graph, GMM1 taking ``gmm1_ns``."""
    end = 100 + gmm1_ns
    return pack(
        1,
        2,
        16,
        16,
        [
            Slot(AIC, 0, 100, [(100, end, GMM1, 1, 0, 0), (end, end + 10, TRIGGER, 1, 0, 0)]),
            Slot(
                AIV,
                0,
                100,
                [(100, end + 15, WAIT, 2, 0, 0), (end + 15, end + 45, SWIGLU, 2, 0, 0)],
            ),
            Slot(AIV, 1, 100, [(100, 120, SWIGLU, 3, 1, 0)]),
        ],
    )


def tasks(kernel_name: str = "TinyMoe") -> pa.Table:
    """Task 1 triggers event 10, task 2 waits for it once, task 3 has no dependency."""
    count = 3
    return pa.table(
        {
            "rank": pa.array([0] * count, pa.int32()),
            "config_id": [CONFIG] * count,
            "kernel_name": [kernel_name] * count,
            "task_id": pa.array([1, 2, 3], pa.uint32()),
            "task_type": pa.array([1, 2, 2], pa.uint32()),
            "desc_id": pa.array([GMM1, SWIGLU, SWIGLU], pa.uint32()),
            "stage_task_index": pa.array([0, 0, 1], pa.uint32()),
            "owner_id": pa.array([0] * count, pa.uint32()),
            "core_type": pa.array([AIC, AIV, AIV], pa.uint8()),
            "worker": pa.array([0, 0, 1], pa.uint32()),
            "wait_event": pa.array([-1, EVENT, -1], pa.int32()),
            "wait_count": pa.array([0, 1, 0], pa.uint32()),
            "trigger_event": pa.array([EVENT, -1, -1], pa.int32()),
            "tiling_position": pa.array([0] * count, pa.uint32()),
            "input_position": pa.array([0] * count, pa.uint32()),
        }
    )


def write_store(root: Path, kernel_name: str = "TinyMoe", gmm1: str = "GMM1") -> list[str]:
    """A store at ``root`` holding the two invocations of the module docstring, in one
    run, with these names of the kernel and of GMM1; its ``--store`` arguments."""
    with open_store(root, create=True) as store:
        run = RunInfo.begin(run_id=RUN, label="tiny")
        store.write_run(run)
        ingest_buffers(
            store,
            [buffer(40), buffer(60)],
            LAYOUT,
            frequency_hz=1e9,
            run_id=RUN,
            kernel=KernelInfo(
                kernel_name=kernel_name,
                config_id=CONFIG,
                stage_names={GMM1: gmm1, SWIGLU: "SwiGLU"},
            ),
            launches=Launches(step=0, first_invocation_id=0),
        )
        store.write_tasks(RUN, tasks(kernel_name))
        store.write_run(run.finish())
    return ["--store", str(root)]


@pytest.fixture
def store_args(tmp_path: Path) -> list[str]:
    """The store of ``write_store``."""
    return write_store(tmp_path / "store")


def analyze(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["analyze", *argv])
    out, err = capsys.readouterr()
    return code, out, err


TABLE = """\
mcprof analyze: run analyze-run: 2 invocation(s) of TinyMoe
critical path: tiles the makespan of every invocation (2 of 2)
replay fidelity: max error 0.00% over 2 invocation(s) (limit 5%)

makespan, static bound and slack:
run_id       rank  step  invocation_id  kernel_name  makespan_us  static_bound_us  slack_us  slack_share
-----------  ----  ----  -------------  -----------  -----------  ---------------  --------  -----------
analyze-run     0     0              0  TinyMoe            0.085            0.080     0.005         5.9%
analyze-run     0     0              1  TinyMoe            0.105            0.100     0.005         4.8%

critical path over the selection (share of the total makespan):
kernel_name  stage   kind       share  dur_us
-----------  ------  ---------  -----  ------
TinyMoe      GMM1    compute    52.6%   0.100
TinyMoe      SwiGLU  compute    31.6%   0.060
TinyMoe      GMM1    trigger    10.5%   0.020
TinyMoe      SwiGLU  data_wait   5.3%   0.010

top blockers (up to 3 producers per consumer stage):
kernel_name  consumer_stage  producer_stage  producer_core  waits  total_wait_us  wait_share
-----------  --------------  --------------  -------------  -----  -------------  ----------
TinyMoe      SwiGLU          GMM1            AIC                2          0.130      100.0%

imbalance per core type (busy = compute + trigger + control):
kernel_name  core  invocations  mean_imbalance  max_imbalance  flagged
-----------  ----  -----------  --------------  -------------  -------
TinyMoe      AIC             2            0.0%           0.0%        0
TinyMoe      AIV             2           16.7%          16.7%        2

what-if (median over the invocations):
change    invocations  faithful  median_observed_us  median_predicted_us  median_ratio
--------  -----------  --------  ------------------  -------------------  ------------
GMM1*0.5            2         2               0.095                0.070        0.7395

speed-up curves (median predicted / observed makespan):
stage   0% faster  10% faster  20% faster  30% faster  40% faster  50% faster
------  ---------  ----------  ----------  ----------  ----------  ----------
GMM1       1.0000      0.9479      0.8958      0.8437      0.7916      0.7395
SwiGLU     1.0000      0.9681      0.9361      0.9042      0.8723      0.8403
"""  # noqa: E501 (the terminal's table, as printed)


def test_table_format_prints_every_summary(capsys, store_args) -> None:
    assert analyze(capsys, *store_args, "--what-if", "GMM1*0.5") == (0, TABLE, "")


def test_names_are_escaped_for_the_terminal(capsys, tmp_path) -> None:
    # A stage that clears the screen and a kernel whose name returns to the line's start
    # and turns the text red: printed raw, they redraw the terminal. Shown as DuckDB's
    # tables show them (mcprof query); CSV and JSON keep the names as stored.
    store_args = write_store(tmp_path / "store", "Tiny\rMoe\x1b[31m", "GMM1\x1b[2J\x9b1m")
    code, out, err = analyze(capsys, *store_args, "--what-if", "GMM1\x1b[2J\x9b1m*0.5")
    assert (code, err) == (0, "")
    assert "\x1b" not in out
    assert "\x9b" not in out
    assert "\r" not in out
    lines = out.splitlines()
    assert lines[0] == ("mcprof analyze: run analyze-run: 2 invocation(s) of Tiny\\rMoe\\e[31m")
    start = lines.index("critical path over the selection (share of the total makespan):")
    shares = ["Tiny\\rMoe\\e[31m", "GMM1\\e[2J\\x9b1m", "compute", "52.6%", "0.100"]
    assert lines[start + 3].split() == shares
    start = lines.index("what-if (median over the invocations):")
    assert lines[start + 3].split()[0] == "GMM1\\e[2J\\x9b1m*0.5"
    assert lines[-2].split()[0] == "GMM1\\e[2J\\x9b1m"
    code, out, err = analyze(capsys, *store_args, "--format", "markdown")
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == (
        "**mcprof analyze: run analyze-run: 2 invocation(s) of Tiny\\rMoe\\e[31m**"
    )
    assert "| GMM1\\e[2J\\x9b1m | 1.0000 |" in out
    code, out, err = analyze(capsys, *store_args, "--format", "json")
    assert json.loads(out)["summary"]["critical_shares"][0]["stage"] == "GMM1\x1b[2J\x9b1m"


def test_markdown_format(capsys, store_args) -> None:
    code, out, err = analyze(capsys, *store_args, "--invocation", "0", "--format", "markdown")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:4] == [
        "**mcprof analyze: run analyze-run, invocation 0: 1 invocation(s) of TinyMoe**",
        "",
        "- critical path: tiles the makespan of every invocation (1 of 1)",
        "- replay fidelity: max error 0.00% over 1 invocation(s) (limit 5%)",
    ]
    start = lines.index("### critical path over the selection (share of the total makespan)")
    assert lines[start + 2 : start + 8] == [
        "| kernel_name | stage | kind | share | dur_us |",
        "|---|---|---|---|---|",
        "| TinyMoe | GMM1 | compute | 47.1% | 0.040 |",
        "| TinyMoe | SwiGLU | compute | 35.3% | 0.030 |",
        "| TinyMoe | GMM1 | trigger | 11.8% | 0.010 |",
        "| TinyMoe | SwiGLU | data_wait | 5.9% | 0.005 |",
    ]
    assert "### what-if (median over the invocations)" not in lines, "no --what-if, no table"
    assert lines[-4:] == [
        "| stage | 0% faster | 10% faster | 20% faster | 30% faster | 40% faster | 50% faster |",
        "|---|---|---|---|---|---|---|",
        "| GMM1 | 1.0000 | 0.9529 | 0.9059 | 0.8588 | 0.8118 | 0.7647 |",
        "| SwiGLU | 1.0000 | 0.9647 | 0.9294 | 0.8941 | 0.8588 | 0.8235 |",
    ]


def test_csv_format_holds_the_summary_tables_with_raw_values(capsys, store_args, tmp_path):
    output = tmp_path / "analysis.csv"
    code, out, err = analyze(
        capsys, *store_args, "--format", "csv", "--what-if", "GMM1*0.5", "-o", str(output)
    )
    assert (code, out, err) == (0, "", "")
    sections = {
        block.splitlines()[0]: block.splitlines()[1:] for block in output.read_text().split("\n\n")
    }
    assert list(sections) == [
        "# makespan",
        "# critical_shares",
        "# blockers",
        "# imbalance",
        "# what_if",
        "# speedup_curves",
    ]
    assert sections["# makespan"] == [
        "run_id,rank,step,invocation_id,kernel_name,makespan_ns,static_bound_ns,slack_ns,"
        "slack_share",
        f"analyze-run,0,0,0,TinyMoe,85,80,5,{5 / 85!r}",
        f"analyze-run,0,0,1,TinyMoe,105,100,5,{5 / 105!r}",
    ]
    assert sections["# blockers"] == [
        "kernel_name,consumer_stage,producer_stage,producer_core,waits,total_wait_ns,wait_share",
        "TinyMoe,SwiGLU,GMM1,AIC,2,130,1.0",
    ]
    assert sections["# what_if"] == [
        "change,invocations,faithful,median_observed_ns,median_predicted_ns,median_ratio",
        f"GMM1*0.5,2,2,95.0,70.0,{(65 / 85 + 75 / 105) / 2!r}",
    ]
    assert len(sections["# speedup_curves"]) == 1 + 2 * 6


def _without_decimals(rows: list[dict]) -> list[dict]:
    """Rows with DuckDB's decimal sums as the integers they are (as JSON writes them)."""
    return [
        {k: int(v) if type(v).__name__ == "Decimal" else v for k, v in row.items()} for row in rows
    ]


def test_json_round_trip_holds_every_table(capsys, store_args) -> None:
    from multicore_profiler.analysis.analyze import analyze as analyze_store
    from multicore_profiler.analysis.analyze import speedup_curves, what_if

    code, out, err = analyze(
        capsys, *store_args, "--format", "json", "--what-if", "GMM1*0.5", "--what-if", "AIC+10"
    )
    assert (code, err) == (0, "")
    document = json.loads(out)
    with open_store(store_args[1]) as store:
        expected = analyze_store(store)
        predictions = {c: what_if(store, None, [c]) for c in ("GMM1*0.5", "AIC+10")}
        curves = speedup_curves(store)
    assert document["selection"] == "run analyze-run"
    assert (document["invocations"], document["tiles"], document["not_tiling"]) == (2, True, [])
    assert (document["max_fidelity_error"], document["unfaithful"]) == (0.0, [])
    assert list(document["tables"]) == list(expected.tables())
    for name, table in expected.tables().items():
        assert document["tables"][name] == _without_decimals(table.to_pylist()), name
    assert len(document["tables"]["critical_path"]) == 8
    assert [p["change"] for p in document["what_if"]] == ["GMM1*0.5", "AIC+10"]
    for entry in document["what_if"]:
        assert entry["invocations"] == predictions[entry["change"]].to_pylist()
    assert [r["predicted_makespan_ns"] for r in document["what_if"][0]["invocations"]] == [65, 75]
    assert [r["predicted_makespan_ns"] for r in document["what_if"][1]["invocations"]] == [95, 115]
    assert document["speedup_curves"] == curves.to_pylist()
    summary = document["summary"]
    assert list(summary) == [
        "makespan",
        "critical_shares",
        "blockers",
        "imbalance",
        "what_if",
        "speedup_curves",
    ]
    assert summary["critical_shares"] == [
        {
            "kernel_name": "TinyMoe",
            "stage": "GMM1",
            "kind": "compute",
            "share": 100 / 190,
            "dur_ns": 100,
        },
        {
            "kernel_name": "TinyMoe",
            "stage": "SwiGLU",
            "kind": "compute",
            "share": 60 / 190,
            "dur_ns": 60,
        },
        {
            "kernel_name": "TinyMoe",
            "stage": "GMM1",
            "kind": "trigger",
            "share": 20 / 190,
            "dur_ns": 20,
        },
        {
            "kernel_name": "TinyMoe",
            "stage": "SwiGLU",
            "kind": "data_wait",
            "share": 10 / 190,
            "dur_ns": 10,
        },
    ]
    assert summary["imbalance"][1] == {
        "kernel_name": "TinyMoe",
        "core": "AIV",
        "invocations": 2,
        "mean_imbalance": pytest.approx(1 - 25 / 30, abs=1e-15),
        "max_imbalance": pytest.approx(1 - 25 / 30, abs=1e-15),
        "flagged": 2,
    }
    assert [r["median_predicted_ns"] for r in summary["what_if"]] == [70.0, 105.0]


def test_many_invocations_give_median_min_and_max(capsys, store_args, tmp_path) -> None:
    """Above FEW_INVOCATIONS the makespan is summarized per kernel: 9 invocations with
    GMM1 taking 40, 50, ..., 120 ns have makespans 85 .. 165 and bounds 80 .. 160."""
    with open_store(store_args[1]) as store:
        run = RunInfo.begin(run_id="many-run")
        store.write_run(run)
        ingest_buffers(
            store,
            [buffer(ns) for ns in range(40, 121, 10)],
            LAYOUT,
            frequency_hz=1e9,
            run_id="many-run",
            kernel=KernelInfo(kernel_name="TinyMoe", config_id=CONFIG),
            launches=Launches(step=0, first_invocation_id=0),
        )
        store.write_tasks("many-run", tasks())
        store.write_run(run.finish())
    code, out, err = analyze(capsys, *store_args, "--run", "many-run", "--format", "json")
    assert (code, err) == (0, "")
    assert json.loads(out)["summary"]["makespan"] == [
        {
            "kernel_name": "TinyMoe",
            "invocations": 9,
            "median_makespan_ns": 125.0,
            "min_makespan_ns": 85,
            "max_makespan_ns": 165,
            "median_static_bound_ns": 120.0,
            "median_slack_ns": 5.0,
            "median_slack_share": 5 / 125,
        }
    ]


def test_select_picks_runs_like_run(capsys, store_args) -> None:
    by_run = analyze(capsys, *store_args, "--run", RUN, "--format", "json")
    by_selector = analyze(capsys, *store_args, "--select", "label:tiny", "--format", "json")
    assert by_run[0] == by_selector[0] == 0
    assert json.loads(by_run[1])["tables"] == json.loads(by_selector[1])["tables"]


def test_tolerance_sets_the_walk_for_the_command(capsys, store_args) -> None:
    """With a tolerance of 0 cycles, the wait that ended 5 cycles after its trigger is not
    crossed: the path stays on AIV/0, its wait (55) then its compute (30)."""
    code, out, err = analyze(
        capsys, *store_args, "--invocation", "0", "--tolerance", "0", "--format", "json"
    )
    assert (code, err) == (0, "")
    shares = json.loads(out)["summary"]["critical_shares"]
    assert [(r["stage"], r["kind"], r["dur_ns"]) for r in shares] == [
        ("SwiGLU", "wait", 55),
        ("SwiGLU", "compute", 30),
    ]
    assert json.loads(out)["tables"]["invocations"][0]["path_tiles"] is True


def test_plot_writes_the_curves_png(capsys, store_args, tmp_path) -> None:
    from matplotlib import image

    picture = tmp_path / "curves.png"
    code, _, err = analyze(capsys, *store_args, "--plot", str(picture), "--format", "json")
    assert (code, err) == (0, f"mcprof: picture: {picture}\n")
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.imread(picture).shape == (550, 880, 4)


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (
            ["--what-if", "GMM1/2"],
            2,
            "argument --what-if: change 'GMM1/2' is not <target>[&<target>...] followed by "
            "*<factor>, +<number>[ns|us|ms] or -<number>[ns|us|ms] (for example GMM1*0.8, "
            "AIC+200us)",
        ),
        (
            ["--what-if", "GMM1+5parsecs"],
            2,
            "argument --what-if: change 'GMM1+5parsecs': unit 'parsecs' is not one of ns, us, ms",
        ),
        (
            ["--what-if", "Combine*0.5"],
            1,
            "the change 'Combine*0.5' matches no compute record of the selection",
        ),
        *(
            (
                ["--what-if", change],
                1,
                f"the change {change!r} cannot be replayed: the duration of a compute record "
                f"of stage GMM1 ({cycles} cycles) of run analyze-run rank 0 invocation 0 "
                "would pass int64 (2^63-1); give a smaller factor or shift",
            )
            # The four: each exited 0 with a makespan of -9,223,372,036,849,824 us.
            for change, cycles in [
                ("GMM1*1e308", "inf"),
                ("GMM1+1e30us", "1e+33"),
                ("GMM1*1e18", "4e+19"),
                ("GMM1+9223372036854775807", "9.22337e+18"),
            ]
        ),
        (["--invocation", "7"], 1, "run analyze-run has no invocation 7"),
        (["--run", "no-such-run"], 1, "run no-such-run is not in the store at {store}"),
        (
            ["--tolerance", "-1"],
            2,
            "argument --tolerance: a tolerance in cycles -1 is out of range "
            "[0 .. 9223372036854775807]",
        ),
        (
            ["--run", RUN, "--select", "label:tiny"],
            2,
            "argument --select: not allowed with argument --run",
        ),
        (
            ["-o", "out.txt"],
            1,
            "--format table prints to the terminal; pick csv, json or markdown",
        ),
    ],
)
def test_errors_are_one_line(capsys, store_args, argv, status, message) -> None:
    if status == 2:
        with pytest.raises(SystemExit) as raised:
            main(["analyze", *store_args, *argv])
        code = raised.value.code
    else:
        code = main(["analyze", *store_args, *argv])
    message = message.replace("{store}", store_args[store_args.index("--store") + 1])
    assert (code, capsys.readouterr()) == (status, ("", f"mcprof: error: {message}\n"))


def test_check_lines_name_what_does_not_tile_and_what_is_not_faithful(store_args) -> None:
    """The replay of these invocations is exact and their paths tile, so the lines for
    the other case are checked on the analysis with invocation 1 marked as failing both."""
    import dataclasses

    from multicore_profiler.analysis.analyze import analyze as analyze_store
    from multicore_profiler.export.analysis_text import check_lines

    with open_store(store_args[1]) as store:
        analysis = analyze_store(store)
    invocations = analysis.invocations
    for name, values in (
        ("critical_path_ns", [85, 104]),
        ("path_tiles", [True, False]),
        ("fidelity_error", [0.0, 0.0625]),
        ("faithful", [True, False]),
    ):
        index = invocations.schema.get_field_index(name)
        column = pa.array(values, invocations.schema.field(name).type)
        invocations = invocations.set_column(index, name, column)
    failing = dataclasses.replace(analysis, invocations=invocations)
    assert check_lines(failing) == [
        "critical path: does not tile the makespan of 1 of 2 invocation(s): run analyze-run "
        "rank 0 invocation 1 (path 104 ns, makespan 105 ns)",
        "replay fidelity: max error 6.25% over 2 invocation(s) (limit 5%)",
        "FLAG: the replay is not faithful for 1 of 2 invocation(s), which get no prediction: "
        "run analyze-run rank 0 invocation 1 (error 6.25%)",
    ]
