"""What-if changes (analysis/changes.py, analysis/what_if.py): their text form,
predictions against a plain-Python replay of the same semantics, and the speed-up curves."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_replay import (
    AIC,
    AIV,
    STAGES,
    Rec,
    compute,
    cross_released,
    releaser,
    table,
    ties,
    trigger,
    wait,
    workloads,
)

from multicore_profiler.analysis.changes import Change, parse_change
from multicore_profiler.analysis.replay import prepare
from multicore_profiler.analysis.what_if import speedup_curves, what_if
from multicore_profiler.errors import AnalysisError, ArgumentError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("GMM1*0.8", Change(stage="GMM1", scale=0.8)),
        ("GMM1+200us", Change(stage="GMM1", shift_ns=200_000.0)),
        ("GMM1+200ns", Change(stage="GMM1", shift_ns=200.0)),
        ("AIC-5000", Change(core_type="AIC", shift_ns=-5000.0)),
        ("AIV&owner=1,4*1.5", Change(core_type="AIV", owners=(1, 4), scale=1.5)),
        (
            "task=10-12&GMM2-1.5ms",
            Change(stage="GMM2", tasks=(10, 11, 12), shift_ns=-1_500_000.0),
        ),
        ("owner=3,10-12*0", Change(owners=(3, 10, 11, 12), scale=0.0)),
        ("up-proj*2", Change(stage="up-proj", scale=2.0)),
        ("GMM1*1e-3", Change(stage="GMM1", scale=0.001)),
    ],
)
def test_parse_change_accepts(text, expected):
    change = parse_change(text)
    assert change.text == text
    assert change == Change(**{**expected.__dict__, "text": text})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("GMM1", "is not <target>"),
        ("GMM1*", "is not <target>"),
        ("*0.5", "is not <target>"),
        ("GMM1*0.8us", "a factor takes no unit"),
        ("GMM1+5s", "unit 's' is not one of ns, us, ms"),
        ("AIC&AIV*2", "gives its core_type twice"),
        ("GMM1&GMM2*2", "gives its stage twice"),
        ("owner=1&owner=2*2", "gives its owner twice"),
        ("owner=*2", "is not a list of ids"),
        ("owner=5-3*2", "the range 5-3 runs backwards"),
        ("worker=3*2", "'worker'= is not a target"),
        ("GMM1&*2", "has an empty target"),
        ("GMM1*-1", r"'GMM1\*' is not a stage name"),
        ("task=0-99999999*2", "more than 1048576 ids"),
        ("GMM1*1e999", "not finite"),
    ],
)
def test_parse_change_rejects(text, message):
    with pytest.raises(ArgumentError, match=message):
        parse_change(text)


def test_change_checks_its_fields_and_names_itself():
    with pytest.raises(ArgumentError, match="scale must be a finite number >= 0"):
        Change(stage="A", scale=-1.0)
    with pytest.raises(ArgumentError, match="core_type is one of AIC, AIV, SM, CTA, got 'GPU'"):
        Change(core_type="GPU")
    assert Change(core_type="SM", scale=0.5).text == "SM*0.5"  # an import's GPU cores
    assert Change(stage="A", scale=0.5).text == "A*0.5"
    assert Change(core_type="AIC", tasks=(1, 2), shift_ns=-50.0).text == "AIC&task=1,2-50ns"


def test_change_matching_no_compute_record_is_refused():
    graph = prepare(table([cross_released()]))
    with pytest.raises(AnalysisError, match=r"the change 'Z\*2' matches no compute record"):
        what_if(graph, ["A*0.5", "Z*2"])
    with pytest.raises(AnalysisError, match=r"'AIV&owner=3\*2'"):
        what_if(graph, ["AIV&owner=3*2"])
    with pytest.raises(AnalysisError, match="the change 'Nope"):
        speedup_curves(graph, stages=["Nope"])
    with pytest.raises(ArgumentError, match=r"fraction in \[0, 1\], got 1\.5"):
        speedup_curves(graph, speedups=[0.5, 1.5])


LAST_FLOAT = 2**63 - 1024
"""The largest float below 2^63: a duration, end or ns figure of at most this many fits."""
LONGEST = f"A*{LAST_FLOAT}"
"""Record A lasts one cycle, from 0: this makes it end at LAST_FLOAT."""


def refusal(change: str, what: str) -> str:
    return (
        f"the change {change!r} cannot be replayed: {what} of run r rank 0 invocation 0 "
        "would pass int64 (2^63-1); give a smaller factor or shift"
    )


def prediction(recs: list[Rec], change: str, frequency: float) -> int:
    graph = prepare(table([recs], frequency=frequency))
    return what_if(graph, [change]).column("predicted_makespan_ns")[0].as_py()


def then_b(cycles: int) -> list[Rec]:
    """A for one cycle, then B for ``cycles`` on the same core."""
    return [compute((AIC, 0), "A", 0, 0, 1), compute((AIC, 0), "B", 1, 1, 1 + cycles)]


@pytest.mark.parametrize(
    ("change", "cycles"),
    [
        ("A*1e308", "1e+308"),
        ("A+1e30us", "1e+33"),
        ("A*1e18", "1e+18"),  # A lasts 1 cycle: 1e18 fits, 1e19 does not
        ("A*1e19", "1e+19"),
        ("A+9223372036854775807", "9.22337e+18"),  # as a float, 2^63
        ("A+9223372036854775296", "9.22337e+18"),  # rounds to 2^63 too
    ],
)
def test_a_duration_past_int64_is_refused(change, cycles):
    # Each predicted a makespan of -9,223,372,036,849,824 us, the durations cast from
    # floats past int64. 1 GHz: a ns is a cycle.
    if cycles == "1e+18":
        assert prediction(then_b(0), change, 1e9) == 10**18
        return
    with pytest.raises(ArgumentError) as refused:
        prediction(then_b(0), change, 1e9)
    what = f"the duration of a compute record of stage A ({cycles} cycles)"
    assert str(refused.value) == refusal(change, what)


def test_the_largest_duration_below_2_63_is_kept_exactly():
    # 2^63 - 1024 is the largest float below 2^63; a shift of 2^63 - 513 ns rounds to it.
    assert prediction(then_b(0), "A+9223372036854774784", 1e9) == LAST_FLOAT
    assert prediction(then_b(0), "A+9223372036854775295", 1e9) == LAST_FLOAT
    assert prediction(then_b(0), LONGEST, 1e9) == LAST_FLOAT


def test_a_replayed_end_past_2_63_minus_1_cycles_is_refused_exactly():
    # A ends at 2^63 - 1024; B after it, 1023 cycles, ends at 2^63 - 1 exactly: it fits
    # (at 100 GHz, 0.01 ns a cycle, as DuckDB rounds it); 1024 cycles end at 2^63.
    assert prediction(then_b(1023), LONGEST, 1e11) == round((2**63 - 1) * (1e9 / 1e11))
    with pytest.raises(ArgumentError) as refused:
        prediction(then_b(1024), LONGEST, 1e11)
    what = "the replayed end of a record (in cycles)"
    assert str(refused.value) == refusal(LONGEST, what)
    # The same past a wait: its release (A's trigger, ending at 2^63 - 1023) plus its
    # observed latency of 1022 cycles ends at 2^63 - 1; 1023 cycles pass.
    for latency, fits in [(1022, True), (1023, False)]:
        recs = [
            compute((AIC, 0), "A", 0, 0, 1),
            trigger((AIC, 0), 0, 1, 2, event=0),
            wait((AIV, 0), 1, 0, 2 + latency, event=0, count=1),
        ]
        if fits:
            assert prediction(recs, LONGEST, 1e11) == round((2**63 - 1) * (1e9 / 1e11))
            continue
        with pytest.raises(ArgumentError) as refused:
            prediction(recs, LONGEST, 1e11)
        assert str(refused.value) == refusal(LONGEST, what)


def test_a_makespan_past_int64_ns_is_refused_exactly():
    # 1 GHz, anchor 0: B ends at 2^63 - 1024 + 511 cycles, whose float ns round to
    # 2^63 - 1024 (the views' figure); 512 cycles round to 2^63, past int64 ns.
    assert prediction(then_b(511), LONGEST, 1e9) == LAST_FLOAT
    for cycles in (512, 1023):
        with pytest.raises(ArgumentError) as refused:
            prediction(then_b(cycles), LONGEST, 1e9)
        assert str(refused.value) == refusal(LONGEST, "the predicted makespan in ns")


def test_speedup_curves_exact():
    graph = prepare(table([cross_released(), ties()]))
    curves = speedup_curves(graph)
    assert curves.column_names == [
        "run_id",
        "rank",
        "invocation_id",
        "write_id",
        "stage",
        "speedup",
        "observed_makespan_ns",
        "faithful",
        "predicted_makespan_ns",
        "ratio",
    ]
    first = curves.filter(curves.column("invocation_id").to_numpy() == 0)
    assert first.column("stage").to_pylist() == ["A"] * 6 + ["B"] * 6
    assert first.column("speedup").to_pylist() == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5] * 2
    # A's 160 cycles are all on the path (16 a step); B's 100 too (10 a step).
    assert first.column("predicted_makespan_ns").to_pylist() == [
        *(300, 284, 268, 252, 236, 220),
        *(300, 290, 280, 270, 260, 250),
    ]
    assert first.column("ratio").to_pylist()[5] == pytest.approx(220 / 300)
    second = curves.filter(curves.column("invocation_id").to_numpy() == 1)
    # Ties: the tail is B after the count-1 wait, 75 = 50 + 5 + 20. A 10 % faster: A takes
    # 36 and 40 (40.5 rounds to even), the triggers end at 46 and 45, the count-1 wait at
    # 45 + 5, B at 70. At 30 %, 45 * 0.7 is 31.499999999999996 in floats: 31.
    assert second.column("predicted_makespan_ns").to_pylist() == [
        *(75, 70, 66, 61, 57, 52),
        *(75, 73, 71, 69, 67, 65),
    ]
    only_b = speedup_curves(graph, stages=["B"], speedups=[0.5])
    assert only_b.column("predicted_makespan_ns").to_pylist() == [250, 65]


def _selects(c: Change, r: Rec) -> bool:
    """Whether the change selects the compute record, in plain Python."""
    return (
        (c.stage is None or c.stage == r.stage)
        and (c.core_type is None or {"AIC": AIC, "AIV": AIV}[c.core_type] == r.core[0])
        and (c.owners is None or r.owner in c.owners)
        and (c.tasks is None or r.task in c.tasks)
    )


def reference_makespan(recs: list[Rec], changes: list[Change]) -> int:
    """The replay's semantics in plain Python, record by record in the simulator's order (in
    which every record follows what it depends on), at 1 GHz: the predicted makespan."""
    triggers: dict[int, list[Rec]] = {}
    for r in recs:
        if r.phase == "trigger" and r.trigger_event is not None:
            triggers.setdefault(r.trigger_event, []).append(r)
    observed = {id(r): releaser(recs, r) for r in recs if r.phase == "wait"}
    graphed = {key: t for key, t in observed.items() if t is not None}
    by_id = {id(r): r for r in recs}
    latency = {key: by_id[key].end - t.end for key, t in graphed.items()}
    waited = sorted(latency[key] for key, t in graphed.items() if t.end >= by_id[key].start)
    median = waited[(len(waited) - 1) // 2] if waited else 0
    start_of: dict[int, int] = {}
    end_of: dict[int, int] = {}
    previous: dict[tuple[int, int], Rec] = {}
    for r in recs:
        before = previous.get(r.core)
        start = r.start if before is None else end_of[id(before)] + r.start - before.end
        duration = r.end - r.start
        if r.phase == "compute":
            for c in changes:
                if _selects(c, r):
                    duration = max(0, round(duration * c.scale + c.shift_ns))
            end = start + duration
        elif id(r) in graphed:
            t = graphed[id(r)]
            ends = sorted(end_of[id(x)] for x in triggers[r.wait_event])
            if t.end >= r.start:
                end = max(start, ends[r.wait_count - 1] + latency[id(r)])
            else:
                own = r.end - r.start
                end = max(start + own, ends[r.wait_count - 1] + min(latency[id(r)], median))
        else:
            end = start + duration
        start_of[id(r)], end_of[id(r)] = start, end
        previous[r.core] = r
    return max(end_of.values()) - min(start_of.values())


changes_strategy = st.lists(
    st.builds(
        Change,
        stage=st.none() | st.sampled_from(STAGES),
        core_type=st.none() | st.sampled_from(["AIC", "AIV"]),
        owners=st.none() | st.lists(st.integers(0, 3), min_size=1, unique=True).map(tuple),
        scale=st.floats(0, 3),
        shift_ns=st.integers(-30, 30).map(float),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=100, deadline=None)
@given(workloads(), changes_strategy)
def test_prediction_equals_a_plain_python_replay(invocations, changes):
    graph = prepare(table(invocations))
    compute = [r for recs in invocations for r in recs if r.phase == "compute"]
    unmatched = [c for c in changes if not any(_selects(c, r) for r in compute)]
    if unmatched:
        with pytest.raises(AnalysisError, match="matches no compute record"):
            what_if(graph, changes)
        return
    result = what_if(graph, changes, strict=True)
    expected = [reference_makespan(recs, changes) for recs in invocations]
    assert result.column("predicted_makespan_ns").to_pylist() == expected


@settings(max_examples=60, deadline=None)
@given(workloads(overlap=False))
def test_a_faster_stage_never_lengthens_the_makespan(invocations):
    # Without overlapping records a replayed start never precedes its core's first start.
    graph = prepare(table(invocations))
    speedups = (0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)
    curves = speedup_curves(graph, speedups=speedups)
    observed = curves.column("observed_makespan_ns").to_pylist()
    spans = curves.column("predicted_makespan_ns").to_pylist()
    assert len(spans) == len(invocations) * len(graph.stages) * len(speedups)
    for curve in range(0, len(spans), len(speedups)):
        points = spans[curve : curve + len(speedups)]
        assert points[0] == observed[curve]
        assert all(a >= b for a, b in itertools.pairwise(points))
