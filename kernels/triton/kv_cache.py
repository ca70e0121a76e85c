"""KV-cache store through a slot mapping: one program per token.

Slot -1 marks a padding token (graph replay pads batches with it): its program
loads and stores nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from interlock.kernels.triton.runtime import unit_stride, warps_for


@dataclass(frozen=True)
class _Launch:
    block_heads: int
    block_dim: int
    num_warps: int


def _launch(n_heads: int, head_size: int) -> _Launch:
    block_heads = triton.next_power_of_2(n_heads)
    block_dim = triton.next_power_of_2(head_size)
    num_warps = warps_for(block_heads * block_dim, 1024)
    return _Launch(block_heads, block_dim, num_warps)


@triton.jit
def _store_kv_kernel(
    k_ptr,
    k_token_stride,
    k_head_stride,
    v_ptr,
    v_token_stride,
    v_head_stride,
    k_cache_ptr,
    v_cache_ptr,
    cache_block_stride,
    cache_slot_stride,
    cache_head_stride,
    slot_mapping_ptr,
    n_heads,
    head_size,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    # A padding token (slot -1) moves no heads.
    stored_heads = tl.where(slot >= 0, n_heads, 0)
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    dims = tl.arange(0, BLOCK_DIM)[None, :]
    mask = (heads < stored_heads) & (dims < head_size)
    src_k = k_ptr + token * k_token_stride + heads * k_head_stride + dims
    src_v = v_ptr + token * v_token_stride + heads * v_head_stride + dims
    dst = ((slot // BLOCK_SIZE) * cache_block_stride + (slot % BLOCK_SIZE) * cache_slot_stride
           + heads * cache_head_stride + dims)
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("slot_mapping", slot_mapping)):
        unit_stride(name, t)
    if k_cache.stride() != v_cache.stride():
        raise ValueError(f"k_cache and v_cache strides differ: {k_cache.stride()} vs "
                         f"{v_cache.stride()}")
    _, block_size, n_heads, head_size = k_cache.shape
    launch = _launch(n_heads, head_size)
    _store_kv_kernel[(k.shape[0],)](
        k, k.stride(0), k.stride(1), v, v.stride(0), v.stride(1), k_cache, v_cache,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), slot_mapping, n_heads, head_size,
        BLOCK_SIZE=block_size, BLOCK_HEADS=launch.block_heads, BLOCK_DIM=launch.block_dim,
        num_warps=launch.num_warps,
    )
