"""A capture session whose job or writer process dies: what stays, what is withdrawn, what is said.

The writer process is made to stall or exit at a chosen file by a ``sitecustomize``
module put on its ``PYTHONPATH`` (it inherits the test's environment); the job is a
separate process when it is the one killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from moe_layer import moe_layer

from multicore_profiler import Store, mega_kernel_profile, open_store, schedule
from multicore_profiler.errors import CaptureError
from multicore_profiler.ingest.committer import ORPHANED
from multicore_profiler.ingest.session import MegaKernelProfile
from multicore_profiler.ingest.writer import GROUP_STEPS, QUEUE_DEPTH, stop_idle_writers
from multicore_profiler.kernels.reference import ReferenceMoeKernel
from multicore_profiler.storage.check import check_store

TOKENS, HIDDEN, INTER, EXPERTS, TOP_K = 48, 16, 32, 4, 2

# What the writer process does at its ``at``-th records file: write half, say so and stall;
# print to stderr and exit with status 3; or find the disk full there and from then on
# ("enospc"); or, at "boot", exit with status 4 at once; or ("slow") take 0.2 s to write
# each file.
SITE = """
import errno, os, sys, time
from pathlib import Path
import pyarrow.parquet as pq

if {action!r} == "boot":
    sys.stderr.write("no room for a writer\\n")
    sys.stderr.flush()
    os._exit(4)

real_write = pq.ParquetWriter.write_table
seen = 0

def write_table(self, table, *args, **kwargs):
    global seen
    if {action!r} == "slow":
        time.sleep(0.2)
    if {action!r} == "enospc" and seen >= {at}:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if "record_index" in table.column_names:
        seen += 1
        if {action!r} == "enospc" and seen == {at}:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if seen == {at}:
            if {action!r} == "exit":
                sys.stderr.write("disk on fire\\n")
                sys.stderr.flush()
                os._exit(3)
            real_write(self, table.slice(0, len(table) // 2), *args, **kwargs)
            Path({marker!r}).touch()
            time.sleep(600)
    return real_write(self, table, *args, **kwargs)

pq.ParquetWriter.write_table = write_table
"""

JOB_PREAMBLE = """
import os, signal, sys, time
from pathlib import Path
import torch
from multicore_profiler import mega_kernel_profile, open_store, schedule
from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route

root = Path(sys.argv[1])
seed = torch.Generator().manual_seed(0)
router, w1, w2 = make_moe_weights({experts}, {hidden}, {inter}, generator=seed)
x = torch.randn({tokens}, {hidden}, generator=torch.Generator().manual_seed(1))
batch = (x, *route(x, router, {top_k}))


def publish(path, value):  # whole or absent: the test polls for it and reads it at once
    part = path.with_name(path.name + ".part")
    part.write_text(str(value))
    os.replace(part, path)
"""
"""What every job script below starts with: the reference kernel's weights and batch, in
``root`` (its first argument), and ``publish`` for the files the test waits for;
``job_script`` fills in the sizes."""

JOB = (
    JOB_PREAMBLE
    + """
with open_store(root / "store") as store, ReferenceMoeKernel(w1, w2, token_tile=16) as kernel:
    with mega_kernel_profile(
        store=store, schedule=schedule(wait=0, warmup=0, active=2), group_steps={group_steps}
    ) as prof:
        for _ in range(3):  # window 0: steps 0 and 1; window 1 opens at step 2
            kernel(*batch)
            prof.step()
        kernel(*batch)  # step 3, the last of window 1, which never ends
        prof.flush()
        forked = os.fork()  # a DataLoader worker, say, which outlives the job
        if forked == 0:
            time.sleep(600)
            os._exit(0)
        publish(root / "forked.pid", forked)
        publish(root / "writer.pid", prof.writer_pid)
        time.sleep(600)
"""
)


@pytest.fixture
def kernel_and_batch() -> Iterator[tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]]]:
    layer = moe_layer(TOKENS, hidden=HIDDEN, intermediate=INTER)
    with ReferenceMoeKernel(layer.w1, layer.w2, token_tile=16) as kernel:
        yield kernel, layer.batch


def writer_site(monkeypatch: pytest.MonkeyPatch, where: Path, action: str, at: int) -> Path:
    """Make writer processes started from now on stall or exit at their ``at``-th records
    file; return the file a stalled writer touches."""
    site = where / "site"
    site.mkdir()
    marker = where / "stalled"
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(SITE.format(at=at, action=action, marker=str(marker)))
    )
    stop_idle_writers()  # the next session starts a writer, which runs the site module
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    )
    return marker


def wait_for(path: Path, what: str) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.02)


def visible(store: Store) -> dict[str, int]:
    """Rows every view shows of the store's recorded steps."""
    return store.sql(
        """SELECT (SELECT count(*) FROM invocations) AS invocations,
                  (SELECT count(*) FROM records) AS records,
                  (SELECT count(*) FROM records_ns) AS timed,
                  (SELECT count(*) FROM cores) AS cores,
                  (SELECT count(*) FROM stage_stats WHERE records > 0) AS stages"""
    ).to_pylist()[0]


def running(pid: int) -> bool:
    """Whether a process that is not our child runs (a zombie nobody reaps has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


NOTHING = {"invocations": 0, "records": 0, "timed": 0, "cores": 0, "stages": 0}


def test_writer_killed_mid_file_fails_the_session_and_leaves_nothing_of_its_window(
    store: Store,
    kernel_and_batch: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    kernel, batch = kernel_and_batch
    stalled = writer_site(monkeypatch, tmp_path, "stall", at=3)
    prof = mega_kernel_profile(store=store, group_steps=1)  # a file per step
    pid = kill_the_stalled_writer(prof, kernel, batch, stalled)
    assert visible(store) == NOTHING
    assert store.sql("SELECT status, capture_steps, capture_writer FROM runs").to_pylist() == [
        {"status": "failed", "capture_steps": 4, "capture_writer": "process"}
    ]
    # Steps 0 and 1 were staged (their records and cores), never committed; step 2 never
    # was written whole.
    assert store.sql("SELECT count(*) AS n FROM raw_invocations").to_pylist() == [{"n": 0}]
    # Three writes are withdrawn: the two staged, and step 2's, which the session handed
    # over (it picks the write ids) and the writer never finished.
    discarded = store.sql("SELECT window_id, reason, write_id FROM raw_discards").to_pylist()
    staged = set(store.sql("SELECT write_id FROM raw_records")["write_id"].to_pylist())
    assert len(discarded) == 3
    assert len(staged) == 2
    assert staged < {d["write_id"] for d in discarded}
    assert {(d["window_id"], d["reason"]) for d in discarded} == {
        (0, f"CaptureError: the profile writer process (pid {pid}) was killed by signal SIGKILL")
    }
    assert [p.parent.name for p in store.root.rglob("*.parquet.tmp")] == ["step=2"]


def test_a_writer_that_exits_is_named_with_its_status_and_what_it_said(
    store: Store,
    kernel_and_batch: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    kernel, batch = kernel_and_batch
    writer_site(monkeypatch, tmp_path, "exit", at=2)
    exited = r"^the profile writer process \(pid \d+\) exited with status 3; it said: disk on fire$"
    with (  # noqa: PT012
        pytest.raises(CaptureError, match=exited),
        mega_kernel_profile(store=store, group_steps=1) as prof,  # a file per step
    ):
        for _ in range(6):
            kernel(*batch)
            prof.step()
    assert visible(store) == NOTHING
    assert store.sql("SELECT status FROM runs")["status"].to_pylist() == ["failed"]


def test_a_writer_that_cannot_start_fails_the_session_start_and_writes_no_run(
    store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    writer_site(monkeypatch, tmp_path, "boot", at=0)
    failed = (
        r"^the profile writer process \(pid \d+\) exited with status 4; "
        r"it said: no room for a writer before it was ready$"
    )
    with pytest.raises(CaptureError, match=failed), mega_kernel_profile(store=store):
        pass
    assert store.sql("SELECT count(*) AS n FROM runs").to_pylist() == [{"n": 0}]
    with mega_kernel_profile(store=store, writer="thread"):  # the session let go of the process
        pass


def test_a_full_queue_holds_the_job_until_the_writer_commits(
    store: Store,
    kernel_and_batch: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
) -> None:
    kernel, batch = kernel_and_batch
    steps = QUEUE_DEPTH + 3
    done: list[int] = []

    def job() -> None:
        for step in range(steps):
            kernel(*batch)
            prof.step()
            done.append(step)

    with mega_kernel_profile(store=store) as prof:
        os.kill(prof.writer_pid, signal.SIGSTOP)
        thread = threading.Thread(target=job)
        try:
            thread.start()
            deadline = time.monotonic() + 60
            while len(done) < QUEUE_DEPTH:
                assert time.monotonic() < deadline, f"the job stopped at step {len(done)}"
                time.sleep(0.01)
            thread.join(timeout=0.5)
            # Four steps are in flight; the fifth hand-over waits for a stopped writer.
            assert (thread.is_alive(), done) == (True, list(range(QUEUE_DEPTH)))
        finally:
            os.kill(prof.writer_pid, signal.SIGCONT)
        thread.join(timeout=60)
    assert done == list(range(steps))
    assert store.sql(
        "SELECT count(DISTINCT step) AS steps, count(*) AS n FROM invocations"
    ).to_pylist() == [{"steps": steps, "n": steps}]


@pytest.mark.parametrize("group_steps", [1, GROUP_STEPS])
def test_job_killed_mid_window_leaves_only_the_windows_it_ended(
    tmp_path: Path, group_steps: int
) -> None:
    """A file per step: window 1's two steps were staged and are withdrawn. In groups:
    they were in the writer's memory, never written, so there is nothing to withdraw."""
    script = job_script(JOB, group_steps=group_steps)
    job = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)])
    try:
        wait_for(tmp_path / "writer.pid", "the job's flush of step 3")
    finally:
        job.kill()
    assert job.wait(timeout=30) == -signal.SIGKILL
    writer = int((tmp_path / "writer.pid").read_text())
    forked = int((tmp_path / "forked.pid").read_text())
    try:
        deadline = time.monotonic() + 60
        while running(writer):  # the orphaned writer withdraws window 1, then exits
            assert time.monotonic() < deadline, "the orphaned writer never exited"
            time.sleep(0.02)
        assert running(forked)  # its copy of the job's socket was closed at the fork
    finally:
        os.kill(forked, signal.SIGKILL)
    with open_store(tmp_path / "store", create=False) as store:
        assert store.sql(
            "SELECT window_id, step, count(*) AS n FROM invocations GROUP BY ALL ORDER BY ALL"
        ).to_pylist() == [
            {"window_id": 0, "step": 0, "n": 1},
            {"window_id": 0, "step": 1, "n": 1},
        ]
        withdrawn = [{"window_id": 1, "reason": ORPHANED, "n": 2}] if group_steps == 1 else []
        assert (
            store.sql(
                "SELECT window_id, reason, count(*) AS n FROM raw_discards GROUP BY ALL"
            ).to_pylist()
            == withdrawn
        )
        staged = store.sql("SELECT DISTINCT step FROM raw_records ORDER BY step")["step"]
        assert staged.to_pylist() == ([0, 1, 2, 3] if group_steps == 1 else [0, 1])
        assert check_store(store).problems == []
        assert store.sql("SELECT status, capture_steps, capture_writer FROM runs").to_pylist() == [
            {"status": "failed", "capture_steps": 4, "capture_writer": "process"}
        ]


KILLED_AFTER_A_WINDOW = (
    JOB_PREAMBLE
    + """
with open_store(root / "store") as store, ReferenceMoeKernel(w1, w2, token_tile=16) as kernel:
    with mega_kernel_profile(store=store, schedule=schedule(wait=0, warmup=0, active=3)) as prof:
        publish(root / "writer.pid", prof.writer_pid)
        for _ in range(4):  # window 0: steps 0 to 2, ended; window 1: step 3, handed over
            kernel(*batch)
            prof.step()
        os.kill(os.getpid(), signal.SIGKILL)  # the writer is still on step 0
"""
)

WAITS_TO_BE_KILLED = (
    JOB_PREAMBLE
    + """
with open_store(root / "store") as store, ReferenceMoeKernel(w1, w2, token_tile=16) as kernel:
    with mega_kernel_profile(store=store) as prof:
        kernel(*batch)
        prof.flush()
        publish(root / "writer.pid", prof.writer_pid)
        time.sleep(600)
"""
)


def kill_the_stalled_writer(
    prof: MegaKernelProfile,
    kernel: ReferenceMoeKernel,
    batch: tuple[torch.Tensor, ...],
    stalled: Path,
) -> int:
    """Three steps, the writer SIGKILLed where it stalls (in step 2's records file), then a
    fourth step, which raises the writer's death; return the writer's pid."""
    killed = r"^the profile writer process \(pid \d+\) was killed by signal SIGKILL$"
    with pytest.raises(CaptureError, match=killed), prof:  # noqa: PT012 (raised a step later)
        for _ in range(3):
            kernel(*batch)
            prof.step()
        wait_for(stalled, "the writer's stall in step 2's records file")
        pid = prof.writer_pid
        os.kill(pid, signal.SIGKILL)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        kernel(*batch)
        prof.step()
    return pid


def job_script(template: str, **more: object) -> str:
    return template.format(
        experts=EXPERTS, hidden=HIDDEN, inter=INTER, tokens=TOKENS, top_k=TOP_K, **more
    )


def leases(root: Path) -> list[str]:
    """The capture sessions' lease files left in a store."""
    return sorted(p.name for p in (root / "runs").rglob("_writing-*"))


def test_a_job_killed_while_its_writer_catches_up_keeps_the_ended_window_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The orphaned writer still has window 0's steps to write when the job dies: it
    writes and commits them (no answer to send stops it), withdraws window 1 and fails
    the run."""
    writer_site(monkeypatch, tmp_path, "slow", at=0)
    job = subprocess.Popen([sys.executable, "-c", job_script(KILLED_AFTER_A_WINDOW), str(tmp_path)])
    assert job.wait(timeout=60) == -signal.SIGKILL
    writer = int((tmp_path / "writer.pid").read_text())
    deadline = time.monotonic() + 60
    while running(writer):
        assert time.monotonic() < deadline, "the orphaned writer never exited"
        time.sleep(0.02)
    with open_store(tmp_path / "store", create=False) as store:
        assert store.sql(
            "SELECT window_id, step, count(*) AS n FROM invocations GROUP BY ALL ORDER BY ALL"
        ).to_pylist() == [
            {"window_id": 0, "step": 0, "n": 1},
            {"window_id": 0, "step": 1, "n": 1},
            {"window_id": 0, "step": 2, "n": 1},
        ]
        assert store.sql("SELECT status, capture_steps FROM runs").to_pylist() == [
            {"status": "failed", "capture_steps": 4}
        ]
        assert leases(store.root) == []
        assert check_store(store).problems == []


def test_a_writer_killed_after_a_windows_last_step_leaves_none_of_that_window(
    store: Store,
    kernel_and_batch: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    kernel, batch = kernel_and_batch
    stalled = writer_site(monkeypatch, tmp_path, "stall", at=3)
    prof = mega_kernel_profile(  # a file per step
        store=store, schedule=schedule(wait=0, warmup=0, active=3), group_steps=1
    )
    pid = kill_the_stalled_writer(prof, kernel, batch, stalled)  # after window 0 ended
    assert visible(store) == NOTHING
    assert store.sql("SELECT count(*) AS n FROM raw_invocations").to_pylist() == [{"n": 0}]
    assert store.sql("SELECT status FROM runs")["status"].to_pylist() == ["failed"]
    reason = f"CaptureError: the profile writer process (pid {pid}) was killed by signal SIGKILL"
    assert store.sql(
        "SELECT window_id, reason, count(*) AS n FROM raw_discards GROUP BY ALL"
    ).to_pylist() == [{"window_id": 0, "reason": reason, "n": 3}]
    assert leases(store.root) == []


def assert_a_full_disk_fails_the_run(
    store: Store,
    kernel_and_batch: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    *,
    at: int,
    group_steps: int = GROUP_STEPS,
) -> None:
    """Run a session of two windows (3 steps, then 1) whose writer's disk fills at its
    ``at``-th records file, and check what it leaves: the error raised at its end, no row
    in view, no invocation written, the run failed after 4 steps, window 0's three steps
    and window 1's step withdrawn with that reason, no lease, nothing for ``mcprof
    check`` to report."""
    kernel, batch = kernel_and_batch
    writer_site(monkeypatch, tmp_path, "enospc", at=at)
    full = (
        "profile buffers could not be stored: cannot write records to the store at "
        f"{store.root}: No space left on device"
    )
    with (  # noqa: PT012 (raised at the exit)
        pytest.raises(CaptureError) as raised,
        mega_kernel_profile(
            store=store, schedule=schedule(wait=0, warmup=0, active=3), group_steps=group_steps
        ) as prof,
    ):
        for _ in range(4):
            kernel(*batch)
            prof.step()
    assert str(raised.value) == full
    assert visible(store) == NOTHING
    assert store.sql("SELECT count(*) AS n FROM raw_invocations").to_pylist() == [{"n": 0}]
    assert store.sql("SELECT status, capture_steps FROM runs").to_pylist() == [
        {"status": "failed", "capture_steps": 4}
    ]
    assert store.sql(
        "SELECT window_id, reason, count(*) AS n FROM raw_discards GROUP BY ALL ORDER BY ALL"
    ).to_pylist() == [
        {"window_id": 0, "reason": f"CaptureError: {full}", "n": 3},
        {"window_id": 1, "reason": f"CaptureError: {full}", "n": 1},
    ]
    assert leases(store.root) == []
    assert check_store(store).problems == []


def test_a_full_disk_leaves_none_of_the_window_and_fails_the_run(
    store: Store,
    kernel_and_batch: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The writer's disk fills at step 2's records, the last step of window 0 (ended):
    window 0's two staged steps and the one that failed are withdrawn, and window 1's
    step, which was skipped."""
    assert_a_full_disk_fails_the_run(  # a file per step
        store, kernel_and_batch, monkeypatch, tmp_path, at=3, group_steps=1
    )


def test_a_full_disk_at_a_group_leaves_none_of_its_window_and_fails_the_run(
    store: Store,
    kernel_and_batch: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The writer's disk fills at its first records file: window 0's group of three
    steps, written when the window ends, handed over and never committed; window 1's
    step is withdrawn too. No records file and no half-written file is left."""
    assert_a_full_disk_fails_the_run(store, kernel_and_batch, monkeypatch, tmp_path, at=1)
    assert store.sql("SELECT count(*) AS n FROM raw_records").to_pylist() == [{"n": 0}]
    assert not list(store.root.rglob("*.tmp"))


def test_a_stopped_writer_fails_the_step_after_the_timeout(
    store: Store,
    kernel_and_batch: tuple[ReferenceMoeKernel, tuple[torch.Tensor, ...]],
) -> None:
    kernel, batch = kernel_and_batch
    prof = mega_kernel_profile(store=store, writer_timeout=0.5)
    with pytest.raises(CaptureError) as raised, prof:  # noqa: PT012 (raised a step later)
        pid = prof.writer_pid
        os.kill(pid, signal.SIGSTOP)
        for _ in range(QUEUE_DEPTH + 1):  # the last hand-over waits for a stopped writer
            kernel(*batch)
            prof.step()
    assert str(raised.value) == (
        f"the profile writer process (pid {pid}) did not answer for 0.5 s (stopped or "
        "stuck), and was killed"
    )
    assert not running(pid)
    assert visible(store) == NOTHING
    assert store.sql("SELECT status FROM runs")["status"].to_pylist() == ["failed"]
    assert leases(store.root) == []


def test_check_reports_a_run_whose_job_and_writer_were_killed(tmp_path: Path) -> None:
    job = subprocess.Popen([sys.executable, "-c", job_script(WAITS_TO_BE_KILLED), str(tmp_path)])
    try:
        wait_for(tmp_path / "writer.pid", "the job's flush of step 0")
        os.kill(int((tmp_path / "writer.pid").read_text()), signal.SIGKILL)
    finally:
        job.kill()
    assert job.wait(timeout=30) == -signal.SIGKILL
    with open_store(tmp_path / "store", create=False) as store:
        (run_id,) = store.sql("SELECT run_id FROM runs WHERE status = 'running'")["run_id"]
        (lease,) = leases(store.root)
        report = check_store(store)
    assert [(p.path, p.check, p.reason) for p in report.problems] == [
        (
            f"runs/run_id={run_id}/{lease}",
            "abandoned",
            f"rank 0 of run {run_id} is left 'running' by a capture session whose job and "
            "writer ended without marking it (killed, or a full disk): it will never end; "
            "the windows it committed are kept",
        )
    ]
