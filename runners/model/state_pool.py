"""The recurrent-state pool: per-request state of linear-attention layers, beside the paged
KV cache.

The pool has one slot per sequence the engine may run at once (``max_num_seqs``), plus
one scratch slot, the last, which padding rows of a graph step (slot -1) read and write.
The scheduler hands slots out at admission and takes them back when a request finishes or
is preempted (``interlock.runners.batching.scheduler``); the tensors are allocated once here,
so decode graphs capture their addresses.
"""

from __future__ import annotations

import torch

from interlock.runners.model.cache_spec import pool_slots, state_spec
from interlock.runners.model.config import ModelConfig

#: Per linear-attention layer: (convolution window [S, C, K-1], KDA state [S, H, D, D]).
StateTensors = dict[int, tuple[torch.Tensor, torch.Tensor]]


def allocate_state_pool(
    config: ModelConfig, max_num_seqs: int, dtype: str, device: str | torch.device,
    tensor_parallel_size: int = 1,
) -> StateTensors:
    """The zeroed pool of every linear-attention layer on this rank (empty for a model
    without)."""
    spec = state_spec(config, tensor_parallel_size)
    if spec is None:
        return {}
    slots = pool_slots(max_num_seqs)
    return {
        layer: (torch.zeros(slots, *spec.conv, dtype=getattr(torch, dtype), device=device),
                torch.zeros(slots, *spec.recurrent, dtype=torch.float32, device=device))
        for layer in spec.layers
    }
