"""Trace files written aside and renamed into place: no reader sees half a trace, and a
failure leaves no file behind and an older one at the path as it was; the file is written
out to disk behind its writer, so that the rename waits for little (``_written_out_behind``);
what a trace writer reports it wrote (``ExportedTrace``); the checks of an output, which may
not lie inside a store or be an input (``check_output``), and of a name that becomes part of
a file name (``file_name_part``)."""

from __future__ import annotations

import functools
import gzip
import os
import re
import stat
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from multicore_profiler.errors import ArgumentError, ExportError, ProfileError
from multicore_profiler.scratch import hold, remove_left_files
from multicore_profiler.storage.location import MARKER, special_file


@dataclass(frozen=True)
class ExportedTrace:
    """What a trace writer wrote: where, how many events, and the trace's
    ``megaKernelCycleTrace`` object; ``flows`` counts the dependency arrows, and
    ``critical_flows`` the critical path's chain (with ``critical_path``). ``events`` counts
    what the format counts: JSON's events, Perfetto's track events."""

    path: Path
    events: int
    records: int
    flows: int
    metadata: dict[str, Any] = field(repr=False)
    critical_flows: int = 0


_SEPARATORS = ("/", "\\", "\0")
"""What a file name part may not hold: a directory separator (POSIX's or Windows', wherever
the files are read later) or NUL, which ends a path."""


def file_name_part(name: str, what: str) -> str:
    """``name`` if it can become part of a file name in a given directory and stay there:
    not empty, not ``.`` or ``..``, without a separator or NUL; else ``ArgumentError``
    naming ``what`` it is."""
    if not isinstance(name, str):
        raise ArgumentError(f"{what} must be a string, got {name!r}")
    bad = next((c for c in _SEPARATORS if c in name), None)
    if bad is not None:
        raise ArgumentError(
            f"{what} {name!r} holds {bad!r}: it becomes part of a file name, so it may hold "
            "no directory separator and no NUL"
        )
    if name in ("", ".", ".."):
        raise ArgumentError(f"{what} {name!r} cannot be part of a file name")
    return name


def store_holding(path: Path) -> Path | None:
    """The store directory ``path`` lies in (``path`` itself or the nearest of its
    directories that holds a store's marker), symlinks and ``..`` resolved; None if none."""
    resolved = path.resolve()
    return next((d for d in (resolved, *resolved.parents) if (d / MARKER).is_file()), None)


def check_output(path: Path, inputs: Iterable[Path] = ()) -> None:
    """Refuse (``ValueError``, saying why) an output ``path`` inside a store, whichever
    store: a file written there would be taken for the store's data or replace it, and a
    store's files change only through its commits. Refuse one that is also one of the
    ``inputs`` (the same file by another name too: symlinks, ``..``, hard links)."""
    store = store_holding(path)
    if store is not None:
        raise ValueError(
            f"it is inside the store at {store}, whose files change only through its "
            "commits; give a path outside it"
        )
    resolved = path.resolve()
    for given in inputs:
        if given.resolve() == resolved or (
            path.exists() and given.exists() and os.path.samefile(path, given)
        ):
            raise ValueError(f"it is the command's input {given}; give another path")


def gzipped(path: Path) -> bool:
    """Whether a trace at ``path`` is written gzipped: its name ends in ``.gz``, in any case."""
    return path.suffix.lower() == ".gz"


@contextmanager
def written_aside(path: Path, error: type[ProfileError], what: str) -> Iterator[Path]:
    """The hidden path beside ``path`` to write; renamed to ``path`` when the block ends.

    The hidden file is created on entry, before the block does any work, so a path that
    cannot be written (a missing or read-only directory, an existing directory or device,
    a path inside a store: ``check_output``) fails first. An ``OSError`` becomes ``error``
    ("cannot write <what> to <path>: ..."). The hidden file stays locked as this process's
    while it is written (``scratch.hold``), and the hidden files of ``path`` that killed
    processes left are removed first.
    """
    try:
        check_output(path)
        _check_target(path)
        aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        remove_left_files(path.parent, rf"\.{re.escape(path.name)}\.[0-9]+\.tmp")
        held = hold(aside)
    except OSError as exc:
        raise error(f"cannot write {what} to {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise error(f"cannot write {what} to {path}: {exc}") from None
    try:
        with _written_out_behind(aside):
            yield aside
        os.replace(aside, path)
    except OSError as exc:
        aside.unlink(missing_ok=True)
        raise error(f"cannot write {what} to {path}: {exc.strerror or exc}") from exc
    except BaseException:
        aside.unlink(missing_ok=True)
        raise
    finally:
        os.close(held)


WRITE_BEHIND_SECONDS = 0.25
"""How often a file written aside has what was written since started out to disk."""


class _SyncFileRange(Protocol):
    def __call__(self, fd: int, offset: int, nbytes: int, flags: int) -> int: ...


_SYNC_FILE_RANGE_WRITE = 2
"""``sync_file_range``'s flag that starts the write-out of dirty pages and waits for none."""


@functools.cache
def _sync_file_range() -> _SyncFileRange | None:
    """Linux's ``sync_file_range`` from the C library (``os`` does not offer it); None
    elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    call = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if call is None:
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


@contextmanager
def _written_out_behind(aside: Path) -> Iterator[None]:
    """While the block writes ``aside``, a thread starts the disk write of its new pages
    every ``WRITE_BEHIND_SECONDS`` (``sync_file_range``, which queues the write-out and
    waits for none of it), so the disk works while the writer renders.

    Why: renaming a file over an existing one makes ext4 write the new file out first
    (``auto_da_alloc``, so a crash leaves one of the two whole), and the rename then waits
    for every byte not yet on disk: about 0.7 s per gigabyte on a virtual disk, which a
    re-export to the same path paid after its work was done. Written behind, the rename
    waits for the last quarter second's bytes only. An optimisation only: where the call
    is missing (not Linux) or fails, the file is written as before."""
    sync = _sync_file_range()
    if sync is None:
        yield
        return
    done = threading.Event()

    def write_out() -> None:
        try:
            fd = os.open(aside, os.O_RDONLY)
        except OSError:
            return
        try:
            while not done.wait(WRITE_BEHIND_SECONDS):
                sync(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
        finally:
            os.close(fd)

    thread = threading.Thread(target=write_out, name="mcprof-write-behind", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextmanager
def aside_sink(aside: Path, gz: bool) -> Iterator[BinaryIO]:
    """``aside`` (a ``written_aside`` path) open to write from its start, gzipped when
    ``gz``. An empty file, as a first pass finds it, is not truncated: ext4 writes a file
    out to disk when it is closed after a truncation (``auto_da_alloc``), about a third of
    a second per gigabyte that a file written aside and renamed has no need of."""
    with open(aside, "r+b") as sink:
        if os.fstat(sink.fileno()).st_size:
            sink.truncate()
        if not gz:
            yield sink
            return
        with gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=6) as zipped:
            yield zipped


def _check_target(path: Path) -> None:
    """Refuse a ``path`` that renaming a file onto would break or replace wrongly: an
    existing directory, device, FIFO or socket (``ValueError``), or one whose directory is
    missing (``OSError``)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        parent = path.parent
        if not parent.is_dir():
            raise OSError(
                2, f"No such file or directory (the directory {parent} does not exist)"
            ) from None
        return
    if stat.S_ISDIR(mode):
        raise ValueError("it is a directory; give a file name")
    kind = special_file(mode)
    if kind is not None:
        raise ValueError(f"it exists and is {kind}, not a regular file")


def save_figure(figure: Any, path: Path) -> Path:
    """Write a matplotlib figure to ``path`` in the format its suffix names (PNG without
    one), aside then renamed; ``ExportError`` for a format matplotlib does not write."""
    kind = path.suffix.lstrip(".").lower() or "png"
    if kind not in figure.canvas.get_supported_filetypes():
        raise ExportError(f"cannot draw {path}: {kind!r} is not an image format matplotlib writes")
    with written_aside(path, ExportError, "the picture") as aside:
        figure.savefig(aside, format=kind, dpi=110)
    return path
