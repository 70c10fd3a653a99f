"""``mcprof trace-buffer``: buffer files to a standalone trace in one command, through a
temporary store, writing exactly the trace of ``ingest-buffer`` then ``export``."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import pytest
from test_cli import LAYOUT_ARGS, golden, run

BUFFER_ARGS = [*LAYOUT_ARGS, "--freq-mhz", "50", "--kernel", "HyperMegaMoe"]
OPTIONS = ["--stage", "0x30001=GMM1", "--rank", "3", "--detailed"]


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory the command's store goes in, empty before it runs."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.parametrize(
    ("name", "files"),
    [
        ("trace.json", ["trace.json"]),
        ("trace.json.gz", ["trace.json.gz"]),
        ("trace.pftrace", ["trace.pftrace", "trace.pftrace.meta.json"]),
    ],
)
def test_the_trace_is_ingest_buffer_then_exports_byte_for_byte(
    capsys, tmp_path, scratch, name, files
) -> None:
    buffers = [golden(tmp_path / "dump0.bin"), golden(tmp_path / "dump1.bin", dropped=3)]
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    store = ["--store", str(tmp_path / "store")]

    code, out, err = run(
        capsys, "trace-buffer", *map(str, buffers), *BUFFER_ARGS, *OPTIONS, "-o", str(one / name)
    )
    assert code == 0
    temporary_run = out.split("from run ")[1].split()[0]
    ingested = run(capsys, "ingest-buffer", *map(str, buffers), *BUFFER_ARGS, *OPTIONS[:4], *store)
    stored_run = ingested[1].split()[1].rstrip(":")
    exported = run(capsys, "export", *store, "--detailed", "-o", str(two / name))
    assert exported[0] == 0
    assert out == exported[1].replace(str(two), str(one)).replace(stored_run, temporary_run)
    assert err == ingested[2] + exported[2]
    assert err.startswith("mcprof: warning: device dropped 3 records on 1 core(s): buffer 1 AIV/2")
    for file in files:
        read = gzip.decompress if file.endswith(".gz") else bytes
        written = read((one / file).read_bytes())
        assert written.replace(temporary_run.encode(), stored_run.encode()) == read(
            (two / file).read_bytes()
        )
    assert sorted(p.name for p in one.iterdir()) == files
    assert list(scratch.iterdir()) == [], "the temporary store is removed"


def test_the_printed_line_says_what_the_trace_holds(capsys, tmp_path, scratch) -> None:
    buffer = golden(tmp_path / "dump.bin")
    trace = tmp_path / "trace.json"
    code, out, err = run(capsys, "trace-buffer", str(buffer), *BUFFER_ARGS, "-o", str(trace))
    run_id = out.split("from run ")[1].split()[0]
    assert (code, out, err) == (
        0,
        f"{trace}: 10 events (4 records of 1 invocation(s), 0 dependency arrows) from run "
        f"{run_id}\n",
        "",
    )


def test_a_bad_buffer_fails_in_one_line_leaving_neither_trace_nor_store(
    capsys, tmp_path, scratch
) -> None:
    buffer = tmp_path / "short.bin"
    buffer.write_bytes(golden(tmp_path / "dump.bin").read_bytes()[:-32])
    trace = tmp_path / "trace.json"
    code, out, err = run(capsys, "trace-buffer", str(buffer), *BUFFER_ARGS, "-o", str(trace))
    assert (code, out) == (1, "")
    assert err == (
        "mcprof: error: the buffer holds 2848 bytes but its layout BufferLayout(aic_slots=2, "
        "aiv_slots=3, aic_capacity=16, aiv_capacity=16) needs 2880 "
        f"(buffer file {buffer})\n"
    )
    assert not trace.exists()
    assert list(scratch.iterdir()) == []
