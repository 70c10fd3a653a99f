"""The task graph and profile spec of the CPU reference MoE MegaKernel.

Per expert ``e`` and tile ``j``: Dispatch -> GMM1 -> SwiGLU -> GMM2, chained by one
event each (``DISP[e, j]``, ``G1[e, j]``, ``SW[e, j]``); every GMM2 triggers the shared
event ``DONE``, on which each Combine task (one per token tile) waits for all of them.
The graph depends only on the expert count, the tiles per expert and the number of
token tiles; which rows a tile covers is data and is left to the launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from multicore_profiler.abi import NO_OWNER, CoreType
from multicore_profiler.errors import ConfigError
from multicore_profiler.kernels.runtime import new_tasks
from multicore_profiler.kernels.spec import ProfileSpec, ProfileStage

DISPATCH = 0
GEMM = 1
SWIGLU = 2
COMBINE = 3

GMM1_TILING, GMM2_TILING = 0, 1
"""``tiling_position`` of the two GEMMs of an expert."""
W1_INPUT, W2_INPUT = 3, 4
"""``input_position`` of each GEMM's weight among the op's inputs (x, ids, weights, w1, w2)."""

STAGE_DISPATCH, STAGE_GMM1, STAGE_SWIGLU, STAGE_GMM2, STAGE_COMBINE = 1, 2, 3, 4, 5


@dataclass(frozen=True)
class MoeGraph:
    """A built graph: the task descriptors and the number of events they use."""

    tasks: np.ndarray
    event_count: int


def build_moe_graph(experts: int, tiles_per_expert: int, token_tiles: int) -> MoeGraph:
    """The tasks of one MoE layer launch, in order: all Dispatch, GMM1, SwiGLU, GMM2
    (each expert-major, tile-minor), then Combine.

    ``args`` are ``[expert, tile, 0, 0]`` for the per-expert tasks and
    ``[token_tile, 0, 0, 0]`` for Combine.
    """
    if experts < 1 or tiles_per_expert < 1 or token_tiles < 1:
        raise ConfigError(
            f"a MoE graph needs at least one expert, tile and token tile, got experts={experts}, "
            f"tiles_per_expert={tiles_per_expert}, token_tiles={token_tiles}"
        )
    pairs = experts * tiles_per_expert
    done = 3 * pairs
    tasks = new_tasks(4 * pairs + token_tiles)
    pair = np.arange(pairs)
    stages = (
        # task_type, core, tiling, input, wait event base, trigger event base
        (DISPATCH, CoreType.AIV, 0, 0, None, 0),
        (GEMM, CoreType.AIC, GMM1_TILING, W1_INPUT, 0, pairs),
        (SWIGLU, CoreType.AIV, 0, 0, pairs, 2 * pairs),
        (GEMM, CoreType.AIC, GMM2_TILING, W2_INPUT, 2 * pairs, None),
    )
    for index, (task_type, core, tiling, position, waits, triggers) in enumerate(stages):
        block = tasks[index * pairs : (index + 1) * pairs]
        block["task_type"] = task_type
        block["core_type"] = core
        block["tiling_position"] = tiling
        block["input_position"] = position
        block["args"][:, 0] = pair // tiles_per_expert
        block["args"][:, 1] = pair % tiles_per_expert
        if waits is not None:
            block["wait_event"] = waits + pair
            block["wait_count"] = 1
        block["trigger_event"] = done if triggers is None else triggers + pair
    combine = tasks[4 * pairs :]
    combine["task_type"] = COMBINE
    combine["core_type"] = CoreType.AIV
    combine["args"][:, 0] = np.arange(token_tiles)
    combine["wait_event"] = done
    combine["wait_count"] = pairs
    return MoeGraph(tasks=tasks, event_count=done + 1)


def moe_spec(expert_offset: int = 0) -> ProfileSpec:
    """The reference kernel's stages, with owners = global expert ids.

    ``expert_offset`` is the global id of this instance's first expert (expert
    parallelism); Combine works for all experts and has no owner.
    """

    def owners(tasks: np.ndarray) -> np.ndarray:
        expert = tasks["args"][:, 0].astype(np.int64) + expert_offset
        return np.where(tasks["task_type"] == COMBINE, NO_OWNER, expert)

    return ProfileSpec(
        kernel_name="ReferenceMegaMoe",
        owner_label="Expert",
        stages=[
            ProfileStage(STAGE_DISPATCH, "Dispatch", task_type=DISPATCH),
            ProfileStage(STAGE_GMM1, "GMM1", task_type=GEMM, tiling_position=GMM1_TILING),
            ProfileStage(STAGE_SWIGLU, "SwiGLU", task_type=SWIGLU),
            ProfileStage(STAGE_GMM2, "GMM2", task_type=GEMM, tiling_position=GMM2_TILING),
            ProfileStage(STAGE_COMBINE, "Combine", task_type=COMBINE),
        ],
        owner_resolver=owners,
    )


MOE_SPEC = moe_spec(0)
