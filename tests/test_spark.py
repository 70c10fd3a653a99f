"""Apache Spark (local mode) reads the store's files and finds DuckDB's per-stage numbers."""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Iterator
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from generation_b import pack_b
from golden import AIC, NO_OWNER, Slot, pack

from multicore_profiler import Store, mega_kernel_profile
from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import StoreError
from multicore_profiler.ingest.buffers import ingest_buffers, ingest_into_run
from multicore_profiler.ingest.step_rows import KernelInfo
from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route
from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.spark import register_spark_views, spark_path
from multicore_profiler.storage.supersede import plan_rewrite
from multicore_profiler.storage.vacuum import run_files

COLUMNS = (
    "run_id, kernel_name, direction, stage_desc_id, stage, records, tasks, compute_total_us, "
    "compute_p50_us, compute_p99_us, wait_p50_us, wait_p99_us"
)


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    assert shutil.which("java"), "pyspark needs a Java runtime: make test installs one"
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("mcprof-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
        # The JVM compiles with its quick compiler only: the JIT's optimizing compiler took
        # a third of this file's CPU and pays off only in longer jobs.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def capture_reference_run(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two recorded steps of the CPU reference kernel: records with a task graph."""
    monkeypatch.setenv("MCPROF_RUN_ID", "reference")
    router, w1, w2 = make_moe_weights(4, 16, 32, generator=torch.Generator().manual_seed(0))
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(1))
    ids, weights = route(x, router, 2)
    with (
        ReferenceMoeKernel(w1, w2, token_tile=16) as kernel,
        mega_kernel_profile(store=store) as prof,
    ):
        for _ in range(2):
            kernel(x, ids, weights)
            prof.step()


def rewrite_racing(store: Store, run_id: str) -> None:
    """Two compactions of a run racing each other, both committed, as on object storage."""
    rewrites = [plan_rewrite(store, run_id, run_files(store.location, run_id)) for _ in range(2)]
    for rewrite in rewrites:
        assert rewrite is not None
        rewrite.write(store)
    for rewrite in rewrites:
        assert rewrite is not None
        rewrite.commit(store, datetime.now(timezone.utc))


def test_spark_stage_totals_equal_duckdb_stage_stats(
    spark: object, runs: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture_reference_run(runs, monkeypatch)
    # The capture wrote its steps as a group (in the run's directory), the simulated runs
    # a file per step: Spark reads both layouts of ``records`` as one table.
    assert list((runs.root / "records" / "run_id=reference").glob("*.parquet"))
    (first,) = runs.sql(
        "SELECT run_id FROM runs WHERE run_id <> 'reference' ORDER BY run_id LIMIT 1"
    )["run_id"].to_pylist()
    records = runs.sql("SELECT count(*) AS n FROM records")["n"][0].as_py()
    window = runs.sql(
        "SELECT DISTINCT rank, write_id FROM invocations WHERE run_id = 'reference' "
        "ORDER BY write_id LIMIT 1"
    ).to_pylist()[0]
    # Supersessions, and a discard of one of the reference run's two original writes
    # made after their rewrite: Spark's views must pick the same rows as DuckDB's
    for run_id in ("reference", first):
        rewrite_racing(runs, run_id)
    runs.discard_writes("reference", window["rank"], [window["write_id"]])
    hidden = runs.sql(
        "SELECT sum(record_count) AS n FROM raw_invocations WHERE write_id = $1",
        [window["write_id"]],
    )["n"][0].as_py()
    assert runs.sql("SELECT count(*) AS n FROM records")["n"][0].as_py() == records - hidden
    names = register_spark_views(spark, runs.uri)
    assert names[-6:] == [
        "current_rewrite",
        "invocations",
        "records",
        "tasks",
        "records_ns",
        "stage_totals",
    ]
    duck = runs.sql(f"SELECT {COLUMNS} FROM stage_stats WHERE records > 0 ORDER BY ALL")
    rows = spark.sql(f"SELECT {COLUMNS} FROM stage_totals ORDER BY {COLUMNS}").collect()  # type: ignore[attr-defined]
    from_spark = [row.asDict() for row in rows]
    from_duck = duck.to_pylist()
    assert len(from_spark) == len(from_duck) == 30  # 5 stages x 5 simulated runs + 5 reference
    assert {r["run_id"] for r in from_spark} >= {"reference"}
    for ours, theirs in zip(from_duck, from_spark, strict=True):
        for column, value in ours.items():
            if isinstance(value, float):
                assert math.isclose(theirs[column], value, rel_tol=1e-12), (column, ours)
            else:
                assert theirs[column] == value, (column, ours)
    counted = spark.sql("SELECT count(*) AS n FROM records").collect()[0]["n"]  # type: ignore[attr-defined]
    assert counted == runs.sql("SELECT count(*) AS n FROM records")["n"].to_pylist()[0]


def test_spark_reads_records_files_of_both_index_widths(spark: object, store: Store) -> None:
    """An older records file (record_index uint16) beside a generation b one (uint32, a slot
    of 300 records): Spark cannot merge the two schemas, so it reads both as written now."""
    ingest_into_run(
        store,
        [pack(1, 1, 16, 16, [Slot(AIC, 0, 5, [(5, 6, 0x30001, 0, 0, 0)] * 3)])],
        BufferLayout(1, 1, 16, 16),
        frequency_hz=50e6,
        run_id="old",
    )
    (path,) = store.root.glob("records/run_id=old/**/*.parquet")
    older = pq.read_table(path, partitioning=None)
    index = older.schema.get_field_index("record_index")
    narrow = older.set_column(index, "record_index", older["record_index"].cast(pa.uint16()))
    pq.write_table(narrow, path)
    wide = BufferLayout(1, 1, 304, 16, generation="b")
    records = [(10 + i, 11 + i, 0x30000, i, i, 0) for i in range(300)]
    ingest_into_run(
        store, [pack_b(wide, [Slot(AIC, 0, 10, records)])], wide, frequency_hz=50e6, run_id="new"
    )
    register_spark_views(spark, store.uri)
    rows = spark.sql(  # type: ignore[attr-defined]
        "SELECT run_id, count(*) AS n, max(record_index) AS top FROM records "
        "GROUP BY run_id ORDER BY run_id"
    ).collect()
    assert [row.asDict() for row in rows] == [
        {"run_id": "new", "n": 300, "top": 299},
        {"run_id": "old", "n": 3, "top": 2},
    ]


def test_spark_paths_and_an_empty_store(
    spark: object, store: Store, s3_env: dict[str, str]
) -> None:
    assert spark_path(store.location) == store.root.as_uri()
    assert spark_path(StoreLocation.parse("s3://bucket/prefix")) == "s3a://bucket/prefix"
    with pytest.raises(StoreError, match="has no runs yet"):
        register_spark_views(spark, store.uri)


def test_spark_views_without_pyspark_name_the_extra_to_install(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyspark.sql", None)  # importing it raises ImportError
    location = StoreLocation.parse(tmp_path / "store")
    with pytest.raises(StoreError) as raised:
        register_spark_views(object(), location)
    assert str(raised.value) == (
        "Spark views need pyspark: pip install 'multicore_profiler[spark]'"
    )


def test_spark_names_every_desc_id_as_duckdb(spark: object, store: Store) -> None:
    """Spark's records_ns names stages by the rules of DuckDB's stage_name: a bound name,
    hyper-parallel's task type names, TaskType_<id - 0x20000> from 0x20000 up, DescId_."""
    descs = [0x10001, 0x10003, 0x20000, 0x20003, 0x2006B, 0x2FFFF, 0x30005]
    records = [(100 + i, 101 + i, desc, i, 0, NO_OWNER) for i, desc in enumerate(descs)]
    store.write_run(RunInfo.begin(run_id="names"))
    ingest_buffers(
        store,
        [pack(1, 1, 16, 16, [Slot(AIC, 0, 100, records)])],
        BufferLayout(aic_slots=1, aiv_slots=1, aic_capacity=16, aiv_capacity=16),
        frequency_hz=50e6,
        run_id="names",
        kernel=KernelInfo(stage_names={0x10001: "GMM1", 0x20003: "Copy"}),
    )
    expected = [
        "GMM1",
        "DescId_65539",
        "TaskType_Terminate",
        "TaskType_Copy",
        "TaskType_ShmemGetMem",
        "TaskType_65535",
        "TaskType_65541",
    ]
    query = "SELECT stage FROM records_ns ORDER BY record_index"
    assert store.sql(query)["stage"].to_pylist() == expected
    register_spark_views(spark, store.uri)
    assert [row["stage"] for row in spark.sql(query).collect()] == expected  # type: ignore[attr-defined]
