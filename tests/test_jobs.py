"""The ranks of one job into the store: ``ingest_job`` and ``mcprof ingest-trace`` over
trace files and torch_npu output folders (text and DB exports, with and without a trace),
and the refusals that keep a job's ranks unambiguous."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from shared_fixtures import shared_fixture

from multicore_profiler import cli
from multicore_profiler.errors import ArgumentError, TraceFormatError
from multicore_profiler.ingest.jobs import ingest_job
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.storage.store import Store, open_store

QWEN3 = "ascend-cluster/msinsight_st_qwen3_4rank_pp2_dp2"
IMAGENET_DB = "ascend-cluster/msinsight_imagenet_2rank_dp_db/level1"
IMAGENET_TEXT = "ascend-cluster/msinsight_imagenet_2rank_dp_text/level1"
TRITON = "kineto/a100_triton_example.json.gz"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with open_store(tmp_path / "store", create=True) as opened:
        yield opened


def sources(store: Store) -> list[dict[str, Any]]:
    return store.sql(
        "SELECT source_id, job_id, rank, device, form, event_count, parallel, profiler_outputs "
        "FROM trace_sources ORDER BY job_id, rank"
    ).to_pylist()


def test_a_folder_of_simplified_exports_is_one_job_of_four_ranks(store: Store) -> None:
    loaded = ingest_job(store, [shared_fixture(QWEN3)])
    rows = sources(store)
    assert [(r["rank"], r["device"], r["form"], r["event_count"]) for r in rows] == [
        (0, 0, "outputs", 0), (1, 1, "outputs", 0), (2, 4, "outputs", 0), (3, 5, "outputs", 0),
    ]  # fmt: skip
    (job,) = {r["job_id"] for r in rows}
    assert job.startswith("job-")
    assert len(job) == 20
    assert [(s.job_id, s.new) for s in loaded] == [(job, True)] * 4
    parallel = json.loads(rows[2]["parallel"])
    assert parallel["distributed_args"]["pipeline_model_parallel_size"] == 2
    assert parallel["parallel_group_info"]["group_name_19"]["global_ranks"] == [0, 2]
    outputs = json.loads(rows[0]["profiler_outputs"])
    assert outputs["step_trace_time"] == [
        {"step": "13", "computing_us": 231290.09999999995,
         "communication_not_overlapped_us": 420174.2600000001, "overlapped_us": 0.0,
         "communication_us": 420174.2600000001, "free_us": 158558.00000000032,
         "stage_us": 810022.25, "bubble_us": 0.0,
         "communication_not_overlapped_exclude_receive_us": 420174.2600000001,
         "preparing_us": 206.25},
    ]  # fmt: skip
    first = outputs["communication"][0]
    assert {k: first[k] for k in ("step", "type", "op_name", "group_name", "elapse_ms")} == {
        "step": "step13", "type": "p2p", "op_name": "hcom_batchSendRecv__128_3_1",
        "group_name": "3985310405473756128", "elapse_ms": 0.43614,
    }  # fmt: skip
    assert len(outputs["communication"]) == 15  # 3 p2p and 12 collective ops
    # The same folders again: the same job, nothing loaded twice.
    again = ingest_job(store, [shared_fixture(QWEN3)])
    assert [(s.job_id, s.new) for s in again] == [(job, False)] * 4


def test_a_db_export_gives_ranks_devices_and_exact_op_times(store: Store) -> None:
    ingest_job(store, [shared_fixture(IMAGENET_DB)], job="imagenet-db")
    rows = sources(store)
    assert [(r["job_id"], r["rank"], r["device"]) for r in rows] == [
        ("imagenet-db", 0, 0), ("imagenet-db", 1, 1),
    ]  # fmt: skip
    outputs = json.loads(rows[0]["profiler_outputs"])
    assert outputs["step_trace_time"][0]["computing_us"] == 8903.431
    first = outputs["communication"][0]
    assert first == {
        "step": "step50", "type": "collective", "op_name": "hcom_allReduce__210_0_1",
        "group_name": "17148521525495523210", "start_us": 1736410576431645.2,
        "elapse_ms": 88.75099321875, "transit_ms": 0.22856459375, "wait_ms": 3.56889128125,
        "sync_ms": 3.51773028125, "idle_ms": 84.95353734375,
        "start_ns": 1736410576431631806, "end_ns": 1736410576520382799,
    }  # fmt: skip


def test_a_level0_db_export_has_op_times_without_msprofs_analysis(store: Store) -> None:
    ingest_job(store, [shared_fixture("ascend-cluster/msinsight_imagenet_2rank_dp_db/level0")])
    outputs = json.loads(sources(store)[1]["profiler_outputs"])
    assert outputs["communication"][0] == {
        "step": "step50", "op_name": "hcom_allReduce__576_0_1",
        "group_name": "90.91.105.46%enp189s0f0_60000_0_1736407029972691",
        "start_ns": 1736407067974055214, "end_ns": 1736407068053244616,
    }  # fmt: skip


def test_a_trace_and_its_folder_join_one_job(store: Store) -> None:
    loaded = ingest_job(
        store,
        [
            shared_fixture(f"{IMAGENET_TEXT}/rank0_ascend_pt"),
            shared_fixture(f"{IMAGENET_TEXT}/rank1_ascend_pt"),
        ],
        job="imagenet",
    )
    assert [(s.rank, s.form, s.job_id) for s in loaded] == [
        (0, "outputs", "imagenet"), (1, "outputs", "imagenet"),
    ]  # fmt: skip


def rank_folder(root: Path, rank: int, *, metadata_rank: int | None = None) -> Path:
    """A copy of the text ImageNet rank 0 folder as rank ``rank``'s."""
    folder = root / f"rank{rank}_ascend_pt"
    source = shared_fixture(f"{IMAGENET_TEXT}/rank0_ascend_pt")
    shutil.copytree(source / "ASCEND_PROFILER_OUTPUT", folder / "ASCEND_PROFILER_OUTPUT")
    (folder / f"profiler_info_{rank}.json").write_text(json.dumps({"rank_id": str(rank)}))
    if metadata_rank is not None:
        (folder / "profiler_metadata.json").write_text(
            json.dumps({"distributed_args": {"rank": metadata_rank, "world_size": 2}})
        )
    return folder


def test_files_that_disagree_on_the_rank_are_refused(tmp_path: Path, store: Store) -> None:
    folder = rank_folder(tmp_path, 1, metadata_rank=3)
    with pytest.raises(
        TraceFormatError, match=r"rank1_ascend_pt: its files name several ranks \[1, 3\]"
    ):
        ingest_job(store, [folder])
    assert sources(store) == []


def test_two_sources_claiming_one_rank_are_refused(tmp_path: Path, store: Store) -> None:
    ingest_job(store, [rank_folder(tmp_path / "a", 0)], job="j")
    other = rank_folder(tmp_path / "b", 0)
    (other / "ASCEND_PROFILER_OUTPUT" / "communication.json").write_text("{}")
    with pytest.raises(ArgumentError, match=r"rank 0 of job 'j' is already source [0-9a-f]{16}"):
        ingest_job(store, [other], job="j")
    assert len(sources(store)) == 1


def test_two_folders_of_one_call_claiming_one_rank_load_neither(
    tmp_path: Path, store: Store
) -> None:
    first, second = rank_folder(tmp_path / "a", 0), rank_folder(tmp_path / "b", 0)
    (second / "ASCEND_PROFILER_OUTPUT" / "communication.json").write_text("{}")
    with pytest.raises(ArgumentError, match=r"rank0_ascend_pt: rank 0 of job 'j' is already"):
        ingest_job(store, [first, second], job="j")
    assert sources(store) == []


def kineto_rank(path: Path, rank: int | None) -> Path:
    """The Triton kineto trace with ``distributedInfo.rank`` set (or removed)."""
    with gzip.open(shared_fixture(TRITON)) as file:
        trace = json.loads(file.read())
    trace.pop("distributedInfo", None)
    if rank is not None:
        trace["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    path.write_text(json.dumps(trace))
    return path


def test_traces_of_a_job_need_ranks_and_a_trace_stays_in_its_job(
    tmp_path: Path, store: Store
) -> None:
    rankless = kineto_rank(tmp_path / "rankless.json", None)
    with pytest.raises(ArgumentError, match="no rank for it in job 'j'"):
        ingest_trace(store, rankless, job="j")
    assert sources(store) == []
    assert not list((Path(store.uri) / "trace_events").glob("*/*.parquet"))
    pair = [kineto_rank(tmp_path / "r0.json", 0), kineto_rank(tmp_path / "r1.json", 1)]
    loaded = ingest_job(store, pair)
    assert [(s.rank, s.job_id) for s in loaded] == [(0, loaded[0].job_id), (1, loaded[0].job_id)]
    with pytest.raises(
        ArgumentError,
        match=f"already in the store as source .* of job '{loaded[0].job_id}', not 'k'",
    ):
        ingest_job(store, [pair[0]], job="k")
    with pytest.raises(ArgumentError, match="rank 3 was given for 2 traces"):
        ingest_job(store, pair, rank=3)


def test_a_folder_that_is_no_profiler_output_is_refused(tmp_path: Path, store: Store) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceFormatError, match="neither a profiler output folder"):
        ingest_job(store, [tmp_path / "empty"])
    folder = tmp_path / "rank0_ascend_pt"
    (folder / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (folder / "profiler_info_0.json").write_text("{}")
    with pytest.raises(TraceFormatError, match=r"holds neither trace_view\.json"):
        ingest_job(store, [folder])
    (folder / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv").write_text(
        "Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,"
        "Bubble,Communication(Not Overlapped and Exclude Receive)\n1,x,0,0,0,0,0,0,0\n"
    )
    with pytest.raises(TraceFormatError, match="column 'Computing' holds 'x', not a number"):
        ingest_job(store, [folder])


def test_cli_ingests_a_folder_of_ranks(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    folder = shared_fixture(QWEN3)
    assert cli.main(["ingest-trace", "--store", store, str(folder), "--job", "qwen3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("  ", 1)[1] for line in out] == [
        f"{folder}/rank_{r}_ascend_pt: no trace: the profiler's tables, rank {r}, job qwen3 "
        "(loaded)"
        for r in range(4)
    ]


def test_a_fifo_among_a_jobs_files_is_refused_without_blocking(
    tmp_path: Path, store: Store
) -> None:
    # The job's name is made of its files' digests: a FIFO is refused before it is read.
    fifo = tmp_path / "rank1.json"
    os.mkfifo(fifo)
    with pytest.raises(TraceFormatError, match="not a regular file"):
        ingest_job(store, [kineto_rank(tmp_path / "r0.json", 0), fifo])
    assert sources(store) == []
