"""Per-element and joining ops: the SwiGLU activation, a sum, a concatenation."""

from __future__ import annotations

import torch

from interlock.kernels.reference.contract import torch_op


@torch_op("silu_and_mul")
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] -> [T, I]: silu(gate) * up."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@torch_op("add")
def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y, of one shape (a MoE block's routed and shared experts' outputs)."""
    return x + y


@torch_op("concat")
def concat(parts: list[torch.Tensor]) -> torch.Tensor:
    """[T, D1], [T, D2], ... -> [T, D1 + D2 + ...]: what one attention split point receives
    when its query is computed in parts (a DSA layer's MLA query, indexer query and head
    weights)."""
    return torch.cat(parts, dim=-1)
