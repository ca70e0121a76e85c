"""Mixture-of-experts: routing, and the routed SwiGLU experts as grouped GEMMs.

Routing: one program per token (softmax over experts, top-k by repeated
argmax, optional renormalisation).

Experts: the (token, slot) pairs are sorted by expert and cut into tiles of
BLOCK_M rows that each belong to one expert (``tile_groups``). One kernel runs
every tile of every expert: gather the tile's token rows, multiply by the
expert's gate and up projections, apply SwiGLU. A second grouped GEMM applies
the down projection and the routing weight, writing each pair's row; the k
rows of a token are then summed. Grids are sized from shapes alone (an upper
bound on tiles, idle tiles exit), so the whole op needs no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from interlock.kernels.triton.runtime import dot_operands, tile_groups, unit_stride


@dataclass(frozen=True)
class _RouteLaunch:
    block_experts: int
    block_k: int


def _route_launch(n_experts: int, top_k: int) -> _RouteLaunch:
    return _RouteLaunch(triton.next_power_of_2(n_experts), triton.next_power_of_2(top_k))


@dataclass(frozen=True)
class _ExpertsLaunch:
    block_m: int  # (token, slot) rows per tile, all of one expert
    block_n: int
    block_k: int
    num_warps: int


def _experts_launch(n_pairs: int, n_experts: int, dtype: torch.dtype) -> _ExpertsLaunch:
    # Decode batches give each expert a handful of rows: small tiles waste less.
    rows_per_expert = n_pairs / n_experts
    block_m = 16 if rows_per_expert <= 16 else 32 if rows_per_expert <= 64 else 64
    # Sized to compile without register spills on sm_90 (see tests/kernels/gpu_compile.py);
    # float32 dots run without tensor cores and need narrower tiles.
    return _ExpertsLaunch(block_m=block_m, block_n=32 if dtype == torch.float32 else 64,
                          block_k=32, num_warps=4 if block_m == 16 else 8)


@triton.jit
def _route_kernel(
    logits_ptr,
    logits_row_stride,
    weights_ptr,
    ids_ptr,
    n_experts,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_EXPERTS: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_EXPERTS)
    logits = tl.load(logits_ptr + token * logits_row_stride + experts, mask=experts < n_experts,
                     other=float("-inf")).to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, axis=0))
    probs = probs / tl.sum(probs, axis=0)
    remaining = tl.where(experts < n_experts, probs, -1.0)
    slots = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_K], tl.float32)
    ids = tl.zeros([BLOCK_K], tl.int32)
    for i in tl.static_range(TOP_K):
        best = tl.argmax(remaining, axis=0)
        weights = tl.where(slots == i, tl.max(remaining, axis=0), weights)
        ids = tl.where(slots == i, best, ids)
        remaining = tl.where(experts == best, -1.0, remaining)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=0)
    tl.store(weights_ptr + token * TOP_K + slots, weights, mask=slots < TOP_K)
    tl.store(ids_ptr + token * TOP_K + slots, ids.to(tl.int64), mask=slots < TOP_K)


def moe_route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    unit_stride("router_logits", router_logits)
    n_tokens, n_experts = router_logits.shape
    if not 0 < top_k <= n_experts:
        raise ValueError(f"top_k={top_k} must be in 1..{n_experts} (the number of experts)")
    weights = torch.empty((n_tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((n_tokens, top_k), dtype=torch.int64, device=router_logits.device)
    launch = _route_launch(n_experts, top_k)
    _route_kernel[(n_tokens,)](
        router_logits, router_logits.stride(0), weights, ids, n_experts,
        TOP_K=top_k, RENORMALIZE=renormalize, BLOCK_EXPERTS=launch.block_experts,
        BLOCK_K=launch.block_k,
    )
    return weights, ids


@triton.jit
def _gate_up_kernel(
    x_ptr,
    x_row_stride,
    w13_ptr,
    w13_expert_stride,
    w13_row_stride,
    inter_ptr,
    sorted_pairs_ptr,
    tile_expert_ptr,
    n_pairs,
    n_experts,
    hidden,
    intermediate,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    expert = tl.load(tile_expert_ptr + tile).to(tl.int64)
    if expert < n_experts:
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        pairs = tl.load(sorted_pairs_ptr + rows)
        row_valid = pairs < n_pairs
        tokens = (pairs // TOP_K).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_valid = cols < intermediate
        ks = tl.arange(0, BLOCK_K)
        a_ptrs = x_ptr + tokens[:, None] * x_row_stride + ks[None, :]
        # w13[e] is [2I, H] (gate rows then up rows); read transposed [K, N] tiles of both.
        gate_ptrs = (w13_ptr + expert * w13_expert_stride + cols[None, :] * w13_row_stride
                     + ks[:, None])
        up_ptrs = gate_ptrs + intermediate * w13_row_stride
        acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            k_valid = k0 + ks < hidden
            a = tl.load(a_ptrs + k0, mask=row_valid[:, None] & k_valid[None, :], other=0.0)
            b_mask = k_valid[:, None] & col_valid[None, :]
            gate_w = tl.load(gate_ptrs + k0, mask=b_mask, other=0.0)
            up_w = tl.load(up_ptrs + k0, mask=b_mask, other=0.0)
            a = a.to(DOT_DTYPE)
            acc_gate = tl.dot(a, gate_w.to(DOT_DTYPE), acc_gate, input_precision=DOT_PRECISION)
            acc_up = tl.dot(a, up_w.to(DOT_DTYPE), acc_up, input_precision=DOT_PRECISION)
        # Round where the reference materialises tensors in the activation dtype.
        dtype = inter_ptr.dtype.element_ty
        gate = acc_gate.to(dtype).to(tl.float32)
        act = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
        hidden_act = act * acc_up.to(dtype).to(tl.float32)
        tl.store(inter_ptr + rows.to(tl.int64)[:, None] * intermediate + cols[None, :],
                 hidden_act.to(dtype), mask=row_valid[:, None] & col_valid[None, :])


@triton.jit
def _down_kernel(
    inter_ptr,
    w2_ptr,
    w2_expert_stride,
    w2_row_stride,
    topk_weights_ptr,
    pair_out_ptr,
    sorted_pairs_ptr,
    tile_expert_ptr,
    n_pairs,
    n_experts,
    hidden,
    intermediate,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    expert = tl.load(tile_expert_ptr + tile).to(tl.int64)
    if expert < n_experts:
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        pairs = tl.load(sorted_pairs_ptr + rows)
        row_valid = pairs < n_pairs
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_valid = cols < hidden
        ks = tl.arange(0, BLOCK_K)
        a_ptrs = inter_ptr + rows[:, None] * intermediate + ks[None, :]
        # w2[e] is [H, I]: read transposed [K, N] tiles.
        b_ptrs = w2_ptr + expert * w2_expert_stride + cols[None, :] * w2_row_stride + ks[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, intermediate, BLOCK_K):
            k_valid = k0 + ks < intermediate
            a = tl.load(a_ptrs + k0, mask=row_valid[:, None] & k_valid[None, :], other=0.0)
            b = tl.load(b_ptrs + k0, mask=k_valid[:, None] & col_valid[None, :], other=0.0)
            acc = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc, input_precision=DOT_PRECISION)
        dtype = inter_ptr.dtype.element_ty
        weight = tl.load(topk_weights_ptr + pairs, mask=row_valid, other=0.0)
        weighted = acc.to(dtype).to(tl.float32) * weight.to(dtype).to(tl.float32)[:, None]
        tl.store(pair_out_ptr + pairs.to(tl.int64)[:, None] * hidden + cols[None, :], weighted,
                 mask=row_valid[:, None] & col_valid[None, :])


def moe_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    for name, t in (("x", x), ("w13", w13), ("w2", w2)):
        unit_stride(name, t)
    n_tokens, hidden = x.shape
    n_experts, two_inter, _ = w13.shape
    intermediate = two_inter // 2
    top_k = topk_ids.shape[1]
    n_pairs = n_tokens * top_k
    launch = _experts_launch(n_pairs, n_experts, x.dtype)

    # Sort the flat (token * k + slot) pairs by expert, then place each expert's
    # run at the start of its first tile; unused rows hold n_pairs (no pair).
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.zeros(n_experts, dtype=torch.int64, device=x.device)
    counts.scatter_add_(0, flat_ids, torch.ones_like(flat_ids))
    max_tiles = triton.cdiv(n_pairs, launch.block_m) + min(n_experts, n_pairs)
    tile_expert, first_tile = tile_groups(counts, launch.block_m, max_tiles)
    sorted_experts = flat_ids[order]
    expert_start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n_pairs, device=x.device) - expert_start[sorted_experts]
    sorted_pairs = torch.full((max_tiles * launch.block_m,), n_pairs, dtype=torch.int64,
                              device=x.device)
    sorted_pairs.scatter_(0, first_tile[sorted_experts] * launch.block_m + rank, order)

    dot_dtype, dot_precision = dot_operands(x.dtype)
    inter = torch.empty((max_tiles * launch.block_m, intermediate), dtype=x.dtype, device=x.device)
    _gate_up_kernel[(max_tiles, triton.cdiv(intermediate, launch.block_n))](
        x, x.stride(0), w13, w13.stride(0), w13.stride(1), inter, sorted_pairs, tile_expert,
        n_pairs, n_experts, hidden, intermediate,
        TOP_K=top_k, BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, BLOCK_K=launch.block_k,
        DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision, num_warps=launch.num_warps,
    )
    pair_out = torch.empty((n_pairs, hidden), dtype=torch.float32, device=x.device)
    _down_kernel[(max_tiles, triton.cdiv(hidden, launch.block_n))](
        inter, w2, w2.stride(0), w2.stride(1), topk_weights.contiguous(), pair_out, sorted_pairs,
        tile_expert, n_pairs, n_experts, hidden, intermediate,
        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, BLOCK_K=launch.block_k,
        DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision, num_warps=launch.num_warps,
    )
    return pair_out.view(n_tokens, top_k, hidden).sum(dim=1).to(x.dtype)
