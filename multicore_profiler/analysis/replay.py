"""What-if replay of MegaKernel invocations over their task DAG, and the DAG's static bound.

Input: a pyarrow Table with one row per record and its releasing trigger (the columns of
``COLUMNS``): the invocation key ``run_id, rank, invocation_id, write_id``; the core
``core_type`` (1 = AIC, 2 = AIV) and ``block_id``, whose records run in ``record_index``
order; ``phase`` ('compute', 'wait', 'trigger', 'terminate'), ``stage``, ``owner_id``,
``task_id``; ``start_cycle`` and ``end_cycle`` (one chip-wide counter per invocation);
``frequency_hz`` and ``anchor_cycle``; ``wait_event`` and ``wait_count`` (NULL unless a
wait whose task has a graph) and ``trigger_event`` (NULL unless a trigger with a graph):
the columns of the ``replay_records`` view. The replay finds the trigger that released
each wait in the observation itself, by the rule of ``task_edges`` (the ``wait_count``-th
trigger record of the wait's event, ordered by end, start, task id).

Replay, per invocation (``prepare`` builds the DAG once; every call reuses it):

- every core keeps its record order. Its first record starts where it started; every
  other record starts at the replayed end of the core's previous record plus the observed
  gap (start - previous end, negative where records overlap);
- compute records take their changed duration: ``max(0, round(dur * scale +
  shift_cycles))`` per change, the changes applied in order (``round`` is half to even);
  trigger and terminate records keep their durations;
- a wait with a graph (a ``wait_event`` >= 0, a ``wait_count`` >= 1 and at least that
  many trigger records of the event in the invocation) is released at R', the
  ``wait_count``-th smallest replayed end among its event's trigger records. From the
  observation, with t its observed releasing trigger: where ``end_t >= start_w`` it
  waited, its release latency is ``L = end_w - end_t`` and its own time ``s = 0``; else
  it was released before it began: ``s = end_w - start_w`` and ``L = min(end_w - end_t,
  the lower median L of the invocation's waits that waited, 0 if none)``. Its replayed
  end is ``max(start' + s, R' + L)``;
- any other wait keeps its duration;
- the makespan is ``ns(max end') - ns(min start')`` over the invocation's records, where
  ``ns(c) = round((c - anchor_cycle) * (1e9 / frequency_hz))`` (half away from zero, as
  the SQL views round), so every ns figure equals the views' to the ns.

With unchanged durations the replay reproduces every end exactly, by construction; the
fidelity error ``|replayed - observed| / observed`` is still computed per invocation, and
an invocation whose error exceeds ``FIDELITY_LIMIT`` gets no prediction.

Assumptions and limits: each core runs its records in the observed order (no
rescheduling of a worker's queue), nothing models contention (a faster record does not
slow or speed its neighbours), latencies and gaps are those observed. A wait depends on
every trigger record of its event, so a wait whose event is also triggered downstream of
it (by a later record of its own core, or of a core it releases) is a dependency cycle:
``prepare`` refuses it with an ``AnalysisError`` naming the invocation. Every figure stays
an int64: changes whose durations, replayed ends (cycles) or makespan (ns) would pass
2^63-1 are refused with an ``ArgumentError`` naming them and the invocation.

Static bound: the same DAG with the observed release edges (each wait after the trigger
that released it), every gap, latency and wait time 0 and every core starting at the
invocation's first start: the longest path through the records with their recorded
durations and each core's order kept. ``slack = makespan - static bound``.

Everything runs on numpy arrays, without a Python loop per record: the records are split
into segments (a core's first record, or a wait with a graph, and the records after it up
to the next one), whose ends follow from the segment's head by a cumulative sum; the heads
are propagated level by level of a topological order that ``prepare`` computes once, for
all scenarios (sets of changed durations) together, as a records x scenarios matrix.
Invocations are independent DAGs, so ``prepare`` packs whole invocations into chunks of
about ``_CHUNK_RECORDS`` records that are propagated together, level by level.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.analysis.changes import Change, ComputeRecords
from multicore_profiler.errors import AnalysisError, ArgumentError

KEY_COLUMNS = ("run_id", "rank", "invocation_id", "write_id")
"""The columns that name an invocation, leading every table this module returns."""

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("invocation_id", pa.int64()),
        ("write_id", pa.int64()),
        ("core_type", pa.uint8()),
        ("block_id", pa.uint32()),
        ("record_index", pa.uint32()),
        ("phase", pa.string()),
        ("stage", pa.string()),
        ("owner_id", pa.uint32()),
        ("task_id", pa.uint32()),
        ("start_cycle", pa.int64()),
        ("end_cycle", pa.int64()),
        ("frequency_hz", pa.float64()),
        ("anchor_cycle", pa.int64()),
        ("wait_event", pa.int32()),
        ("wait_count", pa.uint32()),
        ("trigger_event", pa.int32()),
    ]
)
"""The columns ``prepare`` takes, one row per record (others are ignored)."""

COLUMNS = tuple(SCHEMA.names)

_NULLABLE = frozenset(
    (
        "stage",
        "wait_event",
        "wait_count",
        "trigger_event",
    )
)

FIDELITY_LIMIT = 0.05
"""The largest fidelity error at which an invocation's replay still predicts."""

PHASES = ("compute", "wait", "trigger", "terminate")
_COMPUTE, _WAIT, _TRIGGER = 0, 1, 2

_CHUNK_RECORDS = 1 << 17
"""Invocations are replayed in chunks of about this many records (an invocation whole)."""

_CELLS = 1 << 22
"""At most this many records x scenarios are propagated at once (memory: 32 MiB a matrix)."""

_NO_RELEASE = -(1 << 62)
"""The latency of a segment head that no trigger releases: never the larger term."""

_INT64_END = 2.0**63
"""The first float past int64: a float ``x`` converts to int64 exactly where
``-_INT64_END <= x < _INT64_END`` (the largest float below is 2^63 - 1024)."""


def _sum_wrapped(a: np.ndarray, b: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Where ``total``, computed as ``a + b`` in int64 (which wraps), passed int64: exact."""
    return np.where(b >= 0, total < a, total > a)


def _difference_wrapped(a: np.ndarray, b: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Where ``total``, computed as ``a - b`` in int64 (which wraps), passed int64: exact."""
    return np.where(b >= 0, total > a, total < a)


def _ns(
    cycles: np.ndarray, anchor: np.ndarray, frequency: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Cycles as integer ns from the anchor, rounded half away from zero (DuckDB's round),
    and where that leaves int64 (the ns there are 0): exact, the float ns compared with
    2^63, which converts exactly."""
    since = cycles - anchor
    x = since.astype(np.float64) * (1e9 / frequency)
    outside = _difference_wrapped(cycles, anchor, since) | ~((x >= -_INT64_END) & (x < _INT64_END))
    x[outside] = 0.0
    whole = np.trunc(x)
    ns = (whole + np.where(np.abs(x - whole) >= 0.5, np.sign(x), 0.0)).astype(np.int64)
    return ns, outside


def _span_ns(
    first: np.ndarray, last: np.ndarray, anchor: np.ndarray, frequency: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``ns(last) - ns(first)``, and where it (or either time) leaves int64."""
    start, start_outside = _ns(first, anchor, frequency)
    end, end_outside = _ns(last, anchor, frequency)
    span = end - start
    return span, start_outside | end_outside | _difference_wrapped(end, start, span)


def _ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(start, stop)`` for each pair, without a Python loop."""
    counts = stops - starts
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - (np.cumsum(counts) - counts), counts)
    return np.arange(total, dtype=np.int64) + shift


@dataclass(frozen=True)
class _Topology:
    """A topological schedule of one chunk's segments under one choice of release groups.

    A group is a set of trigger records (its candidates); a segment head that is a wait
    with a graph is released by the k-th smallest end among its group's candidates. Level
    by level: the heads of ``seg_order[seg_bounds[l]:seg_bounds[l + 1]]``, then the
    candidate slots ``cand_bounds[l]:cand_bounds[l + 1]`` (whole groups, sorted within a
    group where ``sorts[l]``). ``head_slot`` is the slot of each head's k-th candidate
    (the padding slot for heads no group releases).
    """

    seg_order: np.ndarray
    seg_bounds: np.ndarray
    slot_rec: np.ndarray
    slot_seg: np.ndarray
    slot_group: np.ndarray
    cand_bounds: np.ndarray
    sorts: np.ndarray
    head_slot: np.ndarray
    unresolved: np.ndarray
    """Segments on or after a dependency cycle (empty for a DAG)."""

    @classmethod
    def build(
        cls,
        head_first: np.ndarray,
        head_group: np.ndarray,
        head_k: np.ndarray,
        cand_rec: np.ndarray,
        cand_seg: np.ndarray,
        group_size: np.ndarray,
    ) -> _Topology:
        """Kahn's algorithm over segments, a whole frontier per step (candidates sorted by
        group, groups numbered 0..G-1)."""
        n_seg, n_group = len(head_first), len(group_size)
        group_start = np.cumsum(group_size) - group_size
        cand_group = np.repeat(np.arange(n_group), group_size)
        has_group = head_group >= 0
        indeg = (~head_first).astype(np.int64) + has_group
        remaining = group_size.astype(np.int64)
        by_seg = np.argsort(cand_seg, kind="stable")
        seg_ptr = np.searchsorted(cand_seg[by_seg], np.arange(n_seg + 1))
        seg_groups = cand_group[by_seg]
        waiting = np.flatnonzero(has_group)
        waiting = waiting[np.argsort(head_group[waiting], kind="stable")]
        group_ptr = np.searchsorted(head_group[waiting], np.arange(n_group + 1))
        seg_level = np.full(n_seg, -1, dtype=np.int64)
        group_level = np.full(n_group, -1, dtype=np.int64)
        frontier = np.flatnonzero(indeg == 0)
        level = 0
        while frontier.size:
            seg_level[frontier] = level
            after = frontier + 1
            after = after[after < n_seg]
            touched = [after[~head_first[after]]]
            members = seg_groups[_ranges(seg_ptr[frontier], seg_ptr[frontier + 1])]
            if members.size:
                groups, counts = np.unique(members, return_counts=True)
                remaining[groups] -= counts
                done = groups[remaining[groups] == 0]
                group_level[done] = level
                touched.append(waiting[_ranges(group_ptr[done], group_ptr[done + 1])])
            touched_all = np.concatenate(touched)
            np.subtract.at(indeg, touched_all, 1)
            frontier = np.unique(touched_all[indeg[touched_all] == 0])
            level += 1
        levels = np.arange(level + 1)
        seg_order = np.argsort(seg_level, kind="stable")
        group_order = np.argsort(group_level, kind="stable")
        sizes = group_size[group_order]
        first_slot = np.empty(n_group, dtype=np.int64)
        first_slot[group_order] = np.cumsum(sizes) - sizes
        slots = _ranges(group_start[group_order], group_start[group_order] + sizes)
        slot_group = cand_group[slots]
        multi = group_level[group_size > 1]
        head_slot = np.full(n_seg, len(slots), dtype=np.int64)
        head_slot[has_group] = first_slot[head_group[has_group]] + head_k[has_group] - 1
        # Unresolved segments and groups (level -1) sort first and lie outside every level.
        return cls(
            seg_order=seg_order,
            seg_bounds=np.searchsorted(seg_level[seg_order], levels),
            slot_rec=cand_rec[slots],
            slot_seg=cand_seg[slots],
            slot_group=slot_group,
            cand_bounds=np.searchsorted(group_level[slot_group], levels),
            sorts=np.bincount(multi[multi >= 0], minlength=level) > 0,
            head_slot=head_slot,
            unresolved=np.flatnonzero(seg_level < 0),
        )

    @property
    def levels(self) -> int:
        """How many levels the schedule has."""
        return len(self.seg_bounds) - 1


class _Chunk:
    """Whole invocations of a graph, with their records' arrays, segments and schedules."""

    def __init__(
        self,
        columns: dict[str, np.ndarray],
        inv_starts: np.ndarray,
        stage_names: tuple[str, ...],
        first_invocation: int,
    ) -> None:
        self.first_invocation = first_invocation
        """The graph's index of the chunk's first invocation."""
        self.start = start = columns["start_cycle"]
        self.end = end = columns["end_cycle"]
        self.dur = end - start
        n = len(start)
        phase = columns["phase"]
        self.inv_starts = inv_starts
        n_inv = len(inv_starts)
        inv = np.repeat(np.arange(n_inv), np.diff(np.append(inv_starts, n)))
        self.anchor = columns["anchor_cycle"][inv_starts]
        self.frequency = columns["frequency_hz"][inv_starts]
        self.first = first = columns["first"]
        self.gap = np.where(first, 0, start - np.roll(end, 1))
        self.compute_index = ci = np.flatnonzero(phase == _COMPUTE)
        self.compute = ComputeRecords(
            stage=columns["stage"][ci],
            stage_names=stage_names,
            core_type=columns["core_type"][ci],
            owner=columns["owner_id"][ci],
            task=columns["task_id"][ci],
            frequency_hz=self.frequency[inv[ci]],
        )
        self.wait_mask = phase == _WAIT

        trig, group_size = _release_groups(inv, phase, columns, start, end)
        waits, group, k, releaser, own, latency = _graphed_waits(
            inv, n_inv, self.wait_mask, columns, start, end, trig, group_size
        )

        # Segments: a core's first record or a wait with a graph heads one.
        graphed = np.zeros(n, dtype=bool)
        graphed[waits] = True
        is_head = first | graphed
        self.heads = heads = np.flatnonzero(is_head)
        self.seg = seg = np.cumsum(is_head) - 1
        self.head_first = head_first = first[heads]
        self.inv_of_seg = inv[heads]
        n_seg = len(heads)
        wseg = seg[waits]
        self.graphed_seg = wseg
        self.own = own
        self.latency = np.full(n_seg, _NO_RELEASE, dtype=np.int64)
        self.latency[wseg] = latency
        self.static_latency = np.full(n_seg, _NO_RELEASE, dtype=np.int64)
        self.static_latency[wseg] = 0
        self.t0 = np.minimum.reduceat(start, inv_starts)[inv]
        head_group = np.full(n_seg, -1, dtype=np.int64)
        head_k = np.ones(n_seg, dtype=np.int64)
        head_group[wseg] = group
        head_k[wseg] = k
        self.replay = _Topology.build(head_first, head_group, head_k, trig, seg[trig], group_size)
        releasers, which = np.unique(releaser, return_inverse=True)
        head_group[wseg] = which
        head_k[wseg] = 1
        self.static = _Topology.build(
            head_first,
            head_group,
            head_k,
            releasers,
            seg[releasers],
            np.ones(len(releasers), dtype=np.int64),
        )

    def propagate(
        self,
        topo: _Topology,
        start0: np.ndarray,
        gap: np.ndarray,
        durations: np.ndarray,
        own: np.ndarray,
        latency: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Replayed (ends, starts) of every record, one column per scenario, and which
        invocations (invocations x scenarios) passed int64 cycles.

        ``durations`` (records x scenarios) are the records' durations, ``start0`` where
        each core's first record starts, ``gap`` the gap before each other record; a
        graphed wait head ends at ``max(start' + own, R' + latency)``.

        int64 wraps. Every end and start is one addition to values before it in the DAG's
        order (start = previous end + gap, end = start + duration, a wait's two terms), so
        where no such addition wrapped (``_sum_wrapped``, exact) every value is exact. The
        cumulative sums in between may wrap: only their differences are used, and those
        are exact whatever the sums wrapped.
        """
        heads, seg = self.heads, self.seg
        n_seg, n_scen = len(heads), durations.shape[1]
        offset = durations + gap[:, None]
        offset[heads] = 0
        np.cumsum(offset, axis=0, out=offset)
        offset -= offset[heads[seg]]
        head_dur = durations[heads]
        head_dur[self.graphed_seg] = own[:, None]
        base = np.where(self.head_first, start0[heads], gap[heads])
        prev_seg = np.maximum(np.arange(n_seg) - 1, 0)
        prev_rec = np.maximum(heads - 1, 0)
        head_end = np.zeros((n_seg, n_scen), dtype=np.int64)
        released = np.zeros((len(topo.slot_rec) + 1, n_scen), dtype=np.int64)
        seg_bounds, cand_bounds = topo.seg_bounds, topo.cand_bounds
        for level in range(topo.levels):
            hs = topo.seg_order[seg_bounds[level] : seg_bounds[level + 1]]
            x = head_end[prev_seg[hs]] + offset[prev_rec[hs]]
            x[self.head_first[hs]] = 0
            x += base[hs, None] + head_dur[hs]
            np.maximum(x, released[topo.head_slot[hs]] + latency[hs, None], out=x)
            head_end[hs] = x
            c0, c1 = cand_bounds[level], cand_bounds[level + 1]
            if c1 > c0:
                values = head_end[topo.slot_seg[c0:c1]] + offset[topo.slot_rec[c0:c1]]
                if topo.sorts[level]:
                    values = _sort_within(values, topo.slot_group[c0:c1])
                released[c0:c1] = values
        ends = head_end[seg] + offset
        starts = np.empty_like(ends)
        starts[1:] = ends[:-1] + gap[1:, None]
        starts[self.first] = start0[self.first, None]
        # A graphed wait's end is the larger of its two terms, each checked; every other
        # end is its start plus its duration; every start but a core's first is the
        # previous end plus the gap.
        wrapped = _sum_wrapped(starts, durations, ends)
        graphed = heads[self.graphed_seg]
        wait_own, wait_latency = own[:, None], latency[self.graphed_seg, None]
        release = released[topo.head_slot[self.graphed_seg]]
        wrapped[graphed] = _sum_wrapped(
            starts[graphed], wait_own, starts[graphed] + wait_own
        ) | _sum_wrapped(release, wait_latency, release + wait_latency)
        later = ~self.first[1:]
        wrapped[1:][later] |= _sum_wrapped(
            ends[:-1][later], gap[1:][later][:, None], starts[1:][later]
        )
        return ends, starts, np.logical_or.reduceat(wrapped, self.inv_starts, axis=0)

    def makespans(self, ends: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each invocation's makespan in ns (invocations x scenarios), and where it leaves
        int64 ns."""
        return _span_ns(
            np.minimum.reduceat(starts, self.inv_starts, axis=0),
            np.maximum.reduceat(ends, self.inv_starts, axis=0),
            self.anchor[:, None],
            self.frequency[:, None],
        )

    def replay_durations(self, compute: Sequence[np.ndarray]) -> np.ndarray:
        """The records' durations with the compute records' of each scenario."""
        durations = np.repeat(self.dur[:, None], len(compute), axis=1)
        for column, values in enumerate(compute):
            durations[self.compute_index, column] = values
        return durations

    def replay_run(
        self, compute: Sequence[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Replayed (ends, starts) for scenarios of compute durations, and which
        invocations passed int64 cycles (``propagate``)."""
        return self.propagate(
            self.replay,
            self.start,
            self.gap,
            self.replay_durations(compute),
            self.own,
            self.latency,
        )

    def static_ends(self) -> np.ndarray:
        """Each record's end in the static bound's schedule."""
        durations = np.where(self.wait_mask, 0, self.dur)[:, None]
        ends, _, _ = self.propagate(
            self.static,
            self.t0,
            np.zeros_like(self.gap),
            durations,
            np.zeros_like(self.own),
            self.static_latency,
        )
        return ends[:, 0]


def _release_groups(
    inv: np.ndarray,
    phase: np.ndarray,
    columns: dict[str, np.ndarray],
    start: np.ndarray,
    end: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The trigger records of each (invocation, event), grouped, each group in observed
    order (end, start, task id); and the groups' sizes."""
    event = columns["trigger_event"]
    trig = np.flatnonzero((phase == _TRIGGER) & (event >= 0))
    trig = trig[
        np.lexsort((columns["task_id"][trig], start[trig], end[trig], event[trig], inv[trig]))
    ]
    key = inv[trig] * (1 << 32) + event[trig]
    group_first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if trig.size else trig
    return trig, np.diff(np.append(group_first, len(trig)))


def _graphed_waits(
    inv: np.ndarray,
    n_inv: int,
    wait_mask: np.ndarray,
    columns: dict[str, np.ndarray],
    start: np.ndarray,
    end: np.ndarray,
    trig: np.ndarray,
    group_size: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """The waits with a graph (records), their release group, count, observed releasing
    trigger (record), own time and release latency (see the module docstring)."""
    group_first = np.cumsum(group_size) - group_size
    group_key = inv[trig[group_first]] * (1 << 32) + columns["trigger_event"][trig[group_first]]
    wait_event, count = columns["wait_event"], columns["wait_count"]
    waits = np.flatnonzero(wait_mask & (wait_event >= 0) & (count >= 1))
    key = inv[waits] * (1 << 32) + wait_event[waits]
    group = np.minimum(np.searchsorted(group_key, key), max(len(group_key) - 1, 0))
    found = np.zeros(len(waits), dtype=bool)
    if group_key.size:
        found = (group_key[group] == key) & (count[waits] <= group_size[group])
    waits, group = waits[found], group[found]
    k = count[waits].astype(np.int64)
    releaser = trig[group_first[group] + k - 1]
    waited = end[releaser] >= start[waits]
    latency = end[waits] - end[releaser]
    median = np.zeros(n_inv, dtype=np.int64)
    waited_inv = inv[waits][waited]
    if waited_inv.size:
        # The lower median of each invocation's latencies of waits that waited.
        ordered = latency[waited][np.lexsort((latency[waited], waited_inv))]
        per_inv = np.bincount(waited_inv, minlength=n_inv)
        lower = np.cumsum(per_inv) - per_inv + (per_inv - 1) // 2
        median = np.where(per_inv > 0, ordered[np.minimum(lower, len(ordered) - 1)], 0)
    own = np.where(waited, 0, end[waits] - start[waits])
    latency = np.where(waited, latency, np.minimum(latency, median[inv[waits]]))
    return waits, group, k, releaser, own, latency


def _sort_within(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """``values`` (slots x scenarios) sorted within each run of equal ``group``."""
    by_value = np.argsort(values, axis=0, kind="stable")
    by_group = np.argsort(group[by_value], axis=0, kind="stable")
    return np.take_along_axis(values, np.take_along_axis(by_value, by_group, axis=0), axis=0)


class ReplayGraph:
    """The replayable DAG of every invocation of a table, built once by ``prepare``.

    ``keys`` holds one row per invocation (the key columns), in the order of every table
    this module returns; ``records`` the records' keys, cores, indexes and phases in core
    order; ``observed_makespan_ns`` the invocations' observed makespans; ``stages`` the
    stages that have compute records.
    """

    def __init__(
        self, keys: pa.Table, records: pa.Table, chunks: list[_Chunk], stages: tuple[str, ...]
    ) -> None:
        self.keys = keys
        self.records = records
        self.chunks = chunks
        self.stages = stages
        spans, outside = zip(
            *(chunk.makespans(chunk.end[:, None], chunk.start[:, None]) for chunk in chunks),
            strict=True,
        )
        self.observed_makespan_ns = np.concatenate(spans)[:, 0]
        bad = np.flatnonzero(np.concatenate(outside)[:, 0])
        if bad.size:
            raise AnalysisError(
                f"the observed makespan of {self.describe(int(bad[0]))} leaves int64 ns "
                "(past 2^63-1 ns from its anchor): it cannot be replayed"
            )

    def __len__(self) -> int:
        return self.keys.num_rows

    def describe(self, index: int) -> str:
        """'run R rank K invocation I' for the index-th invocation."""
        return _describe_key(self.keys, index)


def _describe_key(keys: pa.Table, index: int) -> str:
    """'run R rank K invocation I' for the index-th row of ``keys``."""
    row = {name: keys.column(name)[index].as_py() for name in KEY_COLUMNS}
    return f"run {row['run_id']} rank {row['rank']} invocation {row['invocation_id']}"


def prepare(table: pa.Table) -> ReplayGraph:
    """The replayable DAG of every invocation of ``table`` (one row per record, ``COLUMNS``).

    ``AnalysisError`` for a table without those columns, with no records, with an unknown
    phase or a bad frequency, or with an invocation whose dependencies form a cycle.
    """
    missing = [name for name in COLUMNS if name not in table.column_names]
    if missing:
        raise AnalysisError(f"the replay needs the record columns {', '.join(missing)}")
    if table.num_rows == 0:
        raise AnalysisError("the selection holds no records to replay")
    for name in COLUMNS:
        if name not in _NULLABLE and table.column(name).null_count:
            raise AnalysisError(f"the records' {name} column holds NULLs")
    order = [*KEY_COLUMNS, "core_type", "block_id", "record_index"]
    try:
        table = table.select(list(COLUMNS)).cast(SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise AnalysisError(f"the records do not fit the replay's columns: {error}") from error
    table = table.sort_by([(name, "ascending") for name in order])
    table = table.combine_chunks()

    def changed(name: str) -> np.ndarray:
        column = table.column(name)
        return np.r_[True, pc.not_equal(column[1:], column[:-1]).to_numpy(zero_copy_only=False)]

    new_inv = np.logical_or.reduce([changed(name) for name in KEY_COLUMNS])
    first = new_inv | changed("core_type") | changed("block_id")
    phase = pc.index_in(table.column("phase"), value_set=pa.array(PHASES))
    if phase.null_count:
        bad = table.column("phase").filter(pc.is_null(phase))[0].as_py()
        raise AnalysisError(f"a record has phase {bad!r}; the replay knows {', '.join(PHASES)}")
    stage = pc.dictionary_encode(table.column("stage")).combine_chunks()
    stage_names = tuple(stage.dictionary.to_pylist())

    def numbers(name: str, fill: int, dtype: type) -> np.ndarray:
        column = pc.fill_null(table.column(name), fill) if name in _NULLABLE else table.column(name)
        return column.to_numpy().astype(dtype)

    columns = {
        "first": first,
        "phase": phase.to_numpy(zero_copy_only=False).astype(np.int8),
        "stage": pc.fill_null(stage.indices, -1).to_numpy().astype(np.int64),
        "core_type": numbers("core_type", 0, np.int64),
        "owner_id": numbers("owner_id", 0, np.int64),
        "task_id": numbers("task_id", 0, np.int64),
        "start_cycle": numbers("start_cycle", 0, np.int64),
        "end_cycle": numbers("end_cycle", 0, np.int64),
        "frequency_hz": numbers("frequency_hz", 0, np.float64),
        "anchor_cycle": numbers("anchor_cycle", 0, np.int64),
        "wait_event": numbers("wait_event", -1, np.int64),
        "wait_count": numbers("wait_count", 0, np.int64),
        "trigger_event": numbers("trigger_event", -1, np.int64),
    }
    inv_starts = np.flatnonzero(new_inv)
    keys = table.select(list(KEY_COLUMNS)).take(pa.array(inv_starts))
    frequency = columns["frequency_hz"][inv_starts]
    bad = np.flatnonzero(~(np.isfinite(frequency) & (frequency > 0)))
    if bad.size:
        raise AnalysisError(
            f"{_describe_key(keys, int(bad[0]))} has frequency {frequency[bad[0]]} Hz; "
            "the replay needs a positive finite cycle frequency"
        )
    chunk_of = inv_starts // _CHUNK_RECORDS
    chunk_first = np.flatnonzero(np.r_[True, chunk_of[1:] != chunk_of[:-1]])
    bounds = np.append(inv_starts[chunk_first], table.num_rows)
    inv_bounds = np.append(chunk_first, len(inv_starts))
    chunks = []
    for c, (r0, r1) in enumerate(itertools.pairwise(bounds)):
        local = {name: values[r0:r1] for name, values in columns.items()}
        chunk = _Chunk(
            local,
            inv_starts[inv_bounds[c] : inv_bounds[c + 1]] - r0,
            stage_names,
            int(inv_bounds[c]),
        )
        if chunk.replay.unresolved.size:
            invs = np.unique(chunk.inv_of_seg[chunk.replay.unresolved]) + inv_bounds[c]
            named = "; ".join(_describe_key(keys, int(i)) for i in invs[:5])
            raise AnalysisError(
                f"a wait depends on a trigger downstream of itself (a dependency cycle): {named}"
            )
        chunks.append(chunk)
    compute = pc.equal(table.column("phase"), "compute")
    stages = pc.unique(table.column("stage").filter(compute).drop_null()).to_pylist()
    records = table.select([*order, "phase"])
    return ReplayGraph(keys, records, chunks, tuple(sorted(stages)))


_Masks = dict["Change", list[np.ndarray]]
"""Each change's compute records, a mask per chunk."""


def _change_masks(graph: ReplayGraph, scenarios: Sequence[Sequence[Change]]) -> _Masks:
    """Each change's compute records, per chunk; ``AnalysisError`` for one matching none."""
    masks: _Masks = {}
    for change in (change for scenario in scenarios for change in scenario):
        if change not in masks:
            masks[change] = [change.matches(chunk.compute) for chunk in graph.chunks]
            if not any(mask.any() for mask in masks[change]):
                raise AnalysisError(
                    f"the change {change.text!r} matches no compute record of the selection"
                )
    return masks


def _past_int64(
    graph: ReplayGraph, scenario: Sequence[Change], invocation: int, what: str
) -> ArgumentError:
    """The refusal of a scenario whose replay leaves int64 in ``invocation`` (of the
    graph): ``what`` passes 2^63-1."""
    texts = ", ".join(repr(change.text) for change in scenario)
    changes = f"the change{'s' if len(scenario) > 1 else ''} {texts}"
    return ArgumentError(
        f"{changes} cannot be replayed: {what} of {graph.describe(invocation)} would pass "
        "int64 (2^63-1); give a smaller factor or shift"
    )


def _changed_durations(
    graph: ReplayGraph, chunk: _Chunk, scenario: Sequence[Change], masks: _Masks, index: int
) -> np.ndarray:
    """The chunk's (the graph's ``index``-th) compute durations after the scenario's
    changes, applied in order; ``ArgumentError`` for a duration past int64 cycles, naming
    the change, the stage and the invocation."""
    durations = chunk.dur[chunk.compute_index]
    for change in scenario:
        mask = masks[change][index]
        with np.errstate(over="ignore"):  # a duration past floats is inf, refused below
            shift = change.shift_ns * chunk.compute.frequency_hz[mask] / 1e9
            changed = np.maximum(0, np.rint(durations[mask] * change.scale + shift))
        past = np.flatnonzero(changed >= _INT64_END)
        if past.size:
            record = int(np.flatnonzero(mask)[past[0]])
            code = int(chunk.compute.stage[record])
            stage = chunk.compute.stage_names[code] if code >= 0 else "(none)"
            where = np.searchsorted(chunk.inv_starts, chunk.compute_index[record], "right") - 1
            raise _past_int64(
                graph,
                [change],
                chunk.first_invocation + int(where),
                f"the duration of a compute record of stage {stage} "
                f"({changed[past[0]]:.6g} cycles)",
            )
        durations[mask] = changed
    return durations


def _replay_chunks(
    graph: ReplayGraph, scenarios: Sequence[Sequence[Change]]
) -> Iterator[tuple[_Chunk, Iterator[tuple[np.ndarray, np.ndarray]]]]:
    """Per chunk, the chunk and the replayed (ends, starts) of batches of scenarios, in
    scenario order, each computed when asked for (one batch in memory at a time).
    ``ArgumentError`` for a scenario whose replay passes int64 cycles."""
    masks = _change_masks(graph, scenarios)
    for index, chunk in enumerate(graph.chunks):
        compute = [_changed_durations(graph, chunk, s, masks, index) for s in scenarios]
        yield chunk, _checked_batches(graph, chunk, scenarios, compute)


def _checked_batches(
    graph: ReplayGraph,
    chunk: _Chunk,
    scenarios: Sequence[Sequence[Change]],
    compute: list[np.ndarray],
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The chunk's replayed (ends, starts), a batch of scenarios at a time; the first
    scenario whose replay passed int64 cycles is refused."""
    step = max(1, _CELLS // len(chunk.start))
    for first in range(0, len(compute), step):
        ends, starts, wrapped = chunk.replay_run(compute[first : first + step])
        if wrapped.any():
            column, invocation = np.argwhere(wrapped.T)[0]
            raise _past_int64(
                graph,
                scenarios[first + int(column)],
                chunk.first_invocation + int(invocation),
                "the replayed end of a record (in cycles)",
            )
        yield ends, starts


def predict_makespans(graph: ReplayGraph, scenarios: Sequence[Sequence[Change]]) -> np.ndarray:
    """The replayed makespan in ns of every invocation (rows) under every scenario
    (columns), a scenario being a sequence of changes (``()``: the durations observed).
    ``ArgumentError`` for a scenario whose replay or makespan leaves int64, naming it."""
    spans = []
    for chunk, batches in _replay_chunks(graph, scenarios):
        chunk_spans, outside = zip(*(chunk.makespans(*batch) for batch in batches), strict=True)
        past = np.argwhere(np.concatenate(outside, axis=1).T)
        if past.size:
            column, invocation = past[0]
            raise _past_int64(
                graph,
                scenarios[int(column)],
                chunk.first_invocation + int(invocation),
                "the predicted makespan in ns",
            )
        spans.append(np.concatenate(chunk_spans, axis=1))
    return np.concatenate(spans, axis=0)


def replay_records(graph: ReplayGraph, changes: Sequence[Change] = ()) -> pa.Table:
    """Every record with its replayed ``start_cycle`` and ``end_cycle`` under the changes:
    the key columns, ``core_type, block_id, record_index, phase``, in core order;
    ``ArgumentError`` for changes whose replay passes int64 cycles."""
    ends, starts = [], []
    for _, batches in _replay_chunks(graph, [tuple(changes)]):
        (chunk_ends, chunk_starts), *_ = batches
        ends.append(chunk_ends[:, 0])
        starts.append(chunk_starts[:, 0])
    return graph.records.append_column(
        "start_cycle", pa.array(np.concatenate(starts))
    ).append_column("end_cycle", pa.array(np.concatenate(ends)))


def _fidelity_error(replayed: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """|replayed - observed| / observed (0 where both are 0, inf where only observed is)."""
    difference = np.abs(replayed - observed).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(difference == 0, 0.0, difference / observed)


def replay_table(graph: ReplayGraph, replayed: np.ndarray, predicted: np.ndarray) -> pa.Table:
    """The replay's table from the replayed (unchanged) and predicted makespans."""
    observed = graph.observed_makespan_ns
    error = _fidelity_error(replayed, observed)
    faithful = error <= FIDELITY_LIMIT
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = predicted / observed
    return pa.table(
        {
            **{name: graph.keys.column(name) for name in KEY_COLUMNS},
            "observed_makespan_ns": pa.array(observed),
            "replayed_makespan_ns": pa.array(replayed),
            "fidelity_error": pa.array(error),
            "faithful": pa.array(faithful),
            "predicted_makespan_ns": pa.array(predicted, mask=~faithful),
            "ratio": pa.array(ratio, mask=~faithful | (observed == 0)),
        }
    )


def replay(graph: ReplayGraph, changes: Sequence[Change] = ()) -> pa.Table:
    """One row per invocation: key columns, ``observed_makespan_ns``,
    ``replayed_makespan_ns`` (durations unchanged), ``fidelity_error``, ``faithful``
    (error <= ``FIDELITY_LIMIT``), ``predicted_makespan_ns`` under the changes (NULL where
    not faithful) and ``ratio`` (predicted / observed)."""
    changes = tuple(changes)
    spans = predict_makespans(graph, [(), changes] if changes else [()])
    return replay_table(graph, spans[:, 0], spans[:, -1])


def static_bound(graph: ReplayGraph) -> pa.Table:
    """One row per invocation: key columns, ``makespan_ns`` (observed), ``static_bound_ns``
    (the DAG's longest path), ``slack_ns`` (makespan - bound) and ``slack_share`` (slack /
    makespan, NULL for a makespan of 0)."""
    bounds = []
    for chunk in graph.chunks:
        last = np.maximum.reduceat(chunk.static_ends(), chunk.inv_starts)
        first = chunk.t0[chunk.inv_starts]
        bounds.append(_span_ns(first, last, chunk.anchor, chunk.frequency)[0])
    bound = np.concatenate(bounds)
    makespan = graph.observed_makespan_ns
    slack = makespan - bound
    with np.errstate(divide="ignore", invalid="ignore"):
        share = slack / makespan
    return pa.table(
        {
            **{name: graph.keys.column(name) for name in KEY_COLUMNS},
            "makespan_ns": pa.array(makespan),
            "static_bound_ns": pa.array(bound),
            "slack_ns": pa.array(slack),
            "slack_share": pa.array(share, mask=makespan == 0),
        }
    )
