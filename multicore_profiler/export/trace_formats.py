"""One trace writer per format, chosen by name or by the file's suffix: Chrome JSON
(``chrome_trace``) and Perfetto's protobuf (``perfetto_trace``), each rendering the same
``Timeline`` of a ``RecordSelection``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from multicore_profiler.errors import ExportError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.export.files import ExportedTrace
from multicore_profiler.export.perfetto_trace import export_perfetto_trace
from multicore_profiler.export.timeline import RecordSelection
from multicore_profiler.storage.store import Store

TRACE_FORMATS: dict[str, Callable[..., ExportedTrace]] = {
    "json": export_chrome_trace,
    "perfetto": export_perfetto_trace,
}
"""The writers by format name."""
PERFETTO_SUFFIXES = (".pftrace", ".pftrace.gz", ".perfetto-trace", ".perfetto-trace.gz")
"""File names that ask for Perfetto's protobuf; any other name gets Chrome JSON."""


def trace_format(path: str | os.PathLike[str], format: str | None = None) -> str:
    """The format a trace at ``path`` is written in: ``format`` when given (``ExportError``
    for one no writer has), else ``perfetto`` for ``PERFETTO_SUFFIXES`` and ``json``
    otherwise."""
    if format is not None:
        if format not in TRACE_FORMATS:
            raise ExportError(
                f"no trace format {format!r}: choose one of {', '.join(TRACE_FORMATS)}"
            )
        return format
    return "perfetto" if Path(path).name.lower().endswith(PERFETTO_SUFFIXES) else "json"


def export_trace(
    store: Store,
    path: str | os.PathLike[str],
    selection: RecordSelection | None = None,
    *,
    format: str | None = None,
    detailed_task_names: bool = False,
    critical_path: bool = False,
    clock_correction: bool = False,
) -> ExportedTrace:
    """Write the trace of ``selection`` (default: the latest run) to ``path`` in the format
    ``trace_format`` picks, with the writer's names, ``critical_path`` marks and
    ``clock_correction``; return what was written."""
    writer = TRACE_FORMATS[trace_format(path, format)]
    return writer(
        store,
        path,
        selection=selection,
        detailed_task_names=detailed_task_names,
        critical_path=critical_path,
        clock_correction=clock_correction,
    )
