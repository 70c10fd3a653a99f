"""Retention: remove whole runs from a store, oldest first, safely.

``plan_gc`` picks the runs to remove; ``collect`` removes them. A run goes whole: its
invocations first (they commit the cores and records, so those vanish from every view
at once), then its cores, records, task graphs and discards, and its ``runs`` rows
last, so a removal cut short is picked up again by the next one. In a local store each
run is removed under the store's exclusive lock (no query is reading then) and never
during a compaction; in a remote one a query running meanwhile may find a file gone
and fail, never a half run.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from multicore_profiler.errors import StoreError
from multicore_profiler.progress import progress
from multicore_profiler.storage.compact import COMPACT_LOCK
from multicore_profiler.storage.location import store_write
from multicore_profiler.storage.schema import CORES, DISCARDS, INVOCATIONS, RECORDS, RUNS, TASKS

if TYPE_CHECKING:
    from multicore_profiler.storage.handle import StoreHandle

REMOVAL_ORDER = (INVOCATIONS, CORES, RECORDS, TASKS, DISCARDS, RUNS)
"""Tables holding a run's rows, in the order a removal deletes them."""


@dataclass(frozen=True)
class GcPlan:
    """The runs a retention rule removes, with what they hold, newest first."""

    runs: list[dict[str, Any]]
    """``run_id``, ``label``, ``commit``, ``status``, ``start_time``, ``updated_at``,
    ``files`` and ``bytes`` of each run to remove."""
    kept: int
    """Runs the rule keeps (of those it considered)."""
    applied: bool = False

    @property
    def bytes(self) -> int:
        """Bytes the removal frees."""
        return sum(r["bytes"] for r in self.runs)

    def summary(self) -> str:
        """One line: what was (or would be) removed and kept."""
        verb = "removed" if self.applied else "would remove"
        line = (
            f"{verb} {len(self.runs)} run(s), {sum(r['files'] for r in self.runs)} file(s), "
            f"{self.bytes / 1e6:.1f} MB; kept {self.kept}"
        )
        return line if self.applied or not self.runs else line + " (dry run: add --apply)"


def plan_gc(
    store: StoreHandle,
    *,
    keep_last: int | None = None,
    older_than: timedelta | None = None,
    labels: Sequence[str] = (),
    now: datetime | None = None,
) -> GcPlan:
    """The runs to remove: of the runs with one of ``labels`` (default: all), those
    outside the ``keep_last`` newest (by start time) and, with ``older_than``, last
    updated before ``now - older_than``. A run still marked running is removed only
    by age."""
    if keep_last is None and older_than is None:
        raise StoreError(
            "say which runs to remove: keep_last (--keep-last N) or older_than (--older-than DAYS)"
        )
    if keep_last is not None and (isinstance(keep_last, bool) or keep_last < 0):
        raise StoreError(f"keep_last must be a non-negative integer, got {keep_last!r}")
    if older_than is not None and older_than < timedelta(0):
        raise StoreError(f"older_than must not be negative, got {older_than}")
    now = now or datetime.now(timezone.utc)
    rows = [
        row
        for row in store.sql(
            """SELECT run_id, label, commit, status, start_time, updated_at
               FROM runs ORDER BY start_time DESC, run_id DESC"""
        ).to_pylist()
        if not labels or row["label"] in labels
    ]
    cutoff = None if older_than is None else now - older_than
    chosen = []
    for newest, row in enumerate(rows, start=1):
        outside = keep_last is not None and newest > keep_last
        old = cutoff is not None and row["updated_at"] < cutoff
        if keep_last is None:
            remove = old
        elif cutoff is None:
            remove = outside and row["status"] != "running"
        else:
            remove = outside and old
        if remove:
            chosen.append(row)
    for row in chosen:
        run = f"run_id={row['run_id']}"
        files = [f for spec in REMOVAL_ORDER for f in store.location.files(f"{spec.name}/{run}")]
        row["files"] = len(files)
        row["bytes"] = sum(f.size for f in files)
    return GcPlan(chosen, kept=len(rows) - len(chosen))


def collect(store: StoreHandle, plan: GcPlan) -> GcPlan:
    """Remove the runs of ``plan``; return it as applied."""
    location = store.location
    with store_write(f"remove runs from the store at {store.uri}"), ExitStack() as stack:
        if location.is_local:
            guard = stack.enter_context(open(store.root / COMPACT_LOCK, "a"))
            try:
                fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(f"a compaction of the store at {store.uri} is running") from None
        for row in progress(plan.runs, desc="removing runs", unit="run"):
            with store.lock.exclusive() if location.is_local else ExitStack():
                for spec in REMOVAL_ORDER:
                    relative = f"{spec.name}/run_id={row['run_id']}"
                    directory = store.root / relative if location.is_local else None
                    if directory is None:
                        location.delete_dir(relative)
                    elif directory.is_symlink():  # the link goes, never what it points to
                        directory.unlink()
                    elif directory.exists() and not directory.parent.is_symlink():
                        shutil.rmtree(directory)
    return GcPlan(plan.runs, plan.kept, applied=True)
