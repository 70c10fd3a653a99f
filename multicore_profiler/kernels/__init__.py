"""What a concrete MegaKernel provides to the profiler.

``ProfileSpec`` / ``ProfileStage`` name its stages and owners (``GraphOperator`` the
operators of a compute graph, for ``ProfileSpec.from_graph``); ``build_runtime_config``
applies them to its task graph and plans the profile buffer; every launch goes
through ``prepare_call``; a ``Backend`` says where it runs. ``kernels.reference``
holds the CPU reference MegaKernel. Nothing here knows of the store.
"""

from multicore_profiler.kernels.backend import Backend, CpuBackend
from multicore_profiler.kernels.runtime import (
    PreparedCall,
    RuntimeConfig,
    build_runtime_config,
    new_tasks,
    prepare_call,
)
from multicore_profiler.kernels.spec import (
    GraphOperator,
    ProfileMetadata,
    ProfileSpec,
    ProfileStage,
)

__all__ = [
    "Backend",
    "CpuBackend",
    "GraphOperator",
    "PreparedCall",
    "ProfileMetadata",
    "ProfileSpec",
    "ProfileStage",
    "RuntimeConfig",
    "build_runtime_config",
    "new_tasks",
    "prepare_call",
]
