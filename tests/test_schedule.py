"""schedule() against torch.profiler.schedule, argument checks."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch.profiler

from multicore_profiler import ProfilerAction, schedule
from multicore_profiler.errors import ProfileError, ScheduleError


def torch_actions(steps: int, **kwargs: int) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when warmup is 0
        fn = torch.profiler.schedule(**kwargs)
    return [fn(step).name for step in range(steps)]


GRID = list(
    itertools.product(
        range(3),  # wait
        range(3),  # warmup
        range(1, 4),  # active
        range(3),  # repeat
        range(3),  # skip_first
        range(2),  # skip_first_wait
    )
)


@pytest.mark.parametrize(("wait", "warmup", "active", "repeat", "skip_first", "skip_wait"), GRID)
def test_schedule_matches_torch_step_by_step(
    wait: int, warmup: int, active: int, repeat: int, skip_first: int, skip_wait: int
) -> None:
    kwargs = {
        "wait": wait,
        "warmup": warmup,
        "active": active,
        "repeat": repeat,
        "skip_first": skip_first,
        "skip_first_wait": skip_wait,
    }
    ours = schedule(**kwargs)
    assert [ours(step).name for step in range(40)] == torch_actions(40, **kwargs)


def test_worked_example() -> None:
    fn = schedule(wait=1, warmup=1, active=2, repeat=1, skip_first=1)
    A = ProfilerAction
    assert [fn(s) for s in range(7)] == [
        A.NONE,  # skipped
        A.NONE,  # wait
        A.WARMUP,
        A.RECORD,
        A.RECORD_AND_SAVE,
        A.NONE,  # repeat=1 is over
        A.NONE,
    ]
    assert str(fn) == (
        "schedule(wait=1, warmup=1, active=2, repeat=1, skip_first=1, skip_first_wait=0)"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"wait": -1, "warmup": 0, "active": 1}, "wait must be >= 0, got -1"),
        ({"wait": 0, "warmup": -2, "active": 1}, "warmup must be >= 0, got -2"),
        ({"wait": 0, "warmup": 0, "active": 0}, "active must be > 0"),
        ({"wait": 0, "warmup": 0, "active": 1, "repeat": -1}, "repeat must be >= 0"),
        ({"wait": 0, "warmup": 0, "active": 1, "skip_first": -3}, "skip_first must be >= 0"),
        ({"wait": 1.5, "warmup": 0, "active": 1}, "wait must be an int, got 1.5"),
        ({"wait": 0, "warmup": "1", "active": 1}, "warmup must be an int, got '1'"),
        ({"wait": 0, "warmup": 0, "active": True}, "active must be an int, got True"),
    ],
)
def test_invalid_arguments_raise(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ScheduleError, match=message) as caught:
        schedule(**kwargs)  # type: ignore[arg-type]
    assert isinstance(caught.value, ProfileError)
    assert isinstance(caught.value, ValueError)


def test_negative_step_raises() -> None:
    with pytest.raises(ScheduleError, match="step number must be >= 0, got -1"):
        schedule(wait=0, warmup=0, active=1)(-1)
