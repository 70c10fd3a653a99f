"""multicore_profiler: intra-kernel profiles of MegaKernels in a Parquet store queried with SQL.

The public API: the capture session (``mega_kernel_profile``, ``schedule``,
``ProfilerAction``), ``open_store`` (and ``Store``), the device buffer decoder
(``BufferLayout``, ``decode_buffer``, ``decode_buffers``), ``ingest_buffers`` to write
decoded launches as a step of a run, ``export_trace`` for timelines of the store's
records as Chrome JSON or Perfetto protobuf (``export_chrome_trace`` and
``export_perfetto_trace`` for one format; ``RecordSelection``, ``open_timeline`` and
``Timeline`` underneath; ``chrome_trace_handler`` and ``perfetto_trace_handler`` for
``on_trace_ready``), ``ingest_trace`` to load torch.profiler / kineto and torch_npu
traces into the store, ``import_profile`` for other intra-kernel profilers' files
(Proton, FlashInfer, MPK, Triton-distributed, HazyResearch, simpler),
``merge_chrome_traces`` to fuse a MegaKernel's tracks into such a trace,
``OuterKernelRules`` (alias ``KernelRules``) for the outer-kernel views of those traces
(``Store.use_kernel_rules``), ``RunInfo``, ``RunSelector`` (which runs a listing or
comparison is about), ``analyze``, ``what_if`` and ``speedup_curves`` (where a kernel's
time goes: per-core breakdown, wait attribution, critical path, and what a faster stage
would buy; ``Change`` for what-if changes), and ``ProfileError``, the base of every
error raised on bad input. ``analyze``, the trace exporters, ``open_timeline`` and
``merge_chrome_traces`` take ``clock_correction=True`` to correct each core's clock from
its records' causality first (docs/clocks.md). Kernel authors find specs, RuntimeConfig and
the launch hook in ``multicore_profiler.kernels``.

The capture session needs torch, so it is imported on first use: reading stores and
traces does not load torch.
"""

from importlib import import_module
from typing import Any

# Every room is imported here, so the SQL modules of analysis are registered and the
# methods higher rooms give lower rooms' classes (extension.py) are in place before use.
from multicore_profiler.abi import BufferLayout, CoreType
from multicore_profiler.analysis.analyze import KernelAnalysis, analyze, speedup_curves, what_if
from multicore_profiler.analysis.changes import Change
from multicore_profiler.analysis.outer_kernel_rules import KernelRules, OuterKernelRules
from multicore_profiler.errors import ProfileError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.export.files import ExportedTrace
from multicore_profiler.export.handlers import chrome_trace_handler, perfetto_trace_handler
from multicore_profiler.export.perfetto_trace import export_perfetto_trace
from multicore_profiler.export.timeline import RecordSelection, Timeline, open_timeline
from multicore_profiler.export.trace_formats import export_trace
from multicore_profiler.fuse.merge import MergedTrace, merge_chrome_traces
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.decode import DecodedBuffers, decode_buffer, decode_buffers
from multicore_profiler.ingest.imported import ImportedRun
from multicore_profiler.ingest.imports import import_profile
from multicore_profiler.ingest.outer_trace import TraceSource, ingest_trace
from multicore_profiler.ingest.schedule import ProfilerAction, schedule
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.selectors import RunSelector
from multicore_profiler.storage.store import Store, open_store

__all__ = [
    "BufferLayout",
    "Change",
    "CoreType",
    "DecodedBuffers",
    "ExportedTrace",
    "ImportedRun",
    "KernelAnalysis",
    "KernelInfo",
    "KernelRules",
    "Launches",
    "MegaKernelProfile",
    "MergedTrace",
    "OuterKernelRules",
    "ProfileError",
    "ProfilerAction",
    "RecordSelection",
    "RunInfo",
    "RunSelector",
    "Store",
    "Timeline",
    "TraceSource",
    "analyze",
    "chrome_trace_handler",
    "decode_buffer",
    "decode_buffers",
    "export_chrome_trace",
    "export_perfetto_trace",
    "export_trace",
    "import_profile",
    "ingest_buffers",
    "ingest_trace",
    "mega_kernel_profile",
    "merge_chrome_traces",
    "open_store",
    "open_timeline",
    "perfetto_trace_handler",
    "schedule",
    "speedup_curves",
    "what_if",
]

_ON_FIRST_USE = {
    "MegaKernelProfile": "multicore_profiler.ingest.session",
    "mega_kernel_profile": "multicore_profiler.ingest.session",
}


def __getattr__(name: str) -> Any:
    if name in _ON_FIRST_USE:
        return getattr(import_module(_ON_FIRST_USE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
