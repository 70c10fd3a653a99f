"""The CPU reference MegaKernel: a MoE layer forward on host threads, profiled like a device."""

from multicore_profiler.kernels.reference.graph import (
    COMBINE,
    DISPATCH,
    GEMM,
    MOE_SPEC,
    SWIGLU,
    MoeGraph,
    build_moe_graph,
    moe_spec,
)
from multicore_profiler.kernels.reference.moe import (
    ReferenceMoeKernel,
    make_moe_weights,
    moe_reference,
    reference_mega_moe,
    route,
)

__all__ = [
    "COMBINE",
    "DISPATCH",
    "GEMM",
    "MOE_SPEC",
    "SWIGLU",
    "MoeGraph",
    "ReferenceMoeKernel",
    "build_moe_graph",
    "make_moe_weights",
    "moe_reference",
    "moe_spec",
    "reference_mega_moe",
    "route",
]
