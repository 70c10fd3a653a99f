"""Per-core clock offsets from the records' own causality (``clock_offsets``), and applying
them (``correct_clocks``, ``--clock-correction``).

Each pair of cores with causal edges between them (``_clock_constraints``: the tightest of
its edges) bounds the difference of their clocks' offsets:
``offset(src) - offset(dst) <= slack``, a difference constraint. Such a system is a graph,
an edge dst -> src of weight slack, and shortest paths solve it (Bellman-Ford): every
invocation's cores are solved at once, one numpy relaxation per round over every edge of
the selection, so no Python runs per edge.

* The offsets, relative to each invocation's reference core (its lowest core with an
  edge, which keeps offset 0): each core moves as little as causality forces, forward
  only to the low end of its interval where that end is above 0, back only as far as the
  edges force (the greatest solution below max(low, 0)). Where no edge is contradicted,
  every offset is 0; a single core whose clock is off moves alone.
* The interval a core's offset can lie in, relative to the reference: at most the shortest
  path from the reference to it, at least minus the shortest path from it to the
  reference; a side no path bounds is open (NULL), and a core no path joins to the
  reference is unconstrained.
* Edges that contradict each other around a cycle (a negative cycle) leave no offsets that
  hold them all: ``ClockError`` names the invocation and the cycle's edges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from multicore_profiler.analysis.clock_settings import CORRECTION_SCHEMA
from multicore_profiler.errors import ClockError
from multicore_profiler.storage.store import Store

_UNREACHED = np.iinfo(np.int64).max // 4
"""A distance no path reaches; far from overflow when an edge's weight is added."""

_CYCLES_SHOWN = 5
"""Contradictory invocations an error names one by one."""

# The constraints, once; the cores of the cursor's invocations (each core with a cores row,
# and any other that an edge names), numbered in order, with their invocation's number.
_NODES = """
CREATE OR REPLACE TEMP TABLE _clock_pairs AS SELECT * FROM _clock_constraints;
CREATE OR REPLACE TEMP TABLE _clock_nodes AS
WITH keys AS (
    SELECT run_id, step, rank, invocation_id, write_id, core_type, block_id FROM cores
    UNION
    SELECT run_id, step, rank, invocation_id, write_id, src_core_type, src_block_id
    FROM _clock_pairs
    UNION
    SELECT run_id, step, rank, invocation_id, write_id, dst_core_type, dst_block_id
    FROM _clock_pairs
)
SELECT
    *,
    (row_number() OVER w - 1)::BIGINT AS node,
    (dense_rank() OVER (ORDER BY run_id, rank, invocation_id, write_id) - 1)::BIGINT AS inv
FROM keys
WINDOW w AS (ORDER BY run_id, rank, invocation_id, write_id, core_type, block_id)
ORDER BY node
"""

_EDGES = """
SELECT s.node AS src, d.node AS dst, c.slack_cycles, c.edges, c.tightest.kind AS kind,
    c.tightest.src_task_id AS src_task_id, c.tightest.dst_task_id AS dst_task_id,
    core_name(s.core_type) || '/' || s.block_id AS src_core,
    core_name(d.core_type) || '/' || d.block_id AS dst_core
FROM _clock_pairs c
JOIN _clock_nodes s
    ON s.run_id = c.run_id AND s.rank = c.rank AND s.invocation_id = c.invocation_id
    AND s.write_id = c.write_id AND s.core_type = c.src_core_type
    AND s.block_id = c.src_block_id
JOIN _clock_nodes d
    ON d.run_id = c.run_id AND d.rank = c.rank AND d.invocation_id = c.invocation_id
    AND d.write_id = c.write_id AND d.core_type = c.dst_core_type
    AND d.block_id = c.dst_block_id
ORDER BY src, dst
"""

# The solved cycles per core, in ns at the invocation's frequency.
_VIEW = """
CREATE OR REPLACE TEMP VIEW clock_offsets AS
SELECT
    n.run_id, n.rank, n.invocation_id, n.core_type, n.block_id,
    cycles_to_ns(o.offset_cycles, i.frequency_hz) AS offset_ns,
    cycles_to_ns(o.low_cycles, i.frequency_hz) AS low_ns,
    cycles_to_ns(o.high_cycles, i.frequency_hz) AS high_ns,
    o.constrained,
    n.step, n.write_id, core_name(n.core_type) AS core, o.offset_cycles, o.low_cycles,
    o.high_cycles, o.edges
FROM _clock_nodes n
POSITIONAL JOIN _clock_offset_cycles o
JOIN invocations i
    ON i.run_id = n.run_id AND i.rank = n.rank AND i.invocation_id = n.invocation_id
    AND i.write_id = n.write_id
ORDER BY n.run_id, n.rank, n.invocation_id, n.core_type, n.block_id
"""


@dataclass(frozen=True)
class Solution:
    """Offsets per node (cycles): the chosen offset, its interval relative to the
    invocation's reference (``None`` where ``constrained`` is False on that side), the edges
    at each node; and, per invocation whose edges contradict each other, the edges (indices)
    of one cycle."""

    offset: np.ndarray
    low: np.ndarray
    high: np.ndarray
    low_bounded: np.ndarray
    high_bounded: np.ndarray
    edges: np.ndarray
    cycles: dict[int, list[int]]


@dataclass(frozen=True)
class _Edges:
    """Edges tail -> head of weight ``weight``, sorted by head, with each head's first edge
    (``heads``, ``starts``): grouped once for every relaxation over them."""

    tail: np.ndarray
    head: np.ndarray
    weight: np.ndarray
    heads: np.ndarray
    starts: np.ndarray

    @classmethod
    def by_head(cls, tail: np.ndarray, head: np.ndarray, weight: np.ndarray) -> _Edges:
        order = np.argsort(head, kind="stable")
        tail, head, weight = tail[order], head[order], weight[order]
        heads, starts = np.unique(head, return_index=True)
        return cls(tail, head, weight, heads, starts)


def _relax(dist: np.ndarray, edges: _Edges, rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Bellman-Ford over ``edges``: at most ``rounds`` rounds of
    ``dist[head] = min(dist[head], dist[tail] + weight)``. Returns the distances and the
    nodes the last round lowered (none: they converged)."""
    changed = np.zeros(len(dist), dtype=bool)
    if len(edges.head) == 0:
        return dist, changed
    heads = edges.heads
    for _ in range(rounds):
        reached = dist[edges.tail]
        candidate = np.where(reached >= _UNREACHED, _UNREACHED, reached + edges.weight)
        best = np.minimum.reduceat(candidate, edges.starts)
        lower = best < dist[heads]
        if not lower.any():
            return dist, np.zeros(len(dist), dtype=bool)
        dist = dist.copy()
        dist[heads[lower]] = best[lower]
        changed = np.zeros(len(dist), dtype=bool)
        changed[heads[lower]] = True
    return dist, changed


def _negative_cycle(
    nodes: np.ndarray, src: np.ndarray, dst: np.ndarray, slack: np.ndarray
) -> list[int]:
    """The edges (indices into src/dst/slack) of one negative cycle among ``nodes``' edges
    (an edge dst -> src of weight slack): Bellman-Ford with predecessors, then a walk
    back. Runs only for an invocation known to hold one, to name it."""
    mine = np.flatnonzero(np.isin(dst, nodes) & np.isin(src, nodes))
    dist = dict.fromkeys(nodes.tolist(), 0)
    pred: dict[int, int] = {}
    last = -1
    for _ in range(len(nodes) + 1):
        last = -1
        for edge in mine.tolist():
            tail, head = int(dst[edge]), int(src[edge])
            if dist[tail] + int(slack[edge]) < dist[head]:
                dist[head] = dist[tail] + int(slack[edge])
                pred[head] = edge
                last = head
        if last < 0:
            return []
    for _ in range(len(nodes)):  # step back into the cycle
        last = int(dst[pred[last]])
    cycle, node = [], last
    while True:
        edge = pred[node]
        cycle.append(edge)
        node = int(dst[edge])
        if node == last:
            return cycle[::-1]


def solve(inv: np.ndarray, src: np.ndarray, dst: np.ndarray, slack: np.ndarray) -> Solution:
    """Offsets for nodes numbered by invocation (``inv``: each node's invocation, ascending)
    under ``x[src] - x[dst] <= slack`` per edge (node indices; edges between nodes of one
    invocation)."""
    n = len(inv)
    forward = _Edges.by_head(dst, src, slack)
    reverse = _Edges.by_head(src, dst, slack)
    edges = np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)
    edges -= np.bincount(src[src == dst], minlength=n)
    per_inv = np.bincount(inv) if n else np.zeros(0, dtype=np.int64)
    rounds = int(per_inv.max(initial=0)) + 1

    # Contradictions around a cycle, found from a source with an edge to every core.
    _, changed = _relax(np.zeros(n, dtype=np.int64), forward, rounds)
    cycles = {}
    for bad in np.unique(inv[changed]).tolist():
        cycles[bad] = _negative_cycle(np.flatnonzero(inv == bad), src, dst, slack)
    # Each invocation's reference: its lowest core with an edge (none: no edges at all, and
    # every core keeps offset 0, unconstrained).
    with_edge = np.flatnonzero(edges > 0)
    _, found_at = np.unique(inv[with_edge], return_index=True)
    ref = with_edge[found_at]

    start = np.full(n, _UNREACHED, dtype=np.int64)
    start[ref] = 0
    ahead, _ = _relax(start, forward, rounds)  # x[v] <= path ref -> v
    behind, _ = _relax(start, reverse, rounds)  # x[v] >= -path v -> ref
    high_bounded = ahead < _UNREACHED
    low_bounded = behind < _UNREACHED
    # Two ways to move each core as little as causality forces, both relative to the
    # reference (which no path moves): the greatest offsets at most max(low, 0) (forward
    # only to an interval's low end above 0, else back as far as the edges force), and the
    # least at least min(high, 0) (the mirror image). Each invocation takes the one that
    # moves its cores less in all (the first on a tie).
    ceiling = np.where(low_bounded, np.maximum(-behind, 0), 0)
    back_first, _ = _relax(ceiling, forward, rounds)
    floor = np.where(high_bounded, np.maximum(-ahead, 0), 0)
    mirrored, _ = _relax(floor, reverse, rounds)
    forward_first = -mirrored
    size = len(per_inv)
    back_cost = np.bincount(inv, weights=np.abs(back_first), minlength=size)
    forward_cost = np.bincount(inv, weights=np.abs(forward_first), minlength=size)
    offset = np.where((forward_cost < back_cost)[inv], forward_first, back_first)
    return Solution(
        offset=offset,
        low=np.where(low_bounded, -behind, 0),
        high=np.where(high_bounded, ahead, 0),
        low_bounded=low_bounded,
        high_bounded=high_bounded,
        edges=edges,
        cycles=cycles,
    )


def _cycle_text(nodes: pa.Table, edges: pa.Table, inv: int, cycle: list[int]) -> str:
    """One contradictory invocation and the edges of its cycle, as words."""
    row = nodes.slice(np.flatnonzero(nodes["inv"].to_numpy() == inv)[0], 1).to_pylist()[0]
    parts = []
    for edge in cycle:
        e = edges.slice(edge, 1).to_pylist()[0]
        what = "wait" if e["kind"] == "release" else "compute"
        parts.append(
            f"{e['src_core']} -> {e['dst_core']} ({e['kind']}: task {e['dst_task_id']}'s "
            f"{what} recorded {-e['slack_cycles']} cycles before task {e['src_task_id']}'s "
            "end)"
            if e["slack_cycles"] < 0
            else f"{e['src_core']} -> {e['dst_core']} ({e['kind']}: {e['slack_cycles']} "
            f"cycles of slack, task {e['src_task_id']} to task {e['dst_task_id']})"
        )
    return (
        f"run {row['run_id']} rank {row['rank']} invocation {row['invocation_id']}: "
        + ", ".join(parts)
    )


def install_clock_offsets(con: duckdb.DuckDBPyConnection) -> None:
    """Define ``clock_offsets`` on ``con`` (the computed module ``records.clock_offsets``):
    the offsets of every core of the invocations the cursor sees. ``ClockError`` where an
    invocation's edges contradict each other around a cycle."""
    con.execute(_NODES)
    nodes = con.sql(
        "SELECT run_id, rank, invocation_id, node, inv FROM _clock_nodes"
    ).to_arrow_table()
    edges = con.sql(_EDGES).to_arrow_table()
    found = solve(
        nodes["inv"].to_numpy(),
        edges["src"].to_numpy(),
        edges["dst"].to_numpy(),
        edges["slack_cycles"].to_numpy(),
    )
    if found.cycles:
        shown = [
            _cycle_text(nodes, edges, inv, cycle)
            for inv, cycle in list(found.cycles.items())[:_CYCLES_SHOWN]
        ]
        more = len(found.cycles) - len(shown)
        raise ClockError(
            f"the records of {len(found.cycles)} invocation(s) contradict causality around a "
            "cycle of edges that no per-core clock offset can satisfy (so no offsets are "
            "given): " + "; ".join(shown) + (f"; and {more} more" if more else "")
        )
    bounded = found.low_bounded | found.high_bounded
    con.register(
        "_clock_offset_cycles",
        pa.table(
            {
                "offset_cycles": found.offset,
                "low_cycles": pa.array(found.low, mask=~found.low_bounded),
                "high_cycles": pa.array(found.high, mask=~found.high_bounded),
                "constrained": bounded,
                "edges": found.edges,
            }
        ),
    )
    con.execute(_VIEW)


def correct_clocks(store: Store, runs: Sequence[str] | None) -> pa.Table:
    """Estimate the clock offsets of ``runs`` (None: every run) from their records as
    recorded, and apply them to every record view of ``store`` (setting
    ``clock_correction``); return the ``clock_offsets`` rows of the cores that were moved.
    ``ClockError`` where the edges of an invocation contradict each other, or a moved core
    would start before cycle 0."""
    store.configure("clock_correction", None)
    with store.reading(runs=runs, modules=("records.clock_offsets",)) as con:
        offsets = con.sql(
            "SELECT * FROM clock_offsets WHERE offset_cycles <> 0 "
            "ORDER BY run_id, rank, invocation_id, core_type, block_id"
        ).to_arrow_table()
        con.register("_moved", offsets)
        below = con.execute(
            """
            SELECT m.run_id, m.rank, m.invocation_id, m.core, min(r.start_cycle) AS first
            FROM _moved m
            JOIN aligned_raw_records r
                ON r.run_id = m.run_id AND r.rank = m.rank AND r.invocation_id = m.invocation_id
                AND r.write_id = m.write_id AND r.core_type = m.core_type
                AND r.block_id = m.block_id
            GROUP BY ALL
            HAVING min(r.start_cycle)::HUGEINT + any_value(m.offset_cycles) < 0
            ORDER BY ALL LIMIT 1
            """
        ).fetchall()
    if below:
        run, rank, invocation, core, first = below[0]
        raise ClockError(
            f"the clock correction would move {core} of run {run} rank {rank} invocation "
            f"{invocation} before cycle 0 (its first record is at cycle {first}): a counter "
            "this close to 0 cannot be corrected by an offset"
        )
    correction = offsets.select(CORRECTION_SCHEMA.names).cast(CORRECTION_SCHEMA)
    store.configure("clock_correction", correction)
    return offsets
