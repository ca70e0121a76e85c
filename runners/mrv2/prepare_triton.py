"""The Triton ``mrv2_prepare_inputs`` (contract: ``interlock.runners.mrv2.prepare``).

One program per padded sequence, plus one that pads the token rows: a real
sequence writes its tokens' ids, positions and slots, its length, logits row
and block-table row, and advances its computed count; a padding sequence
zeroes its length, logits row and table row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_TOKENS = 64
BLOCK_COLUMNS = 64


@triton.jit
def _prepare_kernel(
    rows_ptr,
    query_start_loc_ptr,
    num_computed_ptr,
    token_ids_ptr,
    token_row_stride,
    state_tables_ptr,
    state_table_stride,
    input_ids_ptr,
    positions_ptr,
    slot_mapping_ptr,
    seq_lens_ptr,
    tables_ptr,
    table_stride,
    logits_indices_ptr,
    num_seqs,
    padded_seqs,
    num_tokens,
    padded_tokens,
    width,
    block_size,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    seq = tl.program_id(0)
    if seq == padded_seqs:
        for first in range(num_tokens, padded_tokens, BLOCK_T):
            t = first + tl.arange(0, BLOCK_T)
            pad = t < padded_tokens
            tl.store(input_ids_ptr + t, tl.zeros([BLOCK_T], tl.int64), mask=pad)
            tl.store(positions_ptr + t, tl.zeros([BLOCK_T], tl.int64), mask=pad)
            tl.store(slot_mapping_ptr + t, tl.full([BLOCK_T], -1, tl.int64), mask=pad)
    elif seq < num_seqs:
        row = tl.load(rows_ptr + seq).to(tl.int64)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_end = tl.load(query_start_loc_ptr + seq + 1)
        computed = tl.load(num_computed_ptr + row)
        for first in range(q_start, q_end, BLOCK_T):
            t = first + tl.arange(0, BLOCK_T)
            real = t < q_end
            pos = (computed + t - q_start).to(tl.int64)
            token = tl.load(token_ids_ptr + row * token_row_stride + pos, mask=real, other=0)
            block = tl.load(
                state_tables_ptr + row * state_table_stride + pos // block_size, mask=real, other=0
            ).to(tl.int64)
            tl.store(input_ids_ptr + t, token, mask=real)
            tl.store(positions_ptr + t, pos, mask=real)
            tl.store(slot_mapping_ptr + t, block * block_size + pos % block_size, mask=real)
        seq_len = computed + q_end - q_start
        tl.store(seq_lens_ptr + seq, seq_len)
        tl.store(logits_indices_ptr + seq, (q_end - 1).to(tl.int64))
        tl.store(num_computed_ptr + row, seq_len)
        for first in range(0, width, BLOCK_W):
            c = first + tl.arange(0, BLOCK_W)
            inside = c < width
            entry = tl.load(state_tables_ptr + row * state_table_stride + c, mask=inside, other=0)
            tl.store(tables_ptr + seq * table_stride + c, entry, mask=inside)
    else:
        tl.store(seq_lens_ptr + seq, 0)
        tl.store(logits_indices_ptr + seq, 0)
        for first in range(0, width, BLOCK_W):
            c = first + tl.arange(0, BLOCK_W)
            tl.store(tables_ptr + seq * table_stride + c, tl.zeros([BLOCK_W], tl.int32),
                     mask=c < width)


def prepare_inputs(
    rows: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_tokens: int,
    num_computed: torch.Tensor,
    token_ids: torch.Tensor,
    state_block_tables: torch.Tensor,
    block_size: int,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    logits_indices: torch.Tensor,
) -> None:
    """See ``interlock.runners.mrv2.prepare.prepare_inputs``."""
    padded_seqs = seq_lens.shape[0]
    named = {
        "rows": rows, "query_start_loc": query_start_loc, "num_computed": num_computed,
        "token_ids": token_ids, "state_block_tables": state_block_tables,
        "input_ids": input_ids, "positions": positions, "slot_mapping": slot_mapping,
        "seq_lens": seq_lens, "block_tables": block_tables, "logits_indices": logits_indices,
    }
    for name, tensor in named.items():
        if tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    _prepare_kernel[(padded_seqs + 1,)](
        rows, query_start_loc, num_computed, token_ids, token_ids.stride(0), state_block_tables,
        state_block_tables.stride(0), input_ids, positions, slot_mapping, seq_lens, block_tables,
        block_tables.stride(0), logits_indices, rows.shape[0], padded_seqs, num_tokens,
        input_ids.shape[0], block_tables.shape[1], block_size,
        BLOCK_T=BLOCK_TOKENS, BLOCK_W=BLOCK_COLUMNS,
    )
