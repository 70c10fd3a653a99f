"""Each profiled launch's host times: taken where the session says, stored per invocation.

The CPU reference kernel counts on ``time.perf_counter_ns``, the clock the session times
launches on, so its records can be checked exactly against them.
"""

from __future__ import annotations

import itertools
import time
import types

import numpy as np
import pytest
from golden import AIC, GMM1, Slot, pack
from moe_layer import MoeLayer, moe_layer

from multicore_profiler import mega_kernel_profile
from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import ArgumentError
from multicore_profiler.ingest import session as session_module
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import Launches
from multicore_profiler.kernels.backend import CpuBackend
from multicore_profiler.kernels.npu import NpuBackend
from multicore_profiler.kernels.reference import ReferenceMoeKernel
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

STEPS, LAUNCHES = 3, 2
HOST_TIMES = """SELECT invocation_id, step, host_launch_ns, host_sync_ns
                FROM invocations ORDER BY invocation_id"""


class AsyncCpu(CpuBackend):
    """The CPU as a backend whose launches do not block: the session times each launch's
    end after its synchronize, whose calls this backend counts on the session's clock."""

    launch_blocks = False

    def __init__(self) -> None:
        super().__init__()
        self.synchronized: list[int] = []

    def synchronize(self) -> None:
        self.synchronized.append(session_module.time.perf_counter_ns())


@pytest.fixture(scope="module")
def layer() -> MoeLayer:
    return moe_layer()


@pytest.fixture
def counted_session_clock(monkeypatch) -> None:
    """The session's ``time.perf_counter_ns`` counts 0, 1, 2, ... (its ``perf_counter``,
    which times its own cost, stays real; the kernel's records keep the real clock)."""
    ticks = itertools.count()
    fake = types.SimpleNamespace(perf_counter=time.perf_counter, perf_counter_ns=ticks.__next__)
    monkeypatch.setattr(session_module, "time", fake)


def capture(kernel: ReferenceMoeKernel, layer: MoeLayer, store: Store) -> None:
    """STEPS recorded steps of LAUNCHES launches each."""
    with mega_kernel_profile(store=store, writer="thread") as prof:
        for _ in range(STEPS):
            for _ in range(LAUNCHES):
                kernel(*layer.batch)
            prof.step()


def test_the_backends_say_whether_their_launches_block() -> None:
    assert CpuBackend().launch_blocks is True
    assert NpuBackend.launch_blocks is False


def test_a_blocking_launch_is_timed_from_prepare_to_complete(
    layer, store: Store, counted_session_clock
) -> None:
    with ReferenceMoeKernel(layer.w1, layer.w2) as kernel:
        capture(kernel, layer, store)
    rows = store.sql(HOST_TIMES).to_pylist()
    assert len(rows) == STEPS * LAUNCHES
    for row in rows:  # nothing reads the session's clock between prepare's and complete's
        assert row["host_sync_ns"] == row["host_launch_ns"] + 1
    launches = [r["host_launch_ns"] for r in rows]
    assert launches == sorted(set(launches))
    assert store.sql(
        "SELECT host_launch_ns, host_sync_ns FROM raw_invocations ORDER BY invocation_id"
    ).to_pylist() == [{k: r[k] for k in ("host_launch_ns", "host_sync_ns")} for r in rows]
    assert store.compact().partitions > 0  # the step's files merged: the times stay
    assert store.sql(HOST_TIMES).to_pylist() == rows


def test_a_launch_that_does_not_block_ends_at_the_steps_synchronize(
    layer, store: Store, counted_session_clock
) -> None:
    backend = AsyncCpu()
    with ReferenceMoeKernel(layer.w1, layer.w2, backend=backend) as kernel:
        capture(kernel, layer, store)
    rows = store.sql(HOST_TIMES).to_pylist()
    assert len(backend.synchronized) == STEPS
    for step, synchronized in enumerate(backend.synchronized):
        mine = [r for r in rows if r["step"] == step]
        # the step's launches take a tick each, its synchronize one, and the stamp the next
        assert [r["host_launch_ns"] for r in mine] == [synchronized - 2, synchronized - 1]
        assert [r["host_sync_ns"] for r in mine] == [synchronized + 1] * LAUNCHES


def test_every_record_lies_between_its_launch_and_its_synchronize(layer, store: Store) -> None:
    with ReferenceMoeKernel(layer.w1, layer.w2) as kernel:
        capture(kernel, layer, store)
    spans = store.sql(
        """SELECT i.invocation_id, i.host_launch_ns, i.host_sync_ns,
                  least(min(c.entry_cycle), min(r.start_cycle)) AS first_cycle,
                  max(r.end_cycle) AS last_cycle, count(r.*) AS records
           FROM invocations i
           JOIN cores c USING (run_id, rank, invocation_id, write_id)
           JOIN records r USING (run_id, rank, invocation_id, write_id, core_type, block_id)
           GROUP BY ALL ORDER BY i.invocation_id"""
    ).to_pylist()
    assert len(spans) == STEPS * LAUNCHES
    for span in spans:
        assert span["records"] > 0
        assert span["host_launch_ns"] < span["first_cycle"] <= span["last_cycle"]
        assert span["last_cycle"] < span["host_sync_ns"]
    for before, after in itertools.pairwise(spans):
        assert before["host_sync_ns"] < after["host_launch_ns"]


LAYOUT = BufferLayout(aic_slots=1, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
BUFFER = pack(1, 1, 16, 16, [Slot(AIC, 0, 100, [(100, 200, GMM1, 1, 0, 0)])])


def ingest(store: Store, **host: object) -> None:
    run = RunInfo.begin(run_id="host-times")
    store.write_run(run)
    ingest_buffers(
        store,
        [BUFFER, BUFFER, BUFFER],
        LAYOUT,
        frequency_hz=1e9,
        run_id=run.run_id,
        launches=Launches(first_invocation_id=0, **host),
    )


def test_buffers_ingested_by_hand_keep_the_host_times_given(store: Store) -> None:
    ingest(store, host_launch_ns=[10, None, -5], host_sync_ns=(20, 35, None))
    assert store.sql(
        "SELECT host_launch_ns, host_sync_ns FROM invocations ORDER BY invocation_id"
    ).to_pylist() == [
        {"host_launch_ns": 10, "host_sync_ns": 20},
        {"host_launch_ns": None, "host_sync_ns": 35},
        {"host_launch_ns": -5, "host_sync_ns": None},
    ]


def test_buffers_ingested_without_host_times_have_none(store: Store) -> None:
    ingest(store)
    assert store.sql(
        "SELECT count(*) AS n FROM invocations "
        "WHERE host_launch_ns IS NULL AND host_sync_ns IS NULL"
    ).to_pylist() == [{"n": 3}]


@pytest.mark.parametrize(
    ("host", "message"),
    [
        (
            {"host_launch_ns": [1, 2]},
            r"host_launch_ns must hold one time per launch \(3\), got \[1, 2\]",
        ),
        ({"host_sync_ns": "abc"}, r"host_sync_ns must hold one time per launch \(3\)"),
        ({"host_sync_ns": 5}, r"host_sync_ns must hold one time per launch \(3\), got 5"),
        (
            {"host_launch_ns": [1, 2.5, 3]},
            r"host_launch_ns must hold integer ns or None, each an int64, got \[1, 2.5, 3\]",
        ),
        ({"host_launch_ns": [1, True, 3]}, r"host_launch_ns must hold integer ns or None"),
        ({"host_sync_ns": [1, 2, 2**63]}, r"host_sync_ns must hold integer ns or None"),
        ({"host_sync_ns": [None, 2, 2**63]}, r"host_sync_ns must hold integer ns or None"),
        (
            {"host_sync_ns": [1, 2, np.uint64(2**63)]},
            r"host_sync_ns must hold integer ns or None",
        ),
        (
            {"host_launch_ns": [1, None, 3], "host_sync_ns": [2, 7, 3]},
            r"launch 2: host_launch_ns 3 is not before its host_sync_ns 3",
        ),
        (
            {"host_launch_ns": [1, 7, 3], "host_sync_ns": [2, 7, 4]},
            r"launch 1: host_launch_ns 7 is not before its host_sync_ns 7",
        ),
    ],
)
def test_host_times_that_cannot_be_are_refused(store: Store, host, message) -> None:
    with pytest.raises(ArgumentError, match=message):
        ingest(store, **host)
    assert store.sql("SELECT count(*) AS n FROM raw_invocations").to_pylist() == [{"n": 0}]
