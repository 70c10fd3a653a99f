from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from golden import AIC, AIV, NO_OWNER, TASK7, Slot, pack

from multicore_profiler.cli import main
from multicore_profiler.storage.runs import CAPTURE_COLUMNS, CaptureCost, RunInfo
from multicore_profiler.storage.store import open_store

STAGES = ("Dispatch", "GMM1", "SwiGLU", "GMM2", "Combine")

LAYOUT_ARGS = [
    "--aic-slots",
    "2",
    "--aiv-slots",
    "3",
    "--aic-capacity",
    "16",
    "--aiv-capacity",
    "16",
]


def golden(path: Path, *, dropped: int = 0) -> Path:
    full = [(i, i + 1, 0x30001, i, i, 0) for i in range(16)]
    slots = [
        Slot(AIC, 0, 100, TASK7),
        Slot(AIV, 0, 100, [(150, 151, 0x20003, 8, 2, NO_OWNER)]),
    ]
    if dropped:
        slots.append(Slot(AIV, 2, 100, full, dropped=dropped))
    path.write_bytes(pack(2, 3, 16, 16, slots))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def store_args(tmp_path: Path) -> list[str]:
    return ["--store", str(tmp_path / "store")]


def ingest(capsys, store_args: list[str], tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    buffer = golden(tmp_path / "dump.bin")
    return run(
        capsys, "ingest-buffer", str(buffer), *LAYOUT_ARGS, "--freq-mhz", "50", *store_args, *extra
    )


def test_ingest_buffer_appends_invocations_to_a_run(capsys, store_args, tmp_path) -> None:
    args = [
        "--run",
        "r1",
        "--rank",
        "1",
        "--step",
        "2",
        "--kernel",
        "HyperMegaMoe",
        "--stage",
        "0x30001=GMM1",
    ]
    assert ingest(capsys, store_args, tmp_path, *args) == (
        0,
        "run r1: 1 invocation(s) from id 0, 4 records, 0 dropped\n",
        "",
    )
    assert ingest(capsys, store_args, tmp_path, *args)[1] == (
        "run r1: 1 invocation(s) from id 1, 4 records, 0 dropped\n"
    )
    code, out, _ = run(
        capsys,
        "query",
        *store_args,
        "--format",
        "csv",
        "SELECT invocation_id, rank, step, stage, count(*) AS n FROM records_ns "
        "GROUP BY ALL ORDER BY ALL",
    )
    assert code == 0
    assert out == (
        "invocation_id,rank,step,stage,n\n0,1,2,GMM1,3\n0,1,2,TaskType_3,1\n"
        "1,1,2,GMM1,3\n1,1,2,TaskType_3,1\n"
    )


def test_ingest_buffer_without_run_makes_a_new_complete_run(capsys, store_args, tmp_path) -> None:
    code, out, _ = ingest(capsys, store_args, tmp_path, "--label", "from-device")
    assert code == 0
    run_id = out.split()[1].rstrip(":")
    code, out, _ = run(capsys, "runs", *store_args, "--format", "json")
    (row,) = json.loads(out)
    assert (row["run_id"], row["status"], row["label"], row["invocations"], row["records"]) == (
        run_id,
        "complete",
        "from-device",
        1,
        4,
    )


def test_runs_shows_what_profiling_cost_per_recorded_step(capsys, store_args, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    with open_store(store_args[1]) as store:
        cost = CaptureCost(steps=8, job_seconds=0.0025, writer_cpu_seconds=0.0096, writer="process")
        store.write_run(RunInfo.begin(run_id="r1").finish("complete", cost))
        store.write_run(RunInfo.begin(run_id="r2").finish())
    code, out, _ = run(capsys, "runs", *store_args)
    assert code == 0
    lines = out.splitlines()
    assert lines[1].endswith("│ job ms/step │ writer CPU ms/step │")
    (first,) = (line for line in lines if line.startswith("│ r1 "))
    (second,) = (line for line in lines if line.startswith("│ r2 "))
    assert first.endswith("│ 0.31        │ 1.2                │")
    assert second.endswith("│             │                    │")
    code, out, _ = run(capsys, "runs", *store_args, "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert not {"job ms/step", "writer CPU ms/step"} & set(rows[0])
    costs = [{k: v for k, v in row.items() if k in ("run_id", *CAPTURE_COLUMNS)} for row in rows]
    assert costs == [
        {
            "run_id": "r1",
            "capture_steps": 8,
            "capture_job_seconds": 0.0025,
            "capture_writer_cpu_seconds": 0.0096,
            "capture_writer": "process",
        },
        {
            "run_id": "r2",
            "capture_steps": None,
            "capture_job_seconds": None,
            "capture_writer_cpu_seconds": None,
            "capture_writer": None,
        },
    ]


def test_query_formats(capsys, store_args, tmp_path) -> None:
    ingest(capsys, store_args, tmp_path, "--run", "r1")
    sql = "SELECT core, phase, ts_ns, dur_ns FROM records_ns ORDER BY core, record_index"
    code, out, _ = run(capsys, "query", *store_args, "--format", "json", sql)
    assert json.loads(out) == [
        {"core": "AIC", "phase": "wait", "ts_ns": 200.0, "dur_ns": 1000.0},
        {"core": "AIC", "phase": "compute", "ts_ns": 1200.0, "dur_ns": 4800.0},
        {"core": "AIC", "phase": "trigger", "ts_ns": 6000.0, "dur_ns": 100.0},
        {"core": "AIV", "phase": "compute", "ts_ns": 1000.0, "dur_ns": 20.0},
    ]
    target = tmp_path / "rows.parquet"
    assert run(capsys, "query", *store_args, "--format", "parquet", "-o", str(target), sql)[0] == 0
    assert pq.read_table(target).column("ts_ns").to_pylist() == [200.0, 1200.0, 6000.0, 1000.0]
    code, out, _ = run(capsys, "query", *store_args, sql)
    assert code == 0
    assert "│ AIC     │ wait    │  200.0 │ 1000.0 │" in out
    assert out.count("│ AI") == 4


@pytest.mark.parametrize(
    ("fmt", "first"), [("csv", b"range\n"), ("json", b"[\n"), ("table", "┌".encode())]
)
def test_a_reader_closing_the_pipe_ends_the_command_quietly(store_args, fmt, first) -> None:
    # `mcprof query ... | head`: far more rows than a pipe holds, the reader gone after the
    # first bytes. The command stops with 141 (128 + SIGPIPE, as a shell reports for a Unix
    # tool), writing nothing to stderr: no error line, no "Exception ignored" at exit.
    open_store(store_args[1], create=True).close()
    rows = 1_000_000 if fmt != "table" else 100_000
    command = [sys.executable, "-m", "multicore_profiler.cli", "query", *store_args]
    command += ["--format", fmt, f"SELECT * FROM range({rows})"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as reader:
        assert reader.stdout is not None
        assert reader.stderr is not None
        head = reader.stdout.read(len(first))
        reader.stdout.close()
        assert (head, reader.stderr.read(), reader.wait()) == (first, b"", 141)


def test_the_program_ends_with_its_objects_frozen_and_its_scratch_removed(
    store_args, tmp_path
) -> None:
    """``mcprof`` (``cli.command``) freezes every object out of the garbage collector when
    its command is done, so that the interpreter's last collection does not walk them; its
    exit handlers still run: neither the store's DuckDB scratch directory nor that of the
    process's database for Arrow statements (``arrow_cursor``) outlives it."""
    open_store(store_args[1], create=True).close()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = (
        "import gc, json, sys\n"
        "from multicore_profiler.cli import command\n"
        f"sys.argv = ['mcprof', 'query', *{store_args!r}, 'SELECT 42 AS answer']\n"
        "status = command()\n"
        "from multicore_profiler.storage.connection import arrow_cursor\n"
        "with arrow_cursor() as cursor:\n"
        "    cursor.execute('SELECT 1')\n"
        "print(json.dumps({'status': status, 'frozen': gc.get_freeze_count() > 0}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
        check=True,
    )
    *printed, report = done.stdout.splitlines()
    assert "42" in "".join(printed)
    assert json.loads(report) == {"status": 0, "frozen": True}
    assert list(scratch.iterdir()) == []


def test_demo_profiles_and_summarizes(capsys, store_args, tmp_path) -> None:
    code, out, _ = run(capsys, "demo", "--steps", "5", "--launches", "1", *store_args)
    assert code == 0
    lines = out.splitlines()
    # Steps 2, 3 and 4 record one launch each of 184 records (see the task graph).
    assert lines[0].endswith(
        "3 invocations in 1 window(s) of schedule(wait=1, warmup=1, active=3, repeat=0, "
        "skip_first=0, skip_first_wait=0), 552 records, 0 dropped"
    )
    rows = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in lines
        if line.startswith("│ ") and line.split("│")[1].strip() in STAGES
    ]
    assert [(r[0], r[1], r[-1]) for r in rows] == [
        ("Dispatch", "96", "0"),
        ("GMM1", "144", "0"),
        ("SwiGLU", "144", "0"),
        ("GMM2", "144", "0"),
        ("Combine", "24", "0"),
    ]
    trace = Path(lines[-8].removeprefix("torch.profiler trace of window 0: "))
    assert trace.parent == tmp_path / "store-torch"
    run_id = trace.name.removesuffix(".window0.pt.trace.json")
    assert lines[-3] == (
        f"     mcprof analyze --store {tmp_path / 'store'} --what-if 'GMM1*0.8'"
        "  # where the time goes"
    )
    assert lines[-2] == (
        f"     mcprof export --store {tmp_path / 'store'} -o {run_id}.json  # for ui.perfetto.dev"
    )
    assert lines[-1] == (
        f"     mcprof fuse {trace} --store {tmp_path / 'store'} --run {run_id} --window 0 "
        f"--allow-host-alignment -o {run_id}.fused.json"
    )
    assert lines[-7] == (
        "fuse: refused without --allow-host-alignment: kernel pattern "
        "'(?i)reference_?mega_?moe' matches 3 host event(s) but no device kernel: aligning "
        "device records to host-side events (CPU ops, launches) would misplace them; pass "
        "allow_host_alignment=True (--allow-host-alignment) to do it anyway"
    )
    assert lines[-6] == (
        "fuse: with --allow-host-alignment, warning: aligned to 3 host-side event(s) matching "
        "'(?i)reference_?mega_?moe': no device kernel matches, so the records sit on host "
        "events' times, not the device's"
    )
    fused = trace.with_name(f"{run_id}.window0.fused.json")
    assert lines[-5] == f"fused trace of window 0: {fused} (552 records, 872 events added)"
    merged = json.loads(fused.read_text())
    # 552 records, 4 threads (name, sort index), and the 3 launches' 52 arrows each (s, f).
    assert merged["megaKernelTraceMerge"]["counts"]["dependencyArrows"] == 156
    assert len(merged["traceEvents"]) == (
        len(json.loads(trace.read_text())["traceEvents"]) + 552 + 2 * 4 + 2 * 156
    )
    # The torch profiler ran on the same schedule: its trace holds the window's 3 launches.
    assert trace.read_text().count('"name": "mcprof::reference_mega_moe"') == 3
    assert run(capsys, "compact", *store_args)[1].startswith("compacted 1 run(s): ")


def test_store_defaults_to_the_environment(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MCPROF_STORE", str(tmp_path / "env"))
    ingest(capsys, [], tmp_path, "--run", "r9")
    assert run(capsys, "query", "--format", "csv", "SELECT run_id FROM runs")[1] == "run_id\nr9\n"


def test_dropped_records_are_warned_about_on_one_line(capsys, store_args, tmp_path) -> None:
    buffer = golden(tmp_path / "full.bin", dropped=3)
    code, out, err = run(
        capsys, "ingest-buffer", str(buffer), *LAYOUT_ARGS, "--freq-mhz", "50", *store_args
    )
    assert code == 0
    assert out.endswith("20 records, 3 dropped\n")
    assert err == (
        "mcprof: warning: device dropped 3 records on 1 core(s): AIV/2 (3); "
        "their slots were full (plan a larger capacity)\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["runs"], "mcprof: error: no store at "),
        (["query", "SELECT 1"], "mcprof: error: no store at "),
        (["compact"], "mcprof: error: no store at "),
    ],
)
def test_reading_a_missing_store_fails_in_one_line(capsys, store_args, argv, message) -> None:
    code, out, err = run(capsys, *argv, *store_args)
    assert (code, out) == (1, "")
    assert err.startswith(message)
    assert err.count("\n") == 1


BUFFER_SIZE = "the buffer holds 2880 bytes but its layout BufferLayout(aic_slots=3, aiv_slots=3, "


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["query", "SELECT nope FROM records"],
            'query failed: Binder Error: Referenced column "nope"',
        ),
        (["query", "--format", "parquet", "SELECT 1"], "--format parquet writes a binary file"),
        (["query", "--format", "table", "-o", "x.txt", "SELECT 1"], "--format table prints to"),
        (["ingest", "--aic-slots", "3", "--freq-mhz", "50"], BUFFER_SIZE),
        (["ingest", "--freq-mhz", "50", "--run", "a b"], "run id 'a b' is not valid"),
        (["ingest", "--aic-capacity", "20", "--freq-mhz", "50"], "aic_capacity must be a multiple"),
        (
            ["ingest", "--freq-mhz", "50", "--run", "r1", "--invocation", "0"],
            "run r1 already holds invocation(s) [0] of rank 0",
        ),
    ],
)
def test_errors_print_one_line_and_exit_1(capsys, store_args, tmp_path, argv, message) -> None:
    ingest(capsys, store_args, tmp_path, "--run", "r1")
    if argv[0] == "ingest":
        argv = ["ingest-buffer", str(tmp_path / "dump.bin"), *LAYOUT_ARGS, *argv[1:]]
    code, out, err = run(capsys, *argv, *store_args)
    assert (code, out) == (1, "")
    assert err.startswith(f"mcprof: error: {message}")
    assert err.count("\n") == 1
    runs = run(capsys, "query", "--format", "csv", "SELECT run_id, status FROM runs", *store_args)
    assert runs[1] == "run_id,status\nr1,complete\n", "a failed command leaves no run behind"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--freq-mhz", "0"],
            "argument --freq-mhz: a cycle frequency 0.0 MHz is out of range [0.001 .. 100000 MHz]",
        ),
        (
            ["--freq-mhz", "50", "--stage", "GMM1"],
            "argument --stage: a stage is DESC_ID=NAME (e.g. 0x30001=GMM1), got 'GMM1'",
        ),
    ],
)
def test_bad_option_values_are_usage_errors(capsys, store_args, tmp_path, argv, message) -> None:
    """Values argparse reads (numbers in range, DESC_ID=NAME) are refused as usage errors."""
    ingest(capsys, store_args, tmp_path, "--run", "r1")
    with pytest.raises(SystemExit) as raised:
        main(["ingest-buffer", str(tmp_path / "dump.bin"), *LAYOUT_ARGS, *argv, *store_args])
    assert raised.value.code == 2
    assert capsys.readouterr() == ("", f"mcprof: error: {message}\n")
    runs = run(capsys, "query", "--format", "csv", "SELECT run_id, status FROM runs", *store_args)
    assert runs[1] == "run_id,status\nr1,complete\n", "a refused command leaves no run behind"


def test_a_missing_buffer_file_is_named(capsys, store_args, tmp_path) -> None:
    missing = str(tmp_path / "missing.bin")
    code, _, err = run(
        capsys, "ingest-buffer", missing, *LAYOUT_ARGS, "--freq-mhz", "1", *store_args
    )
    assert code == 1
    assert err.startswith(f"mcprof: error: cannot read buffer file {missing}: No such file")


def test_usage_errors_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["query"])
    assert raised.value.code == 2
    assert "the following arguments are required: sql" in capsys.readouterr().err
