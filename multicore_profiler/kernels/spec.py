"""Profile specs: which tasks of a kernel form which stage, and whose work each task is.

A kernel author binds a ``ProfileSpec`` to the kernel's RuntimeConfig builder. Each
``ProfileStage`` names a stage id (the ``desc_id`` its compute records carry) and
selects tasks by task type, tiling position, input position, a range of task ids and a
custom matcher; every selector that is set must match. ``ProfileSpec.from_graph`` makes
the stages of hyper-parallel's newer generation from the compute graph's operators. The
owner resolver maps tasks to owner ids (experts, heads, layers). Selectors work on the
whole task array at once, so a graph of thousands of tasks costs no Python loop per task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from multicore_profiler.abi import (
    DESC_COMPUTE_FALLBACK,
    DESC_GRAPH_STAGE,
    DESC_TERMINATE_TASK,
    MAX_TASK_TYPE,
    NO_OWNER,
    TERMINATE_TASK_TYPE,
    is_stage_desc_id,
)
from multicore_profiler.errors import SpecError

TaskMatcher = Callable[[np.ndarray], np.ndarray]
"""Takes the structured task array, returns one boolean per task."""

OwnerResolver = Callable[[np.ndarray], np.ndarray]
"""Takes the structured task array, returns one owner id per task (``NO_OWNER`` for none)."""

DEFAULT_KERNEL_NAME = "MegaKernel"
DEFAULT_OWNER_LABEL = "Owner"
TERMINATE_STAGE_NAME = "TerminateTask"
"""The name of the stage (``DESC_TERMINATE_TASK``) a spec gives its TerminateTask tasks."""


def fallback_desc_ids(task_types: np.ndarray) -> np.ndarray:
    """The desc id a compute record carries when its task has no stage: 0x20000 + task type."""
    if task_types.size and int(task_types.max()) > MAX_TASK_TYPE:
        raise SpecError(f"task types must be at most {MAX_TASK_TYPE:#x}, got {task_types.max()}")
    return (DESC_COMPUTE_FALLBACK + task_types.astype(np.int64)).astype(np.uint32)


@dataclass(frozen=True)
class ProfileStage:
    """One named stage: the tasks that every set selector matches.

    ``desc_id`` is what the stage's compute records carry: any non-zero 32-bit id but
    the ABI's control ids (0x10000, 0x10006, 0x10007) and fallback ids (0x20000..0x2FFFF).
    ``task_ids`` selects the tasks whose id lies in the range (a graph operator's tasks).
    """

    desc_id: int
    name: str
    task_type: int | None = None
    tiling_position: int | None = None
    input_position: int | None = None
    matcher: TaskMatcher | None = None
    task_ids: range | None = None

    def __post_init__(self) -> None:
        if self.desc_id == DESC_TERMINATE_TASK:
            raise SpecError(
                f"stage {self.name!r}: desc_id {self.desc_id:#x} is the spec's own "
                f"{TERMINATE_STAGE_NAME} stage; set ProfileSpec(terminate_task_type=...) instead"
            )
        if not is_stage_desc_id(self.desc_id):
            raise SpecError(
                f"stage {self.name!r}: desc_id {self.desc_id:#x} is not a stage id; use a "
                "non-zero 32-bit id other than the ABI's control ids 0x10000, 0x10006, 0x10007 "
                "and fallback ids 0x20000..0x2ffff"
            )
        if not self.name:
            raise SpecError(f"stage {self.desc_id:#x} needs a name")
        if self.task_ids is not None and (
            not isinstance(self.task_ids, range) or self.task_ids.step != 1
        ):
            raise SpecError(
                f"stage {self.name!r}: task_ids must be a range of step 1, got {self.task_ids!r}"
            )
        if all(
            s is None
            for s in (
                self.task_type,
                self.tiling_position,
                self.input_position,
                self.matcher,
                self.task_ids,
            )
        ):
            raise SpecError(
                f"stage {self.name!r} selects nothing: set task_type, tiling_position, "
                "input_position, task_ids or matcher"
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
        if self.task_ids is not None:
            ids = tasks["task_id"]
            in_range = (ids >= self.task_ids.start) & (ids < self.task_ids.stop)
            if int(in_range.sum()) != len(self.task_ids):
                raise SpecError(
                    f"stage {self.name!r} ({self.desc_id:#x}) covers task ids "
                    f"{self.task_ids.start}..{self.task_ids.stop - 1}, but the config holds "
                    f"{int(in_range.sum())} of them ({len(tasks)} tasks in all)"
                )
            mask &= in_range
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
class GraphOperator:
    """One operator of a compute graph, as the newer generation of hyper-parallel profiles
    it: its node ``name``, how many tasks it adds (``task_count``) and an optional
    ``diagnostic_name`` that names its stage instead of the CamelCased node name."""

    name: str
    task_count: int
    diagnostic_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise SpecError(f"a graph operator needs a non-empty name, got {self.name!r}")
        if (
            isinstance(self.task_count, bool)
            or not isinstance(self.task_count, int)
            or self.task_count < 0
        ):
            raise SpecError(
                f"graph operator {self.name!r}: task_count must be a non-negative integer, "
                f"got {self.task_count!r}"
            )
        if self.diagnostic_name is not None and (
            not isinstance(self.diagnostic_name, str) or not self.diagnostic_name.strip()
        ):
            raise SpecError(
                f"graph operator {self.name!r}: diagnostic_name must be a non-empty string "
                f"when set, got {self.diagnostic_name!r}"
            )
        if not self.stage_name:
            raise SpecError(
                f"graph operator {self.name!r}: its name has no character to name a stage "
                "with; give it a diagnostic_name"
            )

    @property
    def stage_name(self) -> str:
        """The stage's name: the diagnostic name, else the node name in CamelCase
        (``gate_up_proj`` -> ``GateUpProj``)."""
        if self.diagnostic_name is not None:
            return self.diagnostic_name.strip()
        return "".join(part[:1].upper() + part[1:] for part in self.name.strip().split("_"))


@dataclass(frozen=True)
class ProfileSpec:
    """What a kernel tells the profiler about itself: name, stages, owners and the names of
    its task types (which name the compute records of tasks no stage selects).

    With ``terminate_task_type`` set, the tasks of that type that no stage selects form
    the ``TerminateTask`` stage (``0x10006``, owner none), as hyper-parallel's runtime
    marks its terminate tasks; ``from_graph`` sets it to that runtime's type 0.
    """

    kernel_name: str = DEFAULT_KERNEL_NAME
    owner_label: str = DEFAULT_OWNER_LABEL
    stages: Sequence[ProfileStage] = ()
    owner_resolver: OwnerResolver | None = None
    task_type_names: Mapping[int, str] = field(default_factory=dict)
    terminate_task_type: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "task_type_names", dict(self.task_type_names))
        for task_type, name in self.task_type_names.items():
            if not 0 <= task_type <= MAX_TASK_TYPE or not name:
                raise SpecError(
                    f"kernel {self.kernel_name}: task type names need a type in "
                    f"0..{MAX_TASK_TYPE:#x} and a name, got {task_type!r}: {name!r}"
                )
        if self.terminate_task_type is not None and not (
            0 <= self.terminate_task_type <= MAX_TASK_TYPE
        ):
            raise SpecError(
                f"kernel {self.kernel_name}: terminate_task_type must be a task type in "
                f"0..{MAX_TASK_TYPE:#x}, got {self.terminate_task_type!r}"
            )
        named = [(s.desc_id, s.name) for s in self.stages]
        if self.terminate_task_type is not None:
            named.insert(0, (DESC_TERMINATE_TASK, TERMINATE_STAGE_NAME))
        for position, key in enumerate(("desc_id", "name")):
            seen: dict[object, str] = {}
            for pair in named:
                value, name = pair[position], pair[1]
                if value in seen:
                    raise SpecError(
                        f"kernel {self.kernel_name}: stages {seen[value]!r} and {name!r} "
                        f"share the {key} {value!r}"
                    )
                seen[value] = name

    @classmethod
    def from_graph(
        cls,
        operators: Sequence[GraphOperator],
        *,
        kernel_name: str = DEFAULT_KERNEL_NAME,
        owner_label: str = DEFAULT_OWNER_LABEL,
        owner_resolver: OwnerResolver | None = None,
        task_type_names: Mapping[int, str] | None = None,
        terminate_task_type: int | None = TERMINATE_TASK_TYPE,
    ) -> ProfileSpec:
        """The spec of a kernel built from a compute graph, as hyper-parallel's newer
        generation profiles one: ``operators`` in topological order, the k-th owning the
        next ``task_count`` task ids as stage ``0x30000 + k``, named by its ``stage_name``.
        Tasks of ``terminate_task_type`` outside the graph are the TerminateTask stage."""
        stages = []
        first = 0
        named: dict[str, GraphOperator] = {}
        for k, operator in enumerate(operators):
            if not isinstance(operator, GraphOperator):
                raise SpecError(
                    f"kernel {kernel_name}: graph operator {k} must be a GraphOperator, "
                    f"got {type(operator).__name__}"
                )
            name = operator.stage_name
            if name in named:
                raise SpecError(
                    f"kernel {kernel_name}: graph operators {named[name].name!r} and "
                    f"{operator.name!r} both name a stage {name!r}; give one a diagnostic_name"
                )
            named[name] = operator
            task_ids = range(first, first + operator.task_count)
            stages.append(ProfileStage(DESC_GRAPH_STAGE + k, name, task_ids=task_ids))
            first = task_ids.stop
        return cls(
            kernel_name=kernel_name,
            owner_label=owner_label,
            stages=stages,
            owner_resolver=owner_resolver,
            task_type_names=task_type_names or {},
            terminate_task_type=terminate_task_type,
        )

    @property
    def stage_names(self) -> Mapping[int, str]:
        """Display names by desc id: each stage's, TerminateTask's where the spec has that
        stage, and each named task type's at its compute fallback id 0x20000 + type (shown
        as ``TaskType_<name>``)."""
        names = {DESC_COMPUTE_FALLBACK + t: name for t, name in self.task_type_names.items()}
        names.update((stage.desc_id, stage.name) for stage in self.stages)
        if self.terminate_task_type is not None:
            names[DESC_TERMINATE_TASK] = TERMINATE_STAGE_NAME
        return names

    def _stage_of(self, tasks: np.ndarray) -> np.ndarray:
        """Each task's stage: its index in ``stages``, ``len(stages)`` for TerminateTask,
        -1 for none. A task two stages select is an error."""
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
        if self.terminate_task_type is not None:
            terminate = (owner_stage < 0) & (tasks["task_type"] == self.terminate_task_type)
            owner_stage[terminate] = len(self.stages)
        return owner_stage

    def desc_ids(self, tasks: np.ndarray) -> np.ndarray:
        """Each task's stage id (0x10006 for the TerminateTask stage), 0 where no stage
        selects it (the device then records the fallback 0x20000 + task type). A task two
        stages select is an error."""
        ids = [stage.desc_id for stage in self.stages] + [DESC_TERMINATE_TASK, 0]
        return np.array(ids, dtype=np.uint32)[self._stage_of(tasks)]

    def owner_ids(self, tasks: np.ndarray) -> np.ndarray:
        """Each task's owner id (``NO_OWNER`` everywhere without a resolver, and for the
        TerminateTask stage's tasks)."""
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
        owners = owners.astype(np.uint32)
        if self.terminate_task_type is not None:
            owners[self._stage_of(tasks) == len(self.stages)] = NO_OWNER
        return owners


@dataclass(frozen=True)
class ProfileMetadata:
    """Host-side names attached to a RuntimeConfig: never part of the config's bytes."""

    kernel_name: str = DEFAULT_KERNEL_NAME
    owner_label: str = DEFAULT_OWNER_LABEL
    stage_names: Mapping[int, str] = field(default_factory=dict)
