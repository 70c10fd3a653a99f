"""The reference kernel's clock knob: cores whose clock is skewed or runs at another rate.

A per-thread fake counter makes every recorded cycle exact: each worker's clock reads
BASE, BASE + 1, ... in the order the worker reads it (its entry cycle, then each record's
start and end), so a core with skew s at scale k records round((BASE + n + s) * k) for its
n-th read.
"""

from __future__ import annotations

import re
import threading

import pytest
import torch
from moe_layer import HIDDEN, TOKENS, MoeLayer, moe_layer

from multicore_profiler import mega_kernel_profile
from multicore_profiler.abi import CoreType
from multicore_profiler.errors import ConfigError
from multicore_profiler.kernels.reference import ReferenceMoeKernel
from multicore_profiler.kernels.reference import moe as moe_module
from multicore_profiler.storage.store import Store

BASE = 1_000_001
"""The fake counter's first value (odd, so that scale 0.5 rounds halves both ways)."""
WORKERS = "AIC (1) blocks 0..1, AIV (2) blocks 0..2"
"""How the errors name the workers of the kernels below (2 AIC, 3 AIV)."""


@pytest.fixture(scope="module")
def layer() -> MoeLayer:
    return moe_layer()


@pytest.fixture
def per_thread_clock(monkeypatch) -> None:
    """Each thread's reads of ``clock`` count up from BASE on their own."""
    local = threading.local()

    def read() -> int:
        value = getattr(local, "next", BASE)
        local.next = value + 1
        return value

    monkeypatch.setattr(moe_module, "clock", read)


def recorded(store: Store) -> dict[tuple[int, int], list[int]]:
    """Each core's cycles in the order it read them: entry, then each record's start, end."""
    cores = store.sql("SELECT core_type, block_id, entry_cycle FROM cores").to_pylist()
    records = store.sql(
        "SELECT core_type, block_id, start_cycle, end_cycle FROM records "
        "ORDER BY core_type, block_id, record_index"
    ).to_pylist()
    stamps = {(c["core_type"], c["block_id"]): [c["entry_cycle"]] for c in cores}
    for r in records:
        stamps[r["core_type"], r["block_id"]] += [r["start_cycle"], r["end_cycle"]]
    return stamps


@pytest.mark.parametrize("scale", [1.0, 2.0, 0.5])
def test_each_core_records_its_own_counter(
    layer, store: Store, per_thread_clock, scale: float
) -> None:
    skews = {(CoreType.AIC, 1): 1_000, (2, 0): -301, (CoreType.AIV, 2): 0}
    with (
        ReferenceMoeKernel(
            layer.w1,
            layer.w2,
            aic_workers=2,
            aiv_workers=3,
            clock_skew_ns=skews,
            clock_scale=scale,
        ) as kernel,
        mega_kernel_profile(store=store, writer="thread"),
    ):
        kernel(*layer.batch)
    stamps = recorded(store)
    assert sorted(stamps) == [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    for (core_type, block), cycles in stamps.items():
        skew = skews.get((core_type, block), 0)
        expected = [round((BASE + n + skew) * scale) for n in range(len(cycles))]
        assert cycles == expected, (core_type, block)
    assert stamps[1, 1][0] == round((BASE + 1_000) * scale)  # e.g. 1,001,001 cycles at scale 1


def test_without_the_knob_every_core_reads_the_clock_itself(
    layer, store: Store, per_thread_clock
) -> None:
    with (
        ReferenceMoeKernel(layer.w1, layer.w2, clock_skew_ns={(1, 0): 0}) as kernel,
        mega_kernel_profile(store=store, writer="thread"),
    ):
        kernel(*layer.batch)
    for cycles in recorded(store).values():
        assert cycles == list(range(BASE, BASE + len(cycles)))


@pytest.mark.parametrize(
    ("skews", "message"),
    [
        (
            {(1, 2): 5},
            r"clock_skew_ns names core \(1, 2\), which is no worker of the kernel; its "
            rf"workers are {re.escape(WORKERS)}$",
        ),
        ({(CoreType.AIV, 3): 5}, r"names core \(<CoreType.AIV: 2>, 3\), which is no worker"),
        ({(3, 0): 5}, r"names core \(3, 0\), which is no worker"),
        ({(1, -1): 5}, r"names core \(1, -1\), which is no worker"),
        ({(True, 0): 5}, r"names core \(True, 0\), which is no worker"),
        ({1: 5}, r"names core 1, which is no worker"),
        ({(1, 0, 0): 5}, r"names core \(1, 0, 0\), which is no worker"),
        ({(1, 0): 1.5}, r"clock_skew_ns\[\(1, 0\)\] must be a whole number of ns, got 1.5"),
        ({(2, 1): True}, r"clock_skew_ns\[\(2, 1\)\] must be a whole number of ns, got True"),
    ],
)
def test_a_skew_of_no_worker_or_of_no_whole_ns_is_refused(layer, skews, message) -> None:
    with pytest.raises(ConfigError, match=message):
        ReferenceMoeKernel(layer.w1, layer.w2, aic_workers=2, aiv_workers=3, clock_skew_ns=skews)


@pytest.mark.parametrize("scale", [0, -1.0, 0.0, float("nan"), float("inf"), True, "2", None])
def test_a_scale_that_is_not_finite_and_positive_is_refused(layer, scale) -> None:
    with pytest.raises(ConfigError, match=r"clock_scale must be a finite number > 0, got "):
        ReferenceMoeKernel(layer.w1, layer.w2, clock_scale=scale)


def test_the_op_refuses_a_malformed_skew_table(layer) -> None:
    with ReferenceMoeKernel(layer.w1, layer.w2) as kernel:
        config = kernel.config_for(TOKENS).with_profiling()
        buffer = torch.zeros(config.layout.total_bytes, dtype=torch.uint8)
        op = torch.ops.mcprof.reference_mega_moe
        args = (*layer.batch, kernel.w1, kernel.w2, config.tensor, buffer, None)
        with pytest.raises(ConfigError, match=r"clock_skew must be an int64 CPU tensor"):
            op(*args, torch.zeros(1, 2, dtype=torch.int64))
        with pytest.raises(ConfigError, match=r"names core \(2, 7\), which is no worker"):
            op(*args, torch.tensor([[2, 7, 10]]))
        with pytest.raises(ConfigError, match=r"clock_scale must be a finite number > 0, got -2.0"):
            op(*args, None, -2.0)
        assert not buffer.any()


def test_the_fake_op_takes_the_knob(layer) -> None:
    with ReferenceMoeKernel(layer.w1, layer.w2) as kernel:
        config = kernel.config_for(TOKENS)
        with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True):
            out = torch.ops.mcprof.reference_mega_moe(
                *layer.batch,
                kernel.w1,
                kernel.w2,
                config.tensor,
                kernel.backend.placeholder,
                None,
                torch.tensor([[1, 0, 5]]),
                2.0,
            )
        assert tuple(out.shape) == (TOKENS, HIDDEN)
