"""Neox rotary embedding applied in place to q and k: one program per token.

Each program loads its position's cos/sin row once and rotates every query
and key head of the token with it. q and k may be strided views (e.g. slices
of a fused qkv projection); only the head dimension must be contiguous.
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
    block_half: int
    num_warps: int


def _launch(max_heads: int, half: int) -> _Launch:
    block_heads = triton.next_power_of_2(max_heads)
    block_half = triton.next_power_of_2(half)
    num_warps = warps_for(block_heads * block_half, 512)
    return _Launch(block_heads, block_half, num_warps)


@triton.jit
def _rotate_heads(base_ptr, head_stride, n_heads, cos, sin,
                  HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < n_heads) & (dims < HALF)
    first = base_ptr + heads * head_stride + dims
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, (x1 * cos - x2 * sin).to(base_ptr.dtype.element_ty), mask=mask)
    tl.store(first + HALF, (x2 * cos + x1 * sin).to(base_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,
    q_ptr,
    q_token_stride,
    q_head_stride,
    n_q_heads,
    k_ptr,
    k_token_stride,
    k_head_stride,
    n_k_heads,
    cos_sin_ptr,
    cos_sin_stride,
    HALF: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    row = cos_sin_ptr + position * cos_sin_stride + dims
    # The reference casts cos/sin to the activation dtype before rotating.
    cos = tl.load(row, mask=dims < HALF, other=0.0).to(q_ptr.dtype.element_ty).to(tl.float32)
    sin = tl.load(row + HALF, mask=dims < HALF, other=0.0).to(q_ptr.dtype.element_ty)
    sin = sin.to(tl.float32)
    _rotate_heads(q_ptr + token * q_token_stride, q_head_stride, n_q_heads, cos, sin,
                  HALF, BLOCK_HEADS, BLOCK_HALF)
    _rotate_heads(k_ptr + token * k_token_stride, k_head_stride, n_k_heads, cos, sin,
                  HALF, BLOCK_HEADS, BLOCK_HALF)


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    for name, t in (("positions", positions), ("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache)):
        unit_stride(name, t)
    half = cos_sin_cache.shape[-1] // 2
    launch = _launch(max(q.shape[1], k.shape[1]), half)
    _rotary_kernel[(q.shape[0],)](
        positions, q, q.stride(0), q.stride(1), q.shape[1], k, k.stride(0), k.stride(1),
        k.shape[1], cos_sin_cache, cos_sin_cache.stride(0),
        HALF=half, BLOCK_HEADS=launch.block_heads, BLOCK_HALF=launch.block_half,
        num_warps=launch.num_warps,
    )
