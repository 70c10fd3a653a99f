"""Comparisons at level ``ranks``: the slowest rank's share of each aligned invocation of a
multi-rank run, between runs. The runs are hand-built (``test_kernel_ranks``' invocation
shape, makespan 167 + the extra GMM1 cycles at 1 GHz): rank 0 even, rank 1 slower by a
known number of cycles per step, so each share is known exactly."""

from __future__ import annotations

import numpy as np
import pytest
from test_kernel_ranks import CONFIG, KERNEL, LAYOUT, STAGES, invocation, tasks

from multicore_profiler import cli
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store

BASE_EXTRA = (0, 1, 2, 3, 4, 5)
HEAD_EXTRA = (40, 41, 42, 43, 44, 45)
"""Rank 1's extra GMM1 cycles per step (0..5), in the base run and in the head run."""


def write_job(store: Store, run_id: str, label: str, extra: tuple[int, ...]) -> None:
    """A run of two ranks, one invocation per step: rank 1's GMM1 ``extra[step]`` longer."""
    run = RunInfo.begin(run_id=run_id, label=label)
    store.write_run(run)
    for rank in (0, 1):
        for step, more in enumerate(extra):
            ingest_buffers(
                store,
                [invocation(1_000 * (step + 1), 100 + more * rank, 50)],
                LAYOUT,
                frequency_hz=1e9,
                run_id=run_id,
                kernel=KernelInfo(kernel_name=KERNEL, stage_names=STAGES, config_id=CONFIG),
                launches=Launches(rank=rank, step=step),
            )
        store.write_tasks(run_id, tasks(rank))
    store.write_run(run.finish())


@pytest.fixture
def two_jobs(store: Store) -> Store:
    write_job(store, "ranks-base", "base", BASE_EXTRA)
    write_job(store, "ranks-head", "head", HEAD_EXTRA)
    return store


def shares(extra: tuple[int, ...]) -> np.ndarray:
    """Each step's slowest-rank share: rank 1's excess over the (lower) median, rank 0's
    167, over rank 1's makespan."""
    return np.array([more / (167 + more) for more in extra])


def test_a_slower_rank_regresses_the_slowest_rank_share(two_jobs: Store) -> None:
    comparison = two_jobs.compare("label:base", "label:head", level="ranks")
    (row,) = comparison.rows.to_pylist()
    base, head = shares(BASE_EXTRA), shares(HEAD_EXTRA)
    assert (row["kernel_name"], row["base_count"], row["head_count"]) == (KERNEL, 6, 6)
    assert row["base_median_share"] == pytest.approx(float(np.median(base)), abs=1e-12)
    assert row["head_median_share"] == pytest.approx(float(np.median(head)), abs=1e-12)
    assert row["change"] == pytest.approx(float(np.median(head) - np.median(base)), abs=1e-12)
    # Every head sample above every base sample: the exact two-sided p is 2 / C(12, 6).
    assert row["p_value"] == pytest.approx(2 / 924)
    assert row["verdict"] == "regressed"
    assert comparison.unit == "share"
    samples = comparison.samples[(KERNEL,)]
    np.testing.assert_allclose(samples[False], base, rtol=0, atol=1e-15)
    np.testing.assert_allclose(samples[True], head, rtol=0, atol=1e-15)


def test_cli_compares_ranks_and_fails_on_the_regression(two_jobs: Store, capsys) -> None:
    argv = ["compare", "--store", two_jobs.uri, "--base", "label:base", "--head", "label:head"]
    assert cli.main([*argv, "--level", "ranks", "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("mcprof compare: 1 regressed (change of the median share above 5 points")
