"""What profiling cost a run: the ``CaptureCost`` a capture session records with its run,
the ``capture_*`` columns of ``runs`` (summed over ranks), and NULL for runs without one."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from multicore_profiler.errors import ArgumentError
from multicore_profiler.storage import store as store_module
from multicore_profiler.storage.runs import CAPTURE_COLUMNS, CaptureCost, RunInfo
from multicore_profiler.storage.schema import RUNS
from multicore_profiler.storage.store import Store

COST = CaptureCost(steps=8, job_seconds=0.0025, writer_cpu_seconds=0.0096, writer="process")
COST_COLUMNS = ", ".join(CAPTURE_COLUMNS)


def cost_of(store: Store, run_id: str) -> dict[str, object]:
    sql = f"SELECT {COST_COLUMNS} FROM runs WHERE run_id = $1"
    (row,) = store.sql(sql, [run_id]).to_pylist()
    return row


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"steps": -1}, "capture cost steps must be in [0, 2**63), got -1"),
        ({"steps": 1 << 63}, f"capture cost steps must be in [0, 2**63), got {1 << 63}"),
        ({"steps": 2.0}, "capture cost steps must be an integer, got 2.0"),
        ({"steps": True}, "capture cost steps must be an integer, got True"),
        ({"job_seconds": -0.5}, "capture cost job_seconds must be finite and >= 0, got -0.5"),
        ({"job_seconds": math.nan}, "capture cost job_seconds must be finite and >= 0, got nan"),
        ({"job_seconds": "1"}, "capture cost job_seconds must be a number, got '1'"),
        (
            {"writer_cpu_seconds": math.inf},
            "capture cost writer_cpu_seconds must be finite and >= 0, got inf",
        ),
        (
            {"writer_cpu_seconds": None},
            "capture cost writer_cpu_seconds must be a number, got None",
        ),
        (
            {"writer": "fork"},
            "capture cost writer must be one of ('process', 'thread'), got 'fork'",
        ),
    ],
)
def test_a_capture_cost_outside_its_range_is_refused_naming_the_field(
    fields: dict[str, object], message: str
) -> None:
    good = {"steps": 1, "job_seconds": 0.0, "writer_cpu_seconds": 0.0, "writer": "thread"}
    with pytest.raises(ArgumentError) as raised:
        CaptureCost(**(good | fields))
    assert str(raised.value) == message


def test_a_run_refuses_a_capture_that_is_not_a_cost() -> None:
    with pytest.raises(ArgumentError) as raised:
        RunInfo.begin(run_id="r1").finish("complete", (1, 0.1, 0.2, "process"))  # type: ignore[arg-type]
    assert str(raised.value) == "run capture must be a CaptureCost, got (1, 0.1, 0.2, 'process')"


@pytest.mark.parametrize(
    ("cost", "per_step"),
    [
        (COST, ("0.31", "1.2")),
        (CaptureCost(3, 1.0, 2.0, "thread"), ("330", "670")),
        (CaptureCost(1, 0.0, 0.00000456, "thread"), ("0", "0.0046")),
        (CaptureCost(4, 0.004, 0.04, "process"), ("1", "10")),
        (CaptureCost(0, 0.0, 0.0, "process"), None),
    ],
)
def test_the_cost_per_recorded_step_in_milliseconds(
    cost: CaptureCost, per_step: tuple[str, str] | None
) -> None:
    assert cost.per_step_ms() == per_step


def test_a_run_written_with_a_cost_reads_back_from_the_runs_view(store: Store) -> None:
    store.write_run(RunInfo.begin(run_id="r1").finish("complete", COST))
    assert cost_of(store, "r1") == {
        "capture_steps": 8,
        "capture_job_seconds": 0.0025,
        "capture_writer_cpu_seconds": 0.0096,
        "capture_writer": "process",
    }
    assert CaptureCost.of_row(cost_of(store, "r1")) == COST


def test_finish_keeps_the_cost_it_had_unless_given_another(store: Store) -> None:
    measured = RunInfo.begin(run_id="r1").finish("complete", COST)
    assert measured.capture == COST
    assert measured.finish("failed").capture == COST
    later = CaptureCost(9, 0.003, 0.01, "thread")
    assert measured.finish("complete", later).capture == later
    assert RunInfo.begin(run_id="r2").finish().capture is None
    store.write_run(measured.finish("failed"))
    assert cost_of(store, "r1")["capture_steps"] == 8
    store.write_run(measured.finish("complete", later))
    assert cost_of(store, "r1") == {
        "capture_steps": 9,
        "capture_job_seconds": 0.003,
        "capture_writer_cpu_seconds": 0.01,
        "capture_writer": "thread",
    }


def test_a_run_without_a_cost_reads_null(store: Store) -> None:
    store.write_run(RunInfo.begin(run_id="r1").finish())
    row = cost_of(store, "r1")
    assert row == dict.fromkeys(CAPTURE_COLUMNS)
    assert CaptureCost.of_row(row) is None


def test_the_runs_view_adds_up_the_cost_of_every_rank(store: Store) -> None:
    """Rank 1 is still running and has measured nothing yet: the sums are of ranks 0 and 2."""
    costs = {0: COST, 1: None, 2: CaptureCost(4, 0.0015, 0.0024, "process")}
    for rank, cost in costs.items():
        run = RunInfo.begin(run_id="r1", rank=rank)
        store.write_run(run if cost is None else run.finish("complete", cost))
    assert cost_of(store, "r1") == {
        "capture_steps": 12,
        "capture_job_seconds": pytest.approx(0.004, abs=1e-15),
        "capture_writer_cpu_seconds": pytest.approx(0.012, abs=1e-15),
        "capture_writer": "process",
    }
    assert CaptureCost.of_row(cost_of(store, "r1")).per_step_ms() == ("0.33", "1")


@pytest.mark.parametrize("native_max_files", [256, 0], ids=["native", "dataset"])
def test_a_runs_file_of_an_older_store_reads_its_cost_as_null(
    store: Store, monkeypatch: pytest.MonkeyPatch, native_max_files: int
) -> None:
    """A runs file written before the capture columns existed, next to one written after."""
    monkeypatch.setattr(store_module, "NATIVE_MAX_FILES", native_max_files)
    store.write_run(RunInfo.begin(run_id="new1").finish("complete", COST))
    old_schema = pa.schema([f for f in RUNS.schema if f.name not in CAPTURE_COLUMNS])
    assert old_schema.names == [
        "updated_at", "start_time", "end_time", "status", "commit", "branch", "label", "host",
        "versions", "schedule", "tags", "rank",
    ]  # fmt: skip
    when = datetime(2026, 11, 1, tzinfo=timezone.utc)
    row = dict.fromkeys(old_schema.names) | {
        "updated_at": when, "start_time": when, "end_time": when, "status": "complete",
        "versions": [], "tags": [],
    }  # fmt: skip
    directory = store.root / "runs" / "run_id=old1"
    directory.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([row], schema=old_schema), directory / "part-old.parquet")
    rows = store.sql(f"SELECT run_id, status, {COST_COLUMNS} FROM runs ORDER BY run_id")
    assert rows.to_pylist() == [
        {
            "run_id": "new1",
            "status": "complete",
            "capture_steps": 8,
            "capture_job_seconds": 0.0025,
            "capture_writer_cpu_seconds": 0.0096,
            "capture_writer": "process",
        },
        {"run_id": "old1", "status": "complete", **dict.fromkeys(CAPTURE_COLUMNS)},
    ]
    assert cost_of(store, "old1") == dict.fromkeys(CAPTURE_COLUMNS)
