"""``chrome_trace_handler`` and ``perfetto_trace_handler``: each window that ends writes
that window's trace, by name."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from perfetto_checker import read_perfetto_trace
from trace_checker import check_trace, load_trace

from multicore_profiler import mega_kernel_profile, schedule
from multicore_profiler.errors import ArgumentError, ExportError, StoreError
from multicore_profiler.export.handlers import (
    chrome_trace_handler,
    perfetto_trace_handler,
    trace_file_name,
)
from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route

TOKENS, HIDDEN, INTER, EXPERTS, TOP_K = 48, 16, 32, 4, 2
LAUNCHES_PER_STEP = 2


def per_launch(kernel: ReferenceMoeKernel) -> tuple[int, int]:
    """Records and dependency arrows of one launch, from its task graph: a compute record
    per task, one more per event it waits on (each wait gets an arrow) or triggers."""
    tasks = kernel.config_for(TOKENS).tasks
    waits = int((tasks["wait_event"] >= 0).sum())
    triggers = int((tasks["trigger_event"] >= 0).sum())
    return len(tasks["task_id"]) + waits + triggers, waits


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference kernel's router and expert weights, and its tokens, seeded."""
    router, w1, w2 = make_moe_weights(
        EXPERTS, HIDDEN, INTER, generator=torch.Generator().manual_seed(0)
    )
    return router, w1, w2, torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("use_gzip", [False, True])
def test_each_window_writes_its_trace(tmp_path: Path, use_gzip: bool) -> None:
    router, w1, w2, x = inputs()
    out = tmp_path / "traces"
    with (
        ReferenceMoeKernel(w1, w2, token_tile=16) as kernel,
        mega_kernel_profile(
            store=tmp_path / "store",
            schedule=schedule(wait=1, warmup=0, active=2, repeat=2),
            on_trace_ready=chrome_trace_handler(out, worker_name="w0", use_gzip=use_gzip),
        ) as prof,
    ):
        for _ in range(6):
            for _ in range(LAUNCHES_PER_STEP):
                kernel(x, *route(x, router, TOP_K))
            prof.step()
    suffix = ".gz" if use_gzip else ""
    names = [f"w0.{prof.run_id}.window{k}.pt.trace.json{suffix}" for k in (0, 1)]
    assert sorted(p.name for p in out.iterdir()) == names
    records, arrows = per_launch(kernel)
    launches = 2 * LAUNCHES_PER_STEP  # two active steps a window
    for window, (name, steps) in enumerate(zip(names, ([1, 2], [4, 5]), strict=True)):
        trace = load_trace(out / name)
        check_trace(trace)
        events = trace["traceEvents"]
        slices = [e for e in events if e["ph"] == "X"]
        tracks = {(e["pid"], e["tid"]) for e in slices}
        assert len(slices) == launches * records
        assert len([e for e in events if e["ph"] in "sf"]) == 2 * launches * arrows
        assert len([e for e in events if e["ph"] == "M"]) == 2 + 2 * len(tracks)
        summary = trace["megaKernelCycleTrace"]
        assert summary["selection"] == f"run {prof.run_id}, rank 0, window {window}"
        assert sorted({i["step"] for i in summary["invocations"]}) == steps
        assert summary["detailedTaskNames"] is False


def test_detailed_names_follow_the_session_unless_given(tmp_path: Path) -> None:
    router, w1, w2, x = inputs()
    handlers = [
        chrome_trace_handler(tmp_path / "session", worker_name="w"),
        chrome_trace_handler(tmp_path / "plain", worker_name="w", detailed_task_names=False),
    ]
    with (
        ReferenceMoeKernel(w1, w2, token_tile=16) as kernel,
        mega_kernel_profile(
            store=tmp_path / "store",
            detailed_task_names=True,
            on_trace_ready=lambda p: [handler(p) for handler in handlers],
        ) as prof,
    ):
        kernel(x, *route(x, router, TOP_K))
    for folder, detailed in (("session", True), ("plain", False)):
        trace = load_trace(tmp_path / folder / f"w.{prof.run_id}.window0.pt.trace.json")
        assert trace["megaKernelCycleTrace"]["detailedTaskNames"] is detailed


def test_a_handler_outside_a_window_refuses(tmp_path: Path) -> None:
    session = SimpleNamespace(windows=[], run_id=None)
    with pytest.raises(ExportError, match="before any capture window ended"):
        chrome_trace_handler(tmp_path)(session)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("worker", "why"),
    [
        ("../../x", "holds '/'"),
        ("a/b", "holds '/'"),
        ("..\\x", "holds '\\\\'"),
        ("w\0", "holds '\\x00'"),
        ("..", "cannot be part of a file name"),
        (".", "cannot be part of a file name"),
    ],
)
@pytest.mark.parametrize("make", [chrome_trace_handler, perfetto_trace_handler])
def test_a_worker_name_that_leaves_the_directory_is_refused_at_once(
    tmp_path: Path, make, worker: str, why: str
) -> None:
    # The name becomes part of the file name: '../../x' would write two levels above
    # dir_name. Refused when the handler is made, before any session runs; nothing created.
    with pytest.raises(ArgumentError) as refused:
        make(tmp_path / "traces", worker_name=worker)
    assert str(refused.value).startswith(f"the worker name {worker!r} {why}")
    assert list(tmp_path.iterdir()) == []


def test_trace_file_names_check_the_worker_and_the_run() -> None:
    assert trace_file_name("w0", "r1", 3, True) == "w0.r1.window3.pt.trace.json.gz"
    assert trace_file_name("w0", "r1", 3, False, "perfetto") == "w0.r1.window3.pftrace"
    with pytest.raises(ArgumentError, match=r"the worker name '\.\./w' holds '/'"):
        trace_file_name("../w", "r1", 3, False)
    with pytest.raises(StoreError, match=r"run id '\.\./r' is not valid"):
        trace_file_name("w0", "../r", 3, False)


def test_the_handler_and_the_session_mark_the_critical_path(tmp_path: Path) -> None:
    router, w1, w2, x = inputs()
    with (
        ReferenceMoeKernel(w1, w2, token_tile=16) as kernel,
        mega_kernel_profile(
            store=tmp_path / "store",
            on_trace_ready=chrome_trace_handler(tmp_path, worker_name="w", critical_path=True),
        ) as prof,
    ):
        kernel(x, *route(x, router, TOP_K))
    prof.export_chrome_trace(tmp_path / "session.json", critical_path=True)
    path = prof.store.sql(
        "SELECT count(*) AS n FROM critical_path WHERE run_id = $1 AND record_index IS NOT NULL",
        [prof.run_id],
    )
    expected = path.column("n")[0].as_py()
    for name in (f"w.{prof.run_id}.window0.pt.trace.json", "session.json"):
        trace = load_trace(tmp_path / name)
        check_trace(trace)
        events = trace["traceEvents"]
        critical = [e for e in events if e["ph"] == "X" and e["args"].get("critical") == 1]
        chain = [e for e in events if e.get("cat") == "critical_path" and e["ph"] == "s"]
        assert len(critical) == expected
        assert len(chain) == expected - 1


def test_the_perfetto_handler_writes_each_window(tmp_path: Path) -> None:
    """Each window's ``.pftrace`` and its metadata, by name; every record of the window's
    launches on a record slice, every wait's arrow a flow; ``prof.export_trace`` picks the
    format by suffix."""
    router, w1, w2, x = inputs()
    out = tmp_path / "traces"
    with (
        ReferenceMoeKernel(w1, w2, token_tile=16) as kernel,
        mega_kernel_profile(
            store=tmp_path / "store",
            schedule=schedule(wait=0, warmup=0, active=1, repeat=2),
            on_trace_ready=perfetto_trace_handler(out, worker_name="w0"),
        ) as prof,
    ):
        for _ in range(2):
            for _ in range(LAUNCHES_PER_STEP):
                kernel(x, *route(x, router, TOP_K))
            prof.step()
    suffixes = ("pftrace", "pftrace.meta.json")
    names = [f"w0.{prof.run_id}.window{k}.{end}" for k in (0, 1) for end in suffixes]
    assert sorted(p.name for p in out.iterdir()) == names
    records, arrows = per_launch(kernel)
    for window in (0, 1):
        trace = read_perfetto_trace(out / f"w0.{prof.run_id}.window{window}.pftrace")
        shown = [s for s in trace.slices if "MegaKernelInternal" in s.categories]
        assert len(shown) == LAUNCHES_PER_STEP * records
        assert len(trace.flows) == LAUNCHES_PER_STEP * arrows
    last = prof.export_trace(tmp_path / "last.pftrace")
    assert [i["step"] for i in last.metadata["invocations"]] == [1, 1]
    assert len(read_perfetto_trace(tmp_path / "last.pftrace").flows) == last.flows
