"""Handlers for ``mega_kernel_profile(on_trace_ready=...)`` that write each window's trace
(Chrome JSON or Perfetto protobuf), and the session's ``export_chrome_trace`` and
``export_trace``.

Like ``torch.profiler.tensorboard_trace_handler``: the capture session calls the handler
each time a recording window ends, and the handler exports that window. The handler comes
from ``export`` and is handed to the session, so the session never imports the exporter.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from multicore_profiler.errors import ArgumentError, ExportError, SessionError
from multicore_profiler.export.files import ExportedTrace, check_output, file_name_part
from multicore_profiler.export.timeline import RecordSelection
from multicore_profiler.export.trace_formats import export_trace
from multicore_profiler.extension import extend
from multicore_profiler.storage.partitions import check_run_id
from multicore_profiler.storage.store import Store


class _Window(Protocol):
    @property
    def index(self) -> int: ...


class ProfiledSession(Protocol):
    """What a handler reads of the capture session (``MegaKernelProfile``)."""

    @property
    def store(self) -> Store: ...

    run_id: str | None
    rank: int
    windows: Sequence[_Window]
    detailed_task_names: bool


_SUFFIXES = {"json": ".pt.trace.json", "perfetto": ".pftrace"}


def trace_file_name(
    worker_name: str, run_id: str, window: int, use_gzip: bool, format: str = "json"
) -> str:
    """``<worker>.<run>.window<k>.pt.trace.json`` (``.pftrace`` for Perfetto; ``.gz`` added
    when gzipped). ``ArgumentError`` for a worker name that would leave the directory (a
    separator, ``..``, NUL), ``StoreError`` for a run id that is not one."""
    worker = file_name_part(worker_name, "the worker name")
    name = f"{worker}.{check_run_id(run_id)}.window{window}{_SUFFIXES[format]}"
    return name + (".gz" if use_gzip else "")


def chrome_trace_handler(
    dir_name: str | os.PathLike[str],
    *,
    worker_name: str | None = None,
    use_gzip: bool = False,
    detailed_task_names: bool | None = None,
    critical_path: bool = False,
) -> Callable[[ProfiledSession], ExportedTrace]:
    """A handler that writes the Chrome Trace of each window that ends (that rank's records
    of the window) to ``dir_name/<worker>.<run>.window<k>.pt.trace.json[.gz]``.

    ``worker_name`` defaults to ``<host>_<pid>``, as torch's handler does; names are
    detailed if the session asked for it (or ``detailed_task_names`` says so);
    ``critical_path`` marks each invocation's critical path (see ``export_chrome_trace``). The
    directory is created if missing. A ``worker_name`` that would put the file elsewhere (a
    separator, ``..``, NUL) and a directory inside a store are an ``ArgumentError`` at
    once. The handler raises
    ``ExportError`` when it is called before any window ended (not from a session) or the
    trace cannot be written.
    """
    return _window_handler(
        "json", dir_name, worker_name, use_gzip, detailed_task_names, critical_path
    )


def perfetto_trace_handler(
    dir_name: str | os.PathLike[str],
    *,
    worker_name: str | None = None,
    use_gzip: bool = False,
    detailed_task_names: bool | None = None,
    critical_path: bool = False,
) -> Callable[[ProfiledSession], ExportedTrace]:
    """``chrome_trace_handler`` for Perfetto's protobuf: each window's trace goes to
    ``dir_name/<worker>.<run>.window<k>.pftrace[.gz]``, with its ``.meta.json`` beside it."""
    return _window_handler(
        "perfetto", dir_name, worker_name, use_gzip, detailed_task_names, critical_path
    )


def _window_handler(
    format: str,
    dir_name: str | os.PathLike[str],
    worker_name: str | None,
    use_gzip: bool,
    detailed_task_names: bool | None,
    critical_path: bool,
) -> Callable[[ProfiledSession], ExportedTrace]:
    """A handler that writes each window's trace in ``format`` under ``dir_name``."""
    directory = Path(dir_name)
    try:
        check_output(directory)
    except ValueError as exc:
        raise ArgumentError(f"cannot write traces to {directory}: {exc}") from None
    worker = file_name_part(
        worker_name or f"{socket.gethostname()}_{os.getpid()}",
        "the worker name",
    )

    def handler(session: ProfiledSession) -> ExportedTrace:
        if not session.windows or session.run_id is None:
            raise ExportError("the trace handler ran before any capture window ended")
        window = session.windows[-1].index
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ExportError(f"cannot create {directory}: {exc.strerror or exc}") from None
        return _export_last_window(
            session,
            directory / trace_file_name(worker, session.run_id, window, use_gzip, format),
            format,
            detailed_task_names,
            critical_path,
        )

    return handler


@extend("multicore_profiler.ingest.session.MegaKernelProfile", name="export_chrome_trace")
def export_last_window(
    session: ProfiledSession,
    path: str | os.PathLike[str],
    *,
    detailed_task_names: bool | None = None,
    critical_path: bool = False,
) -> ExportedTrace:
    """``prof.export_chrome_trace(path)``, as torch.profiler's: write the Chrome Trace of
    the last window that ended (this rank's records) to ``path``; names are detailed if
    the session asked for it (or ``detailed_task_names`` says so), and ``critical_path``
    marks each invocation's critical path. ``SessionError`` before any window ended."""
    return _export_last_window(session, Path(path), "json", detailed_task_names, critical_path)


@extend("multicore_profiler.ingest.session.MegaKernelProfile", name="export_trace")
def export_last_window_trace(
    session: ProfiledSession,
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    detailed_task_names: bool | None = None,
    critical_path: bool = False,
) -> ExportedTrace:
    """``prof.export_trace(path)``: ``prof.export_chrome_trace`` in the format ``format``
    names, else the one the file's suffix asks for (``.pftrace``: Perfetto's protobuf)."""
    return _export_last_window(session, Path(path), format, detailed_task_names, critical_path)


def _export_last_window(
    session: ProfiledSession,
    path: Path,
    format: str | None,
    detailed_task_names: bool | None,
    critical_path: bool,
) -> ExportedTrace:
    """The trace of the session's last window that ended, of its rank, at ``path``
    (``SessionError`` before any window ended)."""
    if not session.windows:
        raise SessionError(
            "no capture window has ended yet: call step() past a window's last active "
            "step, or leave the session"
        )
    return export_trace(
        session.store,
        path,
        RecordSelection(run=session.run_id, rank=session.rank, window=session.windows[-1].index),
        format=format,
        detailed_task_names=(
            session.detailed_task_names if detailed_task_names is None else detailed_task_names
        ),
        critical_path=critical_path,
    )
