"""``check_store``: verify every file of a store (or of some runs), and say what is wrong.

Each data file is read whole with its page checksums verified, and its schema compared
with its table's. Each invocation a view shows is compared with the rows that belong to
it: its ``record_count`` with its records, its slots with its cores rows. Files of
writes never committed (as the vacuum defines them), ``*.parquet.tmp`` files and claims
that a dead writer left, once ``ORPHAN_AGE`` old, are reported, and so is any file that
lies outside the store's layout (which no query reads). Nothing is changed: the vacuum
(``mcprof compact``) deletes leftovers, and a corrupt file is the user's to restore or
remove.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from multicore_profiler.errors import StoreError
from multicore_profiler.storage.catalog import LISTING_ORDER
from multicore_profiler.storage.claims import CLAIM_NAME
from multicore_profiler.storage.compact import COMPACT_LOCK
from multicore_profiler.storage.connection import arrow_cursor
from multicore_profiler.storage.derived import DERIVED_DIR
from multicore_profiler.storage.location import MARKER
from multicore_profiler.storage.partitions import (
    ORPHAN_AGE,
    PARQUET_SUFFIX,
    CorruptFileError,
    check_run_id,
    past_orphan_age,
    relative_path,
    utc,
)
from multicore_profiler.storage.runs import LEASE_NAME, lease_abandoned
from multicore_profiler.storage.schema import (
    CORES,
    GROUPED,
    INVOCATIONS,
    RECORDS,
    RUNS,
    TABLES,
    TASKS,
    TableSpec,
    file_spec,
)
from multicore_profiler.storage.swap import JOURNAL_DIR, LOCK_FILE
from multicore_profiler.storage.vacuum import (
    GRAPHS,
    LEFTOVER_SUFFIX,
    SNAPSHOT_TABLES,
    WRITES,
    RunFiles,
    dead_files,
)
from multicore_profiler.storage.verified import RECORD_FILES

if TYPE_CHECKING:
    from multicore_profiler.storage.handle import StoreHandle

CHECKS = (
    "checksum",
    "parquet",
    "schema",
    "counts",
    "orphan",
    "leftover",
    "abandoned",
    "layout",
    "special",
    "clocks",
)
"""What a problem can be: a page failing its CRC; a file that is not readable Parquet;
a schema that does not fit the table; an invocation whose counts disagree with its rows;
a file of a write never committed; a dead writer's ``.parquet.tmp`` file or claim; a run
left ``running`` by a capture session whose job and writer are gone; a file outside the
store's layout; a symbolic link (or FIFO, socket, device), which the store never follows
or reads; a run whose records contradict their own clocks, frequency or schedule (only when
``Store.check(clocks=True)`` asks: its "file" is ``run <run id>``)."""
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_COUNTS = """
WITH records AS (
    SELECT run_id, rank, invocation_id, write_id, sum(n) AS n, string_agg(path, '|') AS paths
    FROM record_rows GROUP BY ALL
),
cores AS (
    SELECT run_id, rank, invocation_id, write_id, sum(n) AS n, sum(header_records) AS recorded
    FROM core_rows GROUP BY ALL
)
SELECT i.path, i.rank, i.invocation_id, i.step, i.record_count, i.slots,
    coalesce(r.n, 0) AS records, coalesce(c.n, 0) AS cores, coalesce(c.recorded, 0) AS recorded,
    r.paths
FROM invocation_rows i
JOIN visible v USING (run_id, rank, invocation_id, write_id)
LEFT JOIN records r USING (run_id, rank, invocation_id, write_id)
LEFT JOIN cores c USING (run_id, rank, invocation_id, write_id)
WHERE (i.run_id, i.step) NOT IN (SELECT (run_id, step) FROM broken)
    AND i.run_id NOT IN (SELECT run_id FROM broken WHERE step = -1)
    AND (i.record_count IS DISTINCT FROM coalesce(r.n, 0)
        OR i.record_count IS DISTINCT FROM coalesce(c.recorded, 0)
        OR coalesce(c.n, 0) > i.slots)
ORDER BY i.path, i.rank, i.invocation_id
"""
"""The invocations a view shows whose counts disagree with their rows: records, the
record counts of their slots, cores rows (one per slot that is not idle). Partitions
holding a file that failed its checks are left out (that file is the problem)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one file."""

    path: str
    """The file, relative to the store."""
    check: str
    """Which check failed: one of ``CHECKS``."""
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.check}: {self.reason}"


@dataclass(frozen=True)
class CheckReport:
    """What ``check_store`` found."""

    store: str
    runs: tuple[str, ...] | None
    """The runs checked; None: the whole store."""
    files_checked: int
    problems: list[Problem] = field(default_factory=list)
    """Every problem, by file (sorted by path, then check)."""
    in_progress: int = 0
    """``.parquet.tmp`` files and claims younger than ``ORPHAN_AGE``: writes under way."""
    clocks: pa.Table | None = None
    """With ``Store.check(clocks=True)``: the ``clock_check`` row of each run checked."""

    @property
    def ok(self) -> bool:
        """Whether no check failed."""
        return not self.problems

    def summary(self) -> str:
        """One line: what was checked and how many problems were found."""
        scope = "the store" if self.runs is None else f"{len(self.runs)} run(s) of the store"
        line = f"checked {self.files_checked} file(s) of {scope} at {self.store}"
        if self.clocks is not None:
            line += f" and the clocks of {self.clocks.num_rows} run(s)"
        line += ": "
        if self.ok:
            line += "no problem found"
        else:
            files = len({p.path for p in self.problems if p.check != "clocks"})
            runs = len({p.path for p in self.problems if p.check == "clocks"})
            line += f"{len(self.problems)} problem(s) in " + " and ".join(
                part
                for part in (
                    f"{files} file(s)" if files else "",
                    f"the clocks of {runs} run(s)" if runs else "",
                )
                if part
            )
        if self.in_progress:
            line += f"; {self.in_progress} file(s) of writes under way"
        return line


@dataclass
class _Scan:
    """What the check gathers while it reads the files."""

    problems: list[Problem] = field(default_factory=list)
    in_progress: int = 0
    checked: int = 0
    good: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """Paths of readable, fitting data files by run and table (run ``""``: the tables
    not partitioned by run)."""
    rows: dict[str, list[pa.Table]] = field(default_factory=dict)
    """Per table: the keys (and counts) of the rows of each good file."""
    infos: dict[str, pafs.FileInfo] = field(default_factory=dict)
    """Every listed file by path."""
    broken: set[tuple[str, int]] = field(default_factory=set)
    """(run, step) partitions of cores or records with a file that failed its checks;
    step -1 for a run whose file of several steps failed (which steps it held is not
    known)."""

    def problem(self, path: str, check: str, reason: str) -> None:
        self.problems.append(Problem(path, check, reason))


def check_store(
    store: StoreHandle, runs: list[str] | None = None, *, now: datetime | None = None
) -> CheckReport:
    """Check every file of ``store`` (of the runs ``runs`` only, when given); ``now`` is
    the time leftovers' ages are judged by. ``StoreError`` naming a run with no file."""
    now = now or datetime.now(timezone.utc)
    location = store.location
    scan = _Scan()
    for info in _listing(store, runs):
        relative = relative_path(location, info.path)
        # What the check itself records, and the tables queries keep: not data.
        if relative in RECORD_FILES or relative.split("/")[0] == DERIVED_DIR:
            continue
        scan.checked += 1
        scan.infos[info.path] = info
        _classify(store, scan, info, relative, now)
    store.save_verified()
    _special(store, scan, runs)
    for run_id in sorted(scan.good):
        if run_id:
            _orphans(store, scan, run_id, now)
    _counts(store, scan)
    order = {check: i for i, check in enumerate(CHECKS)}
    problems = sorted(scan.problems, key=lambda p: (p.path, order[p.check], p.reason))
    return CheckReport(
        location.uri,
        None if runs is None else tuple(runs),
        scan.checked,
        problems,
        scan.in_progress,
    )


def _listing(store: StoreHandle, runs: list[str] | None) -> list[pafs.FileInfo]:
    """Every file of the selection: the whole store, or the runs' partitions (their
    claims included); ``StoreError`` naming a run without any file."""
    location = store.location
    if runs is None:
        return sorted(location.files(), key=lambda i: i.path)
    found = []
    for run_id in runs:
        run = f"run_id={check_run_id(run_id)}"
        prefixes = [f"{s.name}/{run}" for s in TABLES.values() if s.partition_by[0] == "run_id"]
        of_run = [i for prefix in prefixes for i in location.files(prefix)]
        if not of_run:
            raise StoreError(f"no run {run_id!r} in the store at {location}")
        found.extend(of_run)
    return sorted(found, key=lambda i: i.path)


def _special(store: StoreHandle, scan: _Scan, runs: list[str] | None) -> None:
    """Report every symbolic link, FIFO, socket or device of the selection."""
    location = store.location
    prefixes = [""]
    if runs is not None:
        tables = [s.name for s in TABLES.values() if s.partition_by[0] == "run_id"]
        prefixes = [f"{table}/run_id={run_id}" for run_id in runs for table in tables]
    for prefix in prefixes:
        for path, what in location.special_files(prefix):
            scan.checked += 1
            scan.problem(
                relative_path(location, path),
                "special",
                f"{what}: the store follows no link and reads only regular files, so no "
                "query, compaction or removal reads it or what it points to",
            )


def _classify(
    store: StoreHandle, scan: _Scan, info: pafs.FileInfo, relative: str, now: datetime
) -> None:
    """Check one listed file by where it lies and what it is."""
    parts = relative.split("/")
    if len(parts) == 1 and parts[0] in (LOCK_FILE, COMPACT_LOCK, MARKER):
        return
    if parts[0] == JOURNAL_DIR:
        return  # a swap a reader finishes
    spec = TABLES.get(parts[0])
    kind = None if spec is None else file_spec(spec, len(parts) - 2)
    depth = 0 if kind is None else len(kind.partition_by)
    values = _partition(kind, parts[1:-1]) if kind is not None and len(parts) == depth + 2 else None
    name = parts[-1]
    if values is None:
        keys = "/".join(f"{k}=<{k}>" for k in spec.partition_by) if spec else "<partition>"
        scan.problem(
            relative,
            "layout",
            f"not a file of the store's layout ({parts[0] if spec else '<table>'}/{keys}/"
            "<file>.parquet): no query reads it",
        )
    elif spec is INVOCATIONS and (claim := CLAIM_NAME.fullmatch(name)):
        _claim(scan, info, relative, claim, now)
    elif spec is RUNS and (lease := LEASE_NAME.fullmatch(name)):
        _lease(store, scan, info, relative, values, int(lease["rank"]), now)
    elif name.endswith(LEFTOVER_SUFFIX):
        _leftover(scan, info, relative, now)
    elif not name.endswith(PARQUET_SUFFIX):
        scan.problem(relative, "layout", "not a Parquet file (*.parquet): no query reads it")
    else:
        _data_file(store, scan, spec, info, relative, values)


def _partition(spec: TableSpec, parts: list[str]) -> dict[str, object] | None:
    """The partition values a file's directories name, or None if they are not its
    table's keys in order with valid values."""
    values: dict[str, object] = {}
    for key, part in zip(spec.partition_by, parts, strict=True):
        name, _, value = part.partition("=")
        if name != key:
            return None
        if key == "step":
            if not value.isdigit():
                return None
            values[key] = int(value)
        else:
            try:
                values[key] = check_run_id(value)
            except StoreError:
                return None
    return values


def _claim(
    scan: _Scan, info: pafs.FileInfo, relative: str, matched: re.Match[str], now: datetime
) -> None:
    what = (
        f"a claim of invocation ids {matched['first']}..{matched['last']} of rank "
        f"{matched['rank']} that its writer never withdrew"
    )
    _leftover(scan, info, relative, now, what)


def _lease(
    store: StoreHandle,
    scan: _Scan,
    info: pafs.FileInfo,
    relative: str,
    values: dict[str, object],
    rank: int,
    now: datetime,
) -> None:
    """A capture session's lease of a run (``RunLease``): held, a session under way; held
    by nobody while the rank's latest row says ``running``, a run that will never end."""
    if not lease_abandoned(info.path):
        scan.in_progress += 1
        return
    run_id = str(values["run_id"])
    latest = store.sql(
        """SELECT status FROM raw_runs WHERE run_id = $1 AND rank = $2
           ORDER BY updated_at DESC LIMIT 1""",
        [run_id, rank],
        runs=[run_id],
    )["status"].to_pylist()
    if latest == ["running"]:
        scan.problem(
            relative,
            "abandoned",
            f"rank {rank} of run {run_id} is left 'running' by a capture session whose job "
            "and writer ended without marking it (killed, or a full disk): it will never "
            "end; the windows it committed are kept",
        )
    else:
        _leftover(scan, info, relative, now, "the lease of a capture session that ended")


def _leftover(
    scan: _Scan,
    info: pafs.FileInfo,
    relative: str,
    now: datetime,
    what: str = "a file a writer left half-written",
) -> None:
    """A dead writer's leftover once ``ORPHAN_AGE`` old; before, a write under way."""
    if past_orphan_age(info.mtime, now):
        age = _age(utc(info.mtime), now)
        scan.problem(relative, "leftover", f"{what} ({age} old): 'mcprof compact' deletes it")
    else:
        scan.in_progress += 1


def _age(moment: datetime, now: datetime) -> str:
    days = (now - moment).total_seconds() / 86400
    return f"{days:.1f} days"


def _data_file(
    store: StoreHandle,
    scan: _Scan,
    spec: TableSpec,
    info: pafs.FileInfo,
    relative: str,
    values: dict[str, object],
) -> None:
    """Read a data file whole, its checksums verified and its schema compared; keep the
    keys of its rows for the counts and orphan checks."""
    try:
        table = store.verified_file(spec, info.path)
    except CorruptFileError as exc:
        scan.problem(relative, exc.check, exc.reason)
        if spec.name in GROUPED:
            scan.broken.add((str(values["run_id"]), int(values.get("step", -1))))
        return
    run_id = str(values.get("run_id", ""))
    scan.good.setdefault(run_id, {}).setdefault(spec.name, []).append(info.path)
    path = pa.scalar(info.path)
    if spec is TASKS:  # the graphs it holds, for the orphan check
        found = table.group_by(["rank", "config_id"]).aggregate([])
        rows = pa.table(
            {
                "path": pa.repeat(path, found.num_rows),
                "rank": found["rank"],
                "config_id": found["config_id"],
                "run_id": pa.repeat(pa.scalar(run_id), found.num_rows),
            }
        )
        scan.rows.setdefault(spec.name, []).append(rows)
        return
    if spec not in (INVOCATIONS, CORES, RECORDS):
        return
    if spec is INVOCATIONS:
        slots = pc.add(table["aic_slots"].cast(pa.int64()), table["aiv_slots"].cast(pa.int64()))
        rows = pa.table(
            {
                "run_id": pa.repeat(pa.scalar(run_id), table.num_rows),
                "rank": table["rank"],
                "invocation_id": table["invocation_id"],
                "write_id": table["write_id"],
                "step": table["step"],
                "record_count": table["record_count"],
                "slots": slots,
                "path": pa.repeat(path, table.num_rows),
            }
        )
    else:
        sums = [([], "count_all")] + ([("record_count", "sum")] if spec is CORES else [])
        found = table.group_by(["rank", "invocation_id", "write_id"]).aggregate(sums)
        columns = {k: found[k] for k in ("rank", "invocation_id", "write_id")}
        columns["n"] = found["count_all"]
        if spec is CORES:
            columns["header_records"] = found["record_count_sum"]
        columns["run_id"] = pa.repeat(pa.scalar(run_id), found.num_rows)
        columns["path"] = pa.repeat(path, found.num_rows)
        rows = pa.table(columns)
    scan.rows.setdefault(spec.name, []).append(rows)


def _orphans(store: StoreHandle, scan: _Scan, run_id: str, now: datetime) -> None:
    """Report the run's good files of writes never committed, and of task graphs no
    invocation names, once ``ORPHAN_AGE`` old: the vacuum's leftovers of a death (it is
    given no grace, so files hidden for good by a tombstone are not reported: they are no
    problem, only waiting for the vacuum)."""
    paths = scan.good[run_id]
    writes = []
    for spec in (RECORDS, CORES, INVOCATIONS):
        for rows in scan.rows.get(spec.name, []):
            if rows["run_id"][0].as_py() != run_id:
                continue
            found = rows.group_by(["path", "rank", "write_id"]).aggregate([])
            writes.append(
                pa.table(
                    {
                        "path": found["path"],
                        "rank": found["rank"].cast(pa.int32()),
                        "write_id": found["write_id"].cast(pa.int64()),
                        "directory": pc.replace_substring_regex(found["path"], r"/[^/]*$", ""),
                        "table_name": pa.repeat(pa.scalar(spec.name), found.num_rows),
                    }
                )
            )
    of_run = [
        rows.select(GRAPHS.names).cast(GRAPHS)
        for rows in scan.rows.get(TASKS.name, [])
        if rows.num_rows and rows["run_id"][0].as_py() == run_id
    ]
    graphs = pa.concat_tables([GRAPHS.empty_table(), *of_run])
    if not writes and not graphs.num_rows:
        return
    infos = {
        spec.name: [scan.infos[p] for p in paths.get(spec.name, [])] for spec in SNAPSHOT_TABLES
    }
    snapshot = RunFiles(infos, pa.concat_tables([WRITES.empty_table(), *writes]), (), graphs)
    dead = dead_files(store, run_id, snapshot, now=now, grace=now - _EPOCH)
    graph_files = set(graphs["path"].to_pylist())
    for path in sorted(dead):
        scan.problem(
            relative_path(store.location, path),
            "orphan",
            f"task graphs that no invocation names, over {ORPHAN_AGE.days} day old (their "
            "writer died before the steps that name them): no view joins them; "
            "'mcprof compact' deletes the file"
            if path in graph_files
            else f"rows of a write never committed, over {ORPHAN_AGE.days} day old (its "
            "writer died before the invocations that commit it): no view shows them; "
            "'mcprof compact' deletes the file",
        )


def _counts(store: StoreHandle, scan: _Scan) -> None:
    """Report each invocation a view shows whose counts disagree with the records and
    cores rows that belong to it."""
    invocations = scan.rows.get(INVOCATIONS.name)
    if not invocations:
        return
    runs = sorted(r for r in scan.good if r)
    given = {
        spec.name: [p for r in runs for p in scan.good[r].get(spec.name, [])]
        for spec in LISTING_ORDER
        if spec.partition_by[0] == "run_id"
    }
    with store.reading(runs=runs, files=given) as cursor:
        visible = cursor.sql(
            "SELECT DISTINCT run_id, rank, invocation_id, write_id FROM invocations"
        ).to_arrow_table()
    keys = [("rank", pa.int32()), ("invocation_id", pa.int64()), ("write_id", pa.int64())]
    keys += [("n", pa.int64())]
    where = [("run_id", pa.string()), ("path", pa.string())]
    empty = {
        RECORDS.name: pa.schema(keys + where).empty_table(),
        CORES.name: pa.schema([*keys, ("header_records", pa.uint64()), *where]).empty_table(),
    }
    broken = pa.table(
        {
            "run_id": pa.array([r for r, _ in sorted(scan.broken)], pa.string()),
            "step": pa.array([s for _, s in sorted(scan.broken)], pa.int64()),
        }
    )
    with arrow_cursor() as con:
        con.register("visible", visible)
        con.register("broken", broken)
        con.register("invocation_rows", pa.concat_tables(invocations))
        for name, view in ((RECORDS.name, "record_rows"), (CORES.name, "core_rows")):
            con.register(view, pa.concat_tables(scan.rows.get(name) or [empty[name]]))
        found = con.sql(_COUNTS).fetchall()
    for path, rank, invocation, step, counted, slots, records, cores, recorded, paths in found:
        which = f"invocation {invocation} of rank {rank} (step {step})"
        relative = relative_path(store.location, path)
        if counted != records:
            held = ""
            if paths is not None:
                files = sorted(relative_path(store.location, p) for p in paths.split("|"))
                held = " in " + ", ".join(files)
            scan.problem(
                relative,
                "counts",
                f"{which} counts {counted} records, but the store holds {records}{held}",
            )
        if counted != recorded:
            scan.problem(
                relative,
                "counts",
                f"{which} counts {counted} records, but its slots' headers count {recorded}",
            )
        if cores > slots:
            scan.problem(
                relative,
                "counts",
                f"{which} has {slots} slots, but the store holds {cores} cores rows of it",
            )
