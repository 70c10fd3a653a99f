"""The capture session: windows, streaming per step, pooling, errors, with the reference kernel."""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.profiler
from golden import AIC, AIV, NO_OWNER, Slot, pack

from multicore_profiler import ProfilerAction, Store, mega_kernel_profile, schedule
from multicore_profiler.errors import CaptureError, DroppedRecordsWarning, SessionError
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.session import ID_BLOCK, MegaKernelProfile, Window
from multicore_profiler.ingest.step_rows import KernelInfo, Launches
from multicore_profiler.ingest.writer import stop_idle_writers
from multicore_profiler.kernels import (
    CpuBackend,
    RuntimeConfig,
    build_runtime_config,
    new_tasks,
    prepare_call,
)
from multicore_profiler.kernels.reference import (
    ReferenceMoeKernel,
    make_moe_weights,
    moe_reference,
    route,
)
from multicore_profiler.kernels.reference import moe as reference_module

TOKENS, HIDDEN, INTER, EXPERTS, TOP_K = 48, 16, 32, 4, 2


@pytest.fixture
def weights() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return make_moe_weights(EXPERTS, HIDDEN, INTER, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def kernel(weights: tuple[torch.Tensor, ...]) -> Iterator[ReferenceMoeKernel]:
    _, w1, w2 = weights
    with ReferenceMoeKernel(w1, w2, token_tile=16) as k:
        yield k


@pytest.fixture
def batch(weights: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    router, _, _ = weights
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    ids, w = route(x, router, TOP_K)
    return x, ids, w


def expected_per_worker(config: RuntimeConfig) -> dict[tuple[int, int], int]:
    """Records each (core_type, worker) writes per launch: compute + waits + triggers."""
    tasks = config.tasks
    per_task = 1 + (tasks["wait_event"] >= 0) + (tasks["trigger_event"] >= 0)
    out: dict[tuple[int, int], int] = {}
    for core, worker, n in zip(tasks["core_type"], tasks["worker"], per_task, strict=True):
        key = (int(core), int(worker))
        out[key] = out.get(key, 0) + int(n)
    return out


def test_nested_session_and_step_outside_raise(store: Store) -> None:
    prof = mega_kernel_profile(store=store)
    with pytest.raises(SessionError, match="outside its session"):
        prof.step()
    with prof:
        inner = mega_kernel_profile(store=store)
        with pytest.raises(SessionError, match="already open in this process"), inner:
            pass
        prof.step()
    with pytest.raises(SessionError, match="outside its session"):
        prof.step()
    with mega_kernel_profile(store=store):  # the first one's exit released the process
        pass


def test_inactive_call_allocates_nothing_and_reads_no_clock(
    store: Store,
    kernel: ReferenceMoeKernel,
    batch: tuple[torch.Tensor, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_clock() -> int:
        raise AssertionError("the fast loop read the clock")

    monkeypatch.setattr(reference_module, "clock", no_clock)
    backend = kernel.backend
    assert isinstance(backend, CpuBackend)
    with mega_kernel_profile(store=store, schedule=schedule(wait=3, warmup=1, active=1)) as prof:
        config = kernel.config_for(TOKENS)
        call = prepare_call(config)
        assert call.buffer is backend.placeholder
        assert call.config is config
        assert not call.config.profile_enabled
        assert not call.profiled
        call.cancel()
        out = kernel(*batch)
        prof.step()
        kernel(*batch)
        assert (prof.pool.allocations, prof.pool.reuses, backend.allocations) == (0, 0, 0)
    assert backend.placeholder.numel() == 0
    torch.testing.assert_close(out, moe_reference(*batch, kernel.w1, kernel.w2))
    assert store.sql("SELECT count(*) AS n FROM invocations")["n"].to_pylist() == [0]


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_each_recording_step_writes_its_partition(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...], writer: str
) -> None:
    ready: list[tuple[int, list[Window]]] = []
    launches_per_step = 2
    with mega_kernel_profile(
        store=store,
        schedule=schedule(wait=1, warmup=1, active=3),
        on_trace_ready=lambda p: ready.append((p.step_num, list(p.windows))),
        label="unit",
        tags={"case": "steps"},
        writer=writer,
    ) as prof:
        for _ in range(6):
            for _ in range(launches_per_step):
                out = kernel(*batch)
            prof.step()
    torch.testing.assert_close(out, moe_reference(*batch, kernel.w1, kernel.w2))
    window = Window(index=0, steps=(2, 3, 4), invocations=6)
    assert ready == [(5, [window])]
    # Two buffers in flight per step, reused from the warmup step on.
    assert (prof.pool.allocations, prof.pool.reuses) == (2, 6)

    config = kernel.config_for(TOKENS)
    invocations = store.sql(
        """SELECT step, window_id, invocation_id, rank, device, kernel_name, owner_label,
                  frequency_hz, config_id, dropped_count, record_count
           FROM invocations ORDER BY invocation_id"""
    ).to_pylist()
    per_launch = sum(expected_per_worker(config).values())
    assert invocations == [
        {
            "step": 2 + i // 2,
            "window_id": 0,
            "invocation_id": i,
            "rank": 0,
            "device": 0,
            "kernel_name": "ReferenceMegaMoe",
            "owner_label": "Expert",
            "frequency_hz": 1e9,
            "config_id": config.config_id,
            "dropped_count": 0,
            "record_count": per_launch,
        }
        for i in range(6)
    ]
    counts = store.sql(
        """SELECT step, invocation_id, core_type, block_id, count(*) AS n FROM records
           GROUP BY ALL ORDER BY ALL"""
    ).to_pylist()
    expected = expected_per_worker(config)
    assert counts == [
        {"step": 2 + i // 2, "invocation_id": i, "core_type": c, "block_id": w, "n": n}
        for i in range(6)
        for (c, w), n in sorted(expected.items())
    ]
    # The window's three steps are one group: a file per table in the run's directory,
    # their rows in step order.
    run = store.root / "records" / f"run_id={prof.run_id}"
    assert [p.is_file() for p in run.iterdir()] == [True]
    steps = pq.read_table(next(run.iterdir()), columns=["step"])["step"].to_pylist()
    assert steps == sorted(steps)
    assert sorted(set(steps)) == [2, 3, 4]

    stages = store.sql(
        """SELECT stage, tasks, records, expected_records, dropped FROM stage_stats
           ORDER BY stage_desc_id"""
    ).to_pylist()
    tasks = config.tasks
    desc = config.effective_desc_ids()
    per_task = 1 + (tasks["wait_event"] >= 0) + (tasks["trigger_event"] >= 0)
    names = {1: "Dispatch", 2: "GMM1", 3: "SwiGLU", 4: "GMM2", 5: "Combine"}
    assert stages == [
        {
            "stage": names[d],
            "tasks": 6 * int((desc == d).sum()),
            "records": 6 * int(per_task[desc == d].sum()),
            "expected_records": 6 * int(per_task[desc == d].sum()),
            "dropped": 0,
        }
        for d in sorted(names)
    ]
    graph = store.sql(
        "SELECT count(*) AS n, count(DISTINCT config_id) AS configs FROM tasks"
    ).to_pylist()
    assert graph == [{"n": len(tasks), "configs": 1}]
    run = store.sql("SELECT status, label, tags, schedule, commit FROM runs").to_pylist()[0]
    assert run["status"] == "complete"
    assert run["label"] == "unit"
    assert run["tags"] == [("case", "steps")]
    assert run["schedule"] == (
        "schedule(wait=1, warmup=1, active=3, repeat=0, skip_first=0, skip_first_wait=0)"
    )
    # What profiling cost: the three recorded steps, timed on the job's thread and in the writer.
    cost = store.sql(
        """SELECT capture_steps AS steps, capture_writer AS writer,
                  capture_job_seconds > 0 AS timed, capture_writer_cpu_seconds > 0 AS spent
           FROM runs"""
    ).to_pylist()
    assert cost == [{"steps": 3, "writer": writer, "timed": True, "spent": True}]
    assert prof.capture_cost.steps == 3
    assert (prof.writer_pid is None) == (writer == "thread")


def test_a_writer_process_serves_the_next_session_and_a_new_one_after_a_stop(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...]
) -> None:
    pids = []
    for stop in (False, False, True, False):
        if stop:
            stop_idle_writers()
        with mega_kernel_profile(store=store) as prof:
            kernel(*batch)
        pids.append(prof.writer_pid)
    assert pids[0] == pids[1] != pids[2] == pids[3]
    assert store.sql(
        "SELECT count(DISTINCT run_id) AS runs, count(*) AS n FROM invocations"
    ).to_pylist() == [{"runs": 4, "n": 4}]


def test_forced_small_capacity_drops_exactly_the_overflow(
    store: Store, weights: tuple[torch.Tensor, ...], batch: tuple[torch.Tensor, ...]
) -> None:
    _, w1, w2 = weights
    with ReferenceMoeKernel(w1, w2, token_tile=16, aic_capacity=16, aiv_capacity=16) as kernel:
        config = kernel.config_for(TOKENS)
        expected = expected_per_worker(config)
        overflow = {k: max(0, n - 16) for k, n in expected.items()}
        assert sum(overflow.values()) > 0
        with (
            pytest.warns(
                DroppedRecordsWarning, match=rf"dropped {sum(overflow.values())} rec"
            ) as caught,
            mega_kernel_profile(store=store),
        ):
            kernel(*batch)
    assert [w.filename for w in caught] == [__file__]  # points at the user's code
    cores = store.sql(
        "SELECT core_type, block_id, record_count, dropped_count FROM cores ORDER BY ALL"
    ).to_pylist()
    assert cores == [
        {"core_type": c, "block_id": w, "record_count": min(n, 16), "dropped_count": overflow[c, w]}
        for (c, w), n in sorted(expected.items())
    ]
    totals = store.sql(
        "SELECT sum(records) AS kept, sum(dropped) AS dropped FROM stage_stats"
    ).to_pylist()
    assert totals == [
        {
            "kept": sum(min(n, 16) for n in expected.values()),
            "dropped": sum(overflow.values()),
        }
    ]


def test_exception_discards_the_open_window_and_reraises(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...]
) -> None:
    prof = mega_kernel_profile(store=store, schedule=schedule(wait=0, warmup=0, active=2))

    def job() -> None:
        with prof:
            for step in range(4):
                kernel(*batch)
                if step == 3:
                    raise RuntimeError("job died")
                prof.step()

    with pytest.raises(RuntimeError, match="job died"):
        job()
    # Window 0 (steps 0, 1) completed and stays; window 1 had step 2 written, then died.
    assert store.sql(
        "SELECT window_id, step, count(*) AS n FROM invocations GROUP BY ALL ORDER BY ALL"
    ).to_pylist() == [{"window_id": 0, "step": 0, "n": 1}, {"window_id": 0, "step": 1, "n": 1}]
    assert store.sql("SELECT DISTINCT step FROM records ORDER BY step")["step"].to_pylist() == [
        0,
        1,
    ]
    assert store.sql("SELECT status FROM runs")["status"].to_pylist() == ["failed"]
    assert prof.windows == [Window(index=0, steps=(0, 1), invocations=2)]
    assert not list(store.root.rglob("*.tmp"))
    with mega_kernel_profile(store=store):  # the session let go of the process
        pass


def test_a_compaction_meanwhile_does_not_bring_a_discarded_window_back(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...]
) -> None:
    def job() -> None:
        with mega_kernel_profile(store=store, group_steps=2) as prof:
            for _ in range(3):
                kernel(*batch)
                prof.step()
            prof.flush()
            report = store.compact()
            # The open window's first two steps are staged as a group, not committed: a
            # compaction leaves their records and cores files alone, and the task graph no
            # committed invocation names yet (the third step is in the writer's memory).
            assert (report.files_before, report.uncommitted_files) == (0, 3)
            raise RuntimeError("job died")

    with pytest.raises(RuntimeError, match="job died"):
        job()
    assert store.sql(
        """SELECT (SELECT count(*) FROM invocations) AS invocations,
                  (SELECT count(*) FROM records) AS records,
                  (SELECT count(*) FROM records_ns) AS timed,
                  (SELECT count(*) FROM cores) AS cores,
                  (SELECT invocations FROM run_summary) AS summarized,
                  (SELECT count(*) FROM stage_stats WHERE records > 0) AS stages"""
    ).to_pylist() == [
        {"invocations": 0, "records": 0, "timed": 0, "cores": 0, "summarized": 0, "stages": 0}
    ]
    discards = store.sql("SELECT rank, window_id, reason FROM raw_discards").to_pylist()
    assert discards == [{"rank": 0, "window_id": 0, "reason": "RuntimeError: job died"}] * 3


def test_buffers_ingested_by_hand_into_a_captured_run_count_no_negative_drops(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...]
) -> None:
    with mega_kernel_profile(store=store) as prof:
        kernel(*batch)
    config = kernel.config_for(TOKENS).with_profiling()
    buffer = torch.zeros(config.layout.total_bytes, dtype=torch.uint8)
    torch.ops.mcprof.reference_mega_moe(*batch, kernel.w1, kernel.w2, config.tensor, buffer)
    meta = config.metadata
    ingest_buffers(
        store,
        [buffer.numpy()],
        config.layout,
        frequency_hz=1e9,
        run_id=prof.run_id,
        kernel=KernelInfo(meta.kernel_name, meta.owner_label, meta.stage_names),
        launches=Launches(step=1, first_invocation_id=1),
    )
    rows = store.sql("SELECT records, expected_records, dropped FROM stage_stats").to_pylist()
    assert len(rows) == 5
    assert all(r["records"] == 2 * r["expected_records"] and r["dropped"] == 0 for r in rows)


def test_max_pending_calls_drains_within_a_step(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...]
) -> None:
    with mega_kernel_profile(store=store, max_pending_calls=2, group_steps=1) as prof:
        for _ in range(5):  # a file per batch: the drains are counted by files
            kernel(*batch)
    assert prof.pool.allocations == 2
    assert store.sql(
        """SELECT step, list(invocation_id ORDER BY invocation_id) AS ids
           FROM invocations GROUP BY step"""
    ).to_pylist() == [{"step": 0, "ids": [0, 1, 2, 3, 4]}]
    files = list((store.root / "records" / f"run_id={prof.run_id}").rglob("*.parquet"))
    assert len(files) == 3  # drained at 2, 4, and at exit
    # The window's three writes are committed together, by one invocations file.
    files = list((store.root / "invocations" / f"run_id={prof.run_id}").glob("*.parquet"))
    assert len(files) == 1
    stats = prof.writer_stats
    assert (stats.batches, stats.invocations) == (3, 5)
    assert stats.cpu_seconds > 0


def test_without_a_schedule_every_call_records_and_exit_closes_the_window(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...]
) -> None:
    ready: list[int] = []
    with mega_kernel_profile(store=store, on_trace_ready=lambda p: ready.append(p.step_num)) as p:
        for _ in range(3):
            kernel(*batch)
            p.step()
        kernel(*batch, direction="backward")
    assert ready == [3]
    assert p.windows == [Window(index=0, steps=(0, 1, 2, 3), invocations=4)]
    assert store.sql(
        "SELECT step, direction FROM invocations ORDER BY invocation_id"
    ).to_pylist() == [
        {"step": 0, "direction": "forward"},
        {"step": 1, "direction": "forward"},
        {"step": 2, "direction": "forward"},
        {"step": 3, "direction": "backward"},
    ]
    assert store.sql("SELECT schedule FROM runs")["schedule"].to_pylist() == ["every step"]


def test_start_and_stop_without_a_with_block(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...]
) -> None:
    prof = mega_kernel_profile(store=store, schedule=schedule(wait=1, warmup=0, active=1))
    assert prof.start() is prof
    kernel(*batch)
    prof.step()
    kernel(*batch)
    prof.stop()
    assert prof.windows == [Window(index=0, steps=(1,), invocations=1)]
    assert store.sql("SELECT status FROM runs")["status"].to_pylist() == ["complete"]


def test_launches_from_several_threads_get_distinct_ids(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...]
) -> None:
    with mega_kernel_profile(store=store, max_pending_calls=2) as prof:
        threads = [
            threading.Thread(target=lambda: [kernel(*batch) for _ in range(4)]) for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert prof.invocations == 12
    assert store.sql(
        "SELECT list(invocation_id ORDER BY invocation_id) AS ids FROM invocations"
    ).to_pylist() == [{"ids": list(range(12))}]
    per_launch = sum(expected_per_worker(kernel.config_for(TOKENS)).values())
    assert store.sql("SELECT count(*) AS n FROM records")["n"].to_pylist() == [12 * per_launch]


def test_sessions_sharing_a_run_id_continue_its_ids(
    store: Store,
    kernel: ReferenceMoeKernel,
    batch: tuple[torch.Tensor, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MCPROF_RUN_ID", "shared-run")
    for _ in range(2):
        with mega_kernel_profile(store=store) as prof:
            kernel(*batch)
            prof.step()
            kernel(*batch)
    assert prof.windows == [Window(index=1, steps=(0, 1), invocations=2)]
    assert store.sql(
        "SELECT run_id, window_id, list(invocation_id ORDER BY invocation_id) AS ids "
        "FROM invocations GROUP BY ALL ORDER BY window_id"
    ).to_pylist() == [
        {"run_id": "shared-run", "window_id": 0, "ids": [0, 1]},
        {"run_id": "shared-run", "window_id": 1, "ids": [2, 3]},
    ]


OTHER_SESSION = """
import sys
import torch
from multicore_profiler import mega_kernel_profile
from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route

seed = torch.Generator().manual_seed(0)
router, w1, w2 = make_moe_weights({experts}, {hidden}, {inter}, generator=seed)
x = torch.randn({tokens}, {hidden}, generator=torch.Generator().manual_seed(1))
with ReferenceMoeKernel(w1, w2, token_tile=16) as kernel:
    with mega_kernel_profile(store=sys.argv[1], writer="thread") as prof:
        for _ in range(6):
            kernel(x, *route(x, router, {top_k}))
            prof.step()
"""


def test_sessions_open_at_once_on_one_run_id_take_distinct_ids(
    store: Store,
    kernel: ReferenceMoeKernel,
    batch: tuple[torch.Tensor, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second session writes the whole of its window while the first has one open."""
    monkeypatch.setenv("MCPROF_RUN_ID", "shared-run")
    other = OTHER_SESSION.format(
        experts=EXPERTS, hidden=HIDDEN, inter=INTER, tokens=TOKENS, top_k=TOP_K
    )
    with mega_kernel_profile(store=store) as prof:
        kernel(*batch)
        prof.step()
        subprocess.run([sys.executable, "-c", other, str(store.root)], check=True, timeout=120)
        for _ in range(5):
            kernel(*batch)
            prof.step()
    assert store.sql(
        """SELECT count(*) AS launches, count(DISTINCT invocation_id) AS ids,
                  list(invocation_id ORDER BY invocation_id) AS taken
           FROM invocations"""
    ).to_pylist() == [
        {"launches": 12, "ids": 12, "taken": [*range(6), *range(ID_BLOCK, ID_BLOCK + 6)]}
    ]
    assert not list(store.root.rglob("_claim-*"))  # both sessions let go of their ids


def test_drops_in_slots_that_are_not_full_are_not_called_full(store: Store) -> None:
    """A slot whose record_count is below its capacity and that counts dropped records."""
    tasks = new_tasks(1)
    tasks["core_type"] = 1
    config = build_runtime_config(
        tasks,
        event_count=0,
        aic_workers=1,
        aiv_workers=1,
        backend=CpuBackend(),
        aic_capacity=16,
        aiv_capacity=16,
    )
    one = [(100, 200, 0x20000, 0, 0, NO_OWNER)]
    full = [(100 + i, 101 + i, 0x20000, 0, 0, NO_OWNER) for i in range(16)]
    partial_and_full = [Slot(AIC, 0, 100, full, dropped=2), Slot(AIV, 0, 100, one, dropped=1)]
    buffers = [
        pack(1, 1, 16, 16, [Slot(AIC, 0, 100, one, dropped=3)]),
        pack(1, 1, 16, 16, partial_and_full),
    ]
    clean = pack(1, 1, 16, 16, [Slot(AIC, 0, 100, one)])
    warned = []
    with mega_kernel_profile(store=store) as prof:
        # step 2: both, counted at once; step 3: a launch that dropped none, then one that did
        for launches in ([buffers[0]], [buffers[1]], buffers, [clean, buffers[1]]):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for data in launches:
                    with prepare_call(config) as call:
                        call.buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
                prof.step()
            warned += [str(w.message) for w in caught if w.category is DroppedRecordsWarning]
    assert warned == [
        "step 0: the device dropped 3 records in 1 launch(es) in slots that are not full "
        "(their record_count is below their capacity; the invocations list them in "
        "partial_slots); the rest are kept",
        "step 1: the device dropped 3 records in 1 launch(es): 2 because slots were full "
        "(plan a larger capacity), 1 in slots that are not full (their record_count is below "
        "their capacity; the invocations list them in partial_slots); the rest are kept",
        "step 2: the device dropped 6 records in 2 launch(es): 2 because slots were full "
        "(plan a larger capacity), 4 in slots that are not full (their record_count is below "
        "their capacity; the invocations list them in partial_slots); the rest are kept",
        "step 3: the device dropped 3 records in 2 launch(es): 2 because slots were full "
        "(plan a larger capacity), 1 in slots that are not full (their record_count is below "
        "their capacity; the invocations list them in partial_slots); the rest are kept",
    ]


def test_a_failed_launch_is_cancelled_and_not_recorded(
    store: Store, weights: tuple[torch.Tensor, ...], batch: tuple[torch.Tensor, ...]
) -> None:
    _, w1, w2 = weights
    with (
        ReferenceMoeKernel(w1, w2[:, :-1], token_tile=16) as broken,
        ReferenceMoeKernel(w1, w2, token_tile=16) as kernel,
        mega_kernel_profile(store=store) as prof,
    ):
        kernel(*batch)
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            broken(*batch)
        kernel(*batch)
        # The failed launch's buffer came back at once and served the next launch.
        assert (prof.pool.allocations, prof.pool.reuses) == (2, 1)
    assert prof.invocations == 2
    assert store.sql("SELECT count(*) AS n FROM invocations")["n"].to_pylist() == [2]


def test_record_followed_by_none_warns_like_torch(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...]
) -> None:
    ready: list[int] = []
    actions = iter(["RECORD", "NONE", "NONE"])
    custom = lambda step: ProfilerAction[next(actions)]  # noqa: E731
    with mega_kernel_profile(store=store, schedule=custom, on_trace_ready=ready.append) as prof:
        kernel(*batch)
        with pytest.warns(UserWarning, match="RECORD followed by NONE at step 1") as caught:
            prof.step()
        kernel(*batch)
    assert caught[0].filename == __file__
    assert ready == []  # as in torch: the window ends without on_trace_ready
    assert prof.windows == [Window(index=0, steps=(0,), invocations=1)]


def test_launches_of_different_configs_in_one_step(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...]
) -> None:
    """Token counts that change the task graph interleave within a step: each launch keeps
    its own layout, config and task graph."""
    x, ids, weights = batch
    short = (x[:20], ids[:20], weights[:20])
    with mega_kernel_profile(store=store):
        for args in (batch, short, short, batch):
            kernel(*args)
    configs = {n: kernel.config_for(n) for n in (TOKENS, 20)}
    assert configs[TOKENS].config_id != configs[20].config_id
    rows = store.sql(
        "SELECT invocation_id, config_id, record_count FROM invocations ORDER BY 1"
    ).to_pylist()
    per_launch = {n: sum(expected_per_worker(c).values()) for n, c in configs.items()}
    assert rows == [
        {"invocation_id": i, "config_id": configs[n].config_id, "record_count": per_launch[n]}
        for i, n in enumerate((TOKENS, 20, 20, TOKENS))
    ]
    assert store.sql(
        "SELECT config_id, count(*) AS n FROM tasks GROUP BY 1 ORDER BY 2"
    ).to_pylist() == sorted(
        ({"config_id": c.config_id, "n": len(c.tasks)} for c in configs.values()),
        key=lambda r: r["n"],
    )
    assert store.sql("SELECT sum(dropped) AS d FROM stage_stats")["d"].to_pylist() == [0]


def test_torch_schedule_is_accepted(
    store: Store, kernel: ReferenceMoeKernel, batch: tuple[torch.Tensor, ...]
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = torch.profiler.schedule(wait=1, warmup=0, active=1, repeat=1)
    with mega_kernel_profile(store=store, schedule=fn) as prof:
        for _ in range(3):
            kernel(*batch)
            prof.step()
    assert store.sql("SELECT step FROM invocations")["step"].to_pylist() == [1]
    assert store.sql("SELECT schedule FROM runs")["schedule"].to_pylist() == [
        "torch.profiler.profiler.schedule(wait=1, warmup=0, active=1, repeat=1, skip_first=0, "
        "skip_first_wait=0)"
    ]


def test_a_buffer_that_cannot_be_stored_fails_the_exit(store: Store) -> None:
    """A launch that recorded nothing is refused by the decoder: the exit raises, no row stays."""
    tasks = new_tasks(1)
    tasks["core_type"] = 1
    config = build_runtime_config(
        tasks, event_count=0, aic_workers=1, aiv_workers=1, backend=CpuBackend()
    )

    def job() -> None:
        with mega_kernel_profile(store=store) as prof:
            with prepare_call(config) as call:
                assert call.profiled  # a kernel that ignores its profiling flag
            prof.step()

    with pytest.raises(CaptureError, match="no slot of the buffer holds a record"):
        job()
    assert store.sql("SELECT count(*) AS n FROM invocations")["n"].to_pylist() == [0]
    assert store.sql("SELECT status FROM runs")["status"].to_pylist() == ["failed"]


def test_session_reports_itself(store: Store) -> None:
    with mega_kernel_profile(store=store, schedule=schedule(wait=1, warmup=0, active=1)) as prof:
        assert isinstance(prof, MegaKernelProfile)
        assert repr(prof) == f"MegaKernelProfile(run {prof.run_id}, rank 0, step 0, NONE, open)"
        assert prof.store is store
    assert Path(store.root).is_dir()
    assert np.array_equal(
        store.sql("SELECT count(*) AS n FROM runs")["n"].to_numpy(), np.array([1])
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_pending_calls": 0}, "max_pending_calls must be >= 1"),
        ({"max_pending_calls": 1.5}, "max_pending_calls must be an int"),
        ({"on_trace_ready": 3}, "on_trace_ready must be callable"),
        ({"schedule": "often"}, "schedule must be callable"),
        ({"writer": "fork"}, r"writer must be one of \('process', 'thread'\), got 'fork'"),
        ({"writer_timeout": 0}, r"^writer_timeout must be a positive number of seconds, got 0$"),
        ({"writer_timeout": "1"}, r"^writer_timeout must be a number of seconds, got '1'$"),
    ],
)
def test_bad_session_arguments_raise(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SessionError, match=message):
        mega_kernel_profile(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", r"^\$MCPROF_WRITER_TIMEOUT must be a number of seconds, got 'soon'$"),
        ("inf", r"^\$MCPROF_WRITER_TIMEOUT must be a positive number of seconds, got inf$"),
    ],
)
def test_a_bad_writer_timeout_in_the_environment_is_refused(
    value: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCPROF_WRITER_TIMEOUT", value)
    with pytest.raises(SessionError, match=message):
        mega_kernel_profile()


def _rank_job(rank: int, world: int, init_file: str, store_path: str) -> None:
    """One rank of a two-process job: its session learns rank and run id from the group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        router, w1, w2 = make_moe_weights(
            EXPERTS, HIDDEN, INTER, generator=torch.Generator().manual_seed(0)
        )
        x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(rank))
        one_step_windows = schedule(wait=0, warmup=0, active=1)
        with ReferenceMoeKernel(w1, w2, token_tile=16) as kernel:
            try:
                with mega_kernel_profile(store=store_path, schedule=one_step_windows) as prof:
                    kernel(x, *route(x, router, TOP_K))
                    prof.step()
                    kernel(x, *route(x, router, TOP_K))
                    if rank == 1:
                        raise RuntimeError("rank 1 died")
            except RuntimeError:
                pass
    finally:
        dist.destroy_process_group()


def test_ranks_of_a_job_share_one_run(store: Store, tmp_path: Path) -> None:
    """Each rank writes its own rows under rank 0's run id; a failed rank fails the run."""
    import torch.multiprocessing as mp

    mp.spawn(_rank_job, args=(2, str(tmp_path / "init"), str(store.root)), nprocs=2, join=True)
    rows = store.sql(
        """SELECT rank, count(DISTINCT run_id) AS runs, list(step ORDER BY invocation_id) AS steps,
                  list(invocation_id ORDER BY invocation_id) AS ids
           FROM invocations GROUP BY rank ORDER BY rank"""
    ).to_pylist()
    assert rows == [
        {"rank": 0, "runs": 1, "steps": [0, 1], "ids": [0, 1]},
        {"rank": 1, "runs": 1, "steps": [0], "ids": [0]},  # its second window was discarded
    ]
    assert store.sql(
        "SELECT count(*) AS n, any_value(status) AS status, any_value(ranks_reporting) AS ranks,"
        " any_value(ranks_failed) AS failed FROM runs"
    ).to_pylist() == [{"n": 1, "status": "failed", "ranks": 2, "failed": 1}]
    assert store.sql(
        "SELECT rank, status FROM raw_runs QUALIFY row_number() OVER "
        "(PARTITION BY rank ORDER BY updated_at DESC) = 1 ORDER BY rank"
    ).to_pylist() == [{"rank": 0, "status": "complete"}, {"rank": 1, "status": "failed"}]
