from __future__ import annotations

from pathlib import Path

import pytest
from simulated_runs import write_run

from multicore_profiler.kernels.synthetic import GMM1, SWIGLU, SimulatedMoeKernel
from multicore_profiler.storage.store import Store, open_store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """A fresh, empty store in a temporary directory."""
    with open_store(tmp_path / "store") as opened:
        yield opened


@pytest.fixture
def runs(store: Store) -> Store:
    """Base: two runs of the default kernel. Same: another run of it. Slow: SwiGLU 25%
    slower. Fast: GMM1 20% faster."""
    write_run(store, SimulatedMoeKernel(), seed=1, commit="base0001")
    write_run(store, SimulatedMoeKernel(), seed=2, commit="base0001")
    write_run(store, SimulatedMoeKernel(), seed=3, commit="same0002")
    write_run(store, SimulatedMoeKernel(stage_us={SWIGLU: 5.0}), seed=4, commit="slow0003")
    write_run(store, SimulatedMoeKernel(stage_us={GMM1: 20.0}), seed=5, commit="fast0004")
    return store
