"""Temporary directories and files that a killed process does not leave behind for good.

A process removes its scratch directories and half-written files when it is done with
them, but one killed first (SIGKILL, the OOM killer, a scheduler preempting a job) cannot:
DuckDB's spill files, an export's copy of its selection, a fused trace's store stay in
``$TMPDIR`` or beside an output, and so does a trace written aside before its rename. So
each directory made here holds a file, ``OWNER``, that its process keeps locked
(``flock``) while the directory is in use, and a file written aside is locked itself
(``hold``); the kernel drops a lock when its process ends, however it ends. The first time
a process makes a directory of a prefix in a parent, it removes that parent's leftovers
of the prefix: directories of its own user whose ``OWNER`` it can lock, made more than
``GRACE_SECONDS`` ago (a directory being made is unlocked for a moment). A directory
without ``OWNER`` is not one of these, and is left alone. ``remove_left_files`` does the
same for files written aside.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType

OWNER = ".mcprof-owner"
"""The file in each scratch directory that its process keeps locked."""
GRACE_SECONDS = 60.0
"""How long an unlocked directory's ``OWNER``, or an unlocked file, must have gone
unwritten to count as left behind."""

_SWEPT: set[tuple[int, str, str]] = set()
"""(process, parent, prefix) whose leftovers were removed: once a process is enough."""
_SWEPT_LOCK = threading.Lock()


class ScratchDirectory:
    """A new directory ``parent/<prefix>XXXXXXXX`` (parent: the system's temporary
    directory by default), kept locked as this process's until ``remove``, or the end of
    the ``with`` block it is used in; made after removing the parent's leftovers of the
    prefix."""

    def __init__(self, prefix: str, parent: str | Path | None = None) -> None:
        where = Path(tempfile.gettempdir() if parent is None else parent)
        _remove_leftovers(where, prefix)
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
        try:
            self._owner: int | None = hold(self.path / OWNER)
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def remove(self) -> None:
        """Remove the directory and everything in it (once; later calls do nothing)."""
        if self._owner is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            os.close(self._owner)
            self._owner = None

    def __enter__(self) -> Path:
        return self.path

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.remove()


def hold(path: Path) -> int:
    """A descriptor of ``path`` (made if missing, as ``Path.touch`` makes it) that keeps it
    locked as this process's until it is closed or the process ends, where its filesystem
    takes ``flock`` (some FUSE mounts do not: there nothing is locked, and nothing is taken
    for left behind)."""
    held = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
    except OSError:
        pass
    except BaseException:
        os.close(held)
        raise
    return held


def remove_left_files(parent: Path, name: str) -> None:
    """Remove the files of ``parent`` whose names match ``name`` (a regular expression,
    matched whole) that their processes left: their user's, unlocked, and last written
    more than ``GRACE_SECONDS`` ago."""
    pattern = re.compile(name)
    made_before = time.time() - GRACE_SECONDS
    for entry in _entries(parent):
        if pattern.fullmatch(entry.name):
            with suppress(OSError), _left(Path(entry.path), made_before) as left:
                if left:
                    os.unlink(entry.path)


def _remove_leftovers(parent: Path, prefix: str) -> None:
    """Remove the directories of ``prefix`` in ``parent`` that a dead process left, the
    first time this process asks."""
    key = (os.getpid(), str(parent), prefix)
    with _SWEPT_LOCK:
        if key in _SWEPT:
            return
        _SWEPT.add(key)
    made_before = time.time() - GRACE_SECONDS
    for entry in _entries(parent):
        with suppress(OSError):  # removed meanwhile
            if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False):
                with _left(Path(entry.path) / OWNER, made_before) as left:
                    if left:
                        shutil.rmtree(entry.path, ignore_errors=True)


def _entries(parent: Path) -> list[os.DirEntry[str]]:
    """What ``parent`` holds; nothing where it cannot be listed (a directory this process
    may write but not list, or none: what makes a file there will say so)."""
    try:
        with os.scandir(parent) as entries:
            return list(entries)
    except OSError:
        return []


@contextmanager
def _left(owner: Path, made_before: float) -> Iterator[bool]:
    """Whether ``owner`` is a plain file of this user, last written before ``made_before``
    and locked by no process; if so, locked by this one for the block."""
    try:
        held = os.open(owner, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        yield False  # gone, or no file of this kind (a directory without OWNER)
        return
    try:
        found = os.fstat(held)
        mine = stat.S_ISREG(found.st_mode) and found.st_uid == os.getuid()
        if not mine or found.st_mtime >= made_before:
            yield False
            return
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False  # its process is alive, or its filesystem takes no lock
            return
        yield True
    finally:
        os.close(held)
