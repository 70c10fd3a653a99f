"""The HTML report, opened in a real headless Chromium: it draws without script errors and
shows the stages, one lane per worker of the invocation, and the comparison."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from simulated_runs import write_run

from multicore_profiler import cli
from multicore_profiler.errors import ExportError
from multicore_profiler.export.report import write_report
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.store import Store

DATA = Path(__file__).parent / "data"


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


def test_report_draws_each_steps_time_breakdown_as_a_stacked_bar(
    store: Store, tmp_path: Path, capsys
) -> None:
    write_run(store, SimulatedMoeKernel(experts=2, tiles=2), seed=1, commit="abcd")
    npu = DATA / "torchnpu_imagenet_2025_L0_rank0_trace_view.json.gz"
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
    ingest_trace(store, DATA / "a100_triton_example.json.gz", label="triton")
    with pytest.raises(ExportError, match="label:triton have no step to break down"):
        write_report(store, "commit:abcd", out, traces="label:triton")
