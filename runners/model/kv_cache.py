"""Allocate the paged KV cache tensors a runner binds to the model."""

from __future__ import annotations

import torch

from interlock.runners.contract import KVCacheSpec
from interlock.runners.model.checkpoint import DTYPES
from interlock.runners.model.config import ModelConfig


def allocate_kv_cache(
    config: ModelConfig,
    spec: KVCacheSpec,
    dtype: str,
    device: str | torch.device,
    num_kv_heads: int | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (k_cache, v_cache), each [num_blocks, block_size, kv_heads, head_dim],
    views of one zeroed allocation. ``num_kv_heads``: this rank's (default: all)."""
    storage = torch.zeros(
        config.num_layers, 2, spec.num_blocks, spec.block_size,
        config.num_kv_heads if num_kv_heads is None else num_kv_heads,
        config.head_dim, dtype=DTYPES[dtype], device=device,
    )
    return [(layer[0], layer[1]) for layer in storage]
