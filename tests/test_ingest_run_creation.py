"""``ingest_into_run``: buffers into a run, creating the run when the store has none of its id
(what ``mcprof ingest-buffer`` does), with exact rows."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest
from golden import AIC, AIV, NO_OWNER, TASK7, Slot, pack

from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import BufferSizeError, StoreError
from multicore_profiler.ingest.buffers import ingest_into_run
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

LAYOUT = BufferLayout(2, 3, 16, 16)
KERNEL = KernelInfo(kernel_name="HyperMegaMoe", stage_names={0x30001: "GMM1"})
BUFFER = bytes(
    pack(
        2,
        3,
        16,
        16,
        [Slot(AIC, 0, 100, TASK7), Slot(AIV, 0, 100, [(150, 151, 0x20003, 8, 2, NO_OWNER)])],
    )
)
RUN_COLUMNS = "run_id, status, label, host IS NOT NULL AS has_host, end_time IS NOT NULL AS ended"
RECORDS = (
    "SELECT run_id, invocation_id, rank, step, core, stage, phase, ts_ns, dur_ns FROM records_ns "
    "ORDER BY run_id, invocation_id, core, record_index"
)


def records(run_id: str, invocation_id: int, rank: int = 0, step: int = 0) -> list[dict]:
    """The rows of ``BUFFER`` in ``records_ns`` as invocation ``invocation_id``."""
    rows = [
        ("AIC", "GMM1", "wait", 200.0, 1000.0),
        ("AIC", "GMM1", "compute", 1200.0, 4800.0),
        ("AIC", "GMM1", "trigger", 6000.0, 100.0),
        ("AIV", "TaskType_3", "compute", 1000.0, 20.0),
    ]
    return [
        {"run_id": run_id, "invocation_id": invocation_id, "rank": rank, "step": step,
         "core": core, "stage": stage, "phase": phase, "ts_ns": ts, "dur_ns": dur}
        for core, stage, phase, ts, dur in rows
    ]  # fmt: skip


def test_a_new_run_is_created_with_its_label_and_finished(store: Store) -> None:
    step = ingest_into_run(
        store, [BUFFER], LAYOUT, frequency_hz=50e6, run_id="r1", label="nightly", kernel=KERNEL
    )
    assert (step.run_id, step.first_invocation_id, list(step.invocation_ids)) == ("r1", 0, [0])
    assert store.sql(f"SELECT {RUN_COLUMNS} FROM runs").to_pylist() == [
        {"run_id": "r1", "status": "complete", "label": "nightly", "has_host": True, "ended": True}
    ]
    assert store.sql(RECORDS).to_pylist() == records("r1", 0)


def test_an_existing_run_is_reused_and_keeps_its_row(store: Store) -> None:
    start = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)
    store.write_run(RunInfo("r1", start, label="base"))
    for step in (0, 1):
        done = ingest_into_run(
            store,
            [BUFFER],
            LAYOUT,
            frequency_hz=50e6,
            run_id="r1",
            label="ignored",
            kernel=KERNEL,
            launches=Launches(rank=1, step=step),
        )
        assert (done.run_id, done.first_invocation_id) == ("r1", step)
    assert store.sql(f"SELECT {RUN_COLUMNS}, start_time FROM runs").to_pylist() == [
        {"run_id": "r1", "status": "running", "label": "base", "has_host": False, "ended": False,
         "start_time": start}
    ]  # fmt: skip
    assert store.sql(RECORDS).to_pylist() == records("r1", 0, 1, 0) + records("r1", 1, 1, 1)


def test_no_run_id_makes_a_fresh_run(store: Store) -> None:
    first = ingest_into_run(store, [BUFFER], LAYOUT, frequency_hz=50e6, label="a", kernel=KERNEL)
    second = ingest_into_run(store, [BUFFER], LAYOUT, frequency_hz=50e6, kernel=KERNEL)
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", first.run_id)
    assert first.run_id != second.run_id
    got = store.sql(f"SELECT {RUN_COLUMNS} FROM runs ORDER BY label NULLS LAST").to_pylist()
    assert got == [
        {"run_id": first.run_id, "status": "complete", "label": "a", "has_host": True,
         "ended": True},
        {"run_id": second.run_id, "status": "complete", "label": None, "has_host": True,
         "ended": True},
    ]  # fmt: skip
    assert store.sql(RECORDS).to_pylist() == sorted(
        records(first.run_id, 0) + records(second.run_id, 0), key=lambda row: row["run_id"]
    )


def test_a_bad_buffer_or_run_id_writes_nothing(store: Store) -> None:
    size = re.escape(f"the buffer holds 2816 bytes but its layout {LAYOUT!r} needs 2880")
    with pytest.raises(BufferSizeError, match=f"^{size}$"):
        ingest_into_run(store, [BUFFER[:-64]], LAYOUT, frequency_hz=50e6, run_id="r1")
    with pytest.raises(StoreError, match=r"^run id 'a b' is not valid: use 1-128 letters"):
        ingest_into_run(store, [BUFFER], LAYOUT, frequency_hz=50e6, run_id="a b")
    assert store.sql("SELECT count(*) AS n FROM runs").to_pylist() == [{"n": 0}]
    assert store.sql("SELECT count(*) AS n FROM records").to_pylist() == [{"n": 0}]
