"""The store on object storage: a real S3-compatible server (moto) on loopback, sixteen
writer processes, a writer killed before its commit, partition pruning, retention."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import boto3
import numpy as np
import pyarrow.fs as pafs
import pytest
from remote_writer import KERNEL, LAUNCHES, run_writers, write_step
from shared_fixtures import shared_fixture
from simulated_runs import write_run

from multicore_profiler import cli
from multicore_profiler.errors import QueryError, StoreError
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.kernels.synthetic import SWIGLU, SimulatedMoeKernel
from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.store import Store, open_store

WRITER = Path(__file__).parent / "remote_writer.py"
PER_STEP = LAUNCHES * KERNEL.records_per_launch


def bucket_of(uri: str) -> str:
    return uri.removeprefix("s3://").split("/", 1)[0]


def both(store: Store, remote: Store, query: str) -> tuple[list, list]:
    return store.sql(query).to_pylist(), remote.sql(query).to_pylist()


def test_a_store_on_s3_answers_like_a_local_one(store: Store, s3_uri: str) -> None:
    with open_store(s3_uri) as remote:
        assert (remote.uri, repr(remote)) == (s3_uri, f"Store({s3_uri!r})")
        for target in (store, remote):
            write_run(target, SimulatedMoeKernel(), seed=1, commit="aaaa0001")
            write_run(target, SimulatedMoeKernel(stage_us={SWIGLU: 5.0}), seed=2, commit="bbbb")
            ingest_trace(target, shared_fixture("kineto/mi250_minitoy_train.json.gz"), label="toy")
        for query in (
            "SELECT * EXCLUDE (updated_at, end_time, host, versions) FROM runs ORDER BY run_id",
            "SELECT * FROM stage_stats ORDER BY ALL",
            "SELECT * FROM records_ns ORDER BY ALL LIMIT 50",
            "SELECT family, count(*) AS n, sum(dur_ns) AS ns FROM kernels GROUP BY ALL "
            "ORDER BY ALL",
        ):
            local, remote_rows = both(store, remote, query)
            assert remote_rows == local
            assert local  # every query has rows to compare
        keys = {
            o["Key"].split("/")[1]
            for o in boto3.client("s3").list_objects_v2(Bucket=bucket_of(s3_uri))["Contents"]
        }
        assert keys == {
            "mcprof-store.json",
            "runs",
            "invocations",
            "cores",
            "records",
            "trace_events",
            "trace_sources",
        }
    with open_store(s3_uri, create=False) as again:
        assert again.sql("SELECT count(*) AS n FROM invocations").to_pylist() == [{"n": 16}]


def test_what_cannot_be_a_remote_store_is_refused(s3_uri: str) -> None:
    with pytest.raises(StoreError, match=r"no store at s3://.*nothing has been written"):
        open_store(s3_uri, create=False)
    client = boto3.client("s3")
    bucket = bucket_of(s3_uri)
    client.put_object(Bucket=bucket, Key="other/data.csv", Body=b"a,b\n")
    with pytest.raises(StoreError, match=r"is not a multicore_profiler store \(no mcprof-store"):
        open_store(f"s3://{bucket}/other")
    with pytest.raises(
        StoreError,
        match=r"cannot open the store at s3://no-such-bucket-x/s: .*PutObject.*not exist",
    ):
        open_store("s3://no-such-bucket-x/s")
    with pytest.raises(StoreError, match="names no bucket"):
        open_store("s3://")
    with open_store(s3_uri) as remote, pytest.raises(StoreError, match="is not a local directory"):
        _ = remote.root


def test_a_remote_store_made_meanwhile_by_another_rank_opens(
    s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank finds no marker, then lists the prefix: another rank has made the store and
    written its run meanwhile. The listing shows the marker, so it is a store."""
    lookup = StoreLocation.info

    def made_by_another_meanwhile(location: StoreLocation, relative: str) -> pafs.FileInfo:
        monkeypatch.setattr(StoreLocation, "info", lookup)  # the other rank looks as usual
        with open_store(s3_uri) as other:
            other.write_run(RunInfo.begin(run_id="other"))
        return pafs.FileInfo(location.join(relative), pafs.FileType.NotFound)

    monkeypatch.setattr(StoreLocation, "info", made_by_another_meanwhile)
    with open_store(s3_uri) as remote:
        assert StoreLocation.info is lookup
        assert remote.sql("SELECT run_id FROM runs").to_pylist() == [{"run_id": "other"}]


def test_a_store_on_a_given_pyarrow_filesystem(tmp_path: Path, s3_env: dict[str, str]) -> None:
    # Any pyarrow filesystem: here a SubTreeFileSystem over a local directory.
    base = tmp_path / "tree"
    base.mkdir()
    subtree = pafs.SubTreeFileSystem(str(base), pafs.LocalFileSystem())
    with open_store("stores/a", filesystem=subtree) as remote:
        assert remote.uri == "subtree://stores/a"
        write_run(remote, SimulatedMoeKernel(), seed=1, commit="aaaa0001")
        assert remote.sql("SELECT count(*) AS n FROM invocations").to_pylist() == [{"n": 8}]
    assert (base / "stores" / "a" / "mcprof-store.json").is_file()


def test_sixteen_writer_processes_lose_and_duplicate_nothing(
    s3_uri: str, s3_env: dict[str, str]
) -> None:
    ranks, steps = 16, 3
    open_store(s3_uri).close()  # the job's launcher made the store; ranks only write
    run_writers(s3_uri, s3_env, ranks, steps)
    with open_store(s3_uri, create=False) as remote:
        per_rank = remote.sql(
            "SELECT rank, count(*) AS records, count(DISTINCT (invocation_id, core_type, "
            "block_id, record_index)) AS distinct_records FROM records GROUP BY rank ORDER BY rank"
        ).to_pylist()
        assert per_rank == [
            {"rank": r, "records": steps * PER_STEP, "distinct_records": steps * PER_STEP}
            for r in range(ranks)
        ]
        assert remote.sql(
            "SELECT count(*) AS n, count(DISTINCT (rank, invocation_id)) AS d FROM invocations"
        ).to_pylist() == [{"n": ranks * steps * LAUNCHES, "d": ranks * steps * LAUNCHES}]
        assert remote.sql("SELECT status, ranks_reporting FROM runs").to_pylist() == [
            {"status": "complete", "ranks_reporting": ranks}
        ]


def test_each_file_of_a_step_goes_up_in_one_request(
    s3_uri: str, s3_requests: list[tuple[str, str, tuple[str, ...]]]
) -> None:
    """A step's files are small: each is one ``PutObject``, not a multipart upload's three
    round trips (create, part, complete)."""
    with open_store(s3_uri) as remote:
        remote.write_run(RunInfo.begin(run_id="r"))
        s3_requests.clear()
        write_step(remote, "r", np.random.default_rng(0), rank=0, step=0)
    bucket = bucket_of(s3_uri)
    uploads = [
        (method, re.sub(r"[0-9a-f]{32}", "*", key.removeprefix(f"{bucket}/store/")), query)
        for method, key, query in s3_requests
        if method in ("PUT", "POST")
    ]
    assert uploads == [
        ("PUT", f"invocations/run_id=r/_claim-0-0-{LAUNCHES - 1}-*.json", ()),
        ("PUT", "records/run_id=r/step=0/part-*.parquet", ()),
        ("PUT", "cores/run_id=r/step=0/part-*.parquet", ()),
        ("PUT", "invocations/run_id=r/part-*.parquet", ()),
        # pyarrow's delete of the claim puts back the "directory" it leaves empty.
        ("PUT", "invocations/run_id=r/", ()),
    ]
    with open_store(s3_uri, create=False) as remote:
        assert remote.sql("SELECT count(*) AS n FROM records").to_pylist() == [{"n": PER_STEP}]


def test_a_file_whose_upload_fails_is_refused(s3_uri: str) -> None:
    """An upload that fails as its file closes (its one ``PutObject``) fails the write:
    nothing is taken for written that never went up."""
    bucket = boto3.resource("s3").Bucket(bucket_of(s3_uri))
    with open_store(s3_uri) as remote:
        bucket.objects.all().delete()
        bucket.delete()
        with pytest.raises(
            StoreError, match=r"runs/run_id=r/part-.*PutObject.*The specified bucket does not"
        ):
            remote.write_run(RunInfo.begin(run_id="r"))


def test_a_uri_that_says_how_to_open_files_is_obeyed(
    s3_uri: str, s3_requests: list[tuple[str, str, tuple[str, ...]]]
) -> None:
    with open_store(f"{s3_uri}?allow_delayed_open=false") as remote:
        s3_requests.clear()
        remote.write_run(RunInfo.begin(run_id="r"))
    key = f"{bucket_of(s3_uri)}/store/runs/run_id=r/"
    assert [(method, query) for method, name, query in s3_requests if name.startswith(key)] == [
        ("POST", ("uploads",)),
        ("PUT", ("partNumber", "uploadId")),
        ("POST", ("uploadId",)),
    ]


def test_a_writer_killed_before_its_commit_leaves_no_visible_row(
    s3_uri: str, s3_env: dict[str, str]
) -> None:
    open_store(s3_uri).close()
    writer = subprocess.Popen(
        [sys.executable, str(WRITER), s3_uri, "0", "4", "--stall-before-commit", "2"],
        env={**os.environ, **s3_env, "PYTHONPATH": str(WRITER.parent)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "stalled"
    writer.kill()  # step 2's records and cores are uploaded, its invocations are not
    writer.wait(timeout=60)
    with open_store(s3_uri, create=False) as remote:
        raw = remote.sql("SELECT step, count(*) AS n FROM raw_records GROUP BY step ORDER BY step")
        assert raw.to_pylist() == [{"step": s, "n": PER_STEP} for s in range(3)]
        visible = remote.sql("SELECT step, count(*) AS n FROM records GROUP BY step ORDER BY step")
        assert visible.to_pylist() == [{"step": s, "n": PER_STEP} for s in range(2)]
        assert remote.sql("SELECT count(*) AS n FROM records_ns").to_pylist() == [
            {"n": 2 * PER_STEP}
        ]
        assert remote.sql("SELECT status FROM runs").to_pylist() == [{"status": "running"}]


def test_a_query_about_one_run_reads_only_that_runs_files(s3_uri: str) -> None:
    with open_store(s3_uri) as remote:
        runs = [
            write_run(remote, SimulatedMoeKernel(), seed=seed, commit=f"c{seed}")
            for seed in (1, 2, 3)
        ]
        query = f"SELECT * FROM stage_stats WHERE run_id = '{runs[0]}' ORDER BY ALL"
        assert remote._read_plan(query, None)[0] == [runs[0]]  # it lists that run's files only
        before = remote.sql(query)
        # Break every file of the other runs: a query that opened one would fail.
        client = boto3.client("s3")
        bucket = bucket_of(s3_uri)
        for entry in client.list_objects_v2(Bucket=bucket)["Contents"]:
            key = entry["Key"]
            if "run_id=" in key and f"run_id={runs[0]}/" not in key:
                client.put_object(Bucket=bucket, Key=key, Body=b"not parquet")
        assert remote.sql(query).equals(before)
        assert remote.sql(
            f"SELECT count(*) AS n FROM records_ns WHERE run_id = '{runs[0]}'"
        ).to_pylist() == [{"n": 8 * SimulatedMoeKernel().records_per_launch}]
        with pytest.raises(QueryError, match=r"not parquet|magic|Parquet"):
            remote.sql("SELECT count(*) FROM records_ns")
        # Runs chosen by a subquery: only scoping the query keeps it off the broken files.
        by_commit = "SELECT * FROM stage_stats WHERE run_id IN (SELECT run_id FROM runs "
        by_commit += "WHERE commit = 'c1') ORDER BY ALL"
        assert remote.sql(by_commit, runs=runs[:1]).equals(before)


def test_a_query_opens_each_file_at_the_size_its_listing_gave(
    s3_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A remote store's listing gives each file's size: reading a file then costs its
    reads only, not first a request (HEAD) for its size, a round trip per file and query."""
    with open_store(s3_uri) as remote:
        write_run(remote, SimulatedMoeKernel(), seed=1, commit="c1")
    bucket = bucket_of(s3_uri)
    stored = {
        f"/{bucket}/{entry['Key']}"
        for entry in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]
        if entry["Key"].startswith(("store/records/", "store/cores/", "store/invocations/"))
        and entry["Key"].endswith(".parquet")
    }
    caplog.set_level(logging.INFO, logger="werkzeug")  # the S3 server's line per request
    with open_store(s3_uri, create=False) as fresh:
        answer = fresh.sql("SELECT count(*) AS n FROM records_ns").to_pylist()
    assert answer == [{"n": 8 * SimulatedMoeKernel().records_per_launch}]
    requests = [
        found.groups()
        for record in caplog.records
        if (found := re.search(r"(GET|HEAD) (/\S+) HTTP", record.getMessage()))
    ]
    read = {path for method, path in requests if path.endswith(".parquet")}
    assert read == stored
    assert {method for method, path in requests if path in read} == {"GET"}


def test_the_cli_takes_a_store_uri(
    capsys: pytest.CaptureFixture[str], s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(s3_uri) as remote:
        run_id = write_run(remote, SimulatedMoeKernel(), seed=1, commit="aaaa0001")
    assert cli.main(["runs", "--store", s3_uri, "--format", "json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [run_id]
    monkeypatch.setenv("MCPROF_STORE", s3_uri)
    query = "SELECT count(*) AS n FROM invocations"
    assert cli.main(["query", query, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 8}]
    with open_store(s3_uri) as remote:
        write_run(remote, SimulatedMoeKernel(), seed=2, commit="bbbb0002")
    for scope in (["--run", run_id], ["--select", "commit:aaaa0001"]):
        assert cli.main(["query", query, "--format", "json", *scope]) == 0
        assert json.loads(capsys.readouterr().out) == [{"n": 8}]


def test_a_capture_session_records_into_s3_through_its_writer_process(
    s3_uri: str, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The writer process gets the store's location, S3 filesystem included, and writes
    there, in the session's environment: here a writer started (by a session on a local
    store) before the S3 variables were set."""
    import torch

    from multicore_profiler import mega_kernel_profile
    from multicore_profiler.ingest.writer import stop_idle_writers
    from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route

    router, w1, w2 = make_moe_weights(4, 16, 32, generator=torch.Generator().manual_seed(0))
    x = torch.randn(48, 16, generator=torch.Generator().manual_seed(1))
    stop_idle_writers()
    for name in s3_env:
        monkeypatch.delenv(name)
    with ReferenceMoeKernel(w1, w2, token_tile=16) as kernel:
        with mega_kernel_profile(store=tmp_path / "local") as before:
            kernel(x, *route(x, router, 2))
        for name, value in s3_env.items():
            monkeypatch.setenv(name, value)
        with open_store(s3_uri) as remote:
            with mega_kernel_profile(store=remote) as prof:
                for _ in range(2):
                    kernel(x, *route(x, router, 2))
                    prof.step()
            assert prof.writer_pid == before.writer_pid
            # The two steps are one group: an object per table, read as the run's files.
            assert remote.sql(
                """SELECT (SELECT list(step ORDER BY step) FROM invocations) AS steps,
                          (SELECT list(DISTINCT step ORDER BY step) FROM records) AS recorded_steps,
                          (SELECT status FROM runs) AS status,
                          (SELECT capture_steps FROM runs) AS recorded"""
            ).to_pylist() == [
                {"steps": [0, 1], "recorded_steps": [0, 1], "status": "complete", "recorded": 2}
            ]
