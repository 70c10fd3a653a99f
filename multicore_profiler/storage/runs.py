"""A run: one profiling session's identity and provenance, as a row of the ``runs`` table."""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
import subprocess
import uuid
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import pyarrow as pa

from multicore_profiler.storage.partitions import check_run_id
from multicore_profiler.storage.schema import RUNS

STATUSES = ("running", "complete", "failed")
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

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        if self.status not in STATUSES:
            raise ValueError(f"run status must be one of {STATUSES}, got {self.status!r}")

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

    def finish(self, status: str = "complete") -> RunInfo:
        """The same run, ended now with ``status``."""
        return dataclasses.replace(self, status=status, end_time=datetime.now(timezone.utc))

    def to_table(self) -> pa.Table:
        """This run as one ``runs`` row (without its partition column)."""
        row = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "run_id"
        }
        row["updated_at"] = datetime.now(timezone.utc)
        row["versions"] = list(self.versions.items())
        row["tags"] = list(self.tags.items())
        return pa.Table.from_pylist([row], schema=RUNS.schema)
