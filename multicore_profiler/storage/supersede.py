"""Compaction without locks (a remote store): rewrite a run's writes, then supersede them.

Object storage has no rename and no lock, so this compaction never takes a file from
under a reader. It copies a run's committed writes into one new file per partition,
each write under a fresh write id (``origin_write_id`` keeps the first), then commits
them all with one file of supersessions in ``discards``. A query that lists that file
sees the merged rows and no longer the old ones; a query that does not sees the old
ones only: every row once, either way. The old files stay until a vacuum finds them
hidden for longer than its grace period (see ``vacuum``).

No lock is needed between compactions either: if two rewrite the same writes at once,
the views show the rewrite of the higher (generation, write id) and hide the other,
which a later vacuum deletes. A rewrite's fresh ids share their high bits, drawn at
random once, so that it wins or loses whole.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.storage.connection import arrow_cursor
from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.partitions import read_file, spec_of_file, write_partition
from multicore_profiler.storage.schema import DISCARDS, INVOCATIONS, TABLES, TableSpec
from multicore_profiler.storage.vacuum import RunFiles

if TYPE_CHECKING:
    from multicore_profiler.storage.handle import StoreHandle

_PLAN = """
CREATE TEMP TABLE superseded AS
WITH visible AS (
    SELECT rank, write_id, any_value(coalesce(origin_write_id, write_id)) AS origin,
        bool_and(origin_write_id IS NULL) AS original
    FROM invocations GROUP BY ALL
),
generations AS (
    SELECT rank, origin_write_id AS origin, max(generation) AS generation
    FROM raw_discards WHERE replaced_by IS NOT NULL GROUP BY ALL
),
writes AS (
    SELECT v.*, coalesce(g.generation, 0) + 1 AS generation
    FROM visible v LEFT JOIN generations g USING (rank, origin)
),
stepped AS (
    SELECT f.directory, w.*
    FROM file_writes f JOIN writes w USING (rank, write_id)
    WHERE f.table_name IN ('cores', 'records')
)
SELECT rank, write_id, origin, generation FROM writes WHERE original
UNION
SELECT rank, write_id, origin, generation FROM stepped
WHERE directory IN (SELECT directory FROM stepped WHERE original);

SELECT f.table_name, f.directory, f.path,
    count(*) = 1 AND bool_and(s.write_id IS NOT NULL) AS whole
FROM file_writes f LEFT JOIN superseded s USING (rank, write_id)
GROUP BY ALL
HAVING bool_or(s.write_id IS NOT NULL)
ORDER BY f.table_name, f.directory, min(f.rank), f.path;
"""
"""The writes to rewrite: the run's visible writes as their writers made them, and any
rewritten one sharing a step's partition with one of those; each takes the generation
one above any rewrite of its origin yet. Then the files holding their rows, by rank,
and whether a file is one superseded write whole (as a writer wrote it)."""


@dataclass
class Rewrite:
    """A planned rewrite of one run: the writes to supersede and the files holding them."""

    run_id: str
    writes: pa.Table
    """``rank``, ``write_id``, ``origin``, ``generation`` and the fresh ``replaced_by``."""
    sources: dict[tuple[str, str], list[tuple[str, bool]]]
    """(table, partition directory) to the files whose rows of ``writes`` it merges, each
    with whether it holds one of them whole and nothing else."""
    rows: int = 0
    written: int = 0
    """Rows and files the rewrite has written so far."""

    def write(self, store: StoreHandle) -> None:
        """Write the merged files: rows of the superseded writes, under their fresh ids.
        Nothing shows them until ``commit``."""
        location = store.location
        for (table, directory), files in self.sources.items():
            spec = spec_of_file(TABLES[table], f"{directory}/")
            values: dict[str, object] = dict(
                part.split("=", 1) for part in directory.split("/")[-len(spec.partition_by) :]
            )
            if "step" in values:
                values["step"] = int(values["step"])
            rows = self._rows(location, spec, files)
            if spec is INVOCATIONS:  # a few rows a step: sorted whole, as a local compaction does
                rows = iter(
                    [pa.concat_tables(rows).sort_by([(c, "ascending") for c in spec.sort_by])]
                )
            write_partition(location, spec, values, rows)
            self.written += 1

    def commit(self, store: StoreHandle, now: datetime) -> None:
        """Supersede the old writes by their rewrites: one file, read whole or not at all."""
        count = self.writes.num_rows
        rows = pa.table(
            {
                "rank": self.writes["rank"],
                "write_id": self.writes["write_id"],
                "window_id": pa.nulls(count, pa.int64()),
                "discarded_at": pa.repeat(pa.scalar(now), count),
                "reason": pa.repeat(pa.scalar("compacted"), count),
                "replaced_by": self.writes["replaced_by"],
                "origin_write_id": self.writes["origin"],
                "generation": self.writes["generation"],
            }
        )
        write_partition(store.location, DISCARDS, {"run_id": self.run_id}, rows)

    def _rows(
        self, location: StoreLocation, spec: TableSpec, files: list[tuple[str, bool]]
    ) -> Iterator[pa.Table]:
        """The rows of ``files`` that belong to the superseded writes, rewritten: a file
        of one write takes its new id as is, in its writer's order; others are joined."""
        keys = zip(
            self.writes["rank"].to_pylist(), self.writes["write_id"].to_pylist(), strict=True
        )
        renamed = dict(zip(keys, self.writes["replaced_by"].to_pylist(), strict=True))
        origin = ", k.origin AS origin_write_id" if spec is INVOCATIONS else ""
        steps = "f.step, " if "step" in spec.schema.names else ""  # a group's, in order
        with arrow_cursor() as con:
            con.register("keys", self.writes)
            for path, whole in files:
                table = read_file(location, path, spec)
                if whole:
                    old = table["write_id"][0]
                    table = table.set_column(
                        table.schema.get_field_index("write_id"),
                        "write_id",
                        pa.repeat(
                            pa.scalar(renamed[table["rank"][0].as_py(), old.as_py()], pa.int64()),
                            table.num_rows,
                        ),
                    )
                    if spec is INVOCATIONS:
                        table = table.set_column(
                            table.schema.get_field_index("origin_write_id"),
                            "origin_write_id",
                            pc.coalesce(table["origin_write_id"], old),
                        )
                else:
                    con.register("file", table)
                    table = con.sql(
                        f"""SELECT f.* REPLACE (k.replaced_by AS write_id{origin})
                            FROM file f JOIN keys k USING (rank, write_id)
                            ORDER BY {steps}f.rank, f.invocation_id"""
                    ).to_arrow_table()
                self.rows += table.num_rows
                yield table


def plan_rewrite(store: StoreHandle, run_id: str, files: RunFiles) -> Rewrite | None:
    """The rewrite of the run's writes not yet rewritten, or None when there are none."""
    with store.reading(runs=[run_id], files=files.listed) as cursor:
        cursor.register("file_writes", files.writes)
        held = cursor.sql(_PLAN).fetchall()
        writes = cursor.sql("SELECT * FROM superseded ORDER BY rank, write_id").to_arrow_table()
    if writes.num_rows == 0:
        return None
    # One random number for the whole rewrite in the high bits: racing rewrites then
    # compare the same way for every origin, and one of them wins whole.
    rewrite = secrets.randbits(31) << 32
    fresh = pa.array([rewrite | n for n in range(writes.num_rows)], pa.int64())
    sources: dict[tuple[str, str], list[tuple[str, bool]]] = {}
    for table, directory, path, whole in held:
        sources.setdefault((table, directory), []).append((path, whole))
    return Rewrite(run_id, writes.append_column("replaced_by", fresh), sources)
