"""Vacuum: delete a run's files that no view can show again.

Nothing else ever deletes a file but a whole run's removal. Three kinds are left behind:
files a compaction of a remote store superseded, files of writes withdrawn by a plain
discard, and leftovers of writers (or compactions) that died before their commit. The
first two are hidden for good from the moment their tombstone is written, but a query
that listed them just before may still be reading them: they go once that tombstone is
``grace`` old. Leftovers of a death look exactly like a write still under way, so they
go only once the file is ``ORPHAN_AGE`` old, far longer than any write takes: files of
writes never committed, ``tasks`` files of task graphs that no invocation kept names (a
writer writes a graph just before the first step that names it), ``*.parquet.tmp`` files
a writer killed mid-file left aside, and claims of invocation ids (see ``claims``) whose
writer never deleted them.

In a local store the deletions are made under the store's exclusive lock, so no query
is reading meanwhile; in a remote one the grace period is what protects readers.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from multicore_profiler.storage.catalog import LISTING_ORDER
from multicore_profiler.storage.claims import list_claims
from multicore_profiler.storage.location import StoreLocation, store_write
from multicore_profiler.storage.partitions import (
    ORPHAN_AGE,
    PARQUET_SUFFIX,
    TMP_SUFFIX,
    past_orphan_age,
    read_verified,
    verified_parquet,
)
from multicore_profiler.storage.schema import (
    CORES,
    DISCARDS,
    INVOCATIONS,
    RECORDS,
    TABLES,
    TASKS,
    TableSpec,
)

if TYPE_CHECKING:
    from multicore_profiler.storage.handle import StoreHandle

GRACE = timedelta(hours=1)
"""How long files hidden by a tombstone stay for queries that listed them before it."""
WRITTEN_TABLES = (RECORDS, CORES, INVOCATIONS)
"""The tables whose rows belong to a write, in the order a vacuum deletes their files:
invocations last, so that a vacuum cut short still knows the other files' writes."""
VACUUMED_TABLES = (TASKS, *WRITTEN_TABLES)
"""The tables whose files a vacuum deletes, in its order: task graphs, then the writes."""
SNAPSHOT_TABLES = tuple(s for s in LISTING_ORDER if s in (DISCARDS, *VACUUMED_TABLES))
"""The tables a compaction lists, committing tables first (as every query does)."""
WRITES = pa.schema(
    [
        ("path", pa.string()),
        ("rank", pa.int32()),
        ("write_id", pa.int64()),
        ("directory", pa.string()),
        ("table_name", pa.string()),
    ]
)
"""``RunFiles.writes``: the writes each file of a written table holds rows of."""
GRAPHS = pa.schema([("path", pa.string()), ("rank", pa.int32()), ("config_id", pa.string())])
"""``RunFiles.graphs``: the task graphs each ``tasks`` file holds."""
LEFTOVER_SUFFIX = PARQUET_SUFFIX + TMP_SUFFIX
"""A file written aside and never renamed into place: its writer died mid-file."""


@dataclass(frozen=True)
class RunFiles:
    """One listing of a run's files: its discards, and the tables whose rows belong to
    a write. A compaction plans and vacuums from this one snapshot, read through
    ``Store.reading(files=...)``: a write it sees committed has all its files here."""

    infos: dict[str, list[pafs.FileInfo]]
    """Each table's files (name, size, modification time), listed in ``SNAPSHOT_TABLES``
    order."""
    writes: pa.Table
    """``path``, ``rank``, ``write_id``, ``directory``, ``table_name``: the writes each
    file holds rows of."""
    leftovers: tuple[pafs.FileInfo, ...] = ()
    """The run's ``*.parquet.tmp`` files, in any of its tables."""
    graphs: pa.Table = field(default_factory=GRAPHS.empty_table)
    """``path``, ``rank``, ``config_id``: the task graphs each ``tasks`` file holds."""

    def paths(self, spec: TableSpec) -> list[str]:
        """The table's file paths, sorted."""
        return sorted(info.path for info in self.infos[spec.name])

    @property
    def listed(self) -> dict[str, list[str]]:
        """Each table's paths, for ``Store.reading(files=...)``."""
        return {name: [info.path for info in infos] for name, infos in self.infos.items()}

    @property
    def count(self) -> int:
        """How many files of the tables a vacuum deletes from there are, leftovers
        included."""
        return sum(len(self.infos[spec.name]) for spec in VACUUMED_TABLES) + len(self.leftovers)

    def without(self, paths: set[str]) -> RunFiles:
        """These files but ``paths``."""
        import pyarrow.compute as pc  # not at import: the store imports this module

        gone = pa.array(sorted(paths), pa.string())
        return RunFiles(
            {name: [i for i in infos if i.path not in paths] for name, infos in self.infos.items()},
            self.writes.filter(pc.invert(pc.is_in(self.writes["path"], gone))),
            tuple(i for i in self.leftovers if i.path not in paths),
            self.graphs.filter(pc.invert(pc.is_in(self.graphs["path"], gone))),
        )


def run_files(location: StoreLocation, run_id: str) -> RunFiles:
    """List a run's files, committing tables first, and read which writes each file of
    invocations, cores and records holds (two small columns of every file)."""
    import pyarrow.compute as pc  # not at import: the store imports this module

    listed = {
        spec.name: location.files(f"{spec.name}/run_id={run_id}")
        for spec in TABLES.values()
        if spec.partition_by[0] == "run_id"
    }
    infos = {
        spec.name: [info for info in listed[spec.name] if info.path.endswith(PARQUET_SUFFIX)]
        for spec in SNAPSHOT_TABLES
    }
    leftovers = tuple(
        info for found in listed.values() for info in found if info.path.endswith(LEFTOVER_SUFFIX)
    )
    tables = []
    for spec in WRITTEN_TABLES:
        if not infos[spec.name]:
            continue
        keys = _keys(location, infos[spec.name], ["rank", "write_id", "__filename"])
        found = (
            keys.group_by(["__filename", "rank", "write_id"])
            .aggregate([])
            .rename_columns(["path", "rank", "write_id"])
        )
        directory = pc.replace_substring_regex(found["path"], r"/[^/]*$", "")
        tables.append(
            found.append_column("directory", directory).append_column(
                "table_name", pa.repeat(pa.scalar(spec.name), found.num_rows)
            )
        )
    writes = pa.concat_tables(t.cast(WRITES) for t in tables) if tables else WRITES.empty_table()
    return RunFiles(infos, writes, leftovers, _graphs(location, infos[TASKS.name]))


def _keys(location: StoreLocation, infos: list[pafs.FileInfo], columns: list[str]) -> pa.Table:
    """``columns`` of the listed files ``infos`` (``__filename``: the file of each row),
    their checksums verified; a file that cannot be read is named. Each file is opened at
    the size its listing gave: on an object store, a request saved per file."""
    import pyarrow.dataset as ds  # on use: pandas comes with it

    parquet = verified_parquet()
    fragments = [
        parquet.make_fragment(info.path, location.filesystem, file_size=info.size)
        for info in sorted(infos, key=lambda info: info.path)
    ]
    try:
        dataset = ds.FileSystemDataset(
            fragments, fragments[0].physical_schema, parquet, location.filesystem
        )
        return dataset.to_table(columns=columns)
    except (pa.ArrowException, OSError):
        for fragment in fragments:  # name the file that cannot be read
            read_verified(location, fragment.path)
        raise


def _graphs(location: StoreLocation, infos: list[pafs.FileInfo]) -> pa.Table:
    """The task graphs (``rank``, ``config_id``) each of the ``tasks`` files holds."""
    if not infos:
        return GRAPHS.empty_table()
    keys = _keys(location, infos, ["__filename", "rank", "config_id"])
    found = keys.group_by(["__filename", "rank", "config_id"]).aggregate([])
    return found.rename_columns(GRAPHS.names).cast(GRAPHS)


_DEAD = """
WITH visible AS (SELECT DISTINCT rank, write_id FROM invocations),
written AS (
    SELECT rank, write_id, any_value(coalesce(origin_write_id, write_id)) AS origin,
        bool_and(origin_write_id IS NULL) AS original
    FROM raw_invocations GROUP BY ALL
),
activated AS (
    SELECT DISTINCT rank, replaced_by AS write_id FROM raw_discards WHERE replaced_by IS NOT NULL
),
changed AS (
    SELECT rank, coalesce(origin_write_id, write_id) AS origin, max(discarded_at) AS at
    FROM raw_discards GROUP BY ALL
),
status AS (
    SELECT f.path, m.mtime, v.write_id IS NOT NULL AS visible,
        w.write_id IS NOT NULL AND (w.original OR a.write_id IS NOT NULL) AS committed,
        c.at AS changed_at
    FROM file_writes f
    JOIN file_times m USING (path)
    LEFT JOIN visible v USING (rank, write_id)
    LEFT JOIN written w USING (rank, write_id)
    LEFT JOIN activated a USING (rank, write_id)
    LEFT JOIN changed c ON c.rank = f.rank AND c.origin = w.origin
)
SELECT path FROM status GROUP BY path
HAVING bool_and(
    NOT visible
    AND CASE WHEN committed THEN changed_at < $hidden_before ELSE mtime < $written_before END
)
"""
"""Files none of whose writes a view shows or can show again: each write was shown once
(committed) and its origin's tombstones last changed before ``hidden_before``, or it
never was and the file is older than ``written_before``."""

_DEAD_GRAPHS = """
WITH named AS (
    SELECT DISTINCT i.rank, i.config_id
    FROM raw_invocations i
    JOIN file_writes f ON f.table_name = 'invocations' AND f.rank = i.rank
        AND f.write_id = i.write_id
    WHERE f.path NOT IN (SELECT path FROM dead_paths)
)
SELECT g.path FROM file_graphs g
JOIN file_times m USING (path)
LEFT JOIN named n ON n.rank = g.rank AND n.config_id = g.config_id
WHERE m.mtime < $written_before
GROUP BY g.path HAVING bool_and(n.rank IS NULL)
"""
"""``tasks`` files older than ``written_before`` none of whose graphs an invocation names,
of the files the vacuum keeps (``dead_paths``: those it deletes)."""


def dead_files(
    store: StoreHandle, run_id: str, files: RunFiles, *, now: datetime, grace: timedelta
) -> set[str]:
    """The run's files a vacuum at ``now`` deletes: of written tables (``_DEAD``), then of
    task graphs (``_DEAD_GRAPHS``)."""
    listed = [i for spec in VACUUMED_TABLES for i in files.infos[spec.name]]
    times = pa.table(
        {
            "path": pa.array([i.path for i in listed], pa.string()),
            # A filesystem that keeps no times never makes an orphan of a file.
            "mtime": pa.array([i.mtime or now for i in listed], pa.timestamp("us", tz="UTC")),
        }
    )
    with store.reading(runs=[run_id], files=files.listed) as cursor:
        cursor.register("file_writes", files.writes)
        cursor.register("file_times", times)
        found = cursor.sql(
            _DEAD, params={"hidden_before": now - grace, "written_before": now - ORPHAN_AGE}
        ).fetchall()
        dead = {path for (path,) in found}
        if files.graphs.num_rows:
            cursor.register("file_graphs", files.graphs)
            cursor.register("dead_paths", pa.table({"path": pa.array(sorted(dead), pa.string())}))
            graphs = cursor.sql(_DEAD_GRAPHS, params={"written_before": now - ORPHAN_AGE})
            dead.update(path for (path,) in graphs.fetchall())
    return dead


def stale_leftovers(infos: Iterable[pafs.FileInfo], now: datetime) -> set[str]:
    """The paths of ``*.parquet.tmp`` files among ``infos`` older than ``ORPHAN_AGE``."""
    return {
        i.path for i in infos if i.path.endswith(LEFTOVER_SUFFIX) and past_orphan_age(i.mtime, now)
    }


def vacuum(
    store: StoreHandle, run_id: str, files: RunFiles, *, now: datetime, grace: timedelta
) -> RunFiles:
    """Delete the run's dead files (see ``dead_files``: task graphs first, invocations
    last), its day-old ``*.parquet.tmp`` files and its day-old claims; return the files
    left."""
    dead = dead_files(store, run_id, files, now=now, grace=grace)
    dead |= stale_leftovers(files.leftovers, now)
    location = store.location
    with (
        store_write(f"vacuum run {run_id} of the store at {location}"),
        store.lock.exclusive() if location.is_local else nullcontext(),
    ):
        for spec in VACUUMED_TABLES:
            for path in files.paths(spec):
                if path in dead:
                    location.delete_file(path)
        for info in files.leftovers:
            if info.path in dead:
                location.delete_file(info.path)
        for claim in list_claims(location, run_id):
            if past_orphan_age(claim.mtime, now):
                location.delete_file(claim.path)
    return files.without(dead)
