"""Apache Spark (local mode) reads the store's files and finds DuckDB's per-stage numbers."""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator

import pytest
import torch

from multicore_profiler import Store, mega_kernel_profile
from multicore_profiler.errors import StoreError
from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route
from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.spark import register_spark_views, spark_path

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


def test_spark_stage_totals_equal_duckdb_stage_stats(
    spark: object, runs: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture_reference_run(runs, monkeypatch)
    names = register_spark_views(spark, runs.uri)
    assert names[-5:] == ["invocations", "records", "tasks", "records_ns", "stage_totals"]
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


def test_spark_paths_and_an_empty_store(
    spark: object, store: Store, s3_env: dict[str, str]
) -> None:
    assert spark_path(store.location) == store.root.as_uri()
    assert spark_path(StoreLocation.parse("s3://bucket/prefix")) == "s3a://bucket/prefix"
    with pytest.raises(StoreError, match="has no runs yet"):
        register_spark_views(spark, store.uri)
