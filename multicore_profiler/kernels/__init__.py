"""What a concrete MegaKernel provides to the profiler.

``ProfileSpec`` / ``ProfileStage`` name its stages and owners (``GraphOperator`` the
operators of a compute graph, for ``ProfileSpec.from_graph``); ``build_runtime_config``
applies them to its task graph and plans the profile buffer; every launch goes
through ``prepare_call``; a ``Backend`` says where it runs. ``kernels.reference``
holds the CPU reference MegaKernel. Nothing here knows of the store.

The names are imported on first use: the synthetic kernel (``kernels.synthetic``) and the
specs (``kernels.spec``) load no torch, which a backend and the launch hook need.
"""

from typing import TYPE_CHECKING

from multicore_profiler.extension import names_on_first_use

if TYPE_CHECKING:
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

__getattr__, __dir__ = names_on_first_use(
    __name__,
    {
        "Backend": "multicore_profiler.kernels.backend",
        "CpuBackend": "multicore_profiler.kernels.backend",
        "PreparedCall": "multicore_profiler.kernels.runtime",
        "RuntimeConfig": "multicore_profiler.kernels.runtime",
        "build_runtime_config": "multicore_profiler.kernels.runtime",
        "new_tasks": "multicore_profiler.kernels.runtime",
        "prepare_call": "multicore_profiler.kernels.runtime",
        "GraphOperator": "multicore_profiler.kernels.spec",
        "ProfileMetadata": "multicore_profiler.kernels.spec",
        "ProfileSpec": "multicore_profiler.kernels.spec",
        "ProfileStage": "multicore_profiler.kernels.spec",
    },
)
