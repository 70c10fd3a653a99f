"""Reading a store with Apache Spark: the same files, the same commit rule, the same
per-stage statistics as DuckDB's.

``register_spark_views(spark, where)`` registers temporary views on a ``SparkSession``:
``raw_<table>`` over the store's Parquet files (hive partitions, every file's schema
merged), then ``invocations``, ``records``, ``tasks``, ``records_ns`` and
``stage_totals`` (the measured columns of ``stage_stats``) from ``spark_views.sql``.
pyspark is not a dependency: the caller brings its session (``pip install pyspark``
and a Java runtime). A remote store is read through Spark's own connector (``s3a://``
for ``s3://``), configured as the cluster configures it.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from multicore_profiler.errors import StoreError
from multicore_profiler.scratch import ScratchDirectory
from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.partitions import PARQUET_SUFFIX, files_by_spec
from multicore_profiler.storage.schema import (
    DISCARDS,
    INVOCATIONS,
    RECORDS,
    RUNS,
    TASKS,
    WIDENED,
    TableSpec,
)

SPARK_TABLES = (RUNS, INVOCATIONS, RECORDS, TASKS, DISCARDS)
"""The tables the Spark views read."""
_EMPTY = {
    "raw_discards": {"run_id": "string", "rank": "int", "write_id": "bigint"},
    "raw_tasks": {
        "run_id": "string",
        "rank": "int",
        "config_id": "string",
        "task_id": "bigint",
        "desc_id": "bigint",
    },
}
"""Columns the views use of the tables a store may not have yet (with those below)."""
_ADDED_LATER = {
    "raw_invocations": {"origin_write_id": "bigint"},
    "raw_discards": {"replaced_by": "bigint", "origin_write_id": "bigint", "generation": "int"},
}
"""Columns the views use that files written before they existed lack (read as NULL)."""
_SCHEMES = {"s3": "s3a"}


def spark_path(location: StoreLocation) -> str:
    """The store's base path as Spark names it: ``file:///...`` or ``s3a://bucket/prefix``."""
    if location.is_local:
        return location.directory.as_uri()
    scheme = location.uri.split("://", 1)[0]
    return f"{_SCHEMES.get(scheme, scheme)}://{location.path}"


def register_spark_views(spark: Any, where: str | StoreLocation) -> list[str]:
    """Register the store's views on ``spark`` (a ``pyspark.sql.SparkSession``); return
    their names."""
    try:
        from pyspark.sql import functions  # the caller's pyspark, not a dependency
    except ImportError:
        raise StoreError(
            "Spark views need pyspark: pip install 'multicore_profiler[spark]'"
        ) from None

    location = where if isinstance(where, StoreLocation) else StoreLocation.parse(where)
    base = spark_path(location)
    # Partition values stay text (a run id of digits is no number); step is cast below.
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    names = []
    for spec in SPARK_TABLES:
        view = f"raw_{spec.name}"
        listed = location.files(spec.name)
        if not listed:
            if view not in _EMPTY:
                raise StoreError(f"the store at {location} has no {spec.name} yet")
            columns = {**_EMPTY[view], **_ADDED_LATER.get(view, {})}
            nulls = ", ".join(f"CAST(NULL AS {kind}) AS {name}" for name, kind in columns.items())
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {view} AS SELECT {nulls} WHERE false")
            names.append(view)
            continue
        frame = None
        for layout in _layouts(spec, listed):
            part = _frame(spark, f"{base}/{spec.name}", spec, layout)
            frame = part if frame is None else frame.unionByName(part, allowMissingColumns=True)
        for column, kind in _ADDED_LATER.get(view, {}).items():
            if column not in frame.columns:
                frame = frame.withColumn(column, functions.lit(None).cast(kind))
        frame.createOrReplaceTempView(view)
        names.append(view)
    text = resources.files(__package__).joinpath("spark_views.sql").read_text()
    for statement in _statements(text):
        spark.sql(statement)
        names.append(statement.split(" AS", 1)[0].rsplit(" ", 1)[-1])
    return names


def _layouts(spec: TableSpec, listed: list[pafs.FileInfo]) -> list[TableSpec]:
    """The specs of the table's ``listed`` files, those of one step first: a
    step-partitioned table's files of one step and its files of several steps
    (``GROUPED``) are read apart, their hive layouts differing."""
    paths = (info.path for info in listed if info.path.endswith(PARQUET_SUFFIX))
    kinds = [kind for kind, _ in files_by_spec(spec, paths)]
    return sorted(kinds, key=lambda kind: -len(kind.partition_by)) or [spec]


def _frame(spark: Any, table: str, spec: TableSpec, kind: TableSpec) -> Any:
    """The files of ``table`` of one layout (``kind``) as a Spark frame."""
    reader = spark.read.option("basePath", table)
    if any(name == spec.name for name, _ in WIDENED):
        reader = reader.schema(_spark_schema(spark, kind))
    else:
        reader = reader.option("mergeSchema", "true")
    if len(kind.partition_by) < len(spec.partition_by):  # files of several steps
        return reader.parquet(f"{table}/*/*{PARQUET_SUFFIX}")
    if "step" not in spec.partition_by:
        return reader.parquet(f"{table}/{'/'.join(['*'] * len(spec.partition_by))}")
    frame = reader.parquet(f"{table}/*/step=*")
    return frame.withColumn("step", frame["step"].cast("bigint"))


def _spark_schema(spark: Any, spec: TableSpec) -> Any:
    """The Spark schema of a table's files as they are written now, read from an empty file
    of its schema: Spark cannot merge the schemas of files whose column was widened since
    (``WIDENED``: an int and a bigint), but reads the older ones with the newer types."""
    with ScratchDirectory("mcprof-spark-") as scratch:
        empty = scratch / f"{spec.name}.parquet"
        pq.write_table(spec.schema.empty_table(), empty)
        return spark.read.parquet(empty.as_uri()).schema


def _statements(text: str) -> list[str]:
    """The SQL statements of a file (Spark runs one per call), without comment lines."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
