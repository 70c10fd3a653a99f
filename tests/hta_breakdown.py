"""Per-kernel GPU breakdown of one kineto trace, as Holistic Trace Analysis (HTA, ``hta``) sees it.

``trace_analysis_breakdown`` is HTA's own ``get_gpu_kernel_breakdown`` (two DataFrames, to compare
two traces with); ``gpu_kernel_breakdown`` gives exact per-name counts and sums, as below.

Used as an independent oracle for the fusion tests. Approach: the trace is symlinked into a
temporary directory as ``rank0.json[.gz]`` (HTA reads ``.json`` and ``.json.gz`` itself), parsed by
HTA's own parser (``hta.common.trace.Trace.parse_traces``), and the parsed DataFrame
``Trace.get_trace(0)`` is filtered to events of category ``kernel`` and grouped by name.

Why not ``TraceAnalysis.get_gpu_kernel_breakdown()``: its per-kernel frame has no launch count,
folds the tail into an "others" row (``num_kernels`` / ``duration_ratio``), mixes memcpy/memset
into the kernels (it takes every event with a stream), drops kernels of type OTHER, and runs on the
trace ``TraceAnalysis`` has already cut to whole profiler steps (on a100_training_rank0 it keeps
4,300 of the 6,080 kernels, 5,375 with ``include_last_profiler_step=True``).

Durations are HTA's: for traces with fractional-µs timestamps HTA rounds ``ts`` up and
``ts + dur`` down to whole µs, so a kernel's duration is ``floor(ts + dur) - ceil(ts)``; for
integer-µs traces they are the raw values.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def rank0_dir(trace_path: Path) -> Iterator[Path]:
    """A temporary trace directory holding ``trace_path`` as rank 0, HTA's logging and
    pandas' warnings muted."""
    trace_path = Path(trace_path).resolve()
    suffix = ".json.gz" if trace_path.name.endswith(".gz") else ".json"
    hta_logger = logging.getLogger("hta")
    saved_level = hta_logger.level
    hta_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="hta-") as tmp:
            warnings.simplefilter("ignore")
            (Path(tmp) / f"rank0{suffix}").symlink_to(trace_path)
            yield Path(tmp)
    finally:
        hta_logger.setLevel(saved_level)


def trace_analysis_breakdown(trace_path: Path) -> tuple[Any, Any]:
    """HTA's own ``TraceAnalysis.get_gpu_kernel_breakdown()`` of one trace: the per kernel
    type and the per kernel DataFrames."""
    from hta.trace_analysis import TraceAnalysis

    with rank0_dir(trace_path) as directory:
        analysis = TraceAnalysis(trace_dir=str(directory))
        return analysis.get_gpu_kernel_breakdown(visualize=False)


def gpu_kernel_breakdown(trace_path: Path) -> dict[str, tuple[int, int]]:
    """Return ``{kernel name: (launch count, summed duration in µs)}`` computed by HTA."""
    from hta.common.trace import Trace  # slow import; only pay for it when used

    with rank0_dir(trace_path) as directory:
        link = next(directory.iterdir())
        trace = Trace(trace_files={0: str(link)}, trace_dir=str(directory))
        trace.parse_traces(use_multiprocessing=False, use_memory_profiling=False)
        df = trace.get_trace(0)

    kernel_id = trace.symbol_table.get_sym_id_map().get("kernel")
    if kernel_id is None:
        return {}
    names = trace.symbol_table.get_sym_table()
    grouped = df[df["cat"] == kernel_id].groupby("name")["dur"].agg(["count", "sum"])
    return {names[int(i)]: (int(row["count"]), int(row["sum"])) for i, row in grouped.iterrows()}
