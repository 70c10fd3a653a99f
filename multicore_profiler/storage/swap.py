"""Replacing files under readers' feet without their noticing.

Queries hold a shared lock on the store while they glob and read files; a
compaction takes the lock alone for the instant in which it renames merged files
into place and unlinks the ones they replace. So a query sees either every old file
or every new one, never both and never neither. The swap is journaled first: if
the compaction dies half-way, the next reader finishes it before querying.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from multicore_profiler.errors import StoreError
from multicore_profiler.storage.location import store_write
from multicore_profiler.storage.partitions import fsync_dir

LOCK_FILE = ".mcprof.lock"
JOURNAL_DIR = "_journal"


class StoreLock:
    """A store-wide reader/writer lock (``flock``), shared by queries, taken alone by swaps.

    Writers that only add new files need no lock: a new file is whole from the moment
    it has its name.
    """

    def __init__(self, root: Path) -> None:
        self._path = root / LOCK_FILE

    @contextmanager
    def _held(self, mode: int) -> Iterator[None]:
        """Hold the lock in ``mode``. A user who cannot write the store opens the lock file
        read-only (the store made it when it was created): flock works on either. A lock
        file that cannot be opened at all is a ``StoreError`` naming it."""
        with store_write(f"open the store's lock file {self._path}"):
            try:
                fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError:  # a read-only store (EACCES, EROFS)
                fd = os.open(self._path, os.O_RDONLY)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)

    def shared(self) -> AbstractContextManager[None]:
        """Held by a query for as long as it lists and reads files."""
        return self._held(fcntl.LOCK_SH)

    def exclusive(self) -> AbstractContextManager[None]:
        """Held by a swap (or its recovery) while it renames and unlinks files."""
        return self._held(fcntl.LOCK_EX)


def pending(root: Path) -> list[Path]:
    """Journals of swaps that were started and not finished."""
    directory = root / JOURNAL_DIR
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


def _apply(root: Path, journal: Path) -> None:
    entry = json.loads(journal.read_text())
    directories = set()
    for staged, final in entry["staged"]:
        staged_path, final_path = root / staged, root / final
        if staged_path.exists():
            os.replace(staged_path, final_path)
        directories.add(final_path.parent)
    for replaced in entry["replaced"]:
        path = root / replaced
        path.unlink(missing_ok=True)
        directories.add(path.parent)
    for directory in directories:
        fsync_dir(directory)
    journal.unlink()
    fsync_dir(journal.parent)


def swap(
    root: Path, lock: StoreLock, staged: list[tuple[Path, Path]], replaced: list[Path]
) -> None:
    """Rename each staged file to its final path and unlink ``replaced``, as one step for readers.

    Staged files must be complete and durable; paths are inside ``root``.
    """
    directory = root / JOURNAL_DIR
    directory.mkdir(exist_ok=True)
    entry = {
        "staged": [[str(s.relative_to(root)), str(f.relative_to(root))] for s, f in staged],
        "replaced": [str(p.relative_to(root)) for p in replaced],
    }
    journal = directory / f"swap-{uuid.uuid4().hex}.json"
    aside = journal.with_suffix(".tmp")
    with lock.exclusive():
        with open(aside, "w") as sink:
            json.dump(entry, sink)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(aside, journal)
        fsync_dir(directory)
        _apply(root, journal)


def recover(root: Path, lock: StoreLock) -> None:
    """Finish the swaps a dead compaction left half done."""
    try:
        with lock.exclusive():
            for journal in pending(root):
                _apply(root, journal)
    except PermissionError as exc:
        raise StoreError(
            f"the store at {root} has an unfinished compaction that needs write access to "
            f"finish ({exc}); run 'mcprof compact' as a user who can write the store"
        ) from exc
