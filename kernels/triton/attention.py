"""Attention over the paged KV cache.

Decode: one program per (sequence, KV head, context partition). The program
loads the group of query heads that share the KV head, so every cache block
is read once per group (GQA), and walks its partition of the context with an
online softmax in float32. Long contexts are split into partitions (flash
decoding) so small batches still occupy the whole GPU; a second kernel merges
the partitions. Grid and buffers depend only on shapes, so it can be captured
in a CUDA graph.

Prefill (mixed batches): one program per (tile of a sequence's new tokens,
query head), causal within the sequence, same online softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from interlock.kernels.triton.runtime import dot_operands, tile_groups, unit_stride

PARTITION_TOKENS = 512
"""Context tokens per decode program; contexts up to this long take one pass, no merge."""


def _head_block(head_size: int) -> int:
    """Head dimension padded to a power of two of at least one tensor-core tile (16)."""
    return max(16, triton.next_power_of_2(head_size))


@dataclass(frozen=True)
class _DecodeLaunch:
    block_group: int  # query heads of one KV head, padded to a tensor-core tile
    block_d: int
    block_n: int  # cache tokens per loop step
    partitions: int
    num_warps: int


def _decode_launch(group: int, head_size: int, max_context: int) -> _DecodeLaunch:
    # 8 KiB of bf16 keys per step; 8 warps keep the gathered addresses in registers
    # without spills on sm_90 (see tests/kernels/gpu_compile.py).
    block_d = _head_block(head_size)
    return _DecodeLaunch(
        block_group=max(16, triton.next_power_of_2(group)),
        block_d=block_d,
        block_n=64 if block_d <= 64 else 32,
        partitions=max(1, triton.cdiv(max_context, PARTITION_TOKENS)),
        num_warps=8,
    )


@dataclass(frozen=True)
class _PrefillLaunch:
    block_m: int  # new tokens per program
    block_d: int
    block_n: int  # cache tokens per loop step
    num_warps: int


def _prefill_launch(head_size: int, dtype: torch.dtype) -> _PrefillLaunch:
    # float32 dots run without tensor cores and need narrower key tiles to avoid spills.
    wide = dtype != torch.float32
    block_d = _head_block(head_size)
    return _PrefillLaunch(block_m=64, block_d=block_d, block_n=64 if wide else 32,
                          num_warps=4 if wide and block_d <= 64 else 8)


@triton.jit
def _key_scores(q, table, start, hi, kv_head, d, dim_valid, k_cache_ptr, cache_block_stride,
                cache_slot_stride, cache_head_stride, scale, BLOCK_SIZE: tl.constexpr,
                BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The step of a sequence's cache from ``start`` (block table ``table``): its positions,
    which of them are below ``hi``, their rows in the cache, the rows' mask, and the scaled
    scores of ``q`` against their keys (decode and prefill alike)."""
    pos = start + tl.arange(0, BLOCK_N)
    valid = pos < hi
    block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    rows = (block * cache_block_stride + (pos % BLOCK_SIZE) * cache_slot_stride
            + kv_head * cache_head_stride)
    kv_mask = valid[:, None] & dim_valid[None, :]
    k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
    scores = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * scale
    return pos, valid, rows, kv_mask, scores


@triton.jit
def _softmax_step(scores, m_i, l_i, acc, v_cache_ptr, rows, d, kv_mask,
                  DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One step of the online softmax: ``scores`` (-inf where not allowed) folded into the
    running maximum, sum and weighted values (those at ``rows``); the three, updated."""
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    # A row may see no allowed key yet (window, padding rows): keep it NaN-free.
    m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
    p = tl.exp(scores - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE),
                                        input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _decode_kernel(
    q_ptr,
    q_seq_stride,
    q_head_stride,
    k_cache_ptr,
    v_cache_ptr,
    cache_block_stride,
    cache_slot_stride,
    cache_head_stride,
    block_tables_ptr,
    block_table_stride,
    seq_lens_ptr,
    out_ptr,
    out_seq_stride,
    out_head_stride,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    scale,
    sliding_window,
    GROUP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PARTITION: tl.constexpr,
    N_PARTITIONS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    first = tl.where(sliding_window > 0, tl.maximum(seq_len - sliding_window, 0), 0)
    lo = tl.maximum(part * PARTITION, first)
    hi = tl.minimum((part + 1) * PARTITION, seq_len)

    g = tl.arange(0, BLOCK_GROUP)
    d = tl.arange(0, BLOCK_D)
    dim_valid = d < HEAD_SIZE
    heads = kv_head * GROUP + g
    head_mask = (g[:, None] < GROUP) & dim_valid[None, :]
    q = tl.load(q_ptr + seq * q_seq_stride + heads[:, None] * q_head_stride + d[None, :],
                mask=head_mask, other=0.0)
    q = q.to(DOT_DTYPE)

    m_i = tl.full([BLOCK_GROUP], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_GROUP], tl.float32)
    acc = tl.zeros([BLOCK_GROUP, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq * block_table_stride
    # Every step holds at least one position in [lo, hi), so m_i is finite after the first.
    for start in range(lo, hi, BLOCK_N):
        pos, valid, rows, kv_mask, scores = _key_scores(
            q, table, start, hi, kv_head, d, dim_valid, k_cache_ptr, cache_block_stride,
            cache_slot_stride, cache_head_stride, scale, BLOCK_SIZE, BLOCK_N, DOT_DTYPE,
            DOT_PRECISION)
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_i, l_i, acc = _softmax_step(scores, m_i, l_i, acc, v_cache_ptr, rows, d, kv_mask,
                                      DOT_DTYPE, DOT_PRECISION)

    if N_PARTITIONS == 1:
        # An empty context (padding sequence) has acc = 0 and gives zeros, as in the reference.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + seq * out_seq_stride + heads[:, None] * out_head_stride + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=head_mask)
    else:
        # Partials are laid out [seq, query head, partition, ...].
        n_heads = tl.num_programs(1) * GROUP
        slot = (seq * n_heads + heads) * N_PARTITIONS + part
        tl.store(part_max_ptr + slot, m_i, mask=g < GROUP)
        tl.store(part_sum_ptr + slot, l_i, mask=g < GROUP)
        tl.store(part_acc_ptr + slot[:, None] * HEAD_SIZE + d[None, :], acc, mask=head_mask)


@triton.jit
def _merge_partitions_kernel(
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    out_ptr,
    out_seq_stride,
    out_head_stride,
    HEAD_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    N_PARTITIONS: tl.constexpr,
    BLOCK_PARTITIONS: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    parts = tl.arange(0, BLOCK_PARTITIONS)
    d = tl.arange(0, BLOCK_D)
    first_slot = (seq * tl.num_programs(1) + head) * N_PARTITIONS
    in_range = parts < N_PARTITIONS
    part_max = tl.load(part_max_ptr + first_slot + parts, mask=in_range, other=float("-inf"))
    part_sum = tl.load(part_sum_ptr + first_slot + parts, mask=in_range, other=0.0)
    m_all = tl.max(part_max, axis=0)
    # Empty partitions (max -inf) weigh exp(-inf) = 0, also when every partition is empty.
    weight = tl.exp(part_max - tl.where(m_all > float("-inf"), m_all, 0.0))
    total = tl.sum(part_sum * weight, axis=0)
    acc = tl.load(part_acc_ptr + (first_slot + parts)[:, None] * HEAD_SIZE + d[None, :],
                  mask=in_range[:, None] & (d[None, :] < HEAD_SIZE), other=0.0)
    out = tl.sum(acc * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * out_seq_stride + head * out_head_stride + d,
             out.to(out_ptr.dtype.element_ty), mask=d < HEAD_SIZE)


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    unit_stride("k_cache", k_cache)
    if k_cache.stride() != v_cache.stride() or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache differ in layout: {tuple(k_cache.shape)} "
                         f"{k_cache.stride()} vs {tuple(v_cache.shape)} {v_cache.stride()}")


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    unit_stride("q", q)
    unit_stride("block_tables", block_tables)
    _check_cache(k_cache, v_cache)
    batch, n_heads, head_size = q.shape
    _, block_size, n_kv_heads, _ = k_cache.shape
    group = n_heads // n_kv_heads
    launch = _decode_launch(group, head_size, block_tables.shape[1] * block_size)
    dot_dtype, dot_precision = dot_operands(q.dtype)
    out = torch.empty_like(q)
    # One partition writes the output directly and never touches the partial buffers.
    part_acc = part_max = part_sum = out
    if launch.partitions > 1:
        partials = (batch, n_heads, launch.partitions)
        part_acc = torch.empty((*partials, head_size), dtype=torch.float32, device=q.device)
        part_max = torch.empty(partials, dtype=torch.float32, device=q.device)
        part_sum = torch.empty(partials, dtype=torch.float32, device=q.device)
    _decode_kernel[(batch, n_kv_heads, launch.partitions)](
        q, q.stride(0), q.stride(1), k_cache, v_cache, k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), block_tables, block_tables.stride(0), seq_lens, out, out.stride(0),
        out.stride(1), part_acc, part_max, part_sum, scale, sliding_window or 0,
        GROUP=group, HEAD_SIZE=head_size, BLOCK_D=launch.block_d, BLOCK_SIZE=block_size,
        BLOCK_GROUP=launch.block_group, BLOCK_N=launch.block_n, PARTITION=PARTITION_TOKENS,
        N_PARTITIONS=launch.partitions, DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision,
        num_warps=launch.num_warps,
    )
    if launch.partitions > 1:
        _merge_partitions_kernel[(batch, n_heads)](
            part_acc, part_max, part_sum, out, out.stride(0), out.stride(1),
            HEAD_SIZE=head_size, BLOCK_D=launch.block_d, N_PARTITIONS=launch.partitions,
            BLOCK_PARTITIONS=triton.next_power_of_2(launch.partitions),
        )
    return out


@triton.jit
def _prefill_kernel(
    q_ptr,
    q_token_stride,
    q_head_stride,
    k_cache_ptr,
    v_cache_ptr,
    cache_block_stride,
    cache_slot_stride,
    cache_head_stride,
    block_tables_ptr,
    block_table_stride,
    seq_lens_ptr,
    query_start_loc_ptr,
    tile_seq_ptr,
    seq_first_tile_ptr,
    out_ptr,
    out_token_stride,
    out_head_stride,
    n_seqs,
    scale,
    sliding_window,
    GROUP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    seq = tl.load(tile_seq_ptr + tile)
    if seq < n_seqs:
        q_start = tl.load(query_start_loc_ptr + seq).to(tl.int32)
        q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_start
        seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
        first_row = (tile - tl.load(seq_first_tile_ptr + seq).to(tl.int32)) * BLOCK_M
        rows = first_row + tl.arange(0, BLOCK_M)
        row_valid = rows < q_len
        q_pos = seq_len - q_len + rows
        d = tl.arange(0, BLOCK_D)
        dim_valid = d < HEAD_SIZE
        tokens = (q_start + rows).to(tl.int64)
        q_mask = row_valid[:, None] & dim_valid[None, :]
        q = tl.load(q_ptr + tokens[:, None] * q_token_stride + head * q_head_stride + d[None, :],
                    mask=q_mask, other=0.0)
        q = q.to(DOT_DTYPE)

        hi = seq_len - q_len + tl.minimum(first_row + BLOCK_M, q_len)
        first_pos = seq_len - q_len + first_row
        lo = tl.where(sliding_window > 0, tl.maximum(first_pos - sliding_window + 1, 0), 0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        table = block_tables_ptr + seq.to(tl.int64) * block_table_stride
        for start in range(lo, hi, BLOCK_N):
            pos, valid, cache_rows, kv_mask, scores = _key_scores(
                q, table, start, hi, kv_head, d, dim_valid, k_cache_ptr, cache_block_stride,
                cache_slot_stride, cache_head_stride, scale, BLOCK_SIZE, BLOCK_N, DOT_DTYPE,
                DOT_PRECISION)
            allowed = valid[None, :] & (pos[None, :] <= q_pos[:, None])
            if sliding_window > 0:
                allowed &= q_pos[:, None] - pos[None, :] < sliding_window
            scores = tl.where(allowed, scores, float("-inf"))
            m_i, l_i, acc = _softmax_step(scores, m_i, l_i, acc, v_cache_ptr, cache_rows, d,
                                          kv_mask, DOT_DTYPE, DOT_PRECISION)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + tokens[:, None] * out_token_stride + head * out_head_stride + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    unit_stride("q", q)
    unit_stride("block_tables", block_tables)
    _check_cache(k_cache, v_cache)
    n_tokens, n_heads, head_size = q.shape
    n_seqs = seq_lens.shape[0]
    launch = _prefill_launch(head_size, q.dtype)
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    max_tiles = triton.cdiv(n_tokens, launch.block_m) + n_seqs
    tile_seq, seq_first_tile = tile_groups(q_lens, launch.block_m, max_tiles)
    dot_dtype, dot_precision = dot_operands(q.dtype)
    # Tokens outside every sequence's range are left as zeros, like the reference.
    out = torch.zeros_like(q)
    _prefill_kernel[(max_tiles, n_heads)](
        q, q.stride(0), q.stride(1), k_cache, v_cache, k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), block_tables, block_tables.stride(0), seq_lens, query_start_loc,
        tile_seq, seq_first_tile, out, out.stride(0), out.stride(1), n_seqs, scale,
        sliding_window or 0, GROUP=n_heads // k_cache.shape[2], HEAD_SIZE=head_size,
        BLOCK_D=launch.block_d,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_M=launch.block_m, BLOCK_N=launch.block_n,
        DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision, num_warps=launch.num_warps,
    )
    return out
