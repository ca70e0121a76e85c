"""Allocate the paged KV cache tensors a runner binds to the model."""

from __future__ import annotations

import mmap

import torch

from interlock.runners.contract import KVCacheReport, KVCacheSpec
from interlock.runners.model.cache_spec import (
    elements_per_token,
    layer_caches,
    per_head_elements_per_token,
    pool_slots,
    state_spec,
)
from interlock.runners.model.checkpoint import DTYPES
from interlock.runners.model.config import ModelConfig

#: One layer's cache tensors, in its ``cache_spec.LayerCache`` order: (k, v) for per-head
#: attention, (latent,) for MLA.
LayerTensors = tuple[torch.Tensor, ...]


def allocate_kv_cache(
    config: ModelConfig,
    spec: KVCacheSpec,
    dtype: str,
    device: str | torch.device,
    tensor_parallel_size: int = 1,
) -> list[LayerTensors]:
    """Per layer, the tensors of its ``cache_spec.layer_cache`` on this rank, each
    [num_blocks, block_size, *per-token shape], views of one zeroed allocation.

    On the CPU the allocation is an anonymous memory mapping, which the kernel hands out
    zero-filled page by page as blocks are first written: no pass over the whole cache at
    load (377 MB for SmolLM2's 8192-token context in float32), and no resident memory for
    blocks a run never uses. Zeros matter: a decode step reads a padded batch's unused
    slots, and attention gives them weight 0, which NaN garbage would not survive."""
    layers = layer_caches(config, tensor_parallel_size)
    slots = spec.num_blocks * spec.block_size
    total = slots * sum(layer.elements_per_token for layer in layers)
    torch_dtype = DTYPES[dtype]
    if torch.device(device).type == "cpu":
        zeros = mmap.mmap(-1, total * torch_dtype.itemsize,
                          flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        storage = torch.frombuffer(zeros, dtype=torch_dtype)
    else:
        storage = torch.zeros(total, dtype=torch_dtype, device=device)
    caches: list[LayerTensors] = []
    offset = 0
    for layer in layers:
        tensors = []
        for tensor in layer.tensors:
            size = slots * tensor.elements
            view = storage[offset:offset + size]
            tensors.append(view.view(spec.num_blocks, spec.block_size, *tensor.shape))
            offset += size
        caches.append(tuple(tensors))
    return caches


def kv_cache_report(
    config: ModelConfig, dtype: str, spec: KVCacheSpec, tensor_parallel_size: int = 1,
    max_num_seqs: int = 0,
) -> KVCacheReport:
    """Bytes per token of the cache as allocated, beside what per-head K/V would take; and
    for a model with linear attention, its layers and the recurrent-state pool of
    ``max_num_seqs`` requests."""
    itemsize = DTYPES[dtype].itemsize
    state = state_spec(config, tensor_parallel_size)
    return KVCacheReport(
        layout=("per-head K/V" if config.mla is None else "MLA latent" if config.dsa is None
                else "MLA latent + DSA indexer keys"),
        bytes_per_token=elements_per_token(config, tensor_parallel_size) * itemsize,
        per_head_bytes_per_token=per_head_elements_per_token(config) * itemsize,
        num_blocks=spec.num_blocks,
        block_size=spec.block_size,
        linear_layers=() if state is None else state.layers,
        state_bytes_per_request=0 if state is None else state.bytes_per_slot(itemsize),
        state_slots=0 if state is None else pool_slots(max_num_seqs),
    )
