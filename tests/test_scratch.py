"""Scratch directories and hidden traces: each goes with its block, and one that a killed
process left is removed by the next process that makes one of its kind in the same place
(a hidden trace: by the next export to its path)."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from simulated_runs import write_run

from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.scratch import (
    GRACE_SECONDS,
    OWNER,
    ScratchDirectory,
    hold,
    remove_left_files,
)
from multicore_profiler.storage.store import Store

PREFIX = "mcprof-test-"
HOLDER = """\
import sys, time
from multicore_profiler.scratch import ScratchDirectory
scratch = ScratchDirectory(sys.argv[1], sys.argv[2])
(scratch.path / "spill").write_bytes(b"x" * 4096)
print(scratch.path, flush=True)
time.sleep(600)
"""
"""A process that makes a directory, writes in it, says where, and waits to be killed."""
SWEEPER = """\
import sys
from multicore_profiler.scratch import ScratchDirectory
ScratchDirectory(sys.argv[1], sys.argv[2]).remove()
"""
"""A process that makes a directory and removes it at once: what its first one sweeps."""


def holder(parent: Path, prefix: str = PREFIX) -> tuple[subprocess.Popen[str], Path]:
    """A holding process and its directory, made more than the grace period ago."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, prefix, str(parent)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    path = Path(process.stdout.readline().strip())
    assert path.parent == parent
    assert path.name.startswith(prefix)
    age(path / OWNER)
    return process, path


def age(path: Path) -> None:
    """Date the file ``path`` (a directory's owner file) back past the grace period."""
    then = time.time() - 2 * GRACE_SECONDS
    os.utime(path, (then, then))


def killed(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL


def sweep(parent: Path, prefix: str = PREFIX) -> None:
    """What a fresh process's first directory of ``prefix`` in ``parent`` does."""
    subprocess.run([sys.executable, "-c", SWEEPER, prefix, str(parent)], check=True)


def test_a_directory_goes_with_its_block(tmp_path: Path) -> None:
    with ScratchDirectory(PREFIX, tmp_path) as path:
        assert path.parent == tmp_path
        assert path.name.startswith(PREFIX)
        assert sorted(os.listdir(path)) == [OWNER]
        (path / "spill").write_bytes(b"x")
    assert os.listdir(tmp_path) == []
    scratch = ScratchDirectory(PREFIX, tmp_path)
    scratch.remove()
    scratch.remove()
    assert os.listdir(tmp_path) == []


def test_a_killed_processs_directory_is_removed_by_the_next_one_made(tmp_path: Path) -> None:
    process, left = holder(tmp_path)
    killed(process)
    assert sorted(os.listdir(left)) == [OWNER, "spill"]
    with ScratchDirectory(PREFIX, tmp_path) as path:
        assert os.listdir(tmp_path) == [path.name]
    assert os.listdir(tmp_path) == []


def test_a_live_processs_directory_stays_until_a_later_process_finds_it_dead(
    tmp_path: Path,
) -> None:
    process, held = holder(tmp_path)
    try:
        with ScratchDirectory(PREFIX, tmp_path) as path:
            assert sorted(os.listdir(tmp_path)) == sorted([held.name, path.name])
    finally:
        killed(process)
    # This process looked once; the next process looks again.
    with ScratchDirectory(PREFIX, tmp_path):
        assert held.is_dir()
    sweep(tmp_path)
    assert os.listdir(tmp_path) == []


def test_only_old_unlocked_directories_of_the_prefix_are_removed(tmp_path: Path) -> None:
    def made(name: str, *, owner: bool = True, old: bool = True) -> Path:
        path = tmp_path / name
        path.mkdir()
        if owner:
            (path / OWNER).touch()
            if old:
                age(path / OWNER)
        return path

    made(f"{PREFIX}left")  # what a killed process leaves: removed
    made(f"{PREFIX}young", old=False)  # being made a moment ago
    made(f"{PREFIX}no-owner", owner=False)  # not a scratch directory of this kind
    made("mcprof-other-left")  # another prefix: its own kind sweeps it
    target = made("elsewhere")
    (tmp_path / f"{PREFIX}link").symlink_to(target)  # never followed
    (tmp_path / f"{PREFIX}file").write_bytes(b"")
    sweep(tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted(
        [
            f"{PREFIX}young",
            f"{PREFIX}no-owner",
            "mcprof-other-left",
            "elsewhere",
            f"{PREFIX}link",
            f"{PREFIX}file",
        ]
    )
    assert os.listdir(target) == [OWNER]
    sweep(tmp_path, "mcprof-other-")
    assert "mcprof-other-left" not in os.listdir(tmp_path)


def test_a_killed_commands_spill_directory_goes_with_the_next_command(tmp_path: Path) -> None:
    """A process with a store open, killed, leaves its DuckDB spill directory in $TMPDIR;
    the next ``mcprof`` command removes it, and its own."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    opened = (
        "import sys, time\n"
        "from multicore_profiler.storage.store import open_store\n"
        "store = open_store(sys.argv[1])\n"
        "print('open', flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", opened, str(tmp_path / "store")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "open\n"
    killed(process)
    (left,) = scratch.iterdir()
    assert left.name.startswith("mcprof-duckdb-")
    age(left / OWNER)
    command = [sys.executable, "-m", "multicore_profiler.cli", "runs", "--store"]
    subprocess.run([*command, str(tmp_path / "store")], check=True, env=env, capture_output=True)
    assert os.listdir(scratch) == []


EXPORTING = """\
import sys, time
from pathlib import Path
from multicore_profiler.errors import ExportError
from multicore_profiler.export.files import written_aside
from multicore_profiler.scratch import ScratchDirectory
path = Path(sys.argv[1])
with (
    written_aside(path, ExportError, "the trace") as aside,
    ScratchDirectory(".mcprof-export-", path.parent) as scratch,
):
    aside.write_bytes(b"{" * 4096)
    (scratch / "selected.parquet").write_bytes(b"PAR1")
    print(aside.name, scratch.name, flush=True)
    time.sleep(600)
"""
"""An export's files, as the writers make them, held until the process is killed."""


def test_a_killed_exports_hidden_files_go_with_the_next_export_to_its_path(
    store: Store, tmp_path: Path
) -> None:
    write_run(store, SimulatedMoeKernel(), seed=1, commit="aaaa0001")
    out = tmp_path / "out"
    out.mkdir()
    trace = out / "trace.json"

    def exporting() -> tuple[subprocess.Popen[str], str, str]:
        process = subprocess.Popen(
            [sys.executable, "-c", EXPORTING, str(trace)], stdout=subprocess.PIPE, text=True
        )
        assert process.stdout is not None
        aside, scratch = process.stdout.readline().split()
        for written in (out / aside, out / scratch / OWNER):
            age(written)
        return process, aside, scratch

    live, live_aside, live_scratch = exporting()
    dead, dead_aside, dead_scratch = exporting()  # it leaves the live process's files alone
    killed(dead)
    others = [".trace.json.backup.tmp", ".other.json.123.tmp"]  # not this trace's asides
    for name in others:
        (out / name).write_bytes(b"")
        os.utime(out / name, (0, 0))
    assert sorted(os.listdir(out)) == sorted(
        [dead_aside, dead_scratch, live_aside, live_scratch, *others]
    )
    try:
        export_chrome_trace(store, trace)
        assert sorted(os.listdir(out)) == sorted(["trace.json", live_aside, live_scratch, *others])
    finally:
        killed(live)


def test_a_filesystem_without_flock_keeps_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the filesystem takes no ``flock`` (some FUSE mounts), a directory is made and
    removed as anywhere, and no directory is taken for left behind: none can be told apart
    from one in use."""

    def unsupported(descriptor: int, operation: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    old = tmp_path / f"{PREFIX}old"
    old.mkdir()
    (old / OWNER).touch()
    age(old / OWNER)
    monkeypatch.setattr(fcntl, "flock", unsupported)
    with ScratchDirectory(PREFIX, tmp_path) as path:
        assert sorted(os.listdir(tmp_path)) == sorted([old.name, path.name])
    assert os.listdir(tmp_path) == [old.name]
    held = hold(tmp_path / "trace.json")
    os.close(held)
    age(tmp_path / "trace.json")
    remove_left_files(tmp_path, r"trace\.json")
    assert sorted(os.listdir(tmp_path)) == sorted([old.name, "trace.json"])
