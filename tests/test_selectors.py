"""Run selectors: the same text in Python and on the command line picks the same runs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from multicore_profiler import cli
from multicore_profiler.errors import SelectorError
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.selectors import RunSelector
from multicore_profiler.storage.store import Store

DAY0 = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)

# run id, days after DAY0, commit, branch, label, tags
RUNS = [
    ("r0", 0, "3f2a0c1", "main", "nightly", {"model": "moe-7b", "tokens": "256"}),
    ("r1", 1, "3f2a0c1", "main", "nightly", {"model": "moe-7b", "tokens": "1024"}),
    ("r2", 2, "9c1e77d", "main", "nightly", {"model": "moe-7b", "tokens": "256"}),
    ("r3", 3, "9c1e77d", "fix-gmm", "ci", {"model": "moe-70b", "tokens": "256"}),
    ("r4", 4, "b0b0b0b", "fix-gmm", None, {}),
]


@pytest.fixture
def runs_store(store: Store) -> Store:
    for run_id, day, commit, branch, label, tags in RUNS:
        start = DAY0 + timedelta(days=day)
        info = RunInfo(run_id, start, commit=commit, branch=branch, label=label, tags=tags)
        store.write_run(info)
        store.write_run(RunInfo(**{**info.__dict__, "status": "complete", "end_time": start}))
    return store


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("r3", ["r3"]),
        ("run:r1,run:r4", ["r1", "r4"]),
        ("commit:9c1e", ["r2", "r3"]),
        ("commit:3f2a,commit:b0b0", ["r0", "r1", "r4"]),
        ("branch:main", ["r0", "r1", "r2"]),
        ("branch:main,commit:9c1e", ["r2"]),
        ("label:nightly,label:ci", ["r0", "r1", "r2", "r3"]),
        ("tag:model=moe-7b", ["r0", "r1", "r2"]),
        ("tag:model=moe-7b,tag:tokens=256", ["r0", "r2"]),
        ("since:2026-11-22", ["r2", "r3", "r4"]),
        ("until:2026-11-22", ["r0", "r1"]),
        ("since:2026-11-21T08:00,until:2026-11-23T08:00", ["r1", "r2"]),
        ("since:2026-11-21T09:00+01:00,until:2026-11-21T08:00:01", ["r1"]),
        ("since:2026-11-21T08:00Z,until:2026-11-23T08:00Z", ["r1", "r2"]),
        ("latest:2", ["r3", "r4"]),
        ("branch:main,latest:2", ["r1", "r2"]),
        ("label:nightly, tag:tokens=256 ,latest:1", ["r2"]),
    ],
)
def test_selectors_pick_runs(runs_store: Store, text: str, expected: list[str]) -> None:
    assert runs_store.select_runs(text) == expected
    assert runs_store.select_runs(RunSelector.parse(text)) == expected


def test_a_parsed_selector() -> None:
    selector = RunSelector.parse("branch:main,tag:model=moe-7b,latest:5,since:2026-11-20")
    assert selector == RunSelector(
        branches=("main",),
        tags=(("model", "moe-7b"),),
        latest=5,
        since=datetime(2026, 11, 20, tzinfo=timezone.utc),
    )
    assert str(selector) == "branch:main,tag:model=moe-7b,latest:5,since:2026-11-20"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("color:red", "unknown key 'color'; one of run, commit, branch"),
        ("branch:", "selector term 'branch:' has no value"),
        ("branch:main,", "has an empty term"),
        ("", "has an empty term"),
        ("tag:model", "a tag is tag:KEY=VALUE"),
        ("latest:0", "latest takes a count >= 1"),
        ("latest:two", "latest takes a count >= 1"),
        ("since:yesterday", "since:yesterday is not an ISO 8601 date or time"),
        ("latest:1,latest:2", "gives latest more than once"),
    ],
)
def test_bad_selectors_name_the_term(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as caught:
        RunSelector.parse(text)
    assert message in str(caught.value)


def test_a_selector_that_selects_nothing_is_an_error(runs_store: Store) -> None:
    with pytest.raises(SelectorError, match=r"selector commit:ffff selects none of the 5 runs"):
        runs_store.select_runs("commit:ffff")


@pytest.mark.parametrize(
    ("text", "absent"),
    [
        ("run:r1,run:nope", "run:nope names"),
        ("r1,nope,gone", "run:nope, run:gone name"),
        ("commit:3f2a,commit:ffff", "commit:ffff names"),
        ("branch:main,branch:nope", "branch:nope names"),
        ("label:nightly,label:nope", "label:nope names"),
        ("branch:fix-gmm,commit:9c1e,commit:ffff", "commit:ffff names"),
    ],
)
def test_a_selector_naming_an_absent_run_is_an_error(
    runs_store: Store, text: str, absent: str
) -> None:
    """Its other alternatives select runs, but what it names that no run has is not
    silently ignored."""
    with pytest.raises(SelectorError) as caught:
        runs_store.select_runs(text)
    assert str(caught.value) == f"selector {text}: {absent} no run in {runs_store}"


def test_cli_runs_select(capsys, runs_store: Store, tmp_path: Path) -> None:
    store = str(runs_store.root)
    code = cli.main(["runs", "--store", store, "--select", "commit:9c1e", "--format", "csv"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == ["run_id", "r2", "r3"]
    assert cli.main(["runs", "--store", store, "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 6
    assert cli.main(["runs", "--store", store, "--select", "label:nope"]) == 1
    assert "selector label:nope selects none of the 5 runs" in capsys.readouterr().err
    assert cli.main(["runs", "--store", store, "--select", "label:ci,label:nope"]) == 1
    assert capsys.readouterr().err == (
        f"mcprof: error: selector label:ci,label:nope: label:nope names no run in {runs_store}\n"
    )
