from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from golden import AIC, AIV, NO_OWNER, TASK7, TRIGGER, WAIT, Slot, pack

from multicore_profiler.abi import BufferLayout
from multicore_profiler.errors import QueryError, StoreError
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.storage import store as store_module
from multicore_profiler.storage.partitions import write_partition
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.schema import RECORDS, TABLES, TableSpec
from multicore_profiler.storage.store import Store, open_store

LAYOUT = BufferLayout(aic_slots=2, aiv_slots=3, aic_capacity=16, aiv_capacity=16)
KERNEL = KernelInfo(
    kernel_name="HyperMegaMoe",
    owner_label="Expert",
    stage_names={0x30001: "GMM1"},
    soc="Ascend910B4",
)


def golden() -> bytearray:
    return pack(
        2,
        3,
        16,
        16,
        [
            Slot(AIC, 0, 100, TASK7),
            Slot(AIV, 0, 100, [(150, 151, 0x20003, 8, 2, NO_OWNER)]),
        ],
    )


def write_golden(store: Store, run_id: str = "r1", **launch: int) -> None:
    store.write_run(RunInfo.begin(run_id=run_id, label="golden"))
    ingest_buffers(
        store,
        [golden()],
        LAYOUT,
        frequency_hz=50e6,
        run_id=run_id,
        kernel=KERNEL,
        launches=Launches(**launch),
    )


def test_records_come_back_raw_and_exact(store: Store) -> None:
    write_golden(store, rank=3, device=1, step=2, first_invocation_id=9)
    rows = store.sql(
        "SELECT * EXCLUDE (write_id) FROM records ORDER BY core_type, block_id, record_index"
    ).to_pylist()
    assert rows[0] == {
        "run_id": "r1",
        "step": 2,
        "rank": 3,
        "invocation_id": 9,
        "core_type": 1,
        "block_id": 0,
        "record_index": 0,
        "start_cycle": 110,
        "end_cycle": 160,
        "desc_id": WAIT,
        "task_id": 7,
        "stage_task_index": 0,
        "owner_id": 5,
        "phase": "wait",
    }
    assert [(r["start_cycle"], r["desc_id"], r["owner_id"], r["phase"]) for r in rows] == [
        (110, WAIT, 5, "wait"),
        (160, 0x30001, 5, "compute"),
        (400, TRIGGER, 5, "trigger"),
        (150, 0x20003, NO_OWNER, "compute"),
    ]


def test_invocation_row_keeps_layout_frequency_and_names(store: Store) -> None:
    write_golden(store, rank=3, device=1, step=2, first_invocation_id=9)
    (row,) = store.sql("SELECT * EXCLUDE (write_id) FROM invocations").to_pylist()
    assert row == {
        "run_id": "r1",
        "rank": 3,
        "device": 1,
        "step": 2,
        "invocation_id": 9,
        "direction": "forward",
        "kernel_name": "HyperMegaMoe",
        "soc": "Ascend910B4",
        "frequency_hz": 50e6,
        "frequency_source": "given",
        "anchor_cycle": 100,
        "aic_slots": 2,
        "aiv_slots": 3,
        "aic_capacity": 16,
        "aiv_capacity": 16,
        "record_count": 4,
        "dropped_count": 0,
        "owner_label": "Expert",
        "stage_names": [(0x30001, "GMM1")],
        "window_id": None,
        "config_id": None,
        "origin_write_id": None,
        "partial_slots": [],
        "abi_generation": "b",  # inferred: it records graph stage 0x30001
        "producer": None,
        "producer_format": None,
        "clock_domain": "shared",
        "host_launch_ns": None,
        "host_sync_ns": None,
    }
    cores = store.sql(
        "SELECT slot, core_type, block_id, entry_cycle, record_count FROM cores ORDER BY slot"
    )
    assert cores.to_pylist() == [
        {"slot": 0, "core_type": 1, "block_id": 0, "entry_cycle": 100, "record_count": 3},
        {"slot": 2, "core_type": 2, "block_id": 0, "entry_cycle": 100, "record_count": 1},
    ]


def test_records_ns_times_phases_and_stage_names(store: Store) -> None:
    write_golden(store)
    rows = store.sql(
        """SELECT core, phase, stage_desc_id, stage, ts_ns, dur_ns FROM records_ns
           ORDER BY core_type, record_index"""
    ).to_pylist()
    assert [tuple(r.values()) for r in rows] == [
        # The worked case: entry 100, start 110, end 160 at 50 MHz is 200 ns + 1000 ns.
        ("AIC", "wait", 0x30001, "GMM1", 200.0, 1000.0),
        ("AIC", "compute", 0x30001, "GMM1", 1200.0, 4800.0),
        ("AIC", "trigger", 0x30001, "GMM1", 6000.0, 100.0),
        ("AIV", "compute", 0x20003, "TaskType_3", 1000.0, 20.0),
    ]


def test_stage_stats_summarize_each_stage(store: Store) -> None:
    write_golden(store)
    rows = store.sql(
        "SELECT * EXCLUDE (run_id, kernel_name, direction) FROM stage_stats ORDER BY stage_desc_id"
    ).to_pylist()
    assert rows == [
        {
            "stage_desc_id": 0x20003,
            "stage": "TaskType_3",
            "records": 1,
            "tasks": 1,
            "compute_total_us": 0.02,
            "compute_p50_us": 0.02,
            "compute_p99_us": 0.02,
            "wait_p50_us": None,
            "wait_p99_us": None,
            "expected_records": None,
            "dropped": None,
        },
        {
            "stage_desc_id": 0x30001,
            "stage": "GMM1",
            "records": 3,
            "tasks": 1,
            "compute_total_us": 4.8,
            "compute_p50_us": 4.8,
            "compute_p99_us": 4.8,
            "wait_p50_us": 1.0,
            "wait_p99_us": 1.0,
            "expected_records": None,
            "dropped": None,
        },
    ]


def test_runs_show_the_latest_state_and_what_each_holds(store: Store) -> None:
    run = RunInfo.begin(run_id="r1", label="golden", tags={"model": "moe"})
    store.write_run(run)
    assert store.sql("SELECT status FROM runs")["status"].to_pylist() == ["running"]
    # A run that holds nothing yet: zeros, and no kernel.
    (empty,) = store.sql("SELECT * EXCLUDE (start_time) FROM run_summary").to_pylist()
    assert empty == {
        "run_id": "r1",
        "status": "running",
        "label": "golden",
        "commit": run.commit,
        "branch": run.branch,
        "host": run.host,
        "end_time": None,
        "invocations": 0,
        "ranks": 0,
        "steps": 0,
        "records": 0,
        "dropped": 0,
        "kernels": None,
    }
    for step in range(3):
        ingest_buffers(
            store,
            [golden(), golden()],
            LAYOUT,
            frequency_hz=50e6,
            run_id="r1",
            kernel=KERNEL,
            launches=Launches(step=step, first_invocation_id=2 * step),
        )
    store.write_run(run.finish())
    (summary,) = store.sql("SELECT * FROM run_summary").to_pylist()
    assert summary["status"] == "complete"
    assert summary["end_time"] is not None
    assert (summary["invocations"], summary["ranks"], summary["steps"]) == (6, 1, 3)
    assert (summary["records"], summary["dropped"], summary["kernels"]) == (24, 0, "HyperMegaMoe")
    (tags,) = store.sql("SELECT tags FROM runs").to_pylist()
    assert tags == {"tags": [("model", "moe")]}


def test_empty_store_answers_every_view_with_typed_empty_tables(store: Store) -> None:
    for view in (
        "runs",
        "invocations",
        "cores",
        "records",
        "records_ns",
        "stage_stats",
        "run_summary",
    ):
        assert store.sql(f"SELECT * FROM {view}").num_rows == 0
    schema = store.sql("SELECT * FROM records_ns").schema
    assert schema.field("ts_ns").type == pa.float64()
    assert schema.field("start_cycle").type == pa.uint64()
    assert schema.field("stage").type == pa.string()


@pytest.mark.parametrize("spec", TABLES.values(), ids=lambda spec: spec.name)
def test_an_empty_table_has_the_types_duckdb_reads_from_its_arrow_schema(
    store: Store, spec: TableSpec
) -> None:
    """The typed empty tables under every view are made by DDL, not from Arrow: each has
    the partition keys, then the table's columns, at the types DuckDB gives the same
    Arrow columns (a dictionary as its values)."""
    partition_types = {"run_id": pa.string(), "step": pa.int64(), "source_id": pa.string()}
    fields = [pa.field(key, partition_types[key]) for key in spec.partition_by]
    for field in spec.schema:
        dictionary = pa.types.is_dictionary(field.type)
        fields.append(pa.field(field.name, field.type.value_type if dictionary else field.type))
    empty = pa.Table.from_batches([], pa.schema(fields))
    expected = duckdb.connect().from_arrow(empty).to_arrow_table().schema
    assert store.sql(f"SELECT * FROM empty_{spec.name}").schema == expected


def test_a_store_sees_what_others_write_after_it_opened(tmp_path: Path) -> None:
    reader = open_store(tmp_path / "s")
    assert reader.sql("SELECT count(*) AS n FROM records")["n"].to_pylist() == [0]
    writer = open_store(tmp_path / "s")
    write_golden(writer)
    assert reader.sql("SELECT count(*) AS n FROM records")["n"].to_pylist() == [4]
    write_golden(writer, run_id="r2")
    assert reader.sql("SELECT count(DISTINCT run_id) AS n FROM records_ns")["n"].to_pylist() == [2]


def test_rows_of_a_dead_writer_never_join_a_retry(store: Store) -> None:
    write_golden(store)
    # A writer died after its records file and before its invocations file, under the
    # very invocation id that the retry, written next, uses again.
    leftover = store.sql("SELECT * EXCLUDE (run_id, step, write_id) FROM raw_records")
    write_partition(
        store.location,
        RECORDS,
        {"run_id": "r1", "step": 0},
        leftover.append_column("write_id", pa.array([12345] * 4, pa.int64())),
    )
    assert store.sql("SELECT count(*) AS n FROM raw_records")["n"].to_pylist() == [8]
    assert store.sql("SELECT count(*) AS n FROM records")["n"].to_pylist() == [4]
    assert store.sql("SELECT count(*) AS n FROM records_ns")["n"].to_pylist() == [4]
    assert store.sql("SELECT sum(records) AS n FROM stage_stats")["n"].to_pylist() == [4]


def test_partition_files_are_laid_out_by_run_and_step(store: Store) -> None:
    write_golden(store, step=4)
    files = sorted(str(p.relative_to(store.root).parent) for p in store.root.rglob("*.parquet"))
    assert files == [
        "cores/run_id=r1/step=4",
        "invocations/run_id=r1",
        "records/run_id=r1/step=4",
        "runs/run_id=r1",
    ]
    assert not list(store.root.rglob("*.tmp"))


def test_bad_queries_raise_query_errors_with_duckdb_reason(store: Store) -> None:
    with pytest.raises(QueryError, match="Table with name nowhere does not exist"):
        store.sql("SELECT * FROM nowhere")
    with pytest.raises(QueryError, match="Parser Error"):
        store.sql("SELEKT 1")


def test_query_parameters(store: Store) -> None:
    write_golden(store)
    write_golden(store, run_id="r2")
    rows = store.sql("SELECT count(*) AS n FROM records WHERE run_id = $1", ["r2"])
    assert rows["n"].to_pylist() == [4]


def test_opening_what_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no store at"):
        open_store(tmp_path / "missing", create=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="is not a multicore_profiler store"):
        open_store(tmp_path / "other")
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is not a directory"):
        open_store(tmp_path / "file")
    future = tmp_path / "future"
    open_store(future).close()
    (future / "mcprof-store.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(StoreError, match="store of format 99"):
        open_store(future)


def test_a_store_another_process_is_making_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks open a new store at once. One finds what another has made so far, its lock
    file and its marker written aside, and makes the store too; one whose listing finds
    files the other wrote after its marker has a store, the other's."""
    making = tmp_path / "making"
    making.mkdir()
    (making / ".mcprof.lock").touch()
    (making / ".mcprof-store.json.4242.tmp").write_text('{"format"')
    open_store(making).close()
    assert json.loads((making / "mcprof-store.json").read_text()) == {
        "format": store_module.FORMAT_VERSION
    }

    made = tmp_path / "made"
    made.mkdir()
    listing = Path.iterdir

    def made_by_another_meanwhile(directory: Path) -> Iterator[Path]:
        monkeypatch.setattr(Path, "iterdir", listing)  # the other process lists as usual
        with open_store(directory) as other:
            write_golden(other)
        return listing(directory)

    monkeypatch.setattr(Path, "iterdir", made_by_another_meanwhile)
    with open_store(made) as store:
        assert store.sql("SELECT count(*) AS n FROM records").to_pylist() == [{"n": 4}]


def test_default_store_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCPROF_STORE", str(tmp_path / "env-store"))
    assert open_store().root == tmp_path / "env-store"
    monkeypatch.delenv("MCPROF_STORE")
    monkeypatch.chdir(tmp_path)
    assert open_store().root == tmp_path / "mcprof-store"


def test_write_step_refuses_rows_that_do_not_belong(store: Store) -> None:
    write_golden(store)
    invocations = store.sql("SELECT * EXCLUDE (run_id, write_id) FROM invocations")
    cores = store.sql("SELECT * EXCLUDE (run_id, step, write_id) FROM cores")
    records = store.sql("SELECT * EXCLUDE (run_id, step, write_id) FROM records")
    with pytest.raises(StoreError, match=r"written to step 5 carry steps \[0\]"):
        store.write_step("r1", 5, invocations=invocations, cores=cores, records=records)
    strangers = records.set_column(1, "invocation_id", pa.array([7] * 4, pa.int64()))
    with pytest.raises(StoreError, match="records rows name a invocation_id that no invocation"):
        store.write_step("r1", 0, invocations=invocations, cores=cores, records=strangers)
    with pytest.raises(StoreError, match=r"missing \['phase'\], unexpected \[\]"):
        store.write_step(
            "r1", 0, invocations=invocations, cores=cores, records=records.drop_columns(["phase"])
        )
    with pytest.raises(StoreError, match="run id 'a/b' is not valid"):
        store.write_step("a/b", 0, invocations=invocations, cores=cores, records=records)
    assert store.sql("SELECT count(*) AS n FROM raw_records")["n"].to_pylist() == [4]


def test_run_rows_and_ids() -> None:
    assert len(RunInfo.begin().run_id) == len("20261129T193200Z-1a2b3c4d")
    run = RunInfo(run_id="x", start_time=datetime(2026, 1, 2, tzinfo=timezone.utc))
    assert run.to_table()["start_time"].to_pylist()[0] == datetime(2026, 1, 2, tzinfo=timezone.utc)
    with pytest.raises(ValueError, match="run status must be one of"):
        RunInfo(run_id="x", start_time=run.start_time, status="done")


def test_runs_record_the_revision_being_profiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "feature"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    monkeypatch.chdir(repo)
    monkeypatch.delenv("MCPROF_COMMIT", raising=False)
    monkeypatch.delenv("MCPROF_BRANCH", raising=False)
    run = RunInfo.begin()
    assert (run.commit, run.branch) == (head.stdout.strip(), "feature")
    monkeypatch.setenv("MCPROF_COMMIT", "abc123")
    monkeypatch.setenv("MCPROF_BRANCH", "main")
    run = RunInfo.begin()
    assert (run.commit, run.branch) == ("abc123", "main")
    assert run.versions["pyarrow"] == pa.__version__


def test_a_table_whose_files_all_went_away_reads_as_empty(store: Store) -> None:
    write_golden(store)
    assert store.sql("SELECT count(*) AS n FROM records_ns")["n"].to_pylist() == [4]
    for table in ("runs", "invocations", "cores", "records"):
        shutil.rmtree(store.root / table)
    assert store.sql("SELECT count(*) AS n FROM records_ns")["n"].to_pylist() == [0]
    assert store.sql("SELECT count(*) AS n FROM run_summary")["n"].to_pylist() == [0]


def test_a_store_written_before_a_column_existed_still_opens(store: Store) -> None:
    """Files of an older writer lack window_id and config_id: they read as NULL."""
    write_golden(store)
    (path,) = (store.root / "invocations").rglob("*.parquet")
    pq.write_table(pq.read_table(path).drop_columns(["window_id", "config_id"]), path)
    with open_store(store.root, create=False) as reopened:
        rows = reopened.sql(
            "SELECT invocation_id, window_id, config_id FROM invocations ORDER BY 1"
        ).to_pylist()
        assert rows == [{"invocation_id": 0, "window_id": None, "config_id": None}]
        assert reopened.sql("SELECT count(*) AS n FROM records_ns")["n"].to_pylist() == [4]


@pytest.mark.parametrize("native_max_files", [256, 0], ids=["native", "dataset"])
def test_both_readers_read_an_older_writers_file_with_nulls_for_new_columns(
    store: Store, monkeypatch: pytest.MonkeyPatch, native_max_files: int
) -> None:
    monkeypatch.setattr(store_module, "NATIVE_MAX_FILES", native_max_files)
    write_golden(store, step=0, first_invocation_id=1)
    # What a version without frequency_source wrote for step 1 (same records, new ids).
    raw = store.sql("SELECT * EXCLUDE (run_id) FROM raw_invocations")
    old = raw.drop_columns(["frequency_source"])
    old = old.set_column(old.column_names.index("invocation_id"), "invocation_id", pa.array([2]))
    old = old.set_column(old.column_names.index("step"), "step", pa.array([1]))
    records = store.sql("SELECT * EXCLUDE (run_id, step) FROM raw_records")
    records = records.set_column(records.column_names.index("invocation_id"), "invocation_id",
                                 pa.array([2] * records.num_rows))  # fmt: skip
    for table, rows, directory in (
        ("records", records, "records/run_id=r1/step=1"),
        ("invocations", old, "invocations/run_id=r1"),
    ):
        (store.root / directory).mkdir(parents=True, exist_ok=True)
        pq.write_table(rows, store.root / directory / f"part-old-{table}.parquet")
    assert store.sql(
        "SELECT invocation_id, step, frequency_source, frequency_hz FROM invocations ORDER BY 1"
    ).to_pylist() == [
        {"invocation_id": 1, "step": 0, "frequency_source": "given", "frequency_hz": 50e6},
        {"invocation_id": 2, "step": 1, "frequency_source": None, "frequency_hz": 50e6},
    ]
    per_step = store.sql("SELECT step, count(*) AS n FROM records_ns GROUP BY ALL ORDER BY ALL")
    assert per_step.to_pylist() == [{"step": 0, "n": 4}, {"step": 1, "n": 4}]


def test_a_scoped_query_reads_only_its_runs_files(store: Store) -> None:
    for run in ("a1", "b2", "c3"):
        write_golden(store, run_id=run)
    scoped = "SELECT run_id, count(*) AS n FROM records_ns GROUP BY ALL ORDER BY ALL"
    assert store.sql(scoped, runs=["b2", "c3"]).to_pylist() == [
        {"run_id": "b2", "n": 4},
        {"run_id": "c3", "n": 4},
    ]
    # Break run a1's files: an unscoped query fails, a scoped one never opens them, even
    # when its runs come from a subquery (which no filter pushdown could prune).
    for path in (store.root / "records" / "run_id=a1").rglob("*.parquet"):
        path.write_bytes(b"broken")
    with pytest.raises(QueryError):
        store.sql("SELECT count(*) FROM records_ns")
    chosen = "SELECT count(*) AS n FROM records_ns WHERE run_id IN (SELECT run_id FROM runs)"
    assert store.sql(chosen, runs=["b2", "c3"]).to_pylist() == [{"n": 8}]
    assert store.sql("SELECT count(*) AS n FROM runs", runs=["b2"]).to_pylist() == [{"n": 1}]
    with pytest.raises(StoreError, match="run id 'no/such' is not valid"):
        store.sql("SELECT 1", runs=["no/such"])


def test_a_whole_table_scan_of_a_big_store_uses_the_native_reader(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "NATIVE_MAX_FILES", 0)  # every table "big"
    for run in ("a1", "b2"):
        write_golden(store, run_id=run)
    with store.reading() as cursor:
        pruned = "SELECT count(*) FROM records_ns WHERE run_id = 'a1'"
        filtered = store._dataset_filtered
        assert filtered(cursor, pruned, None, frozenset())
        assert not filtered(cursor, "SELECT count(*) FROM records", None, frozenset())
        assert filtered(cursor, "not sql at all", None, frozenset())
    # Both readers, chosen per query, give the same rows.
    assert store.sql("SELECT count(*) AS n FROM records_ns").to_pylist() == [{"n": 8}]
    assert store.sql(pruned.replace("count(*)", "count(*) AS n")).to_pylist() == [{"n": 4}]


def test_a_query_of_whole_tables_makes_no_dataset_of_a_big_store(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its plan over the empty tables filters no scan on a partition column: a new store
    reads its big tables with DuckDB's reader from the start, and makes no dataset that
    would only give way to it. A query filtered on one still reads datasets."""
    for run in ("a1", "b2"):
        write_golden(store, run_id=run)
    monkeypatch.setattr(store_module, "NATIVE_MAX_FILES", 0)  # every table "big"
    made: list[str] = []
    dataset_scan = store_module.Store._dataset_scan
    monkeypatch.setattr(
        store_module.Store,
        "_dataset_scan",
        lambda self, cursor, spec, files: (
            made.append(spec.name) or dataset_scan(self, cursor, spec, files)
        ),
    )
    whole = {
        "SELECT count(*) AS n FROM records_ns": 8,
        "SELECT count(*) AS n FROM run_summary": 2,
        "SELECT count(*) AS n FROM records WHERE start_cycle >= 0": 8,
    }
    filtered = {
        "SELECT count(*) AS n FROM records WHERE step = 0": 8,
        "SELECT count(*) AS n FROM records_ns WHERE run_id >= 'b2'": 4,
    }
    with open_store(store.root) as fresh:  # as a new command sees it
        for query, n in whole.items():
            assert fresh._read_plan(query, None) == (None, True)
            assert fresh.sql(query).to_pylist() == [{"n": n}]
        assert made == []
        for query, n in filtered.items():
            assert fresh._read_plan(query, None) == (None, False)
            assert fresh.sql(query).to_pylist() == [{"n": n}]
        assert "records" in made


def test_a_query_whose_plan_pins_its_runs_reads_as_one_scoped_to_them(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a store with a table too big for DuckDB's reader, a query whose plan filters
    every scan of a table of runs to constant run ids, or scans one without files, reads
    as one scoped to those runs (only their files listed, checked and read); any other
    keeps its whole-store reading. Either way the rows are the same."""
    for run in ("a1", "b2", "c3"):
        write_golden(store, run_id=run)
    count = "SELECT count(*) AS n FROM records_ns"
    pinned = {
        f"{count} WHERE run_id = 'b2'": (["b2"], 4),
        f"{count} WHERE run_id = 'b2' AND step >= 0": (["b2"], 4),
        "SELECT count(*) AS n FROM stage_stats WHERE run_id = 'c3'": (["c3"], 2),
        "SELECT count(*) AS n FROM invocations WHERE run_id = 'b2' OR run_id = 'c3'": (
            ["b2", "c3"],
            2,
        ),
        "SELECT count(*) AS n FROM invocations WHERE run_id IN ('a1', 'c3')": (["a1", "c3"], 2),
    }
    unpinned = {
        # DuckDB filters some of records_ns's scans by a join instead: no constant pins them
        f"{count} WHERE run_id = 'b2' OR run_id = 'c3'": 8,
        f"{count} WHERE run_id IN ('b2', 'c3')": 8,
        f"{count} WHERE run_id = 'b2' OR step > 0": 4,
        f"{count} WHERE run_id >= 'b2'": 8,
        f"{count} WHERE run_id IN (SELECT run_id FROM runs WHERE run_id = 'b2')": 4,
        count: 12,
        "not sql at all": None,
    }
    # What the whole store read natively says (no table is big: nothing is planned twice).
    whole = {q: store.sql(q).to_pylist() for q in [*pinned, *unpinned] if q != "not sql at all"}
    assert whole == {q: [{"n": n}] for q, (_, n) in pinned.items()} | {
        q: [{"n": n}] for q, n in unpinned.items() if n is not None
    }
    monkeypatch.setattr(store_module, "NATIVE_MAX_FILES", 0)  # every table "big"
    store = open_store(store.root)  # as a new command sees it
    assert {q: store._read_plan(q, None)[0] for q in pinned} == {
        q: r for q, (r, _) in pinned.items()
    }
    assert store._read_plan(f"{count} WHERE run_id = $1", ["c3"])[0] == ["c3"]
    assert [store._read_plan(q, None)[0] for q in unpinned] == [None] * len(unpinned)
    # The optimizer rules the plans turned off are the whole database's: on again.
    setting = "SELECT current_setting('disabled_optimizers') AS off"
    assert store.sql(setting).to_pylist() == [{"off": ""}]

    scoped: list[list[str] | None] = []
    point = store_module.Store._point
    monkeypatch.setattr(
        store_module.Store,
        "_point",
        lambda self, cursor, runs, *args, **kwargs: (
            scoped.append(runs) or point(self, cursor, runs, *args, **kwargs)
        ),
    )
    for query, (runs, n) in pinned.items():
        scoped.clear()
        assert store.sql(query).to_pylist() == [{"n": n}]
        assert scoped == [runs]
    scoped.clear()
    assert store.sql(f"{count} WHERE run_id = $1", ["c3"]).to_pylist() == [{"n": 4}]
    assert store.sql(f"{count} WHERE run_id = $1", ["a1"]).to_pylist() == [{"n": 4}]
    assert scoped == [["c3"], ["a1"]]
    scoped.clear()
    counted = {q: store.sql(q).to_pylist() for q in unpinned if unpinned[q] is not None}
    assert counted == {q: [{"n": n}] for q, n in unpinned.items() if n is not None}
    assert set(map(str, scoped)) == {"None"}  # never scoped, whatever reader it took

    # A discarded write is a row of the discards table; it hides invocations of its own run
    # only, so a plan still pins its runs, and the scoped reading applies the discards.
    (write_id,) = store.sql("SELECT write_id FROM invocations WHERE run_id = 'a1'")[0].to_pylist()
    store.discard_writes("a1", 0, [write_id])
    stages = "SELECT count(*) AS n FROM stage_stats WHERE run_id = '{}'"
    assert [store._read_plan(stages.format(run), None)[0] for run in ("a1", "b2")] == [
        ["a1"],
        ["b2"],
    ]
    scoped.clear()
    assert store.sql(f"{count} WHERE run_id = 'a1'").to_pylist() == [{"n": 0}]
    assert store.sql(stages.format("a1")).to_pylist() == [{"n": 0}]
    assert store.sql(stages.format("b2")).to_pylist() == [{"n": 2}]
    assert scoped == [["a1"], ["a1"], ["b2"]]
    monkeypatch.setattr(store_module, "NATIVE_MAX_FILES", 256)  # as read whole
    assert open_store(store.root).sql(f"{count} GROUP BY run_id ORDER BY run_id").to_pylist() == [
        {"n": 4},
        {"n": 4},
    ]
    store.close()


def invocations_form(con: duckdb.DuckDBPyConnection) -> list[tuple[bool, str]]:
    """Each ``invocations`` view ``con`` has (its own temporary one first), as (temporary,
    ``discards`` if it applies the discards' rules, else ``plain``)."""
    views = con.sql(
        "SELECT temporary, sql FROM duckdb_views() WHERE view_name = 'invocations' "
        "ORDER BY temporary DESC"
    ).fetchall()
    return [
        (temporary, "discards" if "raw_discards" in sql else "plain") for temporary, sql in views
    ]


def test_invocations_apply_the_discards_rules_only_where_discards_have_files(
    store: Store,
) -> None:
    """A store without discards (most) defines ``invocations`` as the filter the discards'
    rules come to, which DuckDB plans faster; the rules apply, on the store's connection or
    on a cursor scoped to runs, wherever the discards they see have files."""
    for run in ("a1", "b2"):
        write_golden(store, run_id=run)
    count = "SELECT run_id, count(*) AS n FROM records GROUP BY run_id ORDER BY run_id"
    both = [{"run_id": "a1", "n": 4}, {"run_id": "b2", "n": 4}]
    assert store.sql(count).to_pylist() == both
    assert invocations_form(store._db) == [(False, "plain")]

    (write_id,) = store.sql("SELECT write_id FROM invocations WHERE run_id = 'a1'")[0].to_pylist()
    store.discard_writes("a1", 0, [write_id])
    # Scoped to a1, whose discards the store connection has not listed yet: the cursor's own.
    with store.reading(runs=["a1"]) as cursor:
        assert invocations_form(cursor) == [(True, "discards"), (False, "plain")]
        assert cursor.sql("SELECT count(*) FROM records").fetchall() == [(0,)]
    assert store.sql(count).to_pylist() == [{"run_id": "b2", "n": 4}]
    assert invocations_form(store._db) == [(False, "discards")]
    # Scoped to b2, which has none, under a connection that applies them: the plain filter.
    with store.reading(runs=["b2"]) as cursor:
        assert invocations_form(cursor) == [(True, "plain"), (False, "discards")]
        assert cursor.sql("SELECT count(*) FROM records").fetchall() == [(4,)]
    # The discards gone with their run, the connection goes back to the plain filter.
    removed = store.gc(keep_last=1, older_than=timedelta(0), apply=True)
    assert [run["run_id"] for run in removed.runs] == ["a1"]
    assert store.sql(count).to_pylist() == [{"run_id": "b2", "n": 4}]
    assert invocations_form(store._db) == [(False, "plain")]


def test_reading_given_files_needs_their_runs(store: Store) -> None:
    with (
        pytest.raises(StoreError, match=r"reading given files needs the runs"),
        store.reading(files={"invocations": []}),
    ):
        pass
