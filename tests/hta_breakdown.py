"""Per-kernel GPU breakdown of one kineto trace, as Holistic Trace Analysis (HTA, ``hta``) sees it.

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
from pathlib import Path


def gpu_kernel_breakdown(trace_path: Path) -> dict[str, tuple[int, int]]:
    """Return ``{kernel name: (launch count, summed duration in µs)}`` computed by HTA."""
    from hta.common.trace import Trace  # slow import; only pay for it when used

    # HTA logs warnings (ns rounding, no ProfilerStep) and trips pandas deprecations: mute both.
    trace_path = Path(trace_path).resolve()
    suffix = ".json.gz" if trace_path.name.endswith(".gz") else ".json"
    hta_logger = logging.getLogger("hta")
    saved_level = hta_logger.level
    hta_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="hta-") as tmp:
            warnings.simplefilter("ignore")
            link = Path(tmp) / f"rank0{suffix}"
            link.symlink_to(trace_path)
            trace = Trace(trace_files={0: str(link)}, trace_dir=tmp)
            trace.parse_traces(use_multiprocessing=False, use_memory_profiling=False)
            df = trace.get_trace(0)
    finally:
        hta_logger.setLevel(saved_level)

    kernel_id = trace.symbol_table.get_sym_id_map().get("kernel")
    if kernel_id is None:
        return {}
    names = trace.symbol_table.get_sym_table()
    grouped = df[df["cat"] == kernel_id].groupby("name")["dur"].agg(["count", "sum"])
    return {names[int(i)]: (int(row["count"]), int(row["sum"])) for i, row in grouped.iterrows()}
