"""The DSA lightning indexer: index scores over the paged index-key cache, then top-k.

Two kernels, both with grids and buffers sized by shapes alone (no host sync), so a
decode step captures in a CUDA graph with a fixed k:

1. scores: one program per (token, tile of positions). It gathers the tile's index keys
   through the block table once for all indexer heads (one ``tl.dot`` of [heads, dim] x
   [dim, tile]), applies relu and the per-head weights, and writes float32 scores for the
   positions the token may see, as integers in the same order as the float32 scores;
   tiles wholly past its position exit at once.
2. top-k: one program per token, a radix select over its visible scores, read as
   unsigned 32-bit keys; four passes of 8-bit histograms fix the k-th
   largest key digit by digit, then one pass writes the positions above it, and the first
   of those equal to it, in ascending position order. Five reads of the row, whatever k.
   The lower of equal scores wins, as in CUDA's ``torch.topk`` (the reference's rule on a
   GPU; on the CPU, the interpreter included, the reference follows the CPU's instead).

The scores buffer is [T, positions in the block table]: what one batch's tokens can see.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from interlock.kernels.reference.paged import token_positions
from interlock.kernels.triton.runtime import dot_operands, unit_stride


def _score_launch(head_dim: int, dtype: torch.dtype) -> tuple[int, int]:
    """(positions per scoring program, warps): float32 keys run without tensor cores and
    take a narrower tile, so the keys of 128 dimensions do not spill on sm_90 (see
    tests/kernels/gpu_compile.py)."""
    wide = head_dim > 64
    if dtype == torch.float32:
        return (32 if wide else 64), 8
    return 64, (8 if wide else 4)


SELECT_TILE = 1024
"""Scores per step of the top-k passes."""


@triton.jit
def _scores_kernel(
    q_ptr,
    q_token_stride,
    q_head_stride,
    weights_ptr,
    weights_token_stride,
    cache_ptr,
    cache_block_stride,
    cache_slot_stride,
    block_tables_ptr,
    block_table_stride,
    token_seq_ptr,
    token_pos_ptr,
    scores_ptr,
    scores_stride,
    scale,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * BLOCK_N
    position = tl.load(token_pos_ptr + token)
    if first <= position:
        seq = tl.load(token_seq_ptr + token)
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        head_valid = h < HEADS
        dim_valid = d < HEAD_DIM
        q = tl.load(q_ptr + token * q_token_stride + h[:, None] * q_head_stride + d[None, :],
                    mask=head_valid[:, None] & dim_valid[None, :], other=0.0)
        w = tl.load(weights_ptr + token * weights_token_stride + h, mask=head_valid,
                    other=0.0).to(tl.float32)
        pos = first + tl.arange(0, BLOCK_N)
        visible = pos <= position
        block = tl.load(block_tables_ptr + seq * block_table_stride + pos // BLOCK_SIZE,
                        mask=visible, other=0).to(tl.int64)
        rows = block * cache_block_stride + (pos % BLOCK_SIZE) * cache_slot_stride
        k = tl.load(cache_ptr + rows[:, None] + d[None, :],
                    mask=visible[:, None] & dim_valid[None, :], other=0.0)
        dots = tl.dot(q.to(DOT_DTYPE), tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION)
        score = tl.sum(w[:, None] * tl.maximum(dots * scale, 0.0), axis=0)
        # Stored as int32 in the scores' order (-0.0 as 0.0): the bits of a negative score
        # but its sign flipped, so the top-k compares integers.
        bits = tl.where(score == 0.0, 0.0, score).to(tl.int32, bitcast=True)
        tl.store(scores_ptr + token * scores_stride + pos, bits ^ ((bits >> 31) & 0x7FFFFFFF),
                 mask=visible)


@triton.jit
def _topk_kernel(
    scores_ptr,
    scores_stride,
    token_pos_ptr,
    out_ptr,
    out_stride,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    OFFSET: tl.constexpr = 2147483648  # ordered int32 -> unsigned 32-bit keys, as int64
    token = tl.program_id(0).to(tl.int64)
    visible = tl.load(token_pos_ptr + token) + 1  # positions 0 .. position
    row = scores_ptr + token * scores_stride
    wanted = tl.minimum(visible, TOP_K)
    if wanted > 0:
        bins = tl.arange(0, 256)
        prefix = tl.zeros([], tl.int64)  # the k-th largest key, digit by digit
        remaining = wanted  # of the keys that match the prefix, how many to take
        for step in tl.static_range(4):
            shift = 24 - 8 * step
            hist = tl.zeros([256], tl.int32)
            for start in range(0, visible, BLOCK_N):
                pos = start + tl.arange(0, BLOCK_N)
                valid = pos < visible
                key = tl.load(row + pos, mask=valid, other=0).to(tl.int64) + OFFSET
                match = valid & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
                hist += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=match)
            # Keys in bins above b, and at or above b: the digit is the highest bin whose
            # count at or above reaches what remains to take.
            above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0)
            digit = tl.max(tl.where(above + hist >= remaining, bins, 0), axis=0)
            remaining -= tl.sum(tl.where(bins == digit, above, 0), axis=0)
            prefix += digit.to(tl.int64) << shift
        written = 0
        ties = 0
        for start in range(0, visible, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            valid = pos < visible
            key = tl.load(row + pos, mask=valid, other=0).to(tl.int64) + OFFSET
            tie = valid & (key == prefix)
            tie_rank = ties + tl.cumsum(tie.to(tl.int32), axis=0) - 1
            take = (valid & (key > prefix)) | (tie & (tie_rank < remaining))
            slot = written + tl.cumsum(take.to(tl.int32), axis=0) - 1
            tl.store(out_ptr + token * out_stride + slot, pos.to(tl.int32), mask=take)
            written += tl.sum(take.to(tl.int32), axis=0)
            ties += tl.sum(tie.to(tl.int32), axis=0)


def dsa_index_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    top_k: int,
) -> torch.Tensor:
    n_tokens, heads, head_dim = q.shape
    block_size = index_cache.shape[1]
    width = block_tables.shape[1] * block_size
    out = torch.full((n_tokens, top_k), -1, dtype=torch.int32, device=q.device)
    if n_tokens == 0 or width == 0:
        return out
    unit_stride("q", q)
    unit_stride("weights", weights)
    unit_stride("index_cache", index_cache)
    unit_stride("block_tables", block_tables)
    seq, position = token_positions(seq_lens, query_start_loc, n_tokens)
    scores = torch.empty((n_tokens, width), dtype=torch.int32, device=q.device)
    dot_dtype, dot_precision = dot_operands(q.dtype)
    block_n, warps = _score_launch(head_dim, q.dtype)
    _scores_kernel[(n_tokens, triton.cdiv(width, block_n))](
        q, q.stride(0), q.stride(1), weights, weights.stride(0), index_cache,
        index_cache.stride(0), index_cache.stride(1), block_tables, block_tables.stride(0),
        seq, position, scores, scores.stride(0), scale,
        HEADS=heads, HEAD_DIM=head_dim, BLOCK_H=max(16, triton.next_power_of_2(heads)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_SIZE=block_size,
        BLOCK_N=block_n, DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision, num_warps=warps,
    )
    _topk_kernel[(n_tokens,)](
        scores, scores.stride(0), position, out, out.stride(0), TOP_K=top_k,
        BLOCK_N=SELECT_TILE, num_warps=4,
    )
    return out
