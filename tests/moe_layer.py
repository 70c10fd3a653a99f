"""A small MoE layer for the CPU reference kernel: its expert weights and one routed batch,
the same every time (seeded)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multicore_profiler.kernels.reference import make_moe_weights, route

TOKENS, HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 64, 32, 64, 4, 2


@dataclass(frozen=True)
class MoeLayer:
    """``ReferenceMoeKernel(layer.w1, layer.w2)`` runs ``kernel(*layer.batch)``."""

    w1: torch.Tensor
    w2: torch.Tensor
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    """(x, topk_ids, topk_weights)."""


def moe_layer(
    tokens: int = TOKENS, *, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE
) -> MoeLayer:
    """EXPERTS experts of ``hidden`` x ``intermediate`` and ``tokens`` tokens routed TOP_K
    ways."""
    router, w1, w2 = make_moe_weights(
        EXPERTS, hidden, intermediate, generator=torch.Generator().manual_seed(0)
    )
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(1))
    return MoeLayer(w1, w2, (x, *route(x, router, TOP_K)))
