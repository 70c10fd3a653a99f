"""The HTML report, opened in a real headless Chromium: it draws without script errors and
shows the stages, one lane per worker of the invocation with its critical path, a bar per
core of where its time goes, the speed-up curves, the comparison, and the step x rank
heatmaps of a job's and a run's ranks."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from golden import AIC, AIV, GMM1, TERMINATE, TRIGGER, WAIT, Slot, pack
from shared_fixtures import shared_fixture
from simulated_runs import write_run
from task_graphs import tasks_table

from multicore_profiler import cli
from multicore_profiler.abi import BufferLayout
from multicore_profiler.analysis.analyze import speedup_curves
from multicore_profiler.analysis.selection import RecordSelection
from multicore_profiler.errors import ExportError
from multicore_profiler.export.report import write_report
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.imports import import_profile
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.runs import CaptureCost, RunInfo
from multicore_profiler.storage.store import Store


def rendered(page: Path) -> str:
    """The page's DOM after its scripts ran, from headless Chromium (make test installs it)."""
    browser = shutil.which("chromium")
    assert browser is not None, "Chromium is needed: make test installs it (apt chromium)"
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def test_report_renders_stages_lanes_and_comparison(runs: Store, tmp_path: Path) -> None:
    page = write_report(runs, "commit:slow", tmp_path / "report.html", base="commit:base")
    text = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing fetched
    dom = rendered(page)
    assert '<html lang="en" data-ready="1">' in dom
    assert "data-error" not in dom
    stages = re.findall(r"<td class=\"text\">SimulatedMegaMoe</td><td class=\"text\">(\w+)</td>",
                        dom.split('id="stages"')[1].split("</table>")[0])  # fmt: skip
    assert stages == ["Dispatch", "GMM1", "SwiGLU", "GMM2", "Combine"]
    lanes = re.findall(r'<g class="lane" data-lane="(AI[CV]/\d+)"', dom)
    workers = runs.sql(
        """SELECT DISTINCT core || '/' || block_id AS lane FROM records_ns
           WHERE run_id = 'run-slow0003-4' AND invocation_id = 0 ORDER BY core, block_id"""
    )["lane"].to_pylist()
    assert lanes == workers
    assert len(lanes) == 48  # 24 AIC and 24 AIV workers
    records = runs.sql(
        "SELECT count(*) AS n FROM records_ns WHERE run_id = 'run-slow0003-4' AND invocation_id = 0"
    ).to_pylist()[0]["n"]
    assert dom.count("<rect ") == records
    comparison = dom.split('id="comparison"')[1].split("</table>")[0]
    assert comparison.count('<tr class="regressed">') == 1
    swiglu = (
        '<tr class="regressed"><td class="text">SimulatedMegaMoe</td>'
        '<td class="text">SwiGLU</td><td class="text">compute</td>'
    )
    assert swiglu in comparison
    assert "1 regressed, 12 unchanged" in dom


def test_report_without_base_and_its_errors(store: Store, tmp_path: Path, capsys) -> None:
    write_run(store, SimulatedMoeKernel(experts=2, tiles=2), seed=1, commit="abcd")
    out = tmp_path / "r.html"
    code = cli.main(["report", "--store", str(store.root), "--run", "commit:abcd", "-o", str(out)])
    assert code == 0
    assert f"{out}: report of commit:abcd" in capsys.readouterr().out
    dom = rendered(out)
    assert 'data-ready="1"' in dom
    assert "Comparison" not in dom.split("<script")[0]
    with pytest.raises(ExportError, match="has no invocation 99 to draw"):
        write_report(store, "commit:abcd", out, invocation=99)


def capture_costs(dom: str) -> list[str]:
    """The lines the report says of what profiling cost its runs."""
    section = dom.split('<div id="capture-costs">')[1].split("</div>")[0]
    return re.findall(r'<p class="capture-cost">([^<]*)</p>', section)


def test_report_says_what_profiling_cost_the_runs_that_recorded_it(
    store: Store, tmp_path: Path
) -> None:
    kernel = SimulatedMoeKernel(experts=2, tiles=2)
    plain, costed, threaded = (write_run(store, kernel, seed=s, commit="abcd") for s in (1, 2, 3))
    in_process = CaptureCost(
        steps=8, job_seconds=0.0025, writer_cpu_seconds=0.0096, writer="process"
    )
    in_thread = CaptureCost(steps=4, job_seconds=0.0008, writer_cpu_seconds=0.02, writer="thread")
    for run_id, cost in ((costed, in_process), (threaded, in_thread)):
        store.write_run(RunInfo.begin(run_id=run_id).finish("complete", cost))
    dom = rendered(write_report(store, f"run:{costed}", tmp_path / "costed.html"))
    assert 'data-ready="1"' in dom
    assert capture_costs(dom) == [
        "Profiling cost the job 0.31 ms per recorded step "
        "(writer: 1.2 ms CPU per step, in a separate process)."
    ]
    dom = rendered(write_report(store, f"run:{plain}", tmp_path / "plain.html"))
    assert 'data-ready="1"' in dom
    assert capture_costs(dom) == []
    assert "Profiling cost" not in dom.split("<script")[0]
    every = f"run:{plain},run:{costed},run:{threaded}"
    dom = rendered(write_report(store, every, tmp_path / "all.html"))
    assert capture_costs(dom) == [
        "Run run-abcd-2: profiling cost the job 0.31 ms per recorded step "
        "(writer: 1.2 ms CPU per step, in a separate process).",
        "Run run-abcd-3: profiling cost the job 0.2 ms per recorded step "
        "(writer: 5 ms CPU per step, in a thread of the job's process).",
    ]


def test_report_draws_each_steps_time_breakdown_as_a_stacked_bar(
    store: Store, tmp_path: Path, capsys
) -> None:
    write_run(store, SimulatedMoeKernel(experts=2, tiles=2), seed=1, commit="abcd")
    npu = shared_fixture("ascend/torchnpu_imagenet_2025_L0_rank0_trace_view.json.gz")
    source = ingest_trace(store, npu, label="npu").source_id
    out = tmp_path / "r.html"
    argv = ["report", "--store", str(store.root), "--run", "commit:abcd", "-o", str(out)]
    assert cli.main([*argv, "--traces", "label:npu"]) == 0
    capsys.readouterr()
    dom = rendered(out)
    assert 'data-ready="1"' in dom
    assert "data-error" not in dom
    bars = re.findall(r'<g class="step" data-step="([^"]+)"', dom)
    assert bars == [f"{source[:8]} ProfilerStep#50"]
    parts = re.findall(r'<rect class="part" data-part="(\w+)"[^>]*><title>([^<]+)</title>', dom)
    # step_trace_time.csv: Computing 8827.473, Communication(Not Overlapped) 81515.607,
    # Free 25908.102 us; the three tile the stage (116251.25 us).
    assert parts == [
        ("computing_ns", f"{source[:8]} ProfilerStep#50 computing_ns: 8827.5 us"),
        (
            "communication_not_overlapped_ns",
            f"{source[:8]} ProfilerStep#50 communication_not_overlapped_ns: 81515.6 us",
        ),
        ("free_ns", f"{source[:8]} ProfilerStep#50 free_ns: 25908.1 us"),
    ]
    ingest_trace(store, shared_fixture("kineto/a100_triton_example.json.gz"), label="triton")
    with pytest.raises(ExportError, match="label:triton have no step to break down"):
        write_report(store, "commit:abcd", out, traces="label:triton")


GRAPH_RUN, CONFIG, SWIGLU, CORE_WIDTH = "report-graph", "report-config", 0x30002, 1010
GRAPH_LAYOUT = BufferLayout(aic_slots=1, aiv_slots=2, aic_capacity=16, aiv_capacity=16)
GMM1_CYCLES = (100, 140, 120)
"""Invocations 0, 1 and 2 carry the task graph, GMM1 taking these cycles; invocation 3 is
invocation 0's records of a kernel that handed over none."""


def graph_buffer(gmm1: int) -> bytearray:
    """AIC/0: GMM1 (task 1), its trigger of event 10, a TerminateTask. AIV/0: SwiGLU (task
    3), its trigger of event 11, then task 2 waits for event 10 (released 5 cycles after
    task 1's trigger) and computes, ending last. AIV/1 starts 4 cycles late: task 4 waits
    for event 11, idles 3 cycles, computes, and idles to the end."""
    g = gmm1
    return pack(
        1,
        2,
        16,
        16,
        [
            Slot(
                AIC,
                0,
                100,
                [
                    (100, 100 + g, GMM1, 1, 0, 0),
                    (100 + g, 110 + g, TRIGGER, 1, 0, 0),
                    (110 + g, 112 + g, TERMINATE, 1, 0, 0),
                ],
            ),
            Slot(
                AIV,
                0,
                100,
                [
                    (100, 130, SWIGLU, 3, 0, 0),
                    (130, 135, TRIGGER, 3, 0, 0),
                    (135, 115 + g, WAIT, 2, 1, 0),
                    (115 + g, 160 + g, SWIGLU, 2, 1, 0),
                ],
            ),
            Slot(AIV, 1, 100, [(104, 137, WAIT, 4, 2, 0), (140, 160, SWIGLU, 4, 2, 0)]),
        ],
    )


def graph_tasks() -> pa.Table:
    """Task 1 (AIC/0) triggers event 10, which task 2 (AIV/0) waits for; task 3 (AIV/0)
    triggers event 11, which task 4 (AIV/1) waits for."""
    ids = [1, 2, 3, 4]
    return tasks_table(
        CONFIG,
        "ReportMoe",
        task_id=ids,
        desc_id=[GMM1, SWIGLU, SWIGLU, SWIGLU],
        core_type=[AIC, AIV, AIV, AIV],
        worker=[0, 0, 0, 1],
        wait_event=[-1, 10, -1, 11],
        wait_count=[0, 1, 0, 1],
        trigger_event=[10, -1, 11, -1],
        task_type=[101, 102, 102, 102],
        stage_task_index=[0, 1, 0, 2],
    )


def write_graph_run(store: Store, run_id: str, gmm1_cycles: Sequence[int]) -> None:
    """A run of one invocation with the task graph per entry of ``gmm1_cycles`` (GMM1
    taking that many cycles), then one of the first's records without it."""
    run = RunInfo.begin(run_id=run_id)
    store.write_run(run)
    graphless = len(gmm1_cycles)
    launches = [(i, CONFIG, g) for i, g in enumerate(gmm1_cycles)]
    for invocation, config, gmm1 in [*launches, (graphless, None, gmm1_cycles[0])]:
        ingest_buffers(
            store,
            [graph_buffer(gmm1)],
            GRAPH_LAYOUT,
            frequency_hz=50e6,
            run_id=run_id,
            kernel=KernelInfo(
                kernel_name="ReportMoe",
                stage_names={GMM1: "GMM1", SWIGLU: "SwiGLU"},
                config_id=config,
            ),
            launches=Launches(step=invocation, first_invocation_id=invocation),
        )
    store.write_tasks(run_id, graph_tasks())
    store.write_run(run.finish())


@pytest.fixture
def graph_store(store: Store) -> Store:
    """The run of ``GMM1_CYCLES``'s invocations and the graphless invocation 3."""
    write_graph_run(store, GRAPH_RUN, GMM1_CYCLES)
    return store


def core_bars(dom: str) -> dict[str, list[tuple[str, float]]]:
    """Each core's bar: its segments' parts and widths, in drawing order."""
    chart = dom.split('id="core-breakdown"')[1].split("</svg>")[0]
    bars = {}
    for core, body in re.findall(r'<g class="core" data-core="([^"]+)"[^>]*>(.*?)</g>', chart):
        segments = re.findall(r'data-part="(\w+)" d="M([^ ]+) 0h([^v]+)v', body)
        bars[core] = [(part, float(width)) for part, _, width in segments]
        assert float(segments[0][1]) == 80  # after the lane label, as the timeline's lanes
        for before, after in itertools.pairwise(segments):  # each where the one before ends
            assert float(after[1]) == pytest.approx(float(before[1]) + float(before[2]))
    return bars


def shares(store: Store, run: str, invocation: int) -> dict[str, list[tuple[str, float]]]:
    """The view's shares per core of one invocation, AIC then AIV by block."""
    rows = store.sql(
        """SELECT core || '/' || block_id AS core, compute_share, wait_share, trigger_share,
                  control_share, front_gap_share, gap_share, tail_gap_share
           FROM core_breakdown WHERE run_id = $run AND invocation_id = $invocation
           ORDER BY core_type, block_id""",
        {"run": run, "invocation": invocation},
    ).to_pylist()
    return {
        row.pop("core"): [(name.replace("_share", "_ns"), share) for name, share in row.items()]
        for row in rows
    }


def highlighted(dom: str) -> list[tuple[str, int, int]]:
    """(lane, position of the record in its lane, data-seq) of each outlined record."""
    found = []
    for lane, body in re.findall(r'<g class="lane" data-lane="([^"]+)"[^>]*>(.*?)</g>', dom):
        for position, rect in enumerate(re.findall(r"<rect [^>]*>", body)):
            critical = re.search(r'class="critical" data-seq="(\d+)"', rect)
            if critical:
                found.append((lane, position, int(critical[1])))
    return sorted(found, key=lambda found: found[2])


def test_report_draws_core_bars_critical_path_and_speedup_curves(
    graph_store: Store, tmp_path: Path
) -> None:
    page = write_report(graph_store, f"run:{GRAPH_RUN}", tmp_path / "r.html")
    dom = rendered(page)
    assert 'data-ready="1"' in dom
    assert "data-error" not in dom

    # Bars: AIC then AIV by block, parts in order, widths the view's shares of the width.
    bars = core_bars(dom)
    expected = shares(graph_store, GRAPH_RUN, 0)
    assert list(bars) == list(expected) == ["AIC/0", "AIV/0", "AIV/1"]
    for core, segments in bars.items():
        assert [part for part, _ in segments] == [part for part, _ in expected[core]]
        assert [w for _, w in segments] == pytest.approx(
            [share * CORE_WIDTH for _, share in expected[core]], abs=1e-9
        )
        assert sum(w for _, w in segments) == pytest.approx(CORE_WIDTH)
    # Worked by hand (cycles of 20 ns; makespan cycles 100 -> 260, 3200 ns), in ns: compute,
    # wait, trigger, control, front gap, gaps, tail gap. AIC/0 ends at 212; AIV/1 starts 4
    # cycles late, waits 33, idles 3, computes 20 and idles 100 to the end.
    by_hand = {
        "AIC/0": [2000, 0, 200, 40, 0, 0, 960],
        "AIV/0": [1500, 1600, 100, 0, 0, 0, 0],
        "AIV/1": [400, 660, 0, 0, 80, 60, 2000],
    }
    for core, parts in by_hand.items():
        widths = [w for _, w in bars[core]]
        assert widths == pytest.approx([ns / 3200 * CORE_WIDTH for ns in parts], abs=1e-9)
    assert "AIV/1 front_gap_ns: 0.08 us (2.5 %)" in dom

    # The critical path: exactly the view's records outlined, in seq order; by hand, task
    # 1's GMM1 and trigger on AIC/0, then task 2's wait (crossed) and SwiGLU on AIV/0.
    path = graph_store.sql(
        """WITH lanes AS (
               SELECT core, block_id, record_index, row_number() OVER (
                   PARTITION BY core, block_id ORDER BY ts_ns, record_index) - 1 AS position
               FROM records_ns WHERE run_id = $run AND invocation_id = 0)
           SELECT c.core || '/' || c.block_id AS lane, l.position, c.seq
           FROM critical_path c JOIN lanes l USING (core, block_id, record_index)
           WHERE c.run_id = $run AND c.invocation_id = 0 ORDER BY c.seq""",
        {"run": GRAPH_RUN},
    ).to_pylist()
    assert highlighted(dom) == [(r["lane"], r["position"], r["seq"]) for r in path]
    assert highlighted(dom) == [("AIC/0", 0, 0), ("AIC/0", 1, 1), ("AIV/0", 2, 2), ("AIV/0", 3, 3)]
    line = re.search(r'<polyline id="critical-path" points="([^"]+)"', dom)
    assert line is not None
    assert len(line[1].split()) == 2 * len(path)  # two points a piece: 4 pieces, no gap
    assert "4 records in 4 pieces; most of its makespan: GMM1 compute 62.5%" in dom

    # Curves: one line per stage, at each speed-up the median over invocations 0-2 of
    # speedup_curves' ratios (invocation 3 has no task graph).
    table = speedup_curves(graph_store, RecordSelection(run=GRAPH_RUN)).to_pylist()
    medians: dict[tuple[str, float], list[float]] = {}
    for row in table:
        if row["invocation_id"] != 3:
            medians.setdefault((row["stage"], row["speedup"]), []).append(row["ratio"])
    lines = re.findall(r'<polyline class="curve" data-stage="(\w+)"', dom)
    assert lines == ["GMM1", "SwiGLU"]
    points = re.findall(
        r'<circle class="point" data-stage="(\w+)" data-speedup="([\d.]+)" data-ratio="([^"]+)"',
        dom,
    )
    assert [(stage, float(s)) for stage, s, _ in points] == [
        (stage, s) for stage in lines for s in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    ]
    for stage, speedup, ratio in points:
        ratios = medians[(stage, float(speedup))]
        assert len(ratios) == 3
        assert float(ratio) == statistics.median(ratios)
    assert {float(r) for stage, s, r in points if s == "0"} == {1.0}  # the replay is faithful
    assert float(points[5][2]) < float(points[11][2]) < 1  # GMM1 bounds the kernel
    assert "median over 3 of the 3 invocations of run report-graph with a task graph" in dom


def test_report_without_a_task_graph_says_why_it_has_no_path_or_curves(
    graph_store: Store, tmp_path: Path
) -> None:
    write_run(graph_store, SimulatedMoeKernel(experts=2, tiles=2), seed=1, commit="abcd")
    page = write_report(graph_store, "commit:abcd", tmp_path / "r.html")
    dom = rendered(page)
    assert 'data-ready="1"' in dom
    assert "data-error" not in dom
    bars = core_bars(dom)
    expected = shares(graph_store, "run-abcd-1", 0)
    assert list(bars) == list(expected)
    lanes = re.findall(r'<g class="lane" data-lane="(AI[CV]/\d+)"', dom)
    assert list(bars) == lanes  # a bar per lane of the timeline
    for core, segments in bars.items():
        assert [w for _, w in segments] == pytest.approx(
            [share * CORE_WIDTH for _, share in expected[core]], abs=1e-9
        )
    assert (
        "No critical path: invocation 0 of run run-abcd-1 carries no task graph (its kernel "
        "handed over no tasks), so no wait can be charged to the trigger that released it."
    ) in dom
    assert (
        "No speed-up curves: no invocation of run run-abcd-1 carries a task graph, so the "
        "replay cannot tell what a faster stage would release."
    ) in dom
    assert 'class="critical"' not in dom
    assert "<polyline" not in dom
    assert 'id="speedup-curves"' not in dom
    # A graphless invocation of a run with a graph: its bars, no path, the run's curves.
    dom = rendered(write_report(graph_store, f"run:{GRAPH_RUN}", page, invocation=3))
    assert "No critical path: invocation 3 of run report-graph carries no task graph" in dom
    assert list(core_bars(dom)) == ["AIC/0", "AIV/0", "AIV/1"]
    assert re.findall(r'<polyline class="curve" data-stage="(\w+)"', dom) == ["GMM1", "SwiGLU"]


def test_report_page_stays_small_for_a_run_of_many_invocations(
    store: Store, tmp_path: Path
) -> None:
    """The page carries one invocation's records, a row per core and a median curve per
    stage: 40 invocations make the page 3 make, but for the digits of its numbers (37 more
    invocations' records alone would be some 10 kB)."""
    write_graph_run(store, "few", GMM1_CYCLES)
    write_graph_run(store, "many", [100 + i for i in range(40)])
    sizes = []
    for run in ("few", "many"):
        page = write_report(store, f"run:{run}", tmp_path / f"{run}.html").read_text()
        data = json.loads(page.split('id="data">')[1].split("</script>")[0])
        sizes.append(len(json.dumps(data)))
        assert [len(c["ratios"]) for c in data["curves"]["stages"]] == [6, 6]
        assert len(data["cores"]["core"]) == 3
        assert len(data["timeline"]["ts_ns"]) == 9
    assert abs(sizes[0] - sizes[1]) < 300


def test_report_draws_step_by_rank_heatmaps_of_a_job_and_a_runs_ranks(
    store: Store, tmp_path: Path, capsys
) -> None:
    from test_kernel_ranks import CONFIG, KERNEL, LAYOUT, STAGES, invocation, tasks

    # A MegaKernel run of two ranks: rank 1's GMM1 30 cycles longer in step 0 (makespan
    # 197 against 167 ns at 1 GHz), even in step 1.
    run = RunInfo.begin(run_id="ranks-report", label="ranks")
    store.write_run(run)
    for rank, step, g in ((0, 0, 100), (1, 0, 130), (0, 1, 100), (1, 1, 100)):
        ingest_buffers(
            store, [invocation(1_000 + 1_000 * step, g, 50)], LAYOUT, frequency_hz=1e9,
            run_id=run.run_id,
            kernel=KernelInfo(kernel_name=KERNEL, stage_names=STAGES, config_id=CONFIG),
            launches=Launches(rank=rank, step=step),
        )  # fmt: skip
    for rank in (0, 1):
        store.write_tasks(run.run_id, tasks(rank))
    store.write_run(run.finish())
    cli.main(["ingest-trace", "--store", str(store.root), "--job", "qwen3",
              str(shared_fixture("ascend-cluster/msinsight_st_qwen3_4rank_pp2_dp2"))])  # fmt: skip
    out = tmp_path / "r.html"
    argv = ["report", "--store", str(store.root), "--run", "label:ranks", "-o", str(out)]
    assert cli.main([*argv, "--job", "qwen3"]) == 0
    capsys.readouterr()
    dom = rendered(out)
    assert 'data-ready="1"' in dom
    assert "data-error" not in dom
    assert "Ranks of job qwen3 and run ranks-report (2 ranks) (see mcprof ranks)" in dom
    maps = re.findall(r'<svg class="heatmap" data-map="(\w+)"', dom)
    assert maps == ["step", "wait", "kernel"]
    cells = re.findall(
        r'<rect class="cell" data-step="(\d+)" data-rank="(\d+)"[^>]*fill="([^"]+)"[^>]*>'
        r"<title>([^<]+)</title>",
        dom,
    )
    by_map = dict(zip(maps, (cells[0:4], cells[4:8], cells[8:12]), strict=True))
    # The Qwen3 step: stage + preparing per rank; the wait: collective_waits (exact ns).
    assert [c[3] for c in by_map["step"]] == [
        "step 13, rank 0: 810228.500 us", "step 13, rank 1: 809636.750 us",
        "step 13, rank 2: 809992.250 us", "step 13, rank 3: 810429.000 us",
    ]  # fmt: skip
    assert [c[3] for c in by_map["wait"]] == [
        "step 13, rank 0: 318340.040 us", "step 13, rank 1: 339938.620 us",
        "step 13, rank 2: 175781.800 us", "step 13, rank 3: 159695.100 us",
    ]  # fmt: skip
    # Each cell's shade is its place between the step's fastest (white) and slowest.
    assert [c[2] for c in by_map["wait"]] == [
        "rgb(203,99,103)", "rgb(196,78,82)", "rgb(250,239,240)", "rgb(255,255,255)",
    ]  # fmt: skip
    # The run's kernel time: rank 1 the slower in step 0; an even step is all white.
    assert [(c[0], c[1], c[2], c[3]) for c in by_map["kernel"]] == [
        ("0", "0", "rgb(255,255,255)", "step 0, rank 0: 0.167 us"),
        ("0", "1", "rgb(196,78,82)", "step 0, rank 1: 0.197 us"),
        ("1", "0", "rgb(255,255,255)", "step 1, rank 0: 0.167 us"),
        ("1", "1", "rgb(255,255,255)", "step 1, rank 1: 0.167 us"),
    ]
    with pytest.raises(ExportError, match="no job 'nope'"):
        write_report(store, "label:ranks", out, job="nope")


def test_report_of_an_import_the_replay_cannot_take_says_why(store: Store, tmp_path: Path) -> None:
    # simpler's V200 sample: a task graph of dependency edges alone, which the replay
    # cannot release: the report draws everything else and says why it has no curves.
    sample = shared_fixture("import/simpler_v200_block_table_merged_swimlane.json")
    import_profile(store, [sample], format="simpler", run_id="v200")
    dom = rendered(write_report(store, "run:v200", tmp_path / "v200.html"))
    assert 'data-ready="1"' in dom
    title = re.search(r'id="curves-title"[^>]*>([^<]*)<', dom)
    assert title is not None
    assert title.group(1) == (
        "No speed-up curves: no selected invocation can be replayed: their cores counted on "
        "clocks of their own with no anchor (clock domain per_core), or their producer recorded "
        "spans that overlap on one core or a task graph of dependency edges alone, which the "
        "replay cannot chain or release (see analyze's notes)."
    )
