"""Hostile input at the command line: out-of-range numbers, bad options, SQL that writes,
bad selectors, a store that cannot be written. Each ends in one ``mcprof: error: ...``
line, exit 2 for usage and 1 otherwise, and a store whose files are unchanged."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from contextlib import suppress
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hostile import read_only, refused, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_fixtures import SHARED_FIXTURES, shared_fixture
from test_cli import LAYOUT_ARGS, golden

from multicore_profiler import cli
from multicore_profiler.errors import SelectorError
from multicore_profiler.storage.selectors import RunSelector

TRACE = SHARED_FIXTURES / "kineto" / "a100_triton_example.json.gz"
"""A real trace. The usage errors below name it and are refused before it is read;
``shared_store`` copies it through ``shared_fixture``, which skips where it is absent."""
INT64_RANGE = "[0 .. 9223372036854775807]"


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A store with runs r1 and r2 (one invocation each), a buffer file that fits
    ``LAYOUT_ARGS``, and a scratch directory; the paths by name, for ``{name}`` in argv."""
    root = tmp_path_factory.mktemp("hostile_cli")
    buffer = golden(root / "dump.bin")
    store = root / "store"
    for run_id in ("r1", "r2"):
        argv = ["ingest-buffer", str(buffer), *LAYOUT_ARGS, "--freq-mhz", "50", "--run", run_id]
        assert cli.main([*argv, "--store", str(store)]) == 0
    (root / "scratch").mkdir()
    return {"store": str(store), "buffer": str(buffer), "tmp": str(root / "scratch")}


def mcprof_refused(capsys, place: dict[str, str], *argv: str, status: int) -> str:
    """``refused`` over the module's store, ``{name}`` in argv replaced by its path."""
    filled = [arg.format(**place) for arg in argv]
    return refused(
        capsys, *filled, "--store", place["store"], status=status, store=Path(place["store"])
    )


INGEST = ("ingest-buffer", "{buffer}", *LAYOUT_ARGS)
INGEST_50 = (*INGEST, "--freq-mhz", "50")
FUSE = ("fuse", str(TRACE), "--run", "r1", "-o", "{tmp}/fused.json")
COMPARE = ("compare", "--base", "r1", "--head", "r2")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("export", "-o", "{tmp}/t.json", "--rank", "99999999999"),
            "argument --rank: a rank 99999999999 is out of range [0 .. 2147483647]",
        ),
        (
            (*INGEST_50, "--device", "2147483648"),
            "argument --device: a device index 2147483648 is out of range [0 .. 2147483647]",
        ),
        (
            (*INGEST_50, "--step", str(2**63)),
            f"argument --step: a step 9223372036854775808 is out of range {INT64_RANGE}",
        ),
        (
            (*INGEST_50, "--invocation", "-1"),
            f"argument --invocation: an invocation id -1 is out of range {INT64_RANGE}",
        ),
        (
            (*INGEST_50, "--stage", "4294967296=X"),
            "argument --stage: a desc id 4294967296 is out of range [1 .. 4294967295]",
        ),
        (
            (*INGEST_50, "--stage=-1=X"),
            "argument --stage: a desc id -1 is out of range [1 .. 4294967295]",
        ),
        (
            (*INGEST_50, "--stage", "GMM1"),
            "argument --stage: a stage is DESC_ID=NAME (e.g. 0x30001=GMM1), got 'GMM1'",
        ),
        (
            (*INGEST, "--freq-mhz", "1e-320"),
            "argument --freq-mhz: a cycle frequency 1e-320 MHz is out of range "
            "[0.001 .. 100000 MHz]",
        ),
        (
            (*INGEST, "--freq-mhz", "inf"),
            "argument --freq-mhz: a cycle frequency must be a finite number "
            "[0.001 .. 100000 MHz], got inf",
        ),
        (
            ("ingest-buffer", "{buffer}", "--aic-slots", str(2**32), "--aiv-slots", "3"),
            "argument --aic-slots: a slot count 4294967296 is out of range [0 .. 4294967295]",
        ),
        (
            ("ingest-trace", str(TRACE), "--rank", str(10**11)),
            "argument --rank: a rank 100000000000 is out of range [0 .. 2147483647]",
        ),
        (
            ("kernels", str(TRACE), "--rank", "-1"),
            "argument --rank: a rank -1 is out of range [0 .. 2147483647]",
        ),
        (
            ("gc", "--older-than", "nan"),
            "argument --older-than: an age in days must be a finite number [0 .. 36500], got nan",
        ),
        (
            ("gc", "--keep-last", "-1"),
            f"argument --keep-last: a count -1 is out of range {INT64_RANGE}",
        ),
        (
            ("compact", "--grace", "1e400"),
            "argument --grace: a duration in hours must be a finite number [0 .. 876000], got inf",
        ),
        (
            (*COMPARE, "--threshold", "-0.1"),
            "argument --threshold: a relative change of the median -0.1 is out of range [0 .. 100]",
        ),
        (
            (*COMPARE, "--alpha", "1"),
            "argument --alpha: a significance level 1.0 is out of range [1e-09 .. 0.5]",
        ),
        (
            (*FUSE, "--kernel-index", "-1"),
            f"argument --kernel-index: a count -1 is out of range {INT64_RANGE}",
        ),
        (
            (*FUSE, "--outer-pid", str(2**63)),
            "argument --outer-pid: a process id 9223372036854775808 is out of range "
            "[-9223372036854775808 .. 9223372036854775807]",
        ),
        (
            (*FUSE, "--window", "1.5"),
            f"argument --window: a capture window index must be an integer {INT64_RANGE}, "
            "got '1.5'",
        ),
        (
            ("report", "--run", "r1", "-o", "{tmp}/r.html", "--invocation", str(2**63)),
            "argument --invocation: an invocation id 9223372036854775808 is out of range "
            f"{INT64_RANGE}",
        ),
        (
            ("demo", "--steps", "2"),
            "argument --steps: a step count 2 is out of range [3 .. 9223372036854775807]",
        ),
        (
            ("demo", "--launches", "0"),
            "argument --launches: a launch count 0 is out of range [1 .. 9223372036854775807]",
        ),
        (
            ("demo", "--seed", str(2**64)),
            "argument --seed: a seed 18446744073709551616 is out of range "
            "[0 .. 18446744073709551615]",
        ),
        (("export", "-o", "{tmp}/t.json", "--bogus"), "unrecognized arguments: --bogus"),
        (("export", "-o", ""), "argument -o/--output: '' is not a path or URI"),
        (("export", "-o", "{tmp}/t.json", "--store", ""), "argument --store: '' is not a path"),
        (("query",), "the following arguments are required: sql"),
        (
            ("ingest-buffer", "{buffer}", "--freq-mhz", "50"),
            "the following arguments are required: --aic-slots, --aiv-slots, --aic-capacity, "
            "--aiv-capacity",
        ),
        (
            ("runs", "--format", "xml"),
            "argument --format: invalid choice: 'xml' (choose from 'table', 'csv', 'json', "
            "'parquet')",
        ),
        (("nope",), "argument COMMAND: invalid choice: 'nope' (choose from 'runs', "),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(capsys, place, argv, message) -> None:
    assert mcprof_refused(capsys, place, *argv, status=2).startswith(message)
    assert os.listdir(place["tmp"]) == []


BAD_UTF8 = "\udcff"
"""What Python makes of an argument byte 0xff that is not UTF-8 (``surrogateescape``)."""


@pytest.mark.parametrize(
    ("argv", "name", "text"),
    [
        (("query", f"SELECT '{BAD_UTF8}'"), "sql", f"SELECT '{BAD_UTF8}'"),
        (("runs", "--select", f"label:{BAD_UTF8}"), "--select", f"label:{BAD_UTF8}"),
        ((*INGEST_50, "--kernel", BAD_UTF8), "--kernel", BAD_UTF8),
        ((*INGEST_50, "--stage", f"1={BAD_UTF8}"), "--stage", BAD_UTF8),
        (("ingest-trace", str(TRACE), "--tag", f"k={BAD_UTF8}"), "--tag", f"k={BAD_UTF8}"),
    ],
)
def test_arguments_that_are_not_utf8_are_usage_errors(capsys, place, argv, name, text) -> None:
    message = mcprof_refused(capsys, place, *argv, status=2)
    position = text.index(BAD_UTF8)
    assert message == (
        f"argument {name}: {text!r} is not valid UTF-8 text (at character {position})"
    )


def test_a_store_path_that_is_not_utf8_is_a_usage_error(capsys, tmp_path) -> None:
    store = tmp_path / f"store{BAD_UTF8}"
    message = refused(capsys, "runs", "--store", str(store), status=2)
    assert message.startswith(f"argument --store: {str(store)!r} is not valid UTF-8 text")
    assert not os.path.lexists(store)


def test_help_is_unchanged(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["ingest-buffer", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mcprof ingest-buffer [-h] [--store STORE] --aic-slots AIC_SLOTS")
    assert "--stage DESC_ID=NAME  name a stage id (repeatable)" in out


def test_a_desc_id_named_twice_differently_is_refused(capsys, place) -> None:
    argv = (*INGEST_50, "--stage", "1=GMM1", "--stage", "0x1=GMM2")
    message = mcprof_refused(capsys, place, *argv, status=1)
    assert message == "--stage names desc id 0x1 twice: 'GMM1' and 'GMM2'"


FORGED = "records/run_id=x/step=0/forged.parquet"


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT 1; SELECT 2", "the query holds 2 statements"),
        ("SELECT 1;; VALUES (2)", "the query holds 2 statements"),
        (f"COPY (SELECT * FROM records) TO '{{store}}/{FORGED}'", "statement of type COPY"),
        (f"SELECT 1; COPY (SELECT 1) TO '{{store}}/{FORGED}'", "the query holds 2 statements"),
        (f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{{store}}/{FORGED}'", "statement of type COPY"),
        ("ATTACH '{store}/forged.duckdb' AS forged", "statement of type ATTACH"),
        ("SET enable_external_access = true", "statement of type SET"),
        ("INSTALL httpfs", "statement of type LOAD"),
        ("CREATE TABLE t AS SELECT 1", "statement of type CREATE"),
        ("INSERT INTO runs (run_id) VALUES ('x')", "statement of type INSERT"),
        ("EXPORT DATABASE '{tmp}/exported'", "statement of type EXPORT"),
        ("CHECKPOINT", "statement of type CALL"),
        ("", "the query holds 0 statements"),
    ],
)
def test_query_refuses_all_but_one_read_only_statement(capsys, place, sql, message) -> None:
    refusal = mcprof_refused(capsys, place, "query", sql, status=1)
    assert message in refusal
    assert not (Path(place["store"]) / FORGED).exists()
    assert os.listdir(place["tmp"]) == []


@pytest.mark.parametrize(
    ("option", "text", "message"),
    [
        (
            "--where",
            "true); COPY (SELECT 1) TO '{tmp}/w.csv'; SELECT (1",
            "the --where condition closes a parenthesis it did not open at character 4",
        ),
        ("--where", "true) OR (true", "the --where condition closes a parenthesis it did not open"),
        (
            "--where",
            "stage = 'GMM1'; SELECT 1",
            "the --where condition holds a ';' at character 14",
        ),
        ("--where", "stage = 'GMM1' -- and more", "the --where condition holds a comment"),
        (
            "--sql",
            "COPY (SELECT 1) TO '{tmp}/w.csv'",
            "the --sql query is a statement of type COPY",
        ),
        ("--sql", "SELECT * FROM records_ns; SELECT 1", "the --sql query holds 2 statements"),
    ],
)
def test_export_takes_one_expression_or_one_read_only_statement(
    capsys, place, option, text, message
) -> None:
    argv = ("export", "-o", "{tmp}/trace.json", option, text)
    assert mcprof_refused(capsys, place, *argv, status=1).startswith(message)
    assert os.listdir(place["tmp"]) == []


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("VALUES (1), (2)", "col0\n1\n2\n"),
        ("WITH t AS (SELECT 7 AS x) SELECT x FROM t", "x\n7\n"),
        ("FROM runs SELECT run_id ORDER BY 1", "run_id\nr1\nr2\n"),
        ("SELECT column_name FROM (DESCRIBE runs) LIMIT 1", "column_name\nrun_id\n"),
        ("SELECT count(*) AS n FROM (SUMMARIZE runs) WHERE column_name = 'run_id'", "n\n1\n"),
        ("PIVOT (SELECT run_id FROM runs) ON run_id USING count(*)", "r1,r2\n1,1\n"),
    ],
)
def test_query_runs_read_only_statements(capsys, place, sql, expected) -> None:
    before = snapshot(Path(place["store"]))
    assert cli.main(["query", "--store", place["store"], "--format", "csv", sql]) == 0
    assert capsys.readouterr() == (expected, "")
    assert snapshot(Path(place["store"])) == before


def test_query_explain_and_show_run(capsys, place) -> None:
    for sql in ("EXPLAIN SELECT 1", "SHOW TABLES"):
        assert cli.main(["query", "--store", place["store"], "--format", "csv", sql]) == 0
    out = capsys.readouterr().out
    assert out.startswith("explain_key,explain_value\n")
    tables = out.split("name\n", 1)[1].splitlines()
    assert {"cores", "records", "records_ns", "task_edges"} <= set(tables)


LATEST = "latest:100000000000000000000000"
TOO_MANY = (
    f"selector term '{LATEST}': latest takes a count >= 1: latest "
    "100000000000000000000000 is out of range [1 .. 9223372036854775807]"
)


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (("runs", "--select", LATEST), 1, TOO_MANY),
        (("query", "--select", f"label:x,{LATEST}", "SELECT 1"), 1, TOO_MANY),
        (("compare", "--base", LATEST, "--head", "r2"), 2, TOO_MANY),
        (
            ("runs", "--select", "latest:²"),
            1,
            "selector term 'latest:²': latest takes a count >= 1: latest must be an integer "
            "[1 .. 9223372036854775807], got '²'",
        ),
        (
            ("runs", "--select", "since:2026-13-01"),
            1,
            "since:2026-13-01 is not an ISO 8601 date or time",
        ),
    ],
)
def test_bad_selectors_name_the_term_not_duckdb(capsys, place, argv, status, message) -> None:
    assert mcprof_refused(capsys, place, *argv, status=status).startswith(message)


@pytest.mark.parametrize("count", ["0", "-1", "1.0", str(2**63), "1e3", "²"])
def test_latest_takes_a_count_that_fits_a_limit(count: str) -> None:
    with pytest.raises(SelectorError, match="latest takes a count >= 1: latest"):
        RunSelector.parse(f"latest:{count}")
    assert RunSelector.parse(f"latest:{2**63 - 1}").latest == 2**63 - 1


@pytest.mark.parametrize(
    ("marker", "words"),
    [
        (b'{"format": "1"}', ("mcprof-store.json", 'as a string ("1")', "reads format 1")),
        (b'{"format": 99}', ("a store of format 99; this version reads 1",)),
        (b"not json", ("mcprof-store.json is not JSON",)),
        (b'["format", 1]', ("mcprof-store.json holds an array, not a JSON object",)),
    ],
)
def test_a_bad_store_marker_is_one_line(capsys, tmp_path, place, marker, words) -> None:
    store = tmp_path / "store"
    shutil.copytree(place["store"], store)
    (store / "mcprof-store.json").write_bytes(marker)
    message = refused(capsys, "runs", "--store", str(store), store=store)
    assert all(word in message for word in words), message


def test_an_os_error_escaping_a_command_names_the_command_and_file(capsys, place) -> None:
    # compare writes its JSON itself: a directory as -o is an OSError the net names.
    message = mcprof_refused(capsys, place, *COMPARE, "--format", "json", "-o", "{tmp}", status=2)
    assert message == f"compare: {place['tmp']}: Is a directory"


def test_a_bug_is_one_line_marked_internal_unless_debugging(capsys, place, monkeypatch) -> None:
    def broken(args) -> None:
        raise KeyError("oops")

    monkeypatch.setattr(cli.runs, "cmd_runs", broken)
    message = mcprof_refused(capsys, place, "runs", status=1)
    assert message == (
        "runs: internal error: KeyError: 'oops' (please report it; MCPROF_DEBUG=1 shows the "
        "traceback)"
    )
    monkeypatch.setenv("MCPROF_DEBUG", "1")
    with pytest.raises(KeyError, match="oops"):
        cli.main(["runs", "--store", place["store"]])


@pytest.fixture
def shared_store(place, tmp_path: Path) -> Path:
    """A copy of the module's store (two runs, a loaded trace), with a buffer and trace
    beside it, for a test to make read-only."""
    shutil.copytree(place["store"], tmp_path / "store")
    shutil.copy(place["buffer"], tmp_path / "dump.bin")
    shutil.copy(shared_fixture("kineto/a100_triton_example.json.gz"), tmp_path / "trace.json.gz")
    return tmp_path


@pytest.mark.parametrize(
    "argv",
    [
        ("ingest-buffer", "{root}/dump.bin", *LAYOUT_ARGS, "--freq-mhz", "50", "--run", "r3"),
        ("ingest-buffer", "{root}/dump.bin", *LAYOUT_ARGS, "--freq-mhz", "50", "--run", "r1"),
        ("ingest-trace", "{root}/trace.json.gz"),
        ("kernels", "{root}/trace.json.gz"),
        ("compact",),
        ("gc", "--keep-last", "0", "--apply"),
    ],
)
def test_write_commands_on_a_read_only_store_fail_in_one_line(
    capsys, shared_store: Path, argv
) -> None:
    store = shared_store / "store"
    given = [arg.format(root=shared_store) for arg in argv]
    with read_only(shared_store):
        message = refused(capsys, *given, "--store", str(store), store=store)
    assert "Permission denied" in message or "read-only" in message, message


def _open_for_writing(fifo: Path) -> None:
    """Release a reader blocked on ``fifo``'s open (if any) by opening its other end."""
    with suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("kind", ["a FIFO (named pipe)", "a directory"])
def test_a_buffer_that_is_not_a_regular_file_is_refused(capsys, place, tmp_path, kind) -> None:
    path = tmp_path / "buffer"
    if kind == "a directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    # A reader that waited for a writer would be released after 30 s: the test fails, not hangs.
    release = threading.Timer(30, _open_for_writing, [path])
    release.daemon = True
    release.start()
    try:
        argv = ("ingest-buffer", str(path), *LAYOUT_ARGS, "--freq-mhz", "50", "--run", "r1")
        message = mcprof_refused(capsys, place, *argv, status=1)
    finally:
        release.cancel()
    assert message == f"buffer file {path} is {kind}, not a regular file"


def test_a_buffer_refused_into_a_new_store_leaves_no_store(capsys, tmp_path) -> None:
    buffer = golden(tmp_path / "dump.bin")
    store = tmp_path / "new-store"
    argv = ("ingest-buffer", str(buffer), *LAYOUT_ARGS, "--freq-mhz", "50", "--store", str(store))
    buffer.write_bytes(buffer.read_bytes()[:-32])
    message = refused(capsys, *argv)
    assert message == (
        "the buffer holds 2848 bytes but its layout BufferLayout(aic_slots=2, aiv_slots=3, "
        f"aic_capacity=16, aiv_capacity=16) needs 2880 (buffer file {buffer})"
    )
    assert not store.exists()


def test_invocation_ids_that_would_pass_int64_are_refused(capsys, place) -> None:
    two = ("ingest-buffer", "{buffer}", "{buffer}", *LAYOUT_ARGS, "--freq-mhz", "50")
    argv = (*two, "--run", "r1", "--invocation", str(2**63 - 1))
    message = mcprof_refused(capsys, place, *argv, status=1)
    assert message == (
        "run r1 rank 0: 2 invocation(s) from id 9223372036854775807 would pass the largest "
        "invocation id, 9223372036854775807"
    )


def test_concurrent_ingest_buffer_commands_take_distinct_ids(capsys, tmp_path, place) -> None:
    store = str(tmp_path / "store")
    argv = [*INGEST_50, "--run", "shared", "--store", store]
    command = [sys.executable, "-m", "multicore_profiler.cli", *(a.format(**place) for a in argv)]
    writers = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = sorted(writer.communicate(timeout=120)[0] for writer in writers)
    assert [writer.returncode for writer in writers] == [0] * 4
    assert outputs == [
        f"run shared: 1 invocation(s) from id {i}, 4 records, 0 dropped\n" for i in range(4)
    ]
    sql = "SELECT invocation_id, count(*) AS n FROM records GROUP BY ALL ORDER BY ALL"
    assert cli.main(["query", "--store", store, "--format", "csv", sql]) == 0
    assert capsys.readouterr().out == "invocation_id,n\n0,4\n1,4\n2,4\n3,4\n"
    assert cli.main(["query", "--store", store, "--format", "csv", "FROM runs SELECT status"]) == 0
    assert capsys.readouterr().out == "status\ncomplete\n"


ASCII = st.text(st.characters(max_codepoint=127), max_size=40)
"""ASCII only: DuckDB's tokenizer gives byte offsets, which sql_policy reads as str
indices (reported; non-ASCII text can raise IndexError there until it maps them)."""
NUMBERS = st.one_of(
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=12),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    option=st.sampled_from(["--rank", "--step", "--invocation", "--window"]),
    value=NUMBERS,
    text=ASCII,
    sql_option=st.sampled_from(["--where", "--sql"]),
)
def test_any_option_text_ends_in_one_line(
    capsys, tmp_path, option, value, text, sql_option
) -> None:
    """Whatever the text, export ends in one line: a usage error (2), or, the options read,
    a refused condition or query or the missing store (1); never a traceback."""
    absent = str(tmp_path / "absent")
    for argv in (
        ("export", "--store", absent, "-o", f"{absent}.json", f"{option}={value}"),
        ("export", "--store", absent, "-o", f"{absent}.json", f"{sql_option}={text}"),
        ("query", "--store", absent, "--", text),
    ):
        try:
            code = cli.main(list(argv))
        except SystemExit as exit_:
            code = exit_.code
        err = capsys.readouterr().err
        assert code in (1, 2), err
        assert len(err.splitlines()) == 1, err
        assert err.startswith("mcprof: error: "), err
        assert "internal error" not in err, err
    assert not (tmp_path / "absent").exists()


def test_check_lists_problems_by_file_and_exits_1(capsys, tmp_path, place) -> None:
    store = tmp_path / "store"
    shutil.copytree(place["store"], store)
    assert cli.main(["check", "--store", str(store)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("checked ")
    assert err.endswith(f"of the store at {store}: no problem found\n")
    records = sorted((store / "records" / "run_id=r1").rglob("*.parquet"))[0]
    chunk = pq.ParquetFile(records).metadata.row_group(0).column(0)
    flipped = bytearray(records.read_bytes())
    flipped[chunk.data_page_offset + chunk.total_compressed_size - 1] ^= 0x01
    records.write_bytes(flipped)
    before = snapshot(store)
    assert cli.main(["check", "--store", str(store), "--run", "r1"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith(f"{records.relative_to(store)}: checksum: ")
    assert len(out.splitlines()) == 1
    assert err.startswith("checked ")
    assert "1 run(s) of the store" in err
    assert "1 problem(s) in 1 file(s)" in err
    assert snapshot(store) == before
    assert cli.main(["check", "--store", str(store), "--run", "r2"]) == 0
    capsys.readouterr()
    assert refused(capsys, "check", "--store", str(store), "--run", "r9", store=store) == (
        f"no run 'r9' in the store at {store}"
    )
