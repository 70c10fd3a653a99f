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

Each name is imported on first use (module ``__getattr__``), so importing the package
costs nothing and a command imports only what it uses: reading stores and traces does not
load torch, ``mcprof --help`` loads no library. The modules that extend other rooms'
classes or register SQL modules with the store are imported before the first object of
the class they extend is made (the analysis room before the first ``Store``, the export
handlers before the first capture session: ``extension.load_before_objects``), so every
store query finds them registered.
"""

from typing import TYPE_CHECKING

from multicore_profiler.extension import load_before_objects, names_on_first_use

if TYPE_CHECKING:
    # The rooms the public names come from, as static imports: for type checkers, and for
    # the import contract, which then sees that a room importing the package reaches them.
    from multicore_profiler import abi, analysis, errors, export, fuse, ingest, storage  # noqa: F401

load_before_objects("multicore_profiler.storage.store.Store", "multicore_profiler.analysis")
load_before_objects(
    "multicore_profiler.ingest.session.MegaKernelProfile", "multicore_profiler.export.handlers"
)


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

_PUBLIC = {
    "BufferLayout": "multicore_profiler.abi",
    "Change": "multicore_profiler.analysis.changes",
    "CoreType": "multicore_profiler.abi",
    "DecodedBuffers": "multicore_profiler.ingest.decode",
    "ExportedTrace": "multicore_profiler.export.files",
    "ImportedRun": "multicore_profiler.ingest.imported",
    "KernelAnalysis": "multicore_profiler.analysis.analyze",
    "KernelInfo": "multicore_profiler.ingest.step_rows",
    "KernelRules": "multicore_profiler.analysis.outer_kernel_rules",
    "Launches": "multicore_profiler.ingest.step_rows",
    "MegaKernelProfile": "multicore_profiler.ingest.session",
    "MergedTrace": "multicore_profiler.fuse.merge",
    "OuterKernelRules": "multicore_profiler.analysis.outer_kernel_rules",
    "ProfileError": "multicore_profiler.errors",
    "ProfilerAction": "multicore_profiler.ingest.schedule",
    "RecordSelection": "multicore_profiler.export.timeline",
    "RunInfo": "multicore_profiler.storage.runs",
    "RunSelector": "multicore_profiler.storage.selectors",
    "Store": "multicore_profiler.storage.store",
    "Timeline": "multicore_profiler.export.timeline",
    "TraceSource": "multicore_profiler.ingest.outer_trace",
    "analyze": "multicore_profiler.analysis.analyze",
    "chrome_trace_handler": "multicore_profiler.export.handlers",
    "decode_buffer": "multicore_profiler.ingest.decode",
    "decode_buffers": "multicore_profiler.ingest.decode",
    "export_chrome_trace": "multicore_profiler.export.chrome_trace",
    "export_perfetto_trace": "multicore_profiler.export.perfetto_trace",
    "export_trace": "multicore_profiler.export.trace_formats",
    "import_profile": "multicore_profiler.ingest.imports",
    "ingest_buffers": "multicore_profiler.ingest.buffers",
    "ingest_trace": "multicore_profiler.ingest.outer_trace",
    "mega_kernel_profile": "multicore_profiler.ingest.session",
    "merge_chrome_traces": "multicore_profiler.fuse.merge",
    "open_store": "multicore_profiler.storage.store",
    "open_timeline": "multicore_profiler.export.timeline",
    "perfetto_trace_handler": "multicore_profiler.export.handlers",
    "schedule": "multicore_profiler.ingest.schedule",
    "speedup_curves": "multicore_profiler.analysis.analyze",
    "what_if": "multicore_profiler.analysis.analyze",
}
"""Where each public name lives; it is imported from there on first use."""


__getattr__, __dir__ = names_on_first_use(__name__, _PUBLIC)
