"""A run: one profiling session's identity, provenance and what profiling cost it, as a
row of the ``runs`` table."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import numbers
import os
import platform
import re
import socket
import subprocess
import uuid
import weakref
from collections.abc import Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import IO

import numpy as np
import pyarrow as pa

from multicore_profiler.errors import ArgumentError
from multicore_profiler.storage.location import StoreLocation, store_write
from multicore_profiler.storage.partitions import check_run_id, partition_dir
from multicore_profiler.storage.schema import RUNS

STATUSES = ("running", "complete", "failed")
WRITERS = ("process", "thread")
"""Where a capture session's writer runs: a process of its own, or a thread of the job's."""
_PACKAGES = ("multicore_profiler", "numpy", "pyarrow", "duckdb", "torch", "torch_npu")


def new_run_id(now: datetime | None = None) -> str:
    """A fresh run id that sorts by start time: ``20261129T193200Z-1a2b3c4d``."""
    now = now or datetime.now(timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.strip()
    return out if done.returncode == 0 and out else None


def source_revision(cwd: Path | None = None) -> tuple[str | None, str | None]:
    """(commit, branch) of the code being profiled.

    ``MCPROF_COMMIT`` / ``MCPROF_BRANCH`` win (CI checkouts often have no branch);
    otherwise git of the working directory; ``None`` where neither knows.
    """
    cwd = cwd or Path.cwd()
    commit = os.environ.get("MCPROF_COMMIT") or _git(["rev-parse", "HEAD"], cwd)
    branch = os.environ.get("MCPROF_BRANCH") or _git(["rev-parse", "--abbrev-ref", "HEAD"], cwd)
    return commit, None if branch == "HEAD" else branch


def package_versions() -> dict[str, str]:
    """Versions of Python and of the packages that shape a profile."""
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


@dataclasses.dataclass(frozen=True)
class CaptureCost:
    """What a capture session measured of itself over a run's recorded steps: the cost of
    profiling, kept with the run (the ``capture_*`` columns of ``runs``)."""

    steps: int
    """Recorded step writes."""
    job_seconds: float
    """Time the job's thread spent in the session on them: drains, copies, hand-over and
    backpressure waits."""
    writer_cpu_seconds: float
    """CPU time the writer spent decoding and storing them."""
    writer: str
    """Where the writer ran: ``process`` or ``thread`` (see ``WRITERS``)."""

    def __post_init__(self) -> None:
        steps = self.steps
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral):
            raise ArgumentError(f"capture cost steps must be an integer, got {steps!r}")
        if not 0 <= steps < 1 << 63:
            raise ArgumentError(f"capture cost steps must be in [0, 2**63), got {steps}")
        for name in ("job_seconds", "writer_cpu_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ArgumentError(f"capture cost {name} must be a number, got {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise ArgumentError(f"capture cost {name} must be finite and >= 0, got {value}")
        if self.writer not in WRITERS:
            raise ArgumentError(
                f"capture cost writer must be one of {WRITERS}, got {self.writer!r}"
            )

    @classmethod
    def of_row(cls, row: Mapping[str, object]) -> CaptureCost | None:
        """The cost a ``runs`` row records, or None where its ``capture_*`` columns are NULL
        (a run ingested by hand, a run of an older store)."""
        if row.get("capture_steps") is None:
            return None
        return cls(*(row[column] for column in CAPTURE_COLUMNS))

    def per_step_ms(self) -> tuple[str, str] | None:
        """(job, writer CPU) milliseconds per recorded step, to 2 significant digits, e.g.
        ``("0.31", "1.2")``; None for a run that recorded no step."""
        if self.steps == 0:
            return None
        return _ms(self.job_seconds / self.steps), _ms(self.writer_cpu_seconds / self.steps)


CAPTURE_COLUMNS = tuple(f"capture_{f.name}" for f in dataclasses.fields(CaptureCost))
"""The ``runs`` columns of a ``CaptureCost``, in the order of its fields."""


def _ms(seconds: float) -> str:
    """Seconds as milliseconds to 2 significant digits, never in exponent form."""
    return np.format_float_positional(
        seconds * 1e3, precision=2, unique=False, fractional=False, trim="-"
    )


def _capture_columns(cost: CaptureCost | None) -> dict[str, object]:
    """The ``capture_*`` columns of a ``runs`` row: all NULL without a cost."""
    values = (None,) * len(CAPTURE_COLUMNS) if cost is None else dataclasses.astuple(cost)
    return dict(zip(CAPTURE_COLUMNS, values, strict=True))


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What the ``runs`` table keeps of a profiling session."""

    run_id: str
    start_time: datetime
    status: str = "running"
    end_time: datetime | None = None
    commit: str | None = None
    branch: str | None = None
    label: str | None = None
    host: str | None = None
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    schedule: str | None = None
    tags: dict[str, str] = dataclasses.field(default_factory=dict)
    rank: int | None = None
    """The rank whose session this row reports (every rank of a job writes its own)."""
    capture: CaptureCost | None = None
    """What profiling cost this rank's session, once it measured it; None before, and
    for runs not recorded by a capture session."""

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        if self.status not in STATUSES:
            raise ValueError(f"run status must be one of {STATUSES}, got {self.status!r}")
        if self.capture is not None and not isinstance(self.capture, CaptureCost):
            raise ArgumentError(f"run capture must be a CaptureCost, got {self.capture!r}")

    @classmethod
    def begin(
        cls,
        *,
        run_id: str | None = None,
        label: str | None = None,
        tags: dict[str, str] | None = None,
        schedule: str | None = None,
        rank: int | None = None,
    ) -> RunInfo:
        """A run starting now, with this process's host, git revision and versions."""
        commit, branch = source_revision()
        now = datetime.now(timezone.utc)
        return cls(
            run_id=run_id or new_run_id(now),
            start_time=now,
            commit=commit,
            branch=branch,
            label=label,
            host=socket.gethostname(),
            versions=package_versions(),
            schedule=schedule,
            tags=dict(tags or {}),
            rank=rank,
        )

    def finish(self, status: str = "complete", capture: CaptureCost | None = None) -> RunInfo:
        """The same run, ended now with ``status`` and the cost ``capture`` measured (the
        cost it had, when none is given)."""
        return dataclasses.replace(
            self,
            status=status,
            end_time=datetime.now(timezone.utc),
            capture=self.capture if capture is None else capture,
        )

    def to_table(self) -> pa.Table:
        """This run as one ``runs`` row (without its partition column)."""
        row = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("run_id", "capture")
        }
        row.update(_capture_columns(self.capture))
        row["updated_at"] = datetime.now(timezone.utc)
        row["versions"] = list(self.versions.items())
        row["tags"] = list(self.tags.items())
        return pa.Table.from_pylist([row], schema=RUNS.schema)


LEASE_NAME = re.compile(r"_writing-(?P<rank>\d{1,10})-(?P<token>[0-9a-f]{32})\.lock")
"""The name of a capture session's lease file in its run's ``runs`` directory."""


@dataclasses.dataclass(eq=False)
class RunLease:
    """A rank's claim to end its run's row, held by the processes that may still write it.

    A capture session of a local store creates ``runs/run_id=<run>/_writing-<rank>-<token>.lock``
    before the run's first row; the job and its writer each hold a shared ``flock`` on it
    while they may mark the run ``complete`` or ``failed``. The one that writes the run's
    last row deletes the file. A lease file that nobody holds any more (both processes
    died, or could not write the last row: a full disk) names a run left ``running`` for
    good, which ``mcprof check`` reports (``abandoned``). A remote store takes no lease:
    its filesystem has no locks. A forked child (a DataLoader worker) lets go of its
    copies at once: the lease is its parent's.
    """

    path: str
    _file: IO[bytes] | None = None

    @classmethod
    def take(cls, location: StoreLocation, run_id: str, rank: int) -> RunLease | None:
        """Create and hold a new lease of (run, rank); None for a remote store."""
        if not location.is_local:
            return None
        directory = location.directory / partition_dir(RUNS, {"run_id": run_id})
        lease = cls(str(directory / f"_writing-{rank}-{uuid.uuid4().hex}.lock"))
        with store_write(f"take the lease of run {run_id} rank {rank}"):
            directory.mkdir(parents=True, exist_ok=True)
            lease.hold()
        return lease

    def hold(self) -> None:
        """Hold the lease (shared with the other processes of the session)."""
        self._file = open(self.path, "ab")  # noqa: SIM115 (held until released)
        fcntl.flock(self._file, fcntl.LOCK_SH)
        _HELD.add(self)

    def release(self) -> None:
        """Let go of the lease, keeping its file (the run's last row is another's to write)."""
        _HELD.discard(self)
        if self._file is not None:
            self._file.close()
            self._file = None

    def end(self) -> None:
        """The run's last row is written: delete the lease file and let go."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.release()


_HELD: weakref.WeakSet[RunLease] = weakref.WeakSet()
"""The leases this process holds."""


def _forget_in_child() -> None:
    """Close a forked child's copies of the leases (the parent's hold stays)."""
    for lease in list(_HELD):
        lease.release()


os.register_at_fork(after_in_child=_forget_in_child)


def lease_abandoned(path: str) -> bool:
    """Whether no process holds the lease file at ``path`` any more."""
    try:
        with open(path, "rb") as file:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True
    except FileNotFoundError:
        return False
