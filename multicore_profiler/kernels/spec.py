"""Profile specs: which tasks of a kernel form which stage, and whose work each task is.

A kernel author binds a ``ProfileSpec`` to the kernel's RuntimeConfig builder. Each
``ProfileStage`` names a stage id (the ``desc_id`` its compute records carry) and
selects tasks by task type, tiling position, input position and a custom matcher;
every selector that is set must match. The owner resolver maps tasks to owner ids
(experts, heads, layers). Selectors work on the whole task array at once, so a
graph of thousands of tasks costs no Python loop per task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from multicore_profiler.abi import (
    DESC_COMPUTE_FALLBACK,
    MAX_TASK_TYPE,
    NO_OWNER,
    RESERVED_DESC_IDS,
)
from multicore_profiler.errors import SpecError

TaskMatcher = Callable[[np.ndarray], np.ndarray]
"""Takes the structured task array, returns one boolean per task."""

OwnerResolver = Callable[[np.ndarray], np.ndarray]
"""Takes the structured task array, returns one owner id per task (``NO_OWNER`` for none)."""

DEFAULT_KERNEL_NAME = "MegaKernel"
DEFAULT_OWNER_LABEL = "Owner"


def fallback_desc_ids(task_types: np.ndarray) -> np.ndarray:
    """The desc id a compute record carries when its task has no stage: 0x20000 + task type."""
    if task_types.size and int(task_types.max()) > MAX_TASK_TYPE:
        raise SpecError(f"task types must be at most {MAX_TASK_TYPE:#x}, got {task_types.max()}")
    return (DESC_COMPUTE_FALLBACK + task_types.astype(np.int64)).astype(np.uint32)


@dataclass(frozen=True)
class ProfileStage:
    """One named stage: the tasks that every set selector matches.

    ``desc_id`` is what the stage's compute records carry: any non-zero 32-bit id
    outside 0x10000..0x2FFFF (the ABI's control and fallback ids).
    """

    desc_id: int
    name: str
    task_type: int | None = None
    tiling_position: int | None = None
    input_position: int | None = None
    matcher: TaskMatcher | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.desc_id <= 0xFFFFFFFF or self.desc_id in RESERVED_DESC_IDS:
            raise SpecError(
                f"stage {self.name!r}: desc_id {self.desc_id:#x} is not a stage id; use a "
                f"non-zero 32-bit id outside {RESERVED_DESC_IDS.start:#x}.."
                f"{RESERVED_DESC_IDS.stop - 1:#x} (the ABI's control and fallback ids)"
            )
        if not self.name:
            raise SpecError(f"stage {self.desc_id:#x} needs a name")
        if all(
            s is None
            for s in (self.task_type, self.tiling_position, self.input_position, self.matcher)
        ):
            raise SpecError(
                f"stage {self.name!r} selects nothing: set task_type, tiling_position, "
                "input_position or matcher"
            )

    def select(self, tasks: np.ndarray) -> np.ndarray:
        """One boolean per task: whether every selector that is set matches it."""
        mask = np.ones(len(tasks), dtype=bool)
        for column, wanted in (
            ("task_type", self.task_type),
            ("tiling_position", self.tiling_position),
            ("input_position", self.input_position),
        ):
            if wanted is not None:
                mask &= tasks[column] == wanted
        if self.matcher is not None:
            matched = np.asarray(self.matcher(tasks), dtype=bool)
            if matched.shape != mask.shape:
                raise SpecError(
                    f"stage {self.name!r}: the matcher returned shape {matched.shape} "
                    f"for {len(tasks)} tasks"
                )
            mask &= matched
        return mask


@dataclass(frozen=True)
class ProfileSpec:
    """What a kernel tells the profiler about itself: name, stages, owners and the names of
    its task types (which name the compute records of tasks no stage selects)."""

    kernel_name: str = DEFAULT_KERNEL_NAME
    owner_label: str = DEFAULT_OWNER_LABEL
    stages: Sequence[ProfileStage] = ()
    owner_resolver: OwnerResolver | None = None
    task_type_names: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "task_type_names", dict(self.task_type_names))
        for task_type, name in self.task_type_names.items():
            if not 0 <= task_type <= MAX_TASK_TYPE or not name:
                raise SpecError(
                    f"kernel {self.kernel_name}: task type names need a type in "
                    f"0..{MAX_TASK_TYPE:#x} and a name, got {task_type!r}: {name!r}"
                )
        for key in ("desc_id", "name"):
            seen: dict[object, ProfileStage] = {}
            for stage in self.stages:
                value = getattr(stage, key)
                if value in seen:
                    raise SpecError(
                        f"kernel {self.kernel_name}: stages {seen[value].name!r} and "
                        f"{stage.name!r} share the {key} {value!r}"
                    )
                seen[value] = stage

    @property
    def stage_names(self) -> Mapping[int, str]:
        """Display names by desc id: each stage's, and each named task type's at its
        compute fallback id 0x20000 + type (shown as ``TaskType_<name>``)."""
        names = {DESC_COMPUTE_FALLBACK + t: name for t, name in self.task_type_names.items()}
        names.update((stage.desc_id, stage.name) for stage in self.stages)
        return names

    def desc_ids(self, tasks: np.ndarray) -> np.ndarray:
        """Each task's stage id, 0 where no stage selects it (the device then records the
        fallback 0x20000 + task type). A task two stages select is an error."""
        desc = np.zeros(len(tasks), dtype=np.uint32)
        owner_stage = np.full(len(tasks), -1, dtype=np.int64)
        for index, stage in enumerate(self.stages):
            mask = stage.select(tasks)
            clash = mask & (owner_stage >= 0)
            if clash.any():
                task = int(np.flatnonzero(clash)[0])
                first = self.stages[owner_stage[task]].name
                raise SpecError(
                    f"kernel {self.kernel_name}: task {int(tasks['task_id'][task])} matches "
                    f"both stage {first!r} and stage {stage.name!r} "
                    f"({int(clash.sum())} task(s) match both)"
                )
            owner_stage[mask] = index
            desc[mask] = stage.desc_id
        return desc

    def owner_ids(self, tasks: np.ndarray) -> np.ndarray:
        """Each task's owner id (``NO_OWNER`` everywhere without a resolver)."""
        if self.owner_resolver is None:
            return np.full(len(tasks), NO_OWNER, dtype=np.uint32)
        owners = np.asarray(self.owner_resolver(tasks))
        if owners.shape != (len(tasks),):
            raise SpecError(
                f"kernel {self.kernel_name}: the owner resolver returned shape {owners.shape} "
                f"for {len(tasks)} tasks"
            )
        if owners.size and (owners.min() < 0 or owners.max() > NO_OWNER):
            raise SpecError(
                f"kernel {self.kernel_name}: owner ids must fit in 32 bits without sign"
            )
        return owners.astype(np.uint32)


@dataclass(frozen=True)
class ProfileMetadata:
    """Host-side names attached to a RuntimeConfig: never part of the config's bytes."""

    kernel_name: str = DEFAULT_KERNEL_NAME
    owner_label: str = DEFAULT_OWNER_LABEL
    stage_names: Mapping[int, str] = field(default_factory=dict)
