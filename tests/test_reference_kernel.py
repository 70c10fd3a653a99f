"""The CPU reference MoE MegaKernel: its numbers, its records and its failure modes."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pytest
import torch

from multicore_profiler.abi import (
    DESC_TRIGGER_EVENT,
    DESC_WAIT_DEPENDENCY,
    NO_OWNER,
    CoreType,
)
from multicore_profiler.errors import ConfigError, DroppedRecordsWarning, SpecError
from multicore_profiler.ingest.decode import DecodedBuffers, decode_buffer
from multicore_profiler.kernels.reference import (
    COMBINE,
    DISPATCH,
    GEMM,
    SWIGLU,
    ReferenceMoeKernel,
    build_moe_graph,
    make_moe_weights,
    moe_reference,
    route,
)
from multicore_profiler.kernels.reference import moe as moe_module
from multicore_profiler.kernels.reference.graph import STAGE_GMM1
from multicore_profiler.kernels.runtime import (
    PreparedCall,
    RuntimeConfig,
    install_sink,
    remove_sink,
)
from multicore_profiler.kernels.spec import ProfileSpec, ProfileStage

TOKENS, HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 64, 32, 64, 4, 2
TILES = 2
PAIRS = EXPERTS * TILES
TIMEOUT_S = 30


@pytest.fixture(scope="module")
def weights() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return make_moe_weights(
        EXPERTS, HIDDEN, INTERMEDIATE, generator=torch.Generator().manual_seed(0)
    )


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))


def uneven_routing() -> tuple[torch.Tensor, torch.Tensor]:
    """Expert 3 gets no token and expert 2 one token (so its second tile is empty)."""
    ids = torch.zeros(TOKENS, TOP_K, dtype=torch.int64)
    ids[:, 1] = 1
    ids[0, 1] = 2
    weights = torch.rand(TOKENS, TOP_K, generator=torch.Generator().manual_seed(2))
    return ids, weights / weights.sum(dim=1, keepdim=True)


@pytest.fixture(params=["topk", "uneven"])
def routing(request, x, weights) -> tuple[torch.Tensor, torch.Tensor]:
    if request.param == "uneven":
        return uneven_routing()
    return route(x, weights[0], TOP_K)


@pytest.fixture
def kernel(weights) -> Iterator[ReferenceMoeKernel]:
    with ReferenceMoeKernel(weights[1], weights[2], tiles_per_expert=TILES) as opened:
        yield opened


def within_timeout(function: Callable[[], object]) -> object:
    """Run ``function`` on a daemon thread, so that a hung launch fails the test instead of
    blocking the run."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except BaseException as error:
            outcome["error"] = error

    runner = threading.Thread(target=target, daemon=True)
    runner.start()
    runner.join(TIMEOUT_S)
    if runner.is_alive():
        pytest.fail(f"the launch did not finish within {TIMEOUT_S} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def profiled_launch(
    kernel: ReferenceMoeKernel, x: torch.Tensor, routing: tuple[torch.Tensor, torch.Tensor]
) -> tuple[RuntimeConfig, torch.Tensor, torch.Tensor]:
    """One launch through the op with profiling on: (config, buffer, out)."""
    config = kernel.config_for(len(x)).with_profiling()
    buffer = torch.zeros(config.layout.total_bytes, dtype=torch.uint8)
    out = within_timeout(
        lambda: torch.ops.mcprof.reference_mega_moe(
            x, *routing, kernel.w1, kernel.w2, config.tensor, buffer
        )
    )
    return config, buffer, out


def decode(config: RuntimeConfig, buffer: torch.Tensor) -> DecodedBuffers:
    return decode_buffer(buffer.numpy(), config.layout, frequency_hz=1e9)


def column(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy()


def expected_stage_ids(tasks: np.ndarray, *, with_spec: bool) -> np.ndarray:
    """The desc id of each task's compute record, worked out from its type alone."""
    task_type = tasks["task_type"].astype(np.int64)
    if not with_spec:
        return 0x20000 + task_type
    by_type = np.array([1, 2, 3, 5])[task_type]
    return np.where(task_type == GEMM, 2 + 2 * tasks["tiling_position"], by_type)


def expected_records(
    tasks: np.ndarray, core_type: CoreType, worker: int, stage_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(task ids, desc ids) of a worker's records in order: [wait], compute, [trigger]."""
    queue = np.flatnonzero((tasks["core_type"] == core_type) & (tasks["worker"] == worker))
    present = np.stack(
        [
            tasks["wait_event"][queue] >= 0,
            np.ones(len(queue), bool),
            tasks["trigger_event"][queue] >= 0,
        ],
        axis=1,
    )
    desc = np.stack(
        [
            np.full(len(queue), DESC_WAIT_DEPENDENCY),
            stage_ids[queue],
            np.full(len(queue), DESC_TRIGGER_EVENT),
        ],
        axis=1,
    )
    return np.repeat(queue, 3)[present.ravel()], desc[present]


def worker_records(decoded: DecodedBuffers, core_type: CoreType, worker: int) -> dict:
    records = decoded.records
    mine = (column(records, "core_type") == core_type) & (column(records, "block_id") == worker)
    order = np.argsort(column(records, "record_index")[mine])
    return {name: column(records, name)[mine][order] for name in records.column_names[:-1]}


WORKERS = [(CoreType.AIC, 0), (CoreType.AIC, 1), (CoreType.AIV, 0), (CoreType.AIV, 1)]


# --- numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize("with_spec", [True, False])
def test_output_matches_oracle_unprofiled(weights, x, routing, with_spec) -> None:
    spec = {} if with_spec else {"spec": None}
    with ReferenceMoeKernel(weights[1], weights[2], tiles_per_expert=TILES, **spec) as kernel:
        out = within_timeout(lambda: kernel(x, *routing))
        assert kernel.backend.allocations == 0
    torch.testing.assert_close(out, moe_reference(x, *routing, weights[1], weights[2]))


def test_every_worker_of_a_launch_runs_on_a_thread_of_its_own(weights, x, monkeypatch) -> None:
    """Workers that finish at once (here: doing nothing) still each get their own thread:
    a pool thread done with one would otherwise take the next, one core after the other."""
    threads: list[int] = []
    monkeypatch.setattr(
        moe_module, "_run_fast", lambda queue, events: threads.append(threading.get_ident())
    )
    with ReferenceMoeKernel(
        weights[1], weights[2], tiles_per_expert=TILES, aic_workers=3, aiv_workers=5
    ) as kernel:
        for _ in range(20):
            threads.clear()
            within_timeout(lambda: kernel(x, *route(x, weights[0], TOP_K)))
            assert len(threads) == 8
            assert len(set(threads)) == 8


@pytest.mark.parametrize("with_spec", [True, False])
def test_output_matches_oracle_profiled(weights, x, routing, with_spec) -> None:
    spec = {} if with_spec else {"spec": None}
    with ReferenceMoeKernel(weights[1], weights[2], tiles_per_expert=TILES, **spec) as kernel:
        config, buffer, out = profiled_launch(kernel, x, routing)
    torch.testing.assert_close(out, moe_reference(x, *routing, weights[1], weights[2]))
    assert decode(config, buffer).record_counts[0] > 0


def test_odd_token_count_and_tile_size(weights) -> None:
    tokens = 37
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(3))
    routing = route(x, weights[0], TOP_K)
    with ReferenceMoeKernel(weights[1], weights[2], tiles_per_expert=3, token_tile=8) as kernel:
        out = within_timeout(lambda: kernel(x, *routing))
        assert np.count_nonzero(kernel.config_for(tokens).tasks["task_type"] == COMBINE) == 5
    torch.testing.assert_close(out, moe_reference(x, *routing, weights[1], weights[2]))


def test_route_renormalizes_top_k(x, weights) -> None:
    ids, topk_weights = route(x, weights[0], TOP_K)
    assert ids.shape == (TOKENS, TOP_K)
    assert ids.dtype == torch.int64
    assert bool((ids[:, 0] != ids[:, 1]).all())
    torch.testing.assert_close(topk_weights.sum(dim=1), torch.ones(TOKENS))


# --- graph and config ------------------------------------------------------------------


def test_graph_order_events_and_args() -> None:
    graph = build_moe_graph(EXPERTS, TILES, 2)
    tasks = graph.tasks
    assert graph.event_count == 3 * PAIRS + 1
    assert tasks["task_type"].tolist() == (
        [DISPATCH] * PAIRS + [GEMM] * PAIRS + [SWIGLU] * PAIRS + [GEMM] * PAIRS + [COMBINE] * 2
    )
    assert (
        tasks["core_type"].tolist()
        == [2] * PAIRS + [1] * PAIRS + [2] * PAIRS + [1] * PAIRS + [2] * 2
    )
    gmm1, gmm2 = slice(PAIRS, 2 * PAIRS), slice(3 * PAIRS, 4 * PAIRS)
    assert set(tasks["tiling_position"][gmm1]) == {0}
    assert set(tasks["input_position"][gmm1]) == {3}
    assert set(tasks["tiling_position"][gmm2]) == {1}
    assert set(tasks["input_position"][gmm2]) == {4}
    pair = np.arange(PAIRS)
    assert tasks["args"][:PAIRS].tolist() == [
        [e, j, 0, 0] for e in range(EXPERTS) for j in range(TILES)
    ]
    assert tasks["args"][4 * PAIRS :].tolist() == [[0, 0, 0, 0], [1, 0, 0, 0]]
    # DISP -> G1 -> SW -> DONE, each wait on the event its predecessor triggers.
    assert tasks["trigger_event"][:PAIRS].tolist() == pair.tolist()
    assert tasks["wait_event"][:PAIRS].tolist() == [-1] * PAIRS
    for stage in range(1, 4):
        block = tasks[stage * PAIRS : (stage + 1) * PAIRS]
        assert block["wait_event"].tolist() == ((stage - 1) * PAIRS + pair).tolist()
        assert block["wait_count"].tolist() == [1] * PAIRS
    assert (
        tasks["trigger_event"][PAIRS : 3 * PAIRS].tolist()
        == (PAIRS + np.arange(2 * PAIRS)).tolist()
    )
    assert tasks["trigger_event"][3 * PAIRS :].tolist() == [3 * PAIRS] * PAIRS + [-1, -1]
    assert tasks["wait_event"][4 * PAIRS :].tolist() == [3 * PAIRS] * 2
    assert tasks["wait_count"][4 * PAIRS :].tolist() == [PAIRS] * 2


def test_config_is_cached_per_token_count(kernel) -> None:
    assert kernel.config_for(TOKENS) is kernel.config_for(TOKENS)
    assert kernel.config_for(TOKENS) is not kernel.config_for(TOKENS + 1)
    assert kernel.config_for(TOKENS).metadata.kernel_name == "ReferenceMegaMoe"
    assert kernel.config_for(TOKENS).metadata.stage_names == {
        1: "Dispatch",
        2: "GMM1",
        3: "SwiGLU",
        4: "GMM2",
        5: "Combine",
    }


def test_spec_with_a_task_in_two_stages_names_both(weights) -> None:
    spec = ProfileSpec(
        kernel_name="Clash",
        stages=[
            ProfileStage(1, "AnyGemm", task_type=GEMM),
            ProfileStage(2, "SecondTiling", tiling_position=1),
        ],
    )
    with (
        ReferenceMoeKernel(weights[1], weights[2], spec=spec) as kernel,
        pytest.raises(
            SpecError,
            match=rf"task {3 * PAIRS} matches both stage 'AnyGemm' and stage 'SecondTiling' "
            rf"\({PAIRS} task\(s\)",
        ),
    ):
        kernel.config_for(TOKENS)


# --- records ---------------------------------------------------------------------------


@pytest.mark.parametrize("with_spec", [True, False])
def test_records_follow_the_queues(weights, x, routing, with_spec) -> None:
    offset = 8
    spec = {} if with_spec else {"spec": None}
    with ReferenceMoeKernel(
        weights[1], weights[2], tiles_per_expert=TILES, expert_offset=offset, **spec
    ) as kernel:
        config, buffer, _ = profiled_launch(kernel, x, routing)
    tasks = config.tasks
    decoded = decode(config, buffer)
    queued = 1 + (tasks["wait_event"] >= 0) + (tasks["trigger_event"] >= 0)

    cores = decoded.cores
    assert list(zip(column(cores, "core_type"), column(cores, "block_id"), strict=True)) == WORKERS
    for (core_type, worker), count in zip(WORKERS, column(cores, "record_count"), strict=True):
        mine = (tasks["core_type"] == core_type) & (tasks["worker"] == worker)
        assert count == queued[mine].sum()
    assert column(cores, "dropped_count").tolist() == [0, 0, 0, 0]
    assert decoded.dropped_counts.tolist() == [0]

    stage_ids = expected_stage_ids(tasks, with_spec=with_spec)
    if with_spec:
        owner = np.where(tasks["task_type"] == COMBINE, NO_OWNER, offset + tasks["args"][:, 0])
        index = np.where(tasks["task_type"] == COMBINE, tasks["args"][:, 0], tasks["args"][:, 1])
    else:
        owner = np.full(len(tasks), NO_OWNER)
        index = np.zeros(len(tasks), np.int64)
        for task_type in (DISPATCH, GEMM, SWIGLU, COMBINE):
            same = tasks["task_type"] == task_type
            index[same] = np.arange(same.sum())
    for core_type, worker in WORKERS:
        records = worker_records(decoded, core_type, worker)
        task_ids, desc_ids = expected_records(tasks, core_type, worker, stage_ids)
        assert records["task_id"].tolist() == task_ids.tolist()
        assert records["desc_id"].tolist() == desc_ids.tolist()
        assert records["owner_id"].tolist() == owner[task_ids].tolist()
        assert records["stage_task_index"].tolist() == index[task_ids].tolist()


def test_records_keep_time_order_and_dependencies(kernel, x, routing) -> None:
    config, buffer, _ = profiled_launch(kernel, x, routing)
    tasks = config.tasks
    decoded = decode(config, buffer)
    entries = dict(
        zip(
            zip(column(decoded.cores, "core_type"), column(decoded.cores, "block_id"), strict=True),
            column(decoded.cores, "entry_cycle"),
            strict=True,
        )
    )
    for core_type, worker in WORKERS:
        records = worker_records(decoded, core_type, worker)
        start, end = records["start_cycle"], records["end_cycle"]
        assert bool((start <= end).all())
        assert bool((start[1:] >= end[:-1]).all()), f"{core_type.name}/{worker} overlaps"
        assert start[0] >= entries[core_type, worker]

    records = decoded.records
    desc, task = column(records, "desc_id"), column(records, "task_id")
    end = column(records, "end_cycle")
    triggers = desc == DESC_TRIGGER_EVENT
    released = np.zeros(config.header["event_count"], np.uint64)
    np.maximum.at(released, tasks["trigger_event"][task[triggers]], end[triggers])
    waits = desc == DESC_WAIT_DEPENDENCY
    assert waits.sum() == (tasks["wait_event"] >= 0).sum()
    waited_on = tasks["wait_event"][task[waits]]
    late = end[waits] < released[waited_on]
    assert not late.any(), f"tasks {task[waits][late].tolist()} stopped waiting before the trigger"


def test_fast_loop_never_reads_the_clock_or_the_buffer(
    kernel, weights, x, routing, monkeypatch
) -> None:
    def no_clock() -> int:
        raise AssertionError("the fast loop read the clock")

    monkeypatch.setattr(moe_module, "clock", no_clock)
    out = within_timeout(lambda: kernel(x, *routing))
    torch.testing.assert_close(out, moe_reference(x, *routing, weights[1], weights[2]))
    assert kernel.backend.placeholder.numel() == 0
    assert kernel.backend.allocations == 0

    config = kernel.config_for(TOKENS)
    assert not config.profile_enabled
    buffer = torch.zeros(config.layout.total_bytes, dtype=torch.uint8)
    within_timeout(
        lambda: torch.ops.mcprof.reference_mega_moe(
            x, *routing, kernel.w1, kernel.w2, config.tensor, buffer
        )
    )
    assert not buffer.any()


def test_profiled_loop_reads_the_clock_for_every_field(kernel, x, routing, monkeypatch) -> None:
    base = 10_000
    ticks = itertools.count(base)
    monkeypatch.setattr(moe_module, "clock", ticks.__next__)
    config, buffer, _ = profiled_launch(kernel, x, routing)
    reads = next(ticks) - base
    tasks = config.tasks
    workers = config.workers(CoreType.AIC) + config.workers(CoreType.AIV)
    assert reads == workers + 2 * len(tasks) + 2 * int(
        (tasks["wait_event"] >= 0).sum() + (tasks["trigger_event"] >= 0).sum()
    )
    decoded = decode(config, buffer)
    stamps = np.concatenate(
        [
            column(decoded.cores, "entry_cycle"),
            column(decoded.records, "start_cycle"),
            column(decoded.records, "end_cycle"),
        ]
    )
    assert np.sort(stamps).tolist() == list(range(base, base + reads))


def test_full_slots_drop_the_rest_and_keep_the_first(weights, x, routing) -> None:
    capacity = 16
    with ReferenceMoeKernel(
        weights[1], weights[2], tiles_per_expert=TILES, aic_capacity=capacity
    ) as kernel:
        config, buffer, out = profiled_launch(kernel, x, routing)
    torch.testing.assert_close(out, moe_reference(x, *routing, weights[1], weights[2]))
    tasks = config.tasks
    needed = {
        (core_type, worker): len(expected_records(tasks, core_type, worker, tasks["task_id"])[0])
        for core_type, worker in WORKERS
    }
    assert needed[CoreType.AIC, 0] == 3 * PAIRS  # 2 GEMMs of PAIRS tasks over 2 workers
    with pytest.warns(DroppedRecordsWarning, match=f"dropped {2 * (3 * PAIRS - capacity)} records"):
        decoded = decode(config, buffer)
    cores = decoded.cores
    for (core_type, worker), count, dropped in zip(
        WORKERS, column(cores, "record_count"), column(cores, "dropped_count"), strict=True
    ):
        limit = capacity if core_type == CoreType.AIC else config.layout.aiv_capacity
        assert count == min(needed[core_type, worker], limit)
        assert dropped == max(needed[core_type, worker] - limit, 0)
        kept = worker_records(decoded, core_type, worker)
        stage_ids = expected_stage_ids(tasks, with_spec=True)
        task_ids, desc_ids = expected_records(tasks, core_type, worker, stage_ids)
        assert kept["task_id"].tolist() == task_ids[:count].tolist()
        assert kept["desc_id"].tolist() == desc_ids[:count].tolist()


def test_idle_slots_stay_zero(weights, x, routing) -> None:
    with ReferenceMoeKernel(
        weights[1], weights[2], tiles_per_expert=TILES, aic_slots=3, aiv_slots=5
    ) as kernel:
        config, buffer, _ = profiled_launch(kernel, x, routing)
    assert config.layout.total_slots == 8
    decoded = decode(config, buffer)
    assert column(decoded.cores, "slot").tolist() == [0, 1, 3, 4]


# --- launches --------------------------------------------------------------------------


def test_op_passes_torch_opcheck(kernel, x, routing) -> None:
    config = kernel.config_for(TOKENS).with_profiling()
    buffer = torch.zeros(config.layout.total_bytes, dtype=torch.uint8)
    args = (x, *routing, kernel.w1, kernel.w2, config.tensor, buffer)
    results = within_timeout(
        lambda: torch.library.opcheck(
            torch.ops.mcprof.reference_mega_moe, args, test_utils=("test_schema", "test_faketensor")
        )
    )
    assert results == {"test_schema": "SUCCESS", "test_faketensor": "SUCCESS"}


def test_torch_profiler_shows_each_launch(kernel, x, routing) -> None:
    # The profiler records the thread that starts it, so the launches run on this one.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        kernel(x, *routing)
        kernel(x, *routing)
    names = [event.name for event in prof.events()]
    assert names.count("mcprof::reference_mega_moe") == 2


@pytest.mark.parametrize("profiled", [False, True])
def test_task_error_propagates_and_the_pool_survives(weights, x, routing, profiled) -> None:
    w1, w2 = weights[1], weights[2]
    bad_w2 = torch.zeros(EXPERTS, INTERMEDIATE + 1, HIDDEN)
    with ReferenceMoeKernel(w1, bad_w2, tiles_per_expert=TILES) as kernel:
        failing = (
            (lambda: profiled_launch(kernel, x, routing))
            if profiled
            else (lambda: within_timeout(lambda: kernel(x, *routing)))
        )
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            failing()
        kernel.w2 = w2
        out = within_timeout(lambda: kernel(x, *routing))
    torch.testing.assert_close(out, moe_reference(x, *routing, w1, w2))


def test_pool_threads_persist_across_launches_until_close(weights, x, routing) -> None:
    def pool_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("mcprof-moe-3x1_")}

    kernel = ReferenceMoeKernel(weights[1], weights[2], aic_workers=3, aiv_workers=1)
    started = pool_threads()
    assert len(started) == 4
    for _ in range(3):
        torch.testing.assert_close(
            within_timeout(lambda: kernel(x, *routing)),
            moe_reference(x, *routing, weights[1], weights[2]),
        )
    assert pool_threads() == started
    kernel.close()
    for thread in started:
        thread.join(timeout=TIMEOUT_S)
    assert not pool_threads()
    with pytest.raises(ConfigError, match="closed"):
        kernel(x, *routing)


class RecordingSink:
    """A stand-in capture session: profiles every call and remembers how each ended."""

    def __init__(self) -> None:
        self.completed: list[PreparedCall] = []
        self.cancelled: list[PreparedCall] = []

    def prepare(self, config: RuntimeConfig, direction: str) -> PreparedCall:
        profiled = config.with_profiling()
        buffer = config.backend.allocate(profiled.layout.total_bytes)
        return PreparedCall(profiled, buffer, direction=direction, sink=self)

    def complete(self, call: PreparedCall) -> None:
        self.completed.append(call)

    def cancel(self, call: PreparedCall) -> None:
        self.cancelled.append(call)


def test_calls_complete_or_cancel_through_the_capture_hook(weights, x, routing) -> None:
    sink = RecordingSink()
    install_sink(sink)
    try:
        with ReferenceMoeKernel(weights[1], weights[2], tiles_per_expert=TILES) as kernel:
            within_timeout(lambda: kernel(x, *routing, direction="backward"))
            kernel.w2 = torch.zeros(EXPERTS, INTERMEDIATE + 1, HIDDEN)
            with pytest.raises(RuntimeError):
                within_timeout(lambda: kernel(x, *routing))
    finally:
        remove_sink(sink)
    assert [call.direction for call in sink.completed] == ["backward"]
    assert len(sink.cancelled) == 1
    call = sink.completed[0]
    decoded = decode(call.config, call.buffer)
    tasks = call.config.tasks
    assert (
        decoded.record_counts[0]
        == len(tasks) + (tasks["wait_event"] >= 0).sum() + (tasks["trigger_event"] >= 0).sum()
    )


# --- extra compute: the what-if experiment's knob ---------------------------------------

EXTRA_NS = 2_000_000


def sunk_launch(
    kernel: ReferenceMoeKernel, x: torch.Tensor, routing: tuple[torch.Tensor, torch.Tensor]
) -> tuple[RuntimeConfig, torch.Tensor, torch.Tensor]:
    """One profiled launch through the kernel's own call, which passes its extra compute:
    (config, buffer, out)."""
    sink = RecordingSink()
    install_sink(sink)
    try:
        out = within_timeout(lambda: kernel(x, *routing))
    finally:
        remove_sink(sink)
    (call,) = sink.completed
    return call.config, call.buffer, out


@pytest.mark.parametrize(
    ("extra", "spec", "match"),
    [
        ({"GMM3": 1}, {}, r"stage 'GMM3'.*stages are \['Combine', 'Dispatch', 'GMM1', "),
        ({"GMM1": -1}, {}, r"extra_compute_ns\['GMM1'\] must be a whole number of ns >= 0, got -1"),
        ({"GMM1": 1.5}, {}, r"extra_compute_ns\['GMM1'\] .* got 1.5"),
        ({"GMM1": 1}, {"spec": None}, r"stage 'GMM1', .* its stages are none"),
    ],
)
def test_extra_compute_is_validated(weights, extra, spec, match) -> None:
    with pytest.raises(ConfigError, match=match):
        ReferenceMoeKernel(
            weights[1], weights[2], aic_workers=5, aiv_workers=7, extra_compute_ns=extra, **spec
        )
    assert (5, 7) not in moe_module._pools


SEPARATING_EXTRA_NS = 10 * EXTRA_NS
"""An extra far above what a task takes on a loaded 2-core machine (another test worker
beside this kernel's threads has held a Combine task 2.6 ms), so that the other stages'
medians stay below it."""


def test_extra_compute_lengthens_every_task_of_the_stage(weights, x, routing) -> None:
    with ReferenceMoeKernel(
        weights[1],
        weights[2],
        tiles_per_expert=TILES,
        extra_compute_ns={"GMM1": SEPARATING_EXTRA_NS},
    ) as kernel:
        config, buffer, out = sunk_launch(kernel, x, routing)
    torch.testing.assert_close(out, moe_reference(x, *routing, weights[1], weights[2]))
    records = decode(config, buffer).records
    desc = column(records, "desc_id")
    duration = column(records, "end_cycle") - column(records, "start_cycle")
    gmm1 = desc == STAGE_GMM1
    assert gmm1.sum() == PAIRS
    assert bool((duration[gmm1] >= SEPARATING_EXTRA_NS).all())
    for stage in set(expected_stage_ids(config.tasks, with_spec=True).tolist()) - {STAGE_GMM1}:
        assert np.median(duration[desc == stage]) < SEPARATING_EXTRA_NS, (
            f"stage {stage} was lengthened"
        )


def test_extra_compute_slows_the_fast_loop_without_its_clock(
    weights, x, routing, monkeypatch
) -> None:
    def no_clock() -> int:
        raise AssertionError("the fast loop read the clock")

    monkeypatch.setattr(moe_module, "clock", no_clock)
    with ReferenceMoeKernel(
        weights[1], weights[2], tiles_per_expert=TILES, extra_compute_ns={"GMM1": EXTRA_NS}
    ) as kernel:
        tasks = kernel.config_for(TOKENS).tasks
        gmm1_workers = tasks["worker"][tasks["profile_desc_id"] == STAGE_GMM1]
        chain = int(np.bincount(gmm1_workers).max()) * EXTRA_NS
        start = time.perf_counter_ns()
        out = within_timeout(lambda: kernel(x, *routing))
        wall = time.perf_counter_ns() - start
    torch.testing.assert_close(out, moe_reference(x, *routing, weights[1], weights[2]))
    assert chain == PAIRS // 2 * EXTRA_NS
    assert wall >= chain


def test_extra_compute_keeps_the_replaceable_clock(weights, x, routing, monkeypatch) -> None:
    # The busy time runs on the real clock; the records still read only ``clock``.
    base = 10_000
    ticks = itertools.count(base)
    monkeypatch.setattr(moe_module, "clock", ticks.__next__)
    with ReferenceMoeKernel(
        weights[1], weights[2], tiles_per_expert=TILES, extra_compute_ns={"GMM1": EXTRA_NS}
    ) as kernel:
        start = time.perf_counter_ns()
        config, buffer, _ = sunk_launch(kernel, x, routing)
        wall = time.perf_counter_ns() - start
    assert wall >= PAIRS // 2 * EXTRA_NS
    reads = next(ticks) - base
    tasks = config.tasks
    workers = config.workers(CoreType.AIC) + config.workers(CoreType.AIV)
    assert reads == workers + 2 * len(tasks) + 2 * int(
        (tasks["wait_event"] >= 0).sum() + (tasks["trigger_event"] >= 0).sum()
    )
    records = decode(config, buffer).records
    assert column(records, "end_cycle").max() < base + reads


def test_op_keys_extra_compute_by_the_compute_desc_id(weights, x, routing) -> None:
    with ReferenceMoeKernel(weights[1], weights[2], tiles_per_expert=TILES, spec=None) as kernel:
        config = kernel.config_for(TOKENS).with_profiling()
        buffer = torch.zeros(config.layout.total_bytes, dtype=torch.uint8)
        args = (x, *routing, kernel.w1, kernel.w2, config.tensor, buffer)
        with pytest.raises(ConfigError, match=r"int64 CPU tensor of \(desc id, ns\) rows"):
            torch.ops.mcprof.reference_mega_moe(*args, torch.zeros(2, dtype=torch.int64))
        gemm = 0x20000 + GEMM
        extra = torch.tensor([[gemm, EXTRA_NS]], dtype=torch.int64)
        out = within_timeout(lambda: torch.ops.mcprof.reference_mega_moe(*args, extra))
    torch.testing.assert_close(out, moe_reference(x, *routing, weights[1], weights[2]))
    records = decode(config, buffer).records
    desc = column(records, "desc_id")
    duration = column(records, "end_cycle") - column(records, "start_cycle")
    assert (desc == gemm).sum() == 2 * PAIRS
    assert bool((duration[desc == gemm] >= EXTRA_NS).all())
    assert np.median(duration[desc == 0x20000 + SWIGLU]) < EXTRA_NS
