"""Multi-head latent attention over the paged latent cache (its store and decode), and
DeepSeek routing.

Store: one program per token writes its latent then its rotary key into its slot; a
padding token (slot -1) writes nothing. No host sync, so it is captured in CUDA graphs.

Decode (absorbed form): W_UK is folded into the query and W_UV applied to the attended
latent with batched GEMMs around the kernel; the kernel attends each head's query over the
shared latent cache [NB, BS, L + R]. One program per (sequence, tile of heads): every cache
block is read once for the tile, scored against the latent part and the rotary part
separately (each padded to its own power of two, as L + R rarely is one), with an online
softmax in float32, and the attended latent accumulates over the latent part only. The grid
depends only on shapes (no host sync), so it can be captured in a CUDA graph.

Routing: one program per token: scores, the group choice (a static loop over the groups),
top-k by repeated argmax, renormalisation and scaling, as ``reference.moe_grouped_route``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from interlock.kernels.triton.runtime import dot_operands, unit_stride


@dataclass(frozen=True)
class _DecodeLaunch:
    block_h: int  # heads per program, padded to a tensor-core tile
    block_l: int  # latent features, padded to a power of two
    block_r: int  # rotary features, padded to a power of two
    block_n: int  # cache tokens per loop step
    num_warps: int


def _decode_launch(heads: int, rank: int, rope: int) -> _DecodeLaunch:
    block_l = max(16, triton.next_power_of_2(rank))
    return _DecodeLaunch(
        block_h=min(64, max(16, triton.next_power_of_2(heads))),
        block_l=block_l,
        block_r=max(16, triton.next_power_of_2(rope)),
        # The latent tile [BLOCK_N, BLOCK_L] is the largest operand: keep it near 32 KiB.
        block_n=max(16, min(64, 8192 // block_l)),
        num_warps=8 if block_l >= 256 else 4,
    )


@triton.jit
def _mla_decode_kernel(
    q_ptr,
    q_seq_stride,
    q_head_stride,
    cache_ptr,
    cache_block_stride,
    cache_slot_stride,
    block_tables_ptr,
    block_table_stride,
    seq_lens_ptr,
    out_ptr,
    out_seq_stride,
    out_head_stride,
    scale,
    n_heads,
    RANK: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    lat = tl.arange(0, BLOCK_L)
    rot = tl.arange(0, BLOCK_R)
    head_valid = heads < n_heads
    q_rows = q_ptr + seq * q_seq_stride + heads[:, None] * q_head_stride
    q_lat = tl.load(q_rows + lat[None, :], mask=head_valid[:, None] & (lat[None, :] < RANK),
                    other=0.0).to(DOT_DTYPE)
    q_rot = tl.load(q_rows + RANK + rot[None, :],
                    mask=head_valid[:, None] & (rot[None, :] < ROPE), other=0.0).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_L], tl.float32)
    table = block_tables_ptr + seq * block_table_stride
    for start in range(0, seq_len, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < seq_len
        block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        rows = cache_ptr + block * cache_block_stride + (pos % BLOCK_SIZE) * cache_slot_stride
        c = tl.load(rows[:, None] + lat[None, :], mask=valid[:, None] & (lat[None, :] < RANK),
                    other=0.0).to(DOT_DTYPE)
        k_pe = tl.load(rows[:, None] + RANK + rot[None, :],
                       mask=valid[:, None] & (rot[None, :] < ROPE), other=0.0).to(DOT_DTYPE)
        scores = tl.dot(q_lat, tl.trans(c), input_precision=DOT_PRECISION)
        scores += tl.dot(q_rot, tl.trans(k_pe), input_precision=DOT_PRECISION)
        scores = tl.where(valid[None, :], scores * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), c, input_precision=DOT_PRECISION)
        m_i = m_new
    # A padding sequence (seq_len 0) has acc = 0 and gives zeros, as in the reference.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + seq * out_seq_stride + heads[:, None] * out_head_stride + lat[None, :],
             out.to(out_ptr.dtype.element_ty),
             mask=head_valid[:, None] & (lat[None, :] < RANK))


def mla_decode_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    kv_b: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    unit_stride("cache", cache)
    unit_stride("block_tables", block_tables)
    batch, heads, nope = q_nope.shape
    rank = kv_b.shape[2]
    rope = q_pe.shape[2]
    # W_UK folded into the query: [H, B, Dn] x [H, Dn, L].
    q_latent = torch.bmm(q_nope.transpose(0, 1), kv_b[:, :nope]).transpose(0, 1)
    query = torch.cat([q_latent, q_pe], dim=-1)  # [B, H, L + R], contiguous
    launch = _decode_launch(heads, rank, rope)
    dot_dtype, dot_precision = dot_operands(query.dtype)
    attended = torch.empty(batch, heads, rank, dtype=query.dtype, device=query.device)
    _mla_decode_kernel[(batch, triton.cdiv(heads, launch.block_h))](
        query, query.stride(0), query.stride(1), cache, cache.stride(0), cache.stride(1),
        block_tables, block_tables.stride(0), seq_lens, attended, attended.stride(0),
        attended.stride(1), scale, heads,
        RANK=rank, ROPE=rope, BLOCK_SIZE=cache.shape[1], BLOCK_H=launch.block_h,
        BLOCK_L=launch.block_l, BLOCK_R=launch.block_r, BLOCK_N=launch.block_n,
        DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision, num_warps=launch.num_warps,
    )
    # W_UV after attention: [H, B, L] x [H, L, Dv].
    return torch.bmm(attended.transpose(0, 1), kv_b[:, nope:].transpose(1, 2)).transpose(0, 1)


@triton.jit
def _store_latent_kernel(
    latent_ptr,
    latent_stride,
    k_pe_ptr,
    k_pe_stride,
    cache_ptr,
    cache_block_stride,
    cache_slot_stride,
    slot_mapping_ptr,
    RANK: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    # A padding token (slot -1) moves nothing.
    latent_count = tl.where(slot >= 0, RANK, 0)
    rope_count = tl.where(slot >= 0, ROPE, 0)
    dst = cache_ptr + (slot // BLOCK_SIZE) * cache_block_stride + (slot % BLOCK_SIZE) * (
        cache_slot_stride)
    lat = tl.arange(0, BLOCK_L)
    lat_mask = lat < latent_count
    values = tl.load(latent_ptr + token * latent_stride + lat, mask=lat_mask)
    tl.store(dst + lat, values.to(cache_ptr.dtype.element_ty), mask=lat_mask)
    rot = tl.arange(0, BLOCK_R)
    rot_mask = rot < rope_count
    values = tl.load(k_pe_ptr + token * k_pe_stride + rot, mask=rot_mask)
    tl.store(dst + RANK + rot, values.to(cache_ptr.dtype.element_ty), mask=rot_mask)


def store_latent_cache(
    latent: torch.Tensor, k_pe: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    for name, t in (("latent", latent), ("k_pe", k_pe), ("cache", cache),
                    ("slot_mapping", slot_mapping)):
        unit_stride(name, t)
    rank, rope = latent.shape[1], k_pe.shape[1]
    if cache.shape[2] != rank + rope:
        raise ValueError(f"store_latent_cache: cache {tuple(cache.shape)} for latents of "
                         f"{rank} and rotary keys of {rope}")
    if latent.shape[0] == 0:
        return
    _store_latent_kernel[(latent.shape[0],)](
        latent, latent.stride(0), k_pe, k_pe.stride(0), cache, cache.stride(0),
        cache.stride(1), slot_mapping, RANK=rank, ROPE=rope, BLOCK_SIZE=cache.shape[1],
        BLOCK_L=triton.next_power_of_2(rank), BLOCK_R=triton.next_power_of_2(rope),
    )


_SCORING = {"softmax": 0, "sigmoid": 1}
_METHODS = {"greedy": 0, "group_limited_greedy": 1, "noaux_tc": 2}


@triton.jit
def _grouped_route_kernel(
    logits_ptr,
    logits_row_stride,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    n_experts,
    scaling,
    TOP_K: tl.constexpr,
    SCORING: tl.constexpr,
    METHOD: tl.constexpr,
    N_GROUP: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_EXPERTS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_GROUPS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_EXPERTS)
    present = experts < n_experts
    logits = tl.load(logits_ptr + token * logits_row_stride + experts, mask=present,
                     other=float("-inf")).to(tl.float32)
    if SCORING == 0:
        scores = tl.exp(logits - tl.max(logits, axis=0))
        scores = scores / tl.sum(scores, axis=0)
    else:
        scores = 1.0 / (1.0 + tl.exp(-logits))
    choice = scores
    if HAS_BIAS and METHOD == 2:  # only noaux_tc chooses with the bias, as the reference
        choice = choice + tl.load(bias_ptr + experts, mask=present, other=0.0).to(tl.float32)
    # Absent experts (past n_experts) are never chosen.
    choice = tl.where(present, choice, float("-inf"))
    if METHOD != 0:
        size = n_experts // N_GROUP
        group_of = experts // size
        slots = tl.arange(0, BLOCK_GROUPS)
        group_scores = tl.full([BLOCK_GROUPS], float("-inf"), tl.float32)
        for g in tl.static_range(N_GROUP):
            members = tl.where(present & (group_of == g), choice, float("-inf"))
            best = tl.max(members, axis=0)
            if METHOD == 2:  # the two best of the group
                second = tl.where(experts == tl.argmax(members, axis=0), float("-inf"), members)
                best = best + tl.max(second, axis=0)
            group_scores = tl.where(slots == g, best, group_scores)
        keep = experts < 0  # no group kept yet
        for _ in tl.static_range(TOPK_GROUP):
            chosen = tl.argmax(group_scores, axis=0)
            keep = keep | (group_of == chosen)
            group_scores = tl.where(slots == chosen, float("-inf"), group_scores)
        # Like the reference: noaux_tc leaves the other groups out, group_limited_greedy
        # scores them 0.
        fill = float("-inf") if METHOD == 2 else 0.0
        choice = tl.where(present & keep, choice, tl.where(present, fill, float("-inf")))
    k_slots = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_K], tl.float32)
    ids = tl.zeros([BLOCK_K], tl.int32)
    for i in tl.static_range(TOP_K):
        best = tl.argmax(choice, axis=0)
        weight = tl.sum(tl.where(experts == best, scores, 0.0), axis=0)
        weights = tl.where(k_slots == i, weight, weights)
        ids = tl.where(k_slots == i, best, ids)
        choice = tl.where(experts == best, float("-inf"), choice)
    if RENORMALIZE:
        weights = weights / (tl.sum(weights, axis=0) + 1e-20)
    weights = weights * scaling
    tl.store(weights_ptr + token * TOP_K + k_slots, weights, mask=k_slots < TOP_K)
    tl.store(ids_ptr + token * TOP_K + k_slots, ids.to(tl.int64), mask=k_slots < TOP_K)


def moe_grouped_route(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    scoring: str,
    method: str,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    unit_stride("router_logits", router_logits)
    if scoring not in _SCORING or method not in _METHODS:
        raise ValueError(f"moe_grouped_route: scoring {scoring!r} / method {method!r} unknown")
    tokens, n_experts = router_logits.shape
    device = router_logits.device
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=device)
    if tokens == 0:
        return weights, ids
    groups = n_group if method != "greedy" else 1
    _grouped_route_kernel[(tokens,)](
        router_logits, router_logits.stride(0),
        weights if correction_bias is None else correction_bias, weights, ids, n_experts,
        float(scaling), TOP_K=top_k, SCORING=_SCORING[scoring], METHOD=_METHODS[method],
        N_GROUP=groups, TOPK_GROUP=topk_group if method != "greedy" else 1,
        HAS_BIAS=correction_bias is not None, RENORMALIZE=renormalize,
        BLOCK_EXPERTS=triton.next_power_of_2(n_experts),
        BLOCK_K=triton.next_power_of_2(top_k), BLOCK_GROUPS=triton.next_power_of_2(groups),
    )
    return weights, ids
