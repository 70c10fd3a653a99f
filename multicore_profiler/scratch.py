"""Temporary directories that a killed process does not leave behind for good.

A process removes its scratch directories when it is done with them, but one killed
first (SIGKILL, the OOM killer, a scheduler preempting a job) cannot: DuckDB's spill
files, an export's copy of its selection, a fused trace's store stay in ``$TMPDIR`` or
beside an output. So each directory made here holds a file, ``OWNER``, that its process
keeps locked (``flock``) while the directory is in use; the kernel drops the lock when
the process ends, however it ends. The first time a process makes a directory of a
prefix in a parent, it removes that parent's leftovers of the prefix: directories of its
own user whose ``OWNER`` it can lock, made more than ``GRACE_SECONDS`` ago (a directory
being made is unlocked for a moment). A directory without ``OWNER`` is not one of these,
and is left alone.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

OWNER = ".mcprof-owner"
"""The file in each scratch directory that its process keeps locked."""
GRACE_SECONDS = 60.0
"""How old an unlocked directory must be to count as left behind."""

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
            self._owner: int | None = os.open(
                self.path / OWNER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
            )
            fcntl.flock(self._owner, fcntl.LOCK_EX)
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


def _remove_leftovers(parent: Path, prefix: str) -> None:
    """Remove the directories of ``prefix`` in ``parent`` that a dead process left, the
    first time this process asks."""
    key = (os.getpid(), str(parent), prefix)
    with _SWEPT_LOCK:
        if key in _SWEPT:
            return
        _SWEPT.add(key)
    made_before = time.time() - GRACE_SECONDS
    user = os.getuid()
    try:
        entries = os.scandir(parent)
    except OSError:
        return  # mkdtemp will say what is wrong with the parent
    with entries:
        for entry in entries:
            try:
                ours = entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False)
                if ours and entry.stat(follow_symlinks=False).st_uid == user:
                    _remove_if_left(Path(entry.path), made_before)
            except OSError:
                continue  # removed meanwhile, or not ours to read


def _remove_if_left(path: Path, made_before: float) -> None:
    """Remove ``path`` if its ``OWNER`` is older than ``made_before`` and unlocked."""
    try:
        owner = os.open(path / OWNER, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return  # no owner file: not a scratch directory of this kind
    try:
        if os.fstat(owner).st_mtime >= made_before:
            return
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # its process is alive
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(owner)
