"""clock_frequency: the stored counter frequency against the host's launch-to-synchronize
times, on hand-built invocations (every bound worked out below) and on the CPU reference
kernel with a counter that runs at its nominal 1 GHz, twice as fast, and half as fast.

Every store frequency here is 1 GHz. A bound is cycles * 1e9 / ns, computed as the view does.
"""

from __future__ import annotations

import pytest
from golden import AIC, AIV, GMM1, Slot, pack
from moe_layer import moe_layer

from multicore_profiler import mega_kernel_profile
from multicore_profiler.abi import BufferLayout
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import Launches
from multicore_profiler.kernels.reference import ReferenceMoeKernel
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

LAYOUT = BufferLayout(aic_slots=1, aiv_slots=1, aic_capacity=16, aiv_capacity=16)
COLUMNS = """run_id, device, invocations, untimed_invocations, frequency_hz, low_hz, high_hz,
             fitting_hz, verdict, low_from_invocation, low_to_invocation,
             high_from_invocation, high_to_invocation"""
Span = tuple[int, int, int]
"""A core's entry cycle and its one record's start and end."""


def hz(cycles: int, ns: int) -> float:
    """A bound as the view computes it."""
    return cycles * 1e9 / ns


def invocation(
    store: Store,
    run_id: str,
    invocation_id: int,
    aic: Span,
    host: tuple[int, int] | None,
    *,
    aiv: Span | None = None,
    device: int = 0,
) -> None:
    """One invocation: AIC/0 (and AIV/0) with one GMM1 record, launched and synchronized
    at ``host`` (None: not timed)."""
    slots = [
        Slot(core, 0, span[0], [(span[1], span[2], GMM1, 1, 0, 0)])
        for core, span in ((AIC, aic), (AIV, aiv))
        if span is not None
    ]
    ingest_buffers(
        store,
        [pack(1, 1, 16, 16, slots)],
        LAYOUT,
        frequency_hz=1e9,
        run_id=run_id,
        launches=Launches(
            device=device,
            first_invocation_id=invocation_id,
            host_launch_ns=None if host is None else [host[0]],
            host_sync_ns=None if host is None else [host[1]],
        ),
    )


@pytest.fixture
def judged(store: Store) -> Store:
    """One run per case, each worked out in its test below."""
    for run_id in ("ok", "fast", "slow", "reset", "mixed", "edges", "untimed"):
        store.write_run(RunInfo.begin(run_id=run_id).finish())
    # ok: the counter at 1 GHz, AIV/0's entry the first cycle of invocation 0.
    invocation(store, "ok", 0, (100, 110, 300), (50, 400), aiv=(95, 130, 250))
    invocation(store, "ok", 1, (1000, 1000, 1200), (900, 1250))
    # fast: a counter at 2 GHz (cycle = 2 x host ns).
    invocation(store, "fast", 0, (20, 20, 800), (0, 500))
    invocation(store, "fast", 1, (2020, 2020, 2200), (1000, 1200))
    # slow: a counter at 0.5 GHz (cycle = host ns / 2).
    invocation(store, "slow", 0, (5, 5, 200), (0, 500))
    invocation(store, "slow", 1, (505, 505, 550), (1000, 1200))
    # reset: the counter went back between the two invocations.
    invocation(store, "reset", 0, (1000, 1000, 2000), (0, 1500))
    invocation(store, "reset", 1, (100, 100, 200), (2000, 2500))
    # mixed: device 0 has an untimed invocation (1) and two that overlap on the host
    # (2 launched before 0 synchronized); device 1 one timed invocation.
    invocation(store, "mixed", 0, (10, 10, 90), (0, 100))
    invocation(store, "mixed", 1, (200, 200, 300), None)
    invocation(store, "mixed", 2, (150, 150, 250), (90, 300))
    invocation(store, "mixed", 3, (410, 410, 490), (400, 500))
    invocation(store, "mixed", 10, (10, 10, 60), (0, 100), device=1)
    # edges: invocation 0 spans its whole host time and the gap is exactly as long on
    # both clocks: both bounds are 1 GHz.
    invocation(store, "edges", 0, (100, 100, 1100), (100, 1100))
    invocation(store, "edges", 1, (2100, 2100, 2150), (2100, 2200))
    # untimed: buffers ingested without host times.
    invocation(store, "untimed", 0, (100, 100, 200), None)
    return store


def rows(store: Store, run_id: str) -> list[dict]:
    return store.sql(
        f"SELECT {COLUMNS} FROM clock_frequency WHERE run_id = $1 ORDER BY device", [run_id]
    ).to_pylist()


def row(**values: object) -> dict:
    """A clock_frequency row of device 0 at 1 GHz: the given values, the rest defaults."""
    defaults = {
        "device": 0,
        "invocations": 2,
        "untimed_invocations": 0,
        "frequency_hz": 1e9,
        "low_from_invocation": 0,
        "low_to_invocation": 1,
        "high_from_invocation": 0,
        "high_to_invocation": 1,
    }
    return {column.strip(): None for column in COLUMNS.split(",")} | defaults | values


def test_a_right_frequency_lies_between_the_bounds(judged: Store) -> None:
    # lower: 0 alone (300 - 95) / (400 - 50); 1 alone 200 / 350; 0 to 1 (1200 - 95) / (1250 - 50)
    # upper: 0 to 1: (1000 - 300) / (900 - 400)
    assert rows(judged, "ok") == [
        row(run_id="ok", low_hz=hz(1105, 1200), high_hz=hz(700, 500), fitting_hz=1e9, verdict="ok")
    ]


def test_a_counter_running_faster_than_stored_is_too_low(judged: Store) -> None:
    # lower: 780 / 500, 180 / 200, (2200 - 20) / 1200; upper: (2020 - 800) / (1000 - 500)
    assert rows(judged, "fast") == [
        row(
            run_id="fast",
            low_hz=hz(2180, 1200),
            high_hz=hz(1220, 500),
            fitting_hz=hz(2180, 1200),
            verdict="too_low",
        )
    ]
    assert hz(2180, 1200) > 1e9


def test_a_counter_running_slower_than_stored_is_too_high(judged: Store) -> None:
    # lower: 195 / 500, 45 / 200, (550 - 5) / 1200; upper: (505 - 200) / (1000 - 500)
    assert rows(judged, "slow") == [
        row(
            run_id="slow",
            low_hz=hz(545, 1200),
            high_hz=hz(305, 500),
            fitting_hz=hz(305, 500),
            verdict="too_high",
        )
    ]
    assert hz(305, 500) < 1e9


def test_a_counter_that_went_back_contradicts_every_frequency(judged: Store) -> None:
    # lower: 1000 / 1500 (invocation 0); upper: (100 - 2000) / (2000 - 1500) < 0
    assert rows(judged, "reset") == [
        row(
            run_id="reset",
            low_hz=hz(1000, 1500),
            high_hz=hz(-1900, 500),
            verdict="contradictory",
            low_to_invocation=0,
        )
    ]


def test_pairs_in_launch_order_and_groups_per_device(judged: Store) -> None:
    # device 0 in launch order: 0 (0 .. 100), 2 (90 .. 300), 3 (400 .. 500); 1 is untimed.
    # lower: the first with the last, (490 - 10) / (500 - 0), beats 80 / 100, 100 / 210,
    # 80 / 100, (250 - 10) / 300 and (490 - 150) / (500 - 90). upper: 0 and 2 overlap on
    # the host (none); 2 to 3: (410 - 250) / (400 - 300); the first with the last:
    # (410 - 90) / (400 - 100), the smaller.
    assert rows(judged, "mixed") == [
        row(
            run_id="mixed",
            invocations=3,
            untimed_invocations=1,
            low_hz=hz(480, 500),
            high_hz=hz(320, 300),
            fitting_hz=1e9,
            verdict="ok",
            low_to_invocation=3,
            high_to_invocation=3,
        ),
        row(
            run_id="mixed",
            device=1,
            invocations=1,
            low_hz=hz(50, 100),
            fitting_hz=1e9,
            verdict="untimed",
            low_from_invocation=10,
            low_to_invocation=10,
            high_from_invocation=None,
            high_to_invocation=None,
        ),
    ]
    bounds = judged.sql(
        """SELECT kind, pair, from_invocation, to_invocation, cycles, ns, bound_hz
           FROM clock_frequency_bounds WHERE run_id = 'mixed' AND device = 0
           ORDER BY kind, pair, from_invocation"""
    ).to_pylist()
    assert [tuple(b.values()) for b in bounds] == [
        ("high", "consecutive", 2, 3, 160, 100, hz(160, 100)),
        ("high", "first_last", 0, 3, 320, 300, hz(320, 300)),
        ("low", "consecutive", 0, 2, 240, 300, hz(240, 300)),
        ("low", "consecutive", 2, 3, 340, 410, hz(340, 410)),
        ("low", "first_last", 0, 3, 480, 500, hz(480, 500)),
        ("low", "single", 0, 0, 80, 100, hz(80, 100)),
        ("low", "single", 2, 2, 100, 210, hz(100, 210)),
        ("low", "single", 3, 3, 80, 100, hz(80, 100)),
    ]


def test_bounds_equal_to_the_frequency_fit_it(judged: Store) -> None:
    # lower: 1000 / 1000 (invocation 0); upper: (2100 - 1100) / (2100 - 1100)
    assert rows(judged, "edges") == [
        row(
            run_id="edges",
            low_hz=1e9,
            high_hz=1e9,
            fitting_hz=1e9,
            verdict="ok",
            low_to_invocation=0,
        )
    ]


def test_invocations_without_host_times_are_untimed(judged: Store) -> None:
    assert rows(judged, "untimed") == [
        row(
            run_id="untimed",
            invocations=0,
            untimed_invocations=1,
            fitting_hz=1e9,
            verdict="untimed",
            low_from_invocation=None,
            low_to_invocation=None,
            high_from_invocation=None,
            high_to_invocation=None,
        )
    ]


@pytest.mark.parametrize(("scale", "verdict"), [(1.0, "ok"), (2.0, "too_low"), (0.5, "too_high")])
def test_the_reference_kernel_with_a_counter_off_by_a_scale(
    store: Store, scale: float, verdict: str
) -> None:
    layer = moe_layer()
    with (
        ReferenceMoeKernel(layer.w1, layer.w2, clock_scale=scale) as kernel,
        mega_kernel_profile(store=store, writer="thread") as prof,
    ):
        for _ in range(3):
            kernel(*layer.batch)
            kernel(*layer.batch)
            prof.step()
    [found] = store.sql(
        "SELECT invocations, low_hz, high_hz, fitting_hz, verdict FROM clock_frequency"
    ).to_pylist()
    assert (found["invocations"], found["verdict"]) == (6, verdict)
    assert found["low_hz"] <= found["high_hz"]
    if scale == 1.0:
        assert found["low_hz"] <= 1e9 <= found["high_hz"]
        assert found["fitting_hz"] == 1e9
    elif scale > 1:
        assert found["fitting_hz"] == found["low_hz"] > 1e9
    else:
        assert found["fitting_hz"] == found["high_hz"] < 1e9
    # mcprof check --clocks fails on a frequency the host times rule out, and says which fits.
    report = store.check(clocks=True)
    side = {1.0: None, 2.0: "below", 0.5: "above"}[scale]
    assert [p.reason[:60] for p in report.problems] == (
        [] if side is None else [f"rank 0 device 0: the stored frequency 1000 MHz is {side} the "]
    )
