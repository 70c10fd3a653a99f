"""Invocation ids under concurrency: writers of one (run, rank) claim their ids, so that
every launch gets its own id, on a local and on a remote (S3) store."""

from __future__ import annotations

import multiprocessing
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from hostile import snapshot

from multicore_profiler.errors import ArgumentError, StoreError
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import Launches
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.limits import INT64_MAX
from multicore_profiler.storage import claims
from multicore_profiler.storage.claims import claims_dir, list_claims
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store, open_store

SMALL = {"experts": 2, "tiles": 2, "aic_workers": 4, "aiv_workers": 4, "aic_slots": 4}
KERNEL = SimulatedMoeKernel(**SMALL, aiv_slots=8)
LAUNCHES = 2
BAND = 10**9
"""Writer w's step s starts its cycles at (w * 10 + s + 1) * BAND: each batch's records
carry where they came from."""


def write_steps(where: str, writer: int, steps: int) -> None:
    """One writer: ``steps`` steps of run ``job``, rank 0, with the next free ids."""
    rng = np.random.default_rng(writer)
    with open_store(where) as store:
        for step in range(steps):
            start = (writer * 10 + step + 1) * BAND
            batch = KERNEL.launches(rng, LAUNCHES, start_cycle=start, period=10**6)
            ingest_buffers(
                store,
                batch,
                KERNEL.layout,
                frequency_hz=KERNEL.frequency_hz,
                run_id="job",
                launches=Launches(rank=0, step=step),
            )


def run_writers(where: str, writers: int, steps: int) -> None:
    """``writers`` processes at once (forked: they start at once, with the modules loaded),
    each writing ``steps`` steps."""
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=write_steps, args=(where, w, steps)) for w in range(writers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * writers


def assert_ids_are_their_own(store: Store, writers: int, steps: int) -> None:
    """Ids 0..N-1, each once, and each invocation's records are those of its own launch."""
    total = writers * steps * LAUNCHES
    ids = store.sql("SELECT invocation_id FROM invocations ORDER BY 1")["invocation_id"]
    assert ids.to_pylist() == list(range(total))
    rows = store.sql(
        f"""SELECT i.invocation_id, i.record_count, count(r.invocation_id) AS records,
               count(DISTINCT r.start_cycle // {BAND}) AS bands,
               min(r.start_cycle // {BAND}) AS band
            FROM invocations i LEFT JOIN records r USING (run_id, rank, invocation_id)
            GROUP BY ALL ORDER BY 1"""
    ).to_pylist()
    assert [r["records"] for r in rows] == [r["record_count"] for r in rows]
    assert all(r["record_count"] == KERNEL.records_per_launch for r in rows)
    assert [r["bands"] for r in rows] == [1] * total
    # Each batch (writer, step) is exactly LAUNCHES invocations, with consecutive ids.
    by_band: dict[int, list[int]] = {}
    for r in rows:
        by_band.setdefault(r["band"], []).append(r["invocation_id"])
    expected = {(w * 10 + s + 1) for w in range(writers) for s in range(steps)}
    assert set(by_band) == expected
    assert all(ids == list(range(ids[0], ids[0] + LAUNCHES)) for ids in by_band.values())


def test_four_writers_of_one_rank_take_distinct_ids(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with open_store(root) as store:
        store.write_run(RunInfo.begin(run_id="job"))
    run_writers(str(root), writers=4, steps=3)
    with open_store(root, create=False) as store:
        assert_ids_are_their_own(store, writers=4, steps=3)
        assert list_claims(store.location, "job") == []  # every claim withdrawn


def test_writers_of_one_rank_take_distinct_ids_on_s3(s3_uri: str, s3_env: dict[str, str]) -> None:
    with open_store(s3_uri) as store:
        store.write_run(RunInfo.begin(run_id="job"))
    run_writers(s3_uri, writers=3, steps=2)
    with open_store(s3_uri, create=False) as store:
        assert_ids_are_their_own(store, writers=3, steps=2)
        assert list_claims(store.location, "job") == []


def ingest(store: Store, count: int = 1, **launch: int) -> int:
    """Write ``count`` launches of run ``job``; return their first invocation id."""
    batch = KERNEL.launches(np.random.default_rng(0), count, start_cycle=BAND, period=10**6)
    return ingest_buffers(
        store,
        batch,
        KERNEL.layout,
        frequency_hz=KERNEL.frequency_hz,
        run_id="job",
        launches=Launches(**launch),
    ).first_invocation_id


def test_next_free_ids_follow_the_run_and_rank(store: Store) -> None:
    assert ingest(store, 2) == 0
    assert ingest(store, 2) == 2
    assert ingest(store, 1, rank=1) == 0
    assert ingest(store, 1, first_invocation_id=10) == 10
    assert ingest(store, 3) == 4  # the lowest free range: 4..6
    assert ingest(store, 4) == 11  # 7..10 holds 10: past it
    ids = store.sql("SELECT invocation_id FROM invocations WHERE rank = 0 ORDER BY 1")
    assert ids["invocation_id"].to_pylist() == [*range(7), *range(10, 15)]


def test_a_taken_first_id_is_refused_and_nothing_is_written(store: Store) -> None:
    ingest(store, 2)
    before = snapshot(store.root)
    with pytest.raises(StoreError, match=r"run job already holds invocation\(s\) \[1\] of rank 0"):
        ingest(store, 2, first_invocation_id=1)
    assert snapshot(store.root) == before


def test_a_first_id_another_writer_claims_is_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims, "ATTEMPTS", 3)
    claims._write_claim(store.location, "job", 0, 5, 9)  # a live writer's claim
    before = snapshot(store.root)
    with pytest.raises(
        StoreError,
        match=r"could not claim invocation ids after 3 attempts: "
        r"other writers claim 5\.\.9",
    ):
        ingest(store, 2, first_invocation_id=8)
    assert snapshot(store.root) == before
    assert ingest(store, 2) == 0  # below the claim
    assert ingest(store, 4) == 10  # past it


def test_a_dead_writers_claim_holds_no_id_and_the_vacuum_deletes_it(store: Store) -> None:
    claims._write_claim(store.location, "job", 0, 0, 9)
    [claim] = list_claims(store.location, "job", 0)
    old = (datetime.now(timezone.utc) - timedelta(days=2)).timestamp()
    os.utime(claim.path, (old, old))
    assert ingest(store, 2, first_invocation_id=0) == 0
    assert ingest(store, 1) == 2
    report = store.compact()
    assert report.files_deleted == 0  # a claim is no data file
    assert list_claims(store.location, "job") == []


def test_gc_removes_a_runs_claims_with_it(store: Store) -> None:
    store.write_run(RunInfo.begin(run_id="job").finish())
    ingest(store, 1)
    claims._write_claim(store.location, "job", 0, 1, 1)
    store.gc(keep_last=0, apply=True)
    assert list_claims(store.location, "job") == []
    assert not (store.root / claims_dir("job")).exists()


def test_ids_never_pass_the_largest_invocation_id(store: Store) -> None:
    assert ingest(store, 1, first_invocation_id=INT64_MAX) == INT64_MAX
    with pytest.raises(StoreError, match=rf"holds invocation\(s\) \[{INT64_MAX}\] of rank 0"):
        ingest(store, 2, first_invocation_id=INT64_MAX - 1)
    with pytest.raises(ArgumentError, match="would pass the largest invocation id"):
        ingest(store, 2, first_invocation_id=INT64_MAX)
    ids = store.sql("SELECT invocation_id FROM invocations")["invocation_id"].to_pylist()
    assert ids == [INT64_MAX]  # exact, not wrapped
    # Every lower id claimed by a live writer: the next free ids would pass 2^63-1.
    claims._write_claim(store.location, "job", 0, 0, INT64_MAX - 1)
    with pytest.raises(ArgumentError, match=f"1 invocation.s. from id {INT64_MAX + 1}"):
        ingest(store, 1)
    with pytest.raises(ArgumentError, match="first invocation id"):
        Launches(first_invocation_id=INT64_MAX + 1)
