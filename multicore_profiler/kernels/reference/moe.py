"""The CPU reference MoE MegaKernel: a MoE layer forward run by host threads as workers.

It follows the device protocol so the profiler can be tested without an NPU. A launch
is the torch custom op ``mcprof::reference_mega_moe``; it reads the RuntimeConfig bytes as
a device kernel would, sorts the routed (token, k) pairs by expert in its prologue, and
runs one host thread per worker on a persistent pool. Each worker runs its queue in
task order: wait on an event counter, compute with torch, trigger. The config's
``profile_enabled`` flag, read once per launch, picks the loop: the fast loop reads no
clock and touches no buffer; the profiled loop writes the slot header and the wait,
compute and trigger records of the device ABI into the worker's slot. A launch may add a
known busy time to the compute of every task of chosen stages (``extra_compute_ns``), in
either loop, to test what the analyses predict against what a slower stage measures; the
busy time runs on ``time.perf_counter_ns``, never on ``clock``. A launch may also give
chosen cores a clock that is off (``clock_skew``, ``clock_scale``): a known clock error
to test the clock sanity analyses against.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import enum
import math
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from multicore_profiler.abi import (
    DESC_TRIGGER_EVENT,
    DESC_WAIT_DEPENDENCY,
    CoreType,
    Generation,
)
from multicore_profiler.errors import ConfigError
from multicore_profiler.kernels.backend import Backend, CpuBackend
from multicore_profiler.kernels.reference.graph import (
    COMBINE,
    DISPATCH,
    GEMM,
    GMM1_TILING,
    GMM2_TILING,
    SWIGLU,
    build_moe_graph,
    moe_spec,
)
from multicore_profiler.kernels.runtime import (
    RuntimeConfig,
    build_runtime_config,
    compute_desc_ids,
    header_layout,
    parse_config,
    prepare_call,
)
from multicore_profiler.kernels.spec import ProfileSpec

clock: Callable[[], int] = time.perf_counter_ns
"""The cycle counter of the profiled loop (1 GHz, as ``CpuBackend.frequency_hz``); looked
up once per worker and launch, so a test can replace it."""

WorkerTask = tuple[Callable[[int, int], object], int, int, int, int, int, int, int, int, int]
"""A queued task as a worker runs it: (compute, arg0, arg1, wait_event, wait_count,
trigger_event, task_id, desc_id, stage_task_index, owner_id)."""


_PR_SET_TIMERSLACK = 29
"""Linux's prctl option for a thread's timer slack: the time a sleep may overshoot by
(50 us by default) so that the kernel can batch wake-ups."""
_slack_set = threading.local()


def _tight_timer() -> None:
    """Set the calling thread's timer slack to 1 ns, once, where Linux's prctl exists."""
    if getattr(_slack_set, "done", False):
        return
    _slack_set.done = True
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)


def _busy(ns: int) -> None:
    """Keep the calling worker busy for ``ns`` ns of the real clock, close to exactly and
    without holding the GIL: sleeps to the deadline with the thread's timer slack at 1 ns.

    Measured on 2 busy cores for 0.2 ms (time over the asked, p50 / p90 / p99): this +27 /
    +36 / +290 us; a sleep with the default slack +72 / +112 / +3,400 us. A spin to the
    deadline overshoots by under 1 us but holds the GIL: two GMM1 workers padding at once
    take turns, and a capture with 200 us per GMM1 task ran 1.6 ms longer where the
    replay, which models no contention, predicts 0.8 ms."""
    _tight_timer()
    deadline = time.perf_counter_ns() + ns
    while (left := deadline - time.perf_counter_ns()) > 0:
        time.sleep(left / 1e9)


def _padded(run: Callable[[int, int], object], ns: int) -> Callable[[int, int], None]:
    """``run`` followed by ``ns`` ns of busy time, so the compute record holds both."""

    def padded(arg0: int, arg1: int) -> None:
        run(arg0, arg1)
        _busy(ns)

    return padded


class _Aborted(Exception):
    """Raised in a waiting worker when another worker of the launch failed."""


class _Events:
    """The event counters of one launch; ``error`` doubles as its abort flag."""

    __slots__ = ("cond", "counts", "error")

    def __init__(self, count: int) -> None:
        self.counts = [0] * count
        self.cond = threading.Condition()
        self.error: BaseException | None = None

    def wait(self, event: int, needed: int) -> None:
        """Block until ``event`` has been triggered ``needed`` times (or the launch fails)."""
        with self.cond:
            while self.counts[event] < needed:
                if self.error is not None:
                    raise _Aborted
                self.cond.wait()

    def trigger(self, event: int) -> None:
        """Count one trigger of ``event`` and wake the waiters."""
        with self.cond:
            self.counts[event] += 1
            self.cond.notify_all()

    def trigger_timed(self, event: int, read_clock: Callable[[], int]) -> int:
        """``trigger``, returning a clock read before any waiter can see the trigger, so a
        wait never ends before the trigger record that released it."""
        with self.cond:
            self.counts[event] += 1
            self.cond.notify_all()
            return read_clock()

    def fail(self, error: BaseException) -> None:
        """Record the launch's first error and wake every waiter so that none hangs."""
        with self.cond:
            if self.error is None:
                self.error = error
            self.cond.notify_all()


class _SlotWriter:
    """Appends records to one worker's slot, counting what a full slot drops."""

    __slots__ = ("block", "capacity", "counts", "dropped", "drops", "records", "written")

    def __init__(self, region: np.ndarray, block: int, capacity: int) -> None:
        self.records = region["records"][block]
        self.counts = region["header"]["record_count"]
        self.drops = region["header"]["dropped_count"]
        self.block = block
        self.capacity = capacity
        self.written = 0
        self.dropped = 0

    def write(self, start: int, end: int, desc: int, task: int, index: int, owner: int) -> None:
        """Write one record then bump ``record_count``; in a full slot bump ``dropped_count``."""
        written = self.written
        if written < self.capacity:
            self.records[written] = (start, end, desc, task, index, owner)
            self.written = written + 1
            self.counts[self.block] = written + 1
        else:
            self.dropped += 1
            self.drops[self.block] = self.dropped


def _run_fast(queue: list[WorkerTask], events: _Events) -> None:
    """A worker's queue without profiling: no clock, no buffer."""
    for run, arg0, arg1, wait_event, wait_count, trigger_event, *_ in queue:
        if wait_event >= 0:
            events.wait(wait_event, wait_count)
        run(arg0, arg1)
        if trigger_event >= 0:
            events.trigger(trigger_event)


def _reader(skew_ns: int, scale: float) -> Callable[[], int]:
    """A core's counter: ``clock`` itself (a core whose clock is right), else a clock
    ``skew_ns`` ahead of it that runs ``scale`` times as fast, read as
    ``round((clock() + skew_ns) * scale)`` (an exact integer sum where ``scale`` is 1)."""
    read = clock
    if scale == 1.0:
        if not skew_ns:
            return read
        return lambda: read() + skew_ns
    return lambda: round((read() + skew_ns) * scale)


def _run_profiled(
    queue: list[WorkerTask],
    events: _Events,
    region: np.ndarray,
    core_type: CoreType,
    block: int,
    read: Callable[[], int],
) -> None:
    """A worker's queue with its slot header and wait / compute / trigger records, its
    cycles read from ``read`` (picked once per worker and launch by ``_reader``)."""
    capacity = region["records"].shape[1]
    region["header"][block] = (read(), 0, 0, core_type, block, capacity, 0)
    write = _SlotWriter(region, block, capacity).write
    for run, arg0, arg1, wait_event, wait_count, trigger_event, task, desc, index, owner in queue:
        if wait_event >= 0:
            start = read()
            events.wait(wait_event, wait_count)
            write(start, read(), DESC_WAIT_DEPENDENCY, task, index, owner)
        start = read()
        run(arg0, arg1)
        write(start, read(), desc, task, index, owner)
        if trigger_event >= 0:
            start = read()
            end = events.trigger_timed(trigger_event, read)
            write(start, end, DESC_TRIGGER_EVENT, task, index, owner)


def _guarded(
    events: _Events, together: threading.Barrier, loop: Callable[..., None], *args: object
) -> None:
    """Run a worker loop once every worker of the launch has a thread of its own (a thread
    done with one worker would otherwise take the next from the queue, one core after the
    other); on an error, abort the launch instead of leaving others waiting."""
    try:
        together.wait()
        loop(*args)
    except (_Aborted, threading.BrokenBarrierError):
        pass
    except BaseException as error:
        events.fail(error)


class _WorkerPool:
    """Persistent threads for launches of one worker count; one launch at a time."""

    def __init__(self, workers: int, name: str) -> None:
        self.executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=name)
        self.lock = threading.Lock()
        self.users = 0
        started = threading.Barrier(workers)
        for _ in range(workers):
            self.executor.submit(started.wait)

    def launch(self, jobs: list[tuple[object, ...]], events: _Events) -> None:
        """Run every worker of a launch at once; re-raise the first error of any of them."""
        with self.lock:
            together = threading.Barrier(len(jobs))
            futures = [self.executor.submit(_guarded, events, together, *job) for job in jobs]
            try:
                concurrent.futures.wait(futures)
            except BaseException as interrupted:
                events.fail(interrupted)
                together.abort()
                concurrent.futures.wait(futures)
                raise
        if events.error is not None:
            raise events.error


_pools: dict[tuple[int, int], _WorkerPool] = {}
_pools_lock = threading.Lock()


def _acquire_pool(aic_workers: int, aiv_workers: int) -> _WorkerPool:
    """The pool for these worker counts, made on first use; each acquire needs a release."""
    key = (aic_workers, aiv_workers)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _WorkerPool(aic_workers + aiv_workers, f"mcprof-moe-{aic_workers}x{aiv_workers}")
            _pools[key] = pool
        pool.users += 1
        return pool


def _release_pool(aic_workers: int, aiv_workers: int) -> None:
    """Drop one use of a pool; the last one shuts its threads down."""
    with _pools_lock:
        pool = _pools[aic_workers, aiv_workers]
        pool.users -= 1
        if pool.users == 0:
            del _pools[aic_workers, aiv_workers]
            pool.executor.shutdown(wait=False)


@contextlib.contextmanager
def _borrowed_pool(aic_workers: int, aiv_workers: int) -> Iterator[_WorkerPool]:
    pool = _acquire_pool(aic_workers, aiv_workers)
    try:
        yield pool
    finally:
        _release_pool(aic_workers, aiv_workers)


class _MoeLaunch:
    """One launch's data: the prologue's routing (rows sorted by expert, each tile's row
    range) and the per-launch buffers, with one compute method per task kind.

    The config carries no token tile size, so Combine task i covers the tokens from
    i * s to (i + 1) * s with s = ceil(T / Combine tasks): the kernel's ``token_tile``
    when it divides T, else a smaller, even split (still every token exactly once)."""

    def __init__(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        *,
        tiles_per_expert: int,
        token_tiles: int,
    ) -> None:
        tokens, top_k = topk_ids.shape
        experts = w1.shape[0]
        flat = topk_ids.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= experts):
            raise ConfigError(
                f"topk_ids must be expert ids of 0..{experts - 1}, got "
                f"{int(flat.min())}..{int(flat.max())}"
            )
        order = torch.argsort(flat, stable=True)
        self.token = order // top_k
        self.inverse = torch.empty_like(order)
        self.inverse[order] = torch.arange(len(order))
        counts = torch.bincount(flat, minlength=experts).numpy()
        offsets = np.cumsum(counts) - counts
        size = -(-counts // tiles_per_expert)
        edges = np.minimum(np.arange(tiles_per_expert + 1) * size[:, None], counts[:, None])
        self.bounds = (offsets[:, None] + edges).tolist()
        """Rows of tile j of expert e: ``bounds[e][j]`` to ``bounds[e][j + 1]``."""

        rows, hidden = len(order), x.shape[1]
        self.intermediate = w1.shape[2] // 2
        self.x, self.w1, self.w2 = x, w1, w2
        self.weights = topk_weights.to(x.dtype)
        self.top_k = top_k
        self.tokens = tokens
        self.token_tile = -(-tokens // token_tiles)
        self.gathered = x.new_empty(rows, hidden)
        self.hidden = x.new_empty(rows, w1.shape[2])
        self.activated = x.new_empty(rows, self.intermediate)
        self.expert_out = x.new_empty(rows, w2.shape[2])
        self.out = x.new_empty(tokens, w2.shape[2])

    def dispatch(self, expert: int, tile: int) -> None:
        """Gather the rows of x routed to the tile into the expert-major buffer."""
        start, end = self.bounds[expert][tile : tile + 2]
        torch.index_select(self.x, 0, self.token[start:end], out=self.gathered[start:end])

    def gmm1(self, expert: int, tile: int) -> None:
        """h = rows @ w1[e] (gate and up halves)."""
        start, end = self.bounds[expert][tile : tile + 2]
        torch.mm(self.gathered[start:end], self.w1[expert], out=self.hidden[start:end])

    def swiglu(self, expert: int, tile: int) -> None:
        """a = silu(gate) * up."""
        start, end = self.bounds[expert][tile : tile + 2]
        hidden = self.hidden[start:end]
        gate, up = hidden[:, : self.intermediate], hidden[:, self.intermediate :]
        torch.mul(F.silu(gate), up, out=self.activated[start:end])

    def gmm2(self, expert: int, tile: int) -> None:
        """y = a @ w2[e]."""
        start, end = self.bounds[expert][tile : tile + 2]
        torch.mm(self.activated[start:end], self.w2[expert], out=self.expert_out[start:end])

    def combine(self, tile: int, _unused: int) -> None:
        """out[t] = sum over k of weight[t, k] * y[row of (t, k)]: a gather, race-free."""
        first = tile * self.token_tile
        last = min(first + self.token_tile, self.tokens)
        if last <= first:
            return
        rows = self.expert_out[self.inverse[first * self.top_k : last * self.top_k]]
        rows = rows.view(last - first, self.top_k, -1)
        torch.sum(rows * self.weights[first:last, :, None], dim=1, out=self.out[first:last])

    def queues(
        self, tasks: np.ndarray, workers: dict[CoreType, int], extra_ns: Mapping[int, int]
    ) -> list[list[WorkerTask]]:
        """Each worker's tasks in task order: AIC workers first, then AIV. A task whose
        compute desc id has an entry in ``extra_ns`` computes that many ns longer."""
        handlers = {
            (DISPATCH, 0): self.dispatch,
            (GEMM, GMM1_TILING): self.gmm1,
            (SWIGLU, 0): self.swiglu,
            (GEMM, GMM2_TILING): self.gmm2,
            (COMBINE, 0): self.combine,
        }
        task_type = tasks["task_type"]
        kind = np.where(task_type == GEMM, tasks["tiling_position"], 0)
        desc = compute_desc_ids(tasks)
        columns = zip(
            task_type.tolist(),
            kind.tolist(),
            tasks["args"][:, 0].tolist(),
            tasks["args"][:, 1].tolist(),
            tasks["wait_event"].tolist(),
            tasks["wait_count"].tolist(),
            tasks["trigger_event"].tolist(),
            tasks["task_id"].tolist(),
            desc.tolist(),
            tasks["profile_task_index"].tolist(),
            tasks["profile_owner_id"].tolist(),
            strict=True,
        )
        described: list[WorkerTask] = []
        for task_type_, kind_, *fields in columns:
            run = handlers.get((task_type_, kind_))
            if run is None:
                raise ConfigError(
                    f"task {fields[5]}: the reference MoE kernel has no task of type "
                    f"{task_type_} at tiling position {kind_}"
                )
            extra = extra_ns.get(fields[6], 0)
            described.append((_padded(run, extra) if extra else run, *fields))
        queues = []
        for core_type in (CoreType.AIC, CoreType.AIV):
            mine = tasks["core_type"] == core_type
            for worker in range(workers[core_type]):
                picked = np.flatnonzero(mine & (tasks["worker"] == worker))
                queues.append([described[i] for i in picked])
        return queues


def _extra_by_desc(extra_compute_ns: torch.Tensor | None) -> dict[int, int]:
    """The op's ``extra_compute_ns`` rows (desc id, ns) as a mapping."""
    if extra_compute_ns is None:
        return {}
    if (
        extra_compute_ns.dtype != torch.int64
        or extra_compute_ns.device.type != "cpu"
        or extra_compute_ns.dim() != 2
        or extra_compute_ns.shape[1] != 2
    ):
        raise ConfigError(
            "extra_compute_ns must be an int64 CPU tensor of (desc id, ns) rows, got "
            f"{extra_compute_ns.dtype} of shape {tuple(extra_compute_ns.shape)}"
        )
    return dict(extra_compute_ns.tolist())


def _skew_by_core(clock_skew: torch.Tensor | None) -> dict[tuple[int, int], int]:
    """The op's ``clock_skew`` rows (core type, block, ns) as a mapping."""
    if clock_skew is None:
        return {}
    if (
        clock_skew.dtype != torch.int64
        or clock_skew.device.type != "cpu"
        or clock_skew.dim() != 2
        or clock_skew.shape[1] != 3
    ):
        raise ConfigError(
            "clock_skew must be an int64 CPU tensor of (core type, block, ns) rows, got "
            f"{clock_skew.dtype} of shape {tuple(clock_skew.shape)}"
        )
    return {(core_type, block): ns for core_type, block, ns in clock_skew.tolist()}


def _check_clock_scale(clock_scale: object) -> float:
    """``clock_scale`` as a float: a finite number > 0 (``ConfigError`` otherwise)."""
    if (
        isinstance(clock_scale, bool)
        or not isinstance(clock_scale, int | float | np.integer | np.floating)
        or not math.isfinite(clock_scale)
        or clock_scale <= 0
    ):
        raise ConfigError(f"clock_scale must be a finite number > 0, got {clock_scale!r}")
    return float(clock_scale)


def _is_worker(key: object, workers: Mapping[CoreType, int]) -> bool:
    """Whether ``key`` is a (core type, block) of one of ``workers``."""
    if not isinstance(key, tuple) or len(key) != 2:
        return False
    core_type, block = key
    return (
        not isinstance(core_type, bool)
        and core_type in (CoreType.AIC, CoreType.AIV)
        and isinstance(block, int | np.integer)
        and not isinstance(block, bool)
        and 0 <= block < workers[CoreType(core_type)]
    )


def _check_workers(cores: Iterable[object], workers: Mapping[CoreType, int]) -> None:
    """Raise ``ConfigError`` for the first of ``cores`` that is no (core type, block) of
    ``workers``, naming the workers there are."""
    for key in cores:
        if not _is_worker(key, workers):
            names = ", ".join(
                f"{c.name} ({int(c)}) blocks 0..{workers[c] - 1}" for c in workers if workers[c]
            )
            raise ConfigError(
                f"clock_skew_ns names core {key!r}, which is no worker of the kernel; its "
                f"workers are {names}"
            )


def _parse_config(config: torch.Tensor) -> tuple[np.void, np.ndarray]:
    """The config header and task descriptors, read from the config's bytes."""
    if config.dtype != torch.uint8 or config.device.type != "cpu" or config.dim() != 1:
        raise ConfigError("config must be the RuntimeConfig bytes: a 1-D uint8 CPU tensor")
    return parse_config(config.contiguous().numpy())


@torch.library.custom_op("mcprof::reference_mega_moe", mutates_args=("profile_buffer",))
def reference_mega_moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    config: torch.Tensor,
    profile_buffer: torch.Tensor,
    extra_compute_ns: torch.Tensor | None = None,
    clock_skew: torch.Tensor | None = None,
    clock_scale: float = 1.0,
) -> torch.Tensor:
    """One launch of the reference MoE MegaKernel: out [T, H].

    ``config`` is the RuntimeConfig's bytes; ``profile_buffer`` is written only when the
    config's ``profile_enabled`` is set, and must then be a zeroed buffer of its layout.
    ``extra_compute_ns``, int64 rows (desc id, ns), makes the compute of every task whose
    compute record carries that desc id ns longer (a busy time, not work).
    ``clock_skew``, int64 rows (core type, block, ns), and ``clock_scale`` give the
    profiled loop's cores a clock that is off: each core's counter reads
    ``round((clock() + ns) * clock_scale)`` (ns 0 for a core without a row).
    """
    header, tasks = _parse_config(config)
    workers = {CoreType.AIC: int(header["aic_workers"]), CoreType.AIV: int(header["aiv_workers"])}
    dispatch = tasks["task_type"] == DISPATCH
    launch = _MoeLaunch(
        x,
        topk_ids,
        topk_weights,
        w1,
        w2,
        tiles_per_expert=int(tasks["args"][dispatch, 1].max(initial=0)) + 1,
        token_tiles=int(np.count_nonzero(tasks["task_type"] == COMBINE)),
    )
    queues = launch.queues(tasks, workers, _extra_by_desc(extra_compute_ns))
    events = _Events(int(header["event_count"]))
    blocks = [(c, w) for c in (CoreType.AIC, CoreType.AIV) for w in range(workers[c])]
    if header["profile_enabled"]:
        layout = header_layout(header)
        if (
            profile_buffer.dtype != torch.uint8
            or profile_buffer.numel() != layout.total_bytes
            or not profile_buffer.is_contiguous()
        ):
            raise ConfigError(
                f"profiling is on but the profile buffer holds {profile_buffer.numel()} "
                f"{profile_buffer.dtype} elements; its layout needs {layout.total_bytes} "
                "contiguous bytes"
            )
        buffer = profile_buffer.numpy()
        regions = {c: layout.region(buffer, c) for c in (CoreType.AIC, CoreType.AIV)}
        skews = _skew_by_core(clock_skew)
        _check_workers(skews, workers)
        scale = _check_clock_scale(clock_scale)
        jobs = [
            (_run_profiled, queue, events, regions[c], c, w, _reader(skews.get((c, w), 0), scale))
            for queue, (c, w) in zip(queues, blocks, strict=True)
        ]
    else:
        jobs = [(_run_fast, queue, events) for queue in queues]
    with _borrowed_pool(workers[CoreType.AIC], workers[CoreType.AIV]) as pool:
        pool.launch(jobs, events)
    return launch.out


@reference_mega_moe.register_fake
def _reference_mega_moe_fake(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    config: torch.Tensor,
    profile_buffer: torch.Tensor,
    extra_compute_ns: torch.Tensor | None = None,
    clock_skew: torch.Tensor | None = None,
    clock_scale: float = 1.0,
) -> torch.Tensor:
    """The op's output for tracing: a tensor like ``x``."""
    return torch.empty_like(x)


def _extra_compute_rows(
    spec: ProfileSpec | None, extra_compute_ns: Mapping[str, int]
) -> torch.Tensor | None:
    """The op's (desc id, ns) rows for extra busy times keyed by stage name; None for none."""
    stages = {stage.name: stage.desc_id for stage in spec.stages} if spec is not None else {}
    rows = []
    for name, ns in extra_compute_ns.items():
        if name not in stages:
            raise ConfigError(
                f"extra_compute_ns names stage {name!r}, which the kernel's spec does not "
                f"have; its stages are {sorted(stages) or 'none'}"
            )
        if isinstance(ns, bool) or not isinstance(ns, int | np.integer) or ns < 0:
            raise ConfigError(
                f"extra_compute_ns[{name!r}] must be a whole number of ns >= 0, got {ns!r}"
            )
        if ns:
            rows.append((stages[name], ns))
    return torch.tensor(rows, dtype=torch.int64) if rows else None


def _clock_skew_rows(
    clock_skew_ns: Mapping[tuple[CoreType | int, int], int], workers: Mapping[CoreType, int]
) -> torch.Tensor | None:
    """The op's (core type, block, ns) rows for cores whose clock is skewed; None for none."""
    _check_workers(clock_skew_ns, workers)
    rows = []
    for (core_type, block), ns in clock_skew_ns.items():
        if isinstance(ns, bool) or not isinstance(ns, int | np.integer):
            raise ConfigError(
                f"clock_skew_ns[{(core_type, block)!r}] must be a whole number of ns, got {ns!r}"
            )
        if ns:
            rows.append((int(core_type), int(block), int(ns)))
    return torch.tensor(rows, dtype=torch.int64) if rows else None


class _Default(enum.Enum):
    SPEC = "the reference kernel's spec for its expert offset"


class ReferenceMoeKernel:
    """A MoE layer forward (top-k routing, SwiGLU experts) as a CPU MegaKernel.

    Holds the expert weights, one RuntimeConfig per token count and, while open, a
    persistent worker pool. ``spec`` defaults to ``moe_spec(expert_offset)``; ``None``
    binds no spec (fallback names).

    ``extra_compute_ns`` maps stage names of the spec to a busy time in ns that every
    task of that stage adds to its compute, profiled or not (``{"GMM1": 200_000}``: each
    GMM1 compute record holds 200 us of busy time after the work, overshooting by a
    median 0.4 us on 2 busy cores): a known slowdown to check the what-if replay against.

    ``generation`` is the ABI generation of its profile buffers (``build_runtime_config``).

    ``clock_skew_ns`` maps workers, ``(core type, block)`` (``CoreType`` or 1 / 2), to a
    whole number of ns (maybe negative) by which the core's clock is ahead, and
    ``clock_scale`` (finite, > 0) is how many times the nominal 1 GHz every core's clock
    runs at: in profiled launches a core's counter reads ``round((t + skew_ns) *
    clock_scale)`` where t is ``clock()`` (with the stored 1 GHz, the store sees the core
    shifted by skew_ns * clock_scale cycles). Every cycle the core records takes it: its
    entry cycle and its records' starts and ends. A known clock error, to check the clock
    sanity analyses against; with neither, the cores read ``clock`` as they are.
    """

    def __init__(
        self,
        w1: torch.Tensor,
        w2: torch.Tensor,
        *,
        tiles_per_expert: int = 2,
        token_tile: int = 32,
        aic_workers: int = 2,
        aiv_workers: int = 2,
        aic_slots: int | None = None,
        aiv_slots: int | None = None,
        expert_offset: int = 0,
        spec: ProfileSpec | _Default | None = _Default.SPEC,
        backend: Backend | None = None,
        aic_capacity: int | None = None,
        aiv_capacity: int | None = None,
        extra_compute_ns: Mapping[str, int] | None = None,
        generation: Generation = "a",
        clock_skew_ns: Mapping[tuple[CoreType | int, int], int] | None = None,
        clock_scale: float = 1.0,
    ) -> None:
        if w1.dim() != 3 or w2.dim() != 3 or w1.shape[0] != w2.shape[0] or w1.shape[2] % 2:
            raise ConfigError(
                "w1 must be [E, H, 2*I] and w2 [E, I, H] with the same E, got "
                f"{tuple(w1.shape)} and {tuple(w2.shape)}"
            )
        for name, value in (
            ("tiles_per_expert", tiles_per_expert),
            ("token_tile", token_tile),
            ("aic_workers", aic_workers),
            ("aiv_workers", aiv_workers),
        ):
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}")
        self.w1 = w1
        self.w2 = w2
        self.backend: Backend = CpuBackend() if backend is None else backend
        self.spec = moe_spec(expert_offset) if spec is _Default.SPEC else spec
        self._extra_compute = _extra_compute_rows(self.spec, extra_compute_ns or {})
        self._clock_skew = _clock_skew_rows(
            clock_skew_ns or {}, {CoreType.AIC: aic_workers, CoreType.AIV: aiv_workers}
        )
        self._clock_scale = _check_clock_scale(clock_scale)
        self.tiles_per_expert = tiles_per_expert
        self.token_tile = token_tile
        self._options = {
            "aic_workers": aic_workers,
            "aiv_workers": aiv_workers,
            "aic_slots": aic_slots,
            "aiv_slots": aiv_slots,
            "aic_capacity": aic_capacity,
            "aiv_capacity": aiv_capacity,
            "generation": generation,
        }
        self._configs: dict[int, RuntimeConfig] = {}
        _acquire_pool(aic_workers, aiv_workers)
        self._release = weakref.finalize(self, _release_pool, aic_workers, aiv_workers)

    def config_for(self, tokens: int) -> RuntimeConfig:
        """The RuntimeConfig of a launch over ``tokens`` tokens (built once per count)."""
        config = self._configs.get(tokens)
        if config is None:
            graph = build_moe_graph(
                self.w1.shape[0], self.tiles_per_expert, max(1, math.ceil(tokens / self.token_tile))
            )
            config = build_runtime_config(
                graph.tasks,
                event_count=graph.event_count,
                backend=self.backend,
                spec=self.spec,
                **self._options,
            )
            config = self._configs.setdefault(tokens, config)
        return config

    def __call__(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        *,
        direction: str = "forward",
    ) -> torch.Tensor:
        """The layer's output [T, H]; profiled when a recording capture session is open."""
        if not self._release.alive:
            raise ConfigError("this ReferenceMoeKernel is closed; make a new one")
        call = prepare_call(self.config_for(len(x)), direction=direction)
        with call:
            return torch.ops.mcprof.reference_mega_moe(
                x,
                topk_ids,
                topk_weights,
                self.w1,
                self.w2,
                call.config.tensor,
                call.buffer,
                self._extra_compute,
                self._clock_skew,
                self._clock_scale,
            )

    def close(self) -> None:
        """Shut the worker pool down (when no other open kernel shares it)."""
        self._release()

    def __enter__(self) -> ReferenceMoeKernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def route(
    x: torch.Tensor, router_weight: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: softmax over ``x @ router_weight`` ([H, E]), the k best experts, their
    weights renormalized to sum to 1. Returns (topk_ids int64, topk_weights)."""
    probs = torch.softmax(x @ router_weight, dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    return ids, weights / weights.sum(dim=-1, keepdim=True)


def moe_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
) -> torch.Tensor:
    """The MoE layer in plain torch, one expert at a time: the kernel's numerical oracle."""
    out = torch.zeros(x.shape[0], w2.shape[2], dtype=x.dtype)
    intermediate = w1.shape[2] // 2
    for expert in range(w1.shape[0]):
        token, slot = torch.nonzero(topk_ids == expert, as_tuple=True)
        hidden = x[token] @ w1[expert]
        activated = F.silu(hidden[:, :intermediate]) * hidden[:, intermediate:]
        weight = topk_weights[token, slot].to(x.dtype)[:, None]
        out.index_add_(0, token, (activated @ w2[expert]) * weight)
    return out


def make_moe_weights(
    experts: int, hidden: int, intermediate: int, *, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random (router_weight [H, E], w1 [E, H, 2*I], w2 [E, I, H]), scaled to keep
    activations of order one."""
    router = torch.randn(hidden, experts, generator=generator) / math.sqrt(hidden)
    w1 = torch.randn(experts, hidden, 2 * intermediate, generator=generator) / math.sqrt(hidden)
    w2 = torch.randn(experts, intermediate, hidden, generator=generator) / math.sqrt(intermediate)
    return router, w1, w2
