"""Retention: ``mcprof gc`` removes whole runs by count or age, in local and S3 stores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from remote_writer import write_step

from multicore_profiler import cli
from multicore_profiler.errors import StoreError
from multicore_profiler.storage.retention import collect, plan_gc
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store, open_store

NOW = datetime.now(timezone.utc)
# (run id, label, started hours ago, finished)
RUNS = [
    ("nightly-1", "nightly", 96, True),
    ("nightly-2", "nightly", 72, True),
    ("nightly-3", "nightly", 48, True),
    ("dev-1", "dev", 60, True),
    ("dev-2", "dev", 30, False),  # still running (or died without saying so)
    ("nightly-4", "nightly", 24, True),
]


def write_runs(store: Store) -> None:
    for run_id, label, hours, finished in RUNS:
        run = RunInfo(run_id, NOW - timedelta(hours=hours), label=label)
        store.write_run(run)
        write_step(store, run_id, np.random.default_rng(0), launches=1)
        if finished:
            store.write_run(run.finish())


@pytest.fixture(params=["local", "s3"])
def filled(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    where = (
        str(tmp_path / "store") if request.param == "local" else request.getfixturevalue("s3_uri")
    )
    with open_store(where) as store:
        write_runs(store)
        yield store


def run_ids(store: Store) -> list[str]:
    return store.sql("SELECT run_id FROM runs ORDER BY run_id")["run_id"].to_pylist()


def test_keep_last_is_a_dry_run_until_applied(filled: Store) -> None:
    plan = filled.gc(keep_last=2)
    # Newest first: nightly-4, dev-2 (running: never removed by count), nightly-3, ...
    assert [r["run_id"] for r in plan.runs] == ["nightly-3", "dev-1", "nightly-2", "nightly-1"]
    assert plan.kept == 2
    # Two runs rows (begun, finished), and the invocations, cores and records of its step.
    assert [r["files"] for r in plan.runs] == [5, 5, 5, 5]
    assert all(r["bytes"] > 0 for r in plan.runs)
    assert not plan.applied
    assert plan.summary().endswith("kept 2 (dry run: add --apply)")
    assert len(run_ids(filled)) == 6
    applied = filled.gc(keep_last=2, apply=True)
    assert applied.applied
    assert run_ids(filled) == ["dev-2", "nightly-4"]
    assert filled.sql("SELECT run_id, count(*) AS n FROM raw_records GROUP BY ALL ORDER BY ALL")[
        "run_id"
    ].to_pylist() == ["dev-2", "nightly-4"]
    assert filled.location.files("invocations/run_id=nightly-1") == []


def test_older_than_and_labels(filled: Store) -> None:
    later = NOW + timedelta(hours=50)  # every row was updated now: age them by moving now
    plan = plan_gc(filled, older_than=timedelta(days=2), now=later)
    newest_first = ["nightly-4", "dev-2", "nightly-3", "dev-1", "nightly-2", "nightly-1"]
    assert [r["run_id"] for r in plan.runs] == newest_first
    assert plan_gc(filled, older_than=timedelta(days=3), now=later).runs == []
    by_label = plan_gc(filled, keep_last=1, labels=["nightly"])
    assert [r["run_id"] for r in by_label.runs] == ["nightly-3", "nightly-2", "nightly-1"]
    both = plan_gc(filled, keep_last=1, older_than=timedelta(hours=1), labels=["dev"], now=later)
    assert [r["run_id"] for r in both.runs] == ["dev-1"]
    collect(filled, both)
    assert "dev-1" not in run_ids(filled)


def test_a_removal_cut_short_is_finished_by_the_next(filled: Store) -> None:
    # Died after the invocations, cores and records went: the runs row is left.
    location = filled.location
    for table in ("invocations", "cores", "records"):
        location.delete_dir(f"{table}/run_id=nightly-1")
    assert filled.sql("SELECT invocations FROM run_summary WHERE run_id = 'nightly-1'")[
        "invocations"
    ].to_pylist() == [0]
    plan = filled.gc(keep_last=5, apply=True)
    assert [r["run_id"] for r in plan.runs] == ["nightly-1"]
    assert "nightly-1" not in run_ids(filled)


def test_bad_rules_are_refused(store: Store) -> None:
    with pytest.raises(StoreError, match="say which runs to remove"):
        store.gc()
    with pytest.raises(StoreError, match="keep_last must be a non-negative integer, got -1"):
        store.gc(keep_last=-1)
    with pytest.raises(StoreError, match="older_than must not be negative"):
        store.gc(older_than=timedelta(days=-1))


def test_cli_gc(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    where = str(tmp_path / "store")
    with open_store(where) as store:
        write_runs(store)
    assert cli.main(["gc", "--store", where, "--keep-last", "4", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert [r["run_id"] for r in rows] == ["nightly-2", "nightly-1"]
    assert err.startswith("would remove 2 run(s), 10 file(s), ")
    assert cli.main(["gc", "--store", where, "--keep-last", "4", "--apply"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("removed 2 run(s), 10 file(s), ")
    assert cli.main(["gc", "--store", where, "--older-than", "30", "--label", "dev"]) == 0
    out, err = capsys.readouterr()
    assert (out, err.strip()) == ("", "would remove 0 run(s), 0 file(s), 0.0 MB; kept 2")
    assert cli.main(["gc", "--store", where]) == 1
    assert "say which runs to remove" in capsys.readouterr().err
