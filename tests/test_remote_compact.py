"""Compaction of a store on object storage (moto's S3 on loopback): writes are rewritten,
then superseded by one file, so that a query sees every row once at every moment, even
with two compactions racing; a vacuum deletes what no view can show again."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from polling_reader import QUERY, poll_during
from remote_writer import KERNEL, LAUNCHES, run_writers, write_step

from multicore_profiler import cli
from multicore_profiler.errors import StoreError
from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.partitions import write_partition
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.schema import RECORDS
from multicore_profiler.storage.store import Store, open_store
from multicore_profiler.storage.supersede import plan_rewrite
from multicore_profiler.storage.vacuum import ORPHAN_AGE, run_files

RUNS, RANKS, STEPS = 2, 2, 3
PER_STEP = LAUNCHES * KERNEL.records_per_launch
ANSWERS = {
    "records": "SELECT * EXCLUDE (write_id) FROM records ORDER BY ALL",
    "cores": "SELECT * EXCLUDE (write_id) FROM cores ORDER BY ALL",
    "invocations": "SELECT * EXCLUDE (write_id, origin_write_id) FROM invocations ORDER BY ALL",
    "stage_stats": "SELECT * FROM stage_stats ORDER BY ALL",
    "records_ns": "SELECT * FROM records_ns ORDER BY ALL",
}


def fill(store: Store, steps: range = range(STEPS)) -> None:
    """RUNS runs of RANKS ranks, a write per rank and step."""
    rng = np.random.default_rng(7)
    for r in range(RUNS):
        store.write_run(RunInfo.begin(run_id=f"run{r}"))
        for rank in range(RANKS):
            for step in steps:
                write_step(store, f"run{r}", rng, rank=rank, step=step)


def answers(store: Store) -> dict[str, list[dict]]:
    return {name: store.sql(query).to_pylist() for name, query in ANSWERS.items()}


def files_of(store: Store, table: str) -> int:
    return len(store.location.files(table))


def later(hours: float) -> datetime:
    return datetime.now(timezone.utc) + timedelta(hours=hours)


@pytest.fixture
def remote(s3_uri: str) -> Store:
    return open_store(s3_uri)


def test_compaction_then_vacuum_change_no_answer(remote: Store) -> None:
    fill(remote)
    (dropped,) = remote.sql(
        "SELECT DISTINCT write_id FROM invocations WHERE run_id = 'run1' AND rank = 1 AND step = 2"
    )["write_id"].to_pylist()
    remote.discard_writes("run1", 1, [dropped], reason="window failed")
    before = answers(remote)
    assert len(before["records"]) == (RUNS * RANKS * STEPS - 1) * PER_STEP

    report = remote.compact()
    # 11 visible writes: each of their invocations, cores and records files is merged
    assert (report.runs, report.files_before, report.files_deleted) == (2, 33, 0)
    partitions = RUNS + 2 * RUNS * STEPS  # invocations per run; cores and records per step
    assert (report.partitions, report.files_after) == (partitions, partitions)
    assert answers(remote) == before
    assert remote.sql(
        "SELECT count(*) AS n, min(generation) AS g, max(generation) AS h FROM raw_discards "
        "WHERE replaced_by IS NOT NULL"
    ).to_pylist() == [{"n": 11, "g": 1, "h": 1}]
    # The old files stay for the grace period: readers that listed them still read them.
    assert files_of(remote, "records") == 12 + RUNS * STEPS

    again = remote.compact(now=later(2))
    # The 11 superseded writes' 33 files and the discarded write's 3 go; nothing is left to merge
    assert (again.files_deleted, again.files_before, again.files_after) == (36, 0, 0)
    assert answers(remote) == before
    assert (files_of(remote, "invocations"), files_of(remote, "records")) == (RUNS, RUNS * STEPS)
    counts = remote.sql(QUERY).to_pylist()[0]
    assert counts["n"] == counts["u"] == len(before["records"])


def test_every_moment_of_two_racing_compactions_shows_each_row_once(remote: Store) -> None:
    fill(remote)
    before = answers(remote)
    first = plan_rewrite(remote, "run0", run_files(remote.location, "run0"))
    second = plan_rewrite(remote, "run0", run_files(remote.location, "run0"))
    assert first is not None
    assert second is not None
    for stage in (first.write, second.write):
        stage(remote)
        assert answers(remote) == before
    for rewrite in (first, second):
        rewrite.commit(remote, datetime.now(timezone.utc))
        assert answers(remote) == before
    # Both rewrites are of generation 1: the one of the higher write ids shows, whole.
    shown = remote.sql("SELECT DISTINCT write_id FROM invocations WHERE run_id = 'run0'")
    winner = max(first, second, key=lambda r: r.writes["replaced_by"][0].as_py())
    assert sorted(shown["write_id"].to_pylist()) == winner.writes["replaced_by"].to_pylist()
    # A later compaction rewrites nothing of run0 and vacuums the originals and the losers.
    report = remote.compact(["run0"], now=later(2))
    # run0's 18 original files and the losing rewrite's 7 (1 invocations, 3 cores, 3 records)
    assert (report.files_before, report.files_deleted) == (0, 18 + 7)
    assert answers(remote) == before
    assert files_of(remote, "records") == STEPS + RANKS * STEPS  # run0 merged, run1 not


def test_a_query_during_a_remote_compaction_sees_every_row_once(
    remote: Store, tmp_path: Path
) -> None:
    fill(remote)
    expected = remote.sql(QUERY).to_pylist()[0]
    report, seen, during = poll_during(remote.uri, tmp_path, remote.compact)
    assert report.files_before == 36
    assert during, "no query ran while the compaction did"
    assert seen == {f"{expected['n']} {expected['s']} {expected['u']}"}
    assert expected["n"] == expected["u"] == RUNS * RANKS * STEPS * PER_STEP


def test_compacting_a_run_while_its_ranks_write_it(s3_uri: str, s3_env: dict[str, str]) -> None:
    ranks, steps = 2, 6
    remote = open_store(s3_uri)
    reports = []
    compactions = run_writers(
        s3_uri, s3_env, ranks, steps, lambda: reports.append(remote.compact())
    )
    reports.append(remote.compact())  # whatever the last one during the writes missed
    assert compactions >= 1
    # Every write was rewritten, some again with writes of their step committed later
    rewritten = sum(r.files_before for r in reports)
    assert rewritten >= 3 * ranks * steps
    final = remote.compact(now=later(2))
    # Every source went but invocations files that still hold writes not rewritten again
    assert final.files_before == 0
    assert rewritten - len(reports) < final.files_deleted <= rewritten
    assert remote.compact(now=later(3)).files_deleted == 0
    counts = remote.sql(QUERY).to_pylist()[0]
    assert counts["n"] == counts["u"] == ranks * steps * PER_STEP
    # A step rewritten twice was rewritten whole: one file is left of each
    assert (files_of(remote, "cores"), files_of(remote, "records")) == (steps, steps)
    assert remote.sql("SELECT status FROM runs").to_pylist() == [{"status": "complete"}]


def test_a_compaction_that_dies_before_its_commit_leaves_nothing_in_view(remote: Store) -> None:
    fill(remote)
    before = answers(remote)
    dead = plan_rewrite(remote, "run0", run_files(remote.location, "run0"))
    assert dead is not None
    dead.write(remote)  # 7 merged files (invocations, 3 x cores, 3 x records), no commit
    assert answers(remote) == before
    report = remote.compact(now=later(2))  # they look like a compaction still at work
    assert (report.files_deleted, report.files_before) == (0, 36)
    assert answers(remote) == before
    report = remote.compact(now=later(ORPHAN_AGE.total_seconds() / 3600 + 1))
    assert (report.files_deleted, report.files_before) == (36 + 7, 0)
    assert answers(remote) == before


def test_steps_written_after_a_compaction_are_merged_by_the_next(remote: Store) -> None:
    fill(remote)
    remote.compact(now=later(0))
    fill(remote, range(STEPS, STEPS + 1))
    before = answers(remote)
    report = remote.compact(now=later(2))
    # Only the new step's writes (2 runs x 2 ranks) are rewritten: 12 files in 6 partitions.
    assert (report.files_before, report.partitions, report.files_after) == (12, 6, 6)
    assert answers(remote) == before
    generations = remote.sql(
        "SELECT generation, count(*) AS n FROM raw_discards GROUP BY ALL ORDER BY ALL"
    ).to_pylist()
    assert generations == [{"generation": 1, "n": 12 + 4}]


def test_a_write_discarded_after_its_compaction_stays_hidden(remote: Store) -> None:
    fill(remote)
    original = remote.sql(
        "SELECT DISTINCT write_id FROM invocations WHERE run_id = 'run0' AND rank = 0 AND step = 1"
    )["write_id"].to_pylist()
    remote.compact()
    hidden = remote.sql(
        "SELECT count(*) AS n FROM records WHERE run_id = 'run0' AND rank = 0 AND step = 1"
    ).to_pylist()[0]["n"]
    total = remote.sql("SELECT count(*) AS n FROM records").to_pylist()[0]["n"]
    # A capture window that failed discards the write ids its writer knows: the originals.
    remote.discard_writes("run0", 0, original, reason="window failed")
    assert hidden > 0
    assert remote.sql("SELECT count(*) AS n FROM records").to_pylist() == [{"n": total - hidden}]
    assert remote.sql(
        "SELECT count(*) AS n FROM records WHERE run_id = 'run0' AND rank = 0 AND step = 1"
    ).to_pylist() == [{"n": 0}]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_dead_writers_leftovers_go_after_a_day(
    where: str, store: Store, request: pytest.FixtureRequest
) -> None:
    target = store if where == "local" else request.getfixturevalue("remote")
    fill(target)
    # What a writer that died before its commit leaves: records of a write never committed
    stray = target.sql("SELECT * EXCLUDE (run_id, step) FROM raw_records WHERE step = 1 LIMIT 9")
    stray = stray.set_column(2, "write_id", pa.array([77] * stray.num_rows, pa.int64()))
    write_partition(target.location, RECORDS, {"run_id": "run0", "step": 1}, stray)
    records = target.sql("SELECT count(*) AS n FROM records").to_pylist()
    assert target.compact(now=later(23)).files_deleted == 0
    merged = RUNS * STEPS + 1  # the stray is left
    assert files_of(target, "records") == merged + (0 if where == "local" else RUNS * RANKS * STEPS)
    report = target.compact(now=later(ORPHAN_AGE.total_seconds() / 3600 + 1))
    assert report.files_deleted == (1 if where == "local" else 1 + 3 * RUNS * RANKS * STEPS)
    assert target.sql("SELECT count(*) AS n FROM records").to_pylist() == records
    assert target.sql("SELECT count(*) AS n FROM raw_records").to_pylist() == records


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_dead_writers_task_graph_goes_after_a_day(
    where: str, store: Store, request: pytest.FixtureRequest
) -> None:
    target = store if where == "local" else request.getfixturevalue("remote")
    fill(target, steps=range(1))
    # A writer wrote the graph of config "dead", then died before the step naming it.
    target.write_tasks("run0", KERNEL.tasks_table("dead"))
    graphs = "SELECT config_id, count(*) AS n FROM tasks GROUP BY ALL"
    assert target.sql(graphs).to_pylist() == [{"config_id": "dead", "n": len(KERNEL.tasks)}]
    target.compact(now=later(23))
    assert files_of(target, "tasks") == 1
    target.compact(now=later(ORPHAN_AGE.total_seconds() / 3600 + 1))
    assert files_of(target, "tasks") == 0
    assert target.sql(graphs).to_pylist() == []


def test_the_cli_compacts_a_remote_store(remote: Store, capsys: pytest.CaptureFixture[str]) -> None:
    fill(remote)
    cli.main(["compact", "--store", remote.uri])
    # 12 writes of 2 invocations, 16 busy cores (8 workers a launch) and 96 records
    assert 12 * (2 + 16 + PER_STEP) == 1368
    assert capsys.readouterr().out == (
        "compacted 2 run(s): 36 files in 14 partition(s) merged into 14 (1368 rows)\n"
    )
    cli.main(["compact", "--store", remote.uri, "--grace", "0"])
    assert capsys.readouterr().out == (
        "compacted 2 run(s): 0 files in 0 partition(s) merged into 0 (0 rows); "
        "36 dead file(s) deleted\n"
    )
    with pytest.raises(StoreError, match="grace period must not be negative"):
        remote.compact(grace=timedelta(hours=-1))


def test_listing_a_runs_writes_opens_each_file_at_its_listed_size(
    remote: Store, s3_requests: list[tuple[str, str, tuple[str, ...]]]
) -> None:
    """What a compaction's vacuum reads of a run's files (which writes each holds) costs a
    listing per table and the reads: no request per file for its size."""
    fill(remote, steps=range(1))
    remote.write_tasks("run0", KERNEL.tasks_table("graph"))
    s3_requests.clear()
    files = run_files(remote.location, "run0")
    assert (files.writes.num_rows, files.graphs.num_rows) == (3 * RANKS, 1)
    assert sorted({method for method, _, _ in s3_requests}) == ["GET"]


def test_a_query_lists_each_commit_before_what_it_commits(
    remote: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(remote)
    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    committed = threading.Barrier(4, timeout=30)  # the tables that commit nothing
    files = StoreLocation.files

    def spy(self: StoreLocation, relative: str = "") -> list:
        table = relative.split("/")[0]
        with lock:
            events.append(("start", table))
        if table in ("tasks", "cores", "records", "trace_events"):
            committed.wait()  # breaks unless all four are listed at once
        found = files(self, relative)
        with lock:
            events.append(("end", table))
        return found

    monkeypatch.setattr(StoreLocation, "files", spy)
    remote.sql("SELECT count(*) AS n FROM records")
    # supersessions and discards, then invocations (which commit cores and records),
    # trace sources (which commit trace events) and runs (their task graphs), one after
    # another: a commit listed means its files listed. Then the four tables that commit
    # nothing, at once.
    assert events[:8] == [
        (edge, table)
        for table in ("discards", "invocations", "trace_sources", "runs")
        for edge in ("start", "end")
    ]
    assert sorted(events[8:12]) == [
        ("start", t) for t in sorted(["tasks", "cores", "records", "trace_events"])
    ]
    assert sorted(events[12:]) == [
        ("end", t) for t in sorted(["tasks", "cores", "records", "trace_events"])
    ]
