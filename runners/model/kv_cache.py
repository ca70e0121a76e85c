"""Allocate the paged KV cache tensors a runner binds to the model."""

from __future__ import annotations

import math
import mmap

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
    views of one zeroed allocation. ``num_kv_heads``: this rank's (default: all).

    On the CPU the allocation is an anonymous memory mapping, which the kernel hands out
    zero-filled page by page as blocks are first written: no pass over the whole cache at
    load (377 MB for SmolLM2's 8192-token context in float32), and no resident memory for
    blocks a run never uses. Zeros matter: a decode step reads a padded batch's unused
    slots, and attention gives them weight 0, which NaN garbage would not survive."""
    shape = (
        config.num_layers, 2, spec.num_blocks, spec.block_size,
        config.num_kv_heads if num_kv_heads is None else num_kv_heads, config.head_dim,
    )
    torch_dtype = DTYPES[dtype]
    if torch.device(device).type == "cpu":
        nbytes = math.prod(shape) * torch_dtype.itemsize
        zeros = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        storage = torch.frombuffer(zeros, dtype=torch_dtype).view(shape)
    else:
        storage = torch.zeros(shape, dtype=torch_dtype, device=device)
    return [(layer[0], layer[1]) for layer in storage]
