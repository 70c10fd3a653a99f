"""The record of verified files: which files of a local store passed their checks (every
page against its checksum, the schema against its table's), so that a new ``Store``, as
every ``mcprof`` command opens, trusts an unchanged file without reading it again and
checks only the files that are new or changed.

A file is vouched for by its stamp, taken before it was read: size, modification and
change times (ns) and inode. Any write to a file, a rename onto it or a new file at its
path gives it a change time later than that, which no user can set back; a file is
recorded only when its check began more than ``RACY_NS`` after its last change, so that
even a file system with coarse times gives any later change another time. A record of a
file removed or rewritten (a compaction, ``mcprof gc``, by hand) never vouches for what
is at its path afterwards. A file that fails its checks is dropped from the record.

The record, ``.mcprof.verified`` (a Parquet file) at the store's root, is rewritten whole (aside,
then renamed) under its own lock, merged with what other processes recorded meanwhile;
the entries of files that a listing of the whole store no longer finds are dropped. A
store this process cannot write keeps no record of its checks: each command checks the
files it reads. A remote store needs none: its files are read as pyarrow datasets,
which verify each page as they read it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections import Counter
from collections.abc import Collection, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from multicore_profiler.storage.arrow_values import column, strings
from multicore_profiler.storage.catalog import RACY_NS

RECORD = ".mcprof.verified"
RECORD_LOCK = ".mcprof.verified.lock"
RECORD_ASIDE = f"{RECORD}.tmp"
RECORD_FILES = (RECORD, RECORD_LOCK, RECORD_ASIDE)
"""The record's files at the store's root: no data, never checked as data."""

_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("size", pa.int64()),
        ("mtime_ns", pa.int64()),
        ("ctime_ns", pa.int64()),
        ("inode", pa.uint64()),
        ("current", pa.bool_()),
        ("checked_ns", pa.int64()),
    ]
)
"""One row per file: its path relative to the store, its stamp, whether it has every
column of its table at its type (see ``Store.verified_file``), when its check began."""

_NONE = pa.Table.from_batches([], _SCHEMA)
"""The record of no file (made from no batches: ``Schema.empty_table`` imports pandas)."""

Stamp = tuple[int, int, int, int]
"""A file's size, modification time, change time (ns) and inode."""


def stamp(path: str) -> Stamp:
    """The stamp of the file at ``path`` now (``FileNotFoundError`` if none)."""
    found = os.stat(path)
    return (found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_ino)


class VerifiedRecord:
    """A local store's record of verified files, as one ``Store`` reads and adds to it."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._prefix = f"{str(root).rstrip('/')}/"
        self._read_as: Stamp | None = None
        self._table = _NONE
        self._by_path: dict[str, tuple[Stamp, bool]] | None = None
        """``_table``'s rows by path: each file's stamp and whether it is current."""
        self._passed: dict[str, tuple[Stamp, bool, int]] = {}
        self._failed: set[str] = set()
        self._listing: tuple[Collection[str], int] | None = None

    def vouched(self, paths: Sequence[str]) -> dict[str, bool]:
        """Those of ``paths`` (as the filesystem names them) whose stamp the record holds
        now, each with whether its schema is current."""
        entries = self._entries()
        found = {}
        for path in paths:
            entry = entries.get(path.removeprefix(self._prefix))
            if entry is None:
                continue
            try:
                now = stamp(path)
            except FileNotFoundError:
                continue
            if now == entry[0]:
                found[path] = entry[1]
        return found

    def files_per_table(self) -> Counter[str]:
        """How many files of each table the record holds now (files removed since
        included, until a save drops them): a store's size without a listing."""
        return Counter(path.partition("/")[0] for path in self._entries())

    @staticmethod
    def before(path: str) -> tuple[Stamp, int]:
        """The stamp of a file about to be checked, and when its check begins."""
        return stamp(path), time.time_ns()

    def passed(self, path: str, before: tuple[Stamp, int], current: bool) -> None:
        """Record that the file at ``path``, stamped ``before`` its check, passed it."""
        found, began = before
        if began - found[2] > RACY_NS:
            self._passed[path.removeprefix(self._prefix)] = (found, current, began)
            self._failed.discard(path.removeprefix(self._prefix))

    def failed(self, path: str) -> None:
        """Drop the file at ``path``, which failed its checks, from the record."""
        relative = path.removeprefix(self._prefix)
        self._passed.pop(relative, None)
        self._failed.add(relative)

    def listed(self, paths: Collection[str], since_ns: int) -> None:
        """Every data file of the store, as a listing begun at ``since_ns`` found them:
        the next ``save`` drops the entries of other files checked before it."""
        self._listing = ({p.removeprefix(self._prefix) for p in paths}, since_ns)

    def save(self) -> None:
        """Merge what this process checked since into the store's record, if anything. A
        store that cannot be written (read-only, full) keeps its record as it was."""
        if not self._passed and not self._failed:
            return
        passed, failed, listing = self._passed, self._failed, self._listing
        self._passed, self._failed, self._listing = {}, set(), None
        aside = self._root / RECORD_ASIDE
        try:
            fd = os.open(self._root / RECORD_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return
        try:
            import pyarrow.compute as pc  # only a process that checked files saves

            fcntl.flock(fd, fcntl.LOCK_EX)
            self._read_as = None  # what other processes saved meanwhile
            table = self._read()
            changed = strings([*passed, *failed])
            keep = pc.invert(pc.is_in(table["path"], value_set=changed))
            if listing is not None:
                paths, since = listing
                seen = pc.is_in(table["path"], value_set=strings(list(paths)))
                since_ns = column([since], pa.int64())[0]  # a Python int would import pandas
                keep = pc.and_(keep, pc.or_(seen, pc.greater_equal(table["checked_ns"], since_ns)))
            rows = [(p, *found, current, began) for p, (found, current, began) in passed.items()]
            values = list(zip(*rows, strict=True)) or [()] * len(_SCHEMA)
            added = pa.Table.from_arrays(
                [strings(values[0])]
                + [column(v, f.type) for v, f in zip(values[1:], list(_SCHEMA)[1:], strict=True)],
                schema=_SCHEMA,
            )
            merged = pa.concat_tables([table.filter(keep), added])
            pq.write_table(merged, aside, compression="snappy", write_page_checksum=True)
            os.replace(aside, self._root / RECORD)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(aside)
        finally:
            os.close(fd)

    def _read(self) -> pa.Table:
        """The record as the store holds it now (read again only when it was replaced);
        empty when there is none or it cannot be read."""
        path = str(self._root / RECORD)
        try:
            found = stamp(path)
        except OSError:
            found = None
        if found is None:
            self._table, self._read_as, self._by_path = _NONE, None, None
        elif found != self._read_as:
            try:
                table = pq.ParquetFile(path, page_checksum_verification=True).read()
                self._table = table if table.schema.equals(_SCHEMA) else _NONE
            except (pa.ArrowException, OSError):
                self._table = _NONE
            self._read_as, self._by_path = found, None
        return self._table

    def _entries(self) -> dict[str, tuple[Stamp, bool]]:
        """The record's rows by path, as the store holds it now: a dictionary, where a
        filter would import ``pyarrow.compute`` (a thirtieth of a second) into every
        command that reads the store."""
        table = self._read()
        if self._by_path is None:
            columns = ["path", "size", "mtime_ns", "ctime_ns", "inode", "current"]
            path, *found, current = (table[name].to_pylist() for name in columns)
            stamps = zip(*found, strict=True)
            self._by_path = dict(zip(path, zip(stamps, current, strict=True), strict=True))
        return self._by_path
