"""Sparse MLA attention: each token attends to the cached positions its indexer chose.

The wrapper folds W_UK into the query and applies W_UV after, as ``mla_decode_attention``
does; the kernel attends in the latent space. One program per (token, tile of query
heads). Every head of a token reads the same latent rows (MLA's keys and values are one
shared row per position), so a program gathers each chosen row once for its whole tile of
heads, split in two column ranges (the value columns, then the rope key) so neither is
padded to the next power of two of their sum (DeepSeek's 512 + 64 would pad to 1024).
Online softmax in float32 over the chosen positions, in chunks; positions marked -1 are
skipped. The grid depends only on shapes, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from interlock.kernels.reference.paged import token_positions
from interlock.kernels.triton.runtime import dot_operands, unit_stride


def _launch(value_dim: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(heads per program, positions per step, warps): the accumulator is [heads, value
    columns] float32, and sized so DeepSeek's 512 value columns do not spill on sm_90 (see
    tests/kernels/gpu_compile.py)."""
    wide = triton.next_power_of_2(value_dim) > 128
    block_n = 16 if wide or dtype == torch.float32 else 32
    return 16, block_n, 8 if wide else 4


@triton.jit
def _sparse_kernel(
    q_ptr,
    q_token_stride,
    q_head_stride,
    cache_ptr,
    cache_block_stride,
    cache_slot_stride,
    block_tables_ptr,
    block_table_stride,
    token_seq_ptr,
    indices_ptr,
    indices_stride,
    out_ptr,
    out_token_stride,
    out_head_stride,
    scale,
    HEADS: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    v = tl.arange(0, BLOCK_V)
    r = tl.arange(0, BLOCK_R)
    head_valid = h < HEADS
    v_valid = v < VALUE_DIM
    r_valid = r < ROPE_DIM
    q_rows = q_ptr + token * q_token_stride + h[:, None] * q_head_stride
    q_value = tl.load(q_rows + v[None, :], mask=head_valid[:, None] & v_valid[None, :], other=0.0)
    q_rope = tl.load(q_rows + VALUE_DIM + r[None, :], mask=head_valid[:, None] & r_valid[None, :],
                     other=0.0)
    q_value = q_value.to(DOT_DTYPE)
    q_rope = q_rope.to(DOT_DTYPE)
    table = block_tables_ptr + tl.load(token_seq_ptr + token) * block_table_stride

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_V], tl.float32)
    for start in range(0, TOP_K, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        pos = tl.load(indices_ptr + token * indices_stride + j, mask=j < TOP_K, other=-1)
        chosen = pos >= 0
        block = tl.load(table + pos // BLOCK_SIZE, mask=chosen, other=0).to(tl.int64)
        rows = cache_ptr + block * cache_block_stride + (pos % BLOCK_SIZE) * cache_slot_stride
        values = tl.load(rows[:, None] + v[None, :], mask=chosen[:, None] & v_valid[None, :],
                         other=0.0).to(DOT_DTYPE)
        rope = tl.load(rows[:, None] + VALUE_DIM + r[None, :],
                       mask=chosen[:, None] & r_valid[None, :], other=0.0).to(DOT_DTYPE)
        scores = tl.dot(q_value, tl.trans(values), input_precision=DOT_PRECISION)
        scores += tl.dot(q_rope, tl.trans(rope), input_precision=DOT_PRECISION)
        scores = tl.where(chosen[None, :], scores * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # A chunk of -1s leaves a row with no score yet: keep it NaN-free.
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), values, input_precision=DOT_PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # no position chosen: zeros
    tl.store(out_ptr + token * out_token_stride + h[:, None] * out_head_stride + v[None, :],
             out.to(out_ptr.dtype.element_ty), mask=head_valid[:, None] & v_valid[None, :])


def sparse_mla_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    kv_b: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    n_tokens, heads, nope = q_nope.shape
    rank = kv_b.shape[2]
    if n_tokens == 0:
        return q_nope.new_empty(0, heads, kv_b.shape[1] - nope)
    unit_stride("cache", cache)
    unit_stride("block_tables", block_tables)
    unit_stride("indices", indices)
    # W_UK folded into the query: [H, T, Dn] x [H, Dn, L].
    q_latent = torch.bmm(q_nope.transpose(0, 1), kv_b[:, :nope]).transpose(0, 1)
    query = torch.cat([q_latent, q_pe], dim=-1)  # [T, H, L + R], contiguous
    rope = query.shape[2] - rank
    attended = torch.empty((n_tokens, heads, rank), dtype=query.dtype, device=query.device)
    seq, _ = token_positions(seq_lens, query_start_loc, n_tokens)
    block_h, block_n, warps = _launch(rank, query.dtype)
    dot_dtype, dot_precision = dot_operands(query.dtype)
    _sparse_kernel[(n_tokens, triton.cdiv(heads, block_h))](
        query, query.stride(0), query.stride(1), cache, cache.stride(0), cache.stride(1),
        block_tables, block_tables.stride(0), seq, indices, indices.stride(0), attended,
        attended.stride(0), attended.stride(1), scale,
        HEADS=heads, VALUE_DIM=rank, ROPE_DIM=rope, TOP_K=indices.shape[1],
        BLOCK_H=block_h, BLOCK_V=max(16, triton.next_power_of_2(rank)),
        BLOCK_R=max(16, triton.next_power_of_2(rope)), BLOCK_SIZE=cache.shape[1],
        BLOCK_N=block_n, DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision, num_warps=warps,
    )
    # W_UV after attention, [T, H, 1, L] x [H, L, Dv]: contiguous [T, H, Dv] (o_proj views it
    # as [T, H * Dv] without a copy, which a native tape could not replay).
    w_uv = kv_b[:, q_nope.shape[2]:].transpose(1, 2)  # [H, L, Dv]
    return torch.matmul(attended[:, :, None, :], w_uv)[:, :, 0]
