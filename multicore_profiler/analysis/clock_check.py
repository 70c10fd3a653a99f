"""``Store.check(runs, clocks=True)``: the store's files, and whether each run's records
contradict their own clocks, frequency or schedule (``clock_check``, ``clock_offsets``).

A run's clock problems are ``clocks`` problems of the ``CheckReport`` (their "file" is
``run <run id>``), one per finding, each saying what to look at next; the report's
``clocks`` table holds every run's ``clock_check`` row with the largest offset the
estimate gives (``largest_offset_ns``, null where its edges contradict each other).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from multicore_profiler.errors import ClockError
from multicore_profiler.storage.check import CHECKS, CheckReport, Problem, check_store
from multicore_profiler.storage.store import Store

_OFFSETS = """
SELECT max(abs(offset_ns)) AS largest_offset_ns,
    count(*) FILTER (WHERE offset_cycles <> 0) AS moved_cores
FROM clock_offsets
"""


def check(store: Store, runs: Sequence[str] | None = None, *, clocks: bool = False) -> CheckReport:
    """Verify every file of ``store`` (of ``runs`` only, when given; see ``check_store``)
    and, with ``clocks``, each run's clock, frequency and schedule sanity."""
    report = check_store(store, None if runs is None else list(runs))
    if not clocks:
        return report
    ids = (
        list(runs)
        if runs is not None
        else store.sql("SELECT run_id FROM runs ORDER BY run_id")["run_id"]
    )
    rows, problems = [], list(report.problems)
    for run_id in [str(r) for r in ids]:
        found = store.sql("SELECT * FROM clock_check", runs=[run_id]).to_pylist()
        if not found:
            continue
        row = found[0]
        try:
            row.update(store.sql(_OFFSETS, runs=[run_id]).to_pylist()[0])
        except ClockError as exc:
            row.update(largest_offset_ns=None, moved_cores=None)
            problems.append(Problem(f"run {run_id}", "clocks", str(exc)))
        problems.extend(Problem(f"run {run_id}", "clocks", why) for why in findings(row))
        rows.append(row)
    order = {name: i for i, name in enumerate(CHECKS)}
    problems.sort(key=lambda p: (p.path, order[p.check], p.reason))
    return dataclasses.replace(report, problems=problems, clocks=pa.Table.from_pylist(rows))


def findings(row: dict[str, Any]) -> list[str]:
    """What is wrong with one run's ``clock_check`` row, a sentence each (none: sane)."""
    found = []
    if row["edges_beyond_tolerance"]:
        found.append(
            f"{row['edges_beyond_tolerance']} causal edge(s) in "
            f"{row['contradicted_invocations']} invocation(s) contradict causality beyond "
            f"the tolerance of {row['tolerance_ns']} ns (a wait or dependent task recorded "
            f"before what released it ended), the largest by {row['max_violation_ns']:g} ns: "
            "the cores' clocks disagree (see clock_violations and clock_offsets; "
            "--clock-correction applies the offsets)"
        )
    if row["backwards_cores"]:
        found.append(
            f"{row['backwards_cores']} core(s) recorded records that run backwards (a record "
            "starting before the previous one on its core, or ending before it starts): "
            "the counter went back (see clock_sanity)"
        )
    if row["overlapping_cores"]:
        found.append(
            f"{row['overlapping_cores']} core(s) with one writer recorded overlapping "
            "records (see clock_sanity)"
        )
    if row["faulty_workers"]:
        found.append(
            f"{row['faulty_workers']} worker(s) ran other than their planned queue "
            "(missing, extra, repeated or out-of-order tasks: see schedule_sanity and "
            "schedule_faults)"
        )
    if row["faulty_events"]:
        found.append(
            f"{row['faulty_events']} event(s) whose recorded waits and triggers disagree "
            "(see event_sanity)"
        )
    found.extend(_frequency_finding(fault) for fault in row["frequency_faults"])
    if row["late_entry_cores"]:
        found.append(
            f"{row['late_entry_cores']} core(s) recorded their entry cycle after their "
            "first record (see clock_sanity)"
        )
    return found


def _frequency_summary(row: dict[str, Any]) -> str:
    """The run's worst frequency verdict, in words."""
    verdict = row["frequency_verdict"]
    if verdict == "untimed":
        return "frequency not checked (no host launch times); "
    bounds = " .. ".join(
        "?" if row[side] is None else _mhz(row[side]) for side in ("low_hz", "high_hz")
    )
    return f"frequency {_mhz(row['frequency_hz'])} {verdict} (host times allow {bounds}); "


def _mhz(hz: float) -> str:
    return f"{hz / 1e6:.6g} MHz"


def _frequency_finding(fault: dict[str, Any]) -> str:
    """A (rank, device) group whose stored frequency its host launch times rule out."""
    where = f"rank {fault['rank']} device {fault['device']}: "
    stored = _mhz(fault["frequency_hz"])
    if fault["verdict"] == "contradictory":
        return (
            where + f"the host's launch times and the counter contradict each other at any "
            f"frequency (at least {_mhz(fault['low_hz'])}, at most {_mhz(fault['high_hz'])}): "
            "a counter reset, invocations of another device, or cores whose clocks disagree "
            "(see clock_frequency_bounds and clock_sanity)"
        )
    if fault["verdict"] == "too_low":
        why = (
            f"below the {_mhz(fault['low_hz'])} that the kernels' spans within their host "
            "launch-to-synchronize times require (the counter ran faster)"
        )
    else:
        why = (
            f"above the {_mhz(fault['high_hz'])} that the gaps between launches allow (the "
            "counter ran slower)"
        )
    return (
        where + f"the stored frequency {stored} is {why}; {_mhz(fault['fitting_hz'])} fits "
        "(see clock_frequency; every time in ns is off by their ratio)"
    )


def summary(row: dict[str, Any]) -> str:
    """One run's clock check in one line, sane or not."""
    offset = row.get("largest_offset_ns")
    edges = (
        "no causal edge contradicted"
        if not row["contradicted_edges"]
        else f"{row['contradicted_edges']} causal edge(s) contradicted "
        f"({row['edges_beyond_tolerance']} beyond {row['tolerance_ns']} ns, the largest "
        f"{row['max_violation_ns']:g} ns)"
    )
    return (
        f"run {row['run_id']}: clocks: {'ok' if not findings(row) else 'NOT OK'}: "
        f"{row['invocations']} invocation(s), {row['cores']} core(s); {edges}; "
        + _frequency_summary(row)
        + (
            "no offsets (the edges contradict each other)"
            if offset is None
            else f"largest estimated offset {offset:g} ns on {row['moved_cores']} core(s)"
        )
    )
