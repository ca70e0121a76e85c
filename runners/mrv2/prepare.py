"""mrv2 input preparation on the device: from request state to a step's forward inputs.

One op, ``mrv2_prepare_inputs``, in ``kernels.REGISTRY`` with two
implementations: torch (any device; what runs on CPU) and Triton (GPU
platforms; on CPU only under ``TRITON_INTERPRET=1``). Given the state rows of
the step's sequences and the step's ``query_start_loc``, it gathers each
token's id from the request's device-resident tokens, computes positions and
cache slots from the device-resident block table, gathers the block tables,
writes sequence lengths and logits rows, pads the rest (slot -1, seq_len 0),
and advances each request's computed-token count.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from interlock.core.platform import PLATFORM_NAMES
from interlock.kernels import REGISTRY, KernelImpl
from interlock.kernels.registry import DTYPES
from interlock.kernels.triton import unavailable as triton_unavailable
from interlock.runners.graphs.buffers import ForwardInputs
from interlock.runners.mrv2.states import RequestStates, StepRows

OP = "mrv2_prepare_inputs"


def prepare_step(
    prepare: Callable[..., None],
    step: StepRows,
    num_tokens: int,
    states: RequestStates,
    block_size: int,
    target: ForwardInputs,
) -> None:
    """Fill ``target`` (static views or fresh tensors, padded to their shape) for a step:
    ``query_start_loc`` by a device cumsum, the rest by the ``prepare`` implementation."""
    query_start_loc = target.metadata.query_start_loc
    count = step.rows.shape[0]
    padded_seqs = query_start_loc.shape[0] - 1
    query_start_loc[0] = 0
    torch.cumsum(step.query_lens, 0, dtype=torch.int32, out=query_start_loc[1 : count + 1])
    if padded_seqs > count:
        # Each padding sequence owns one padding token while tokens last.
        pad = torch.arange(1, padded_seqs - count + 1, device=query_start_loc.device) + num_tokens
        query_start_loc[count + 1 :] = pad.clamp_(max=target.input_ids.shape[0])
    metadata = target.metadata
    prepare(
        step.rows, query_start_loc, num_tokens, states.num_computed, states.token_ids,
        states.block_tables, block_size, target.input_ids, target.positions,
        metadata.slot_mapping, metadata.seq_lens, metadata.block_tables, target.logits_indices,
    )


@REGISTRY.implement(OP, "torch")
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
    """Fill a step's inputs from request state.

    rows [B] int64: state row of each sequence; query_start_loc [Bp+1] int32
    (filled, padded); num_tokens: real tokens T. State: num_computed [R] int32
    (advanced in place), token_ids [R, L] int64, state_block_tables [R, W]
    int32. Outputs: input_ids/positions/slot_mapping [Tp] int64, seq_lens [Bp]
    int32, block_tables [Bp, W'] int32 (W' <= W columns gathered),
    logits_indices [Bp] int64. Rows past B and tokens past T are padding.
    """
    count = rows.shape[0]
    starts = query_start_loc[:count].long()
    q_lens = query_start_loc[1 : count + 1].long() - starts
    computed = num_computed[rows].long()
    owner = torch.repeat_interleave(
        torch.arange(count, device=rows.device), q_lens, output_size=num_tokens
    )
    token_rows = rows[owner]
    pos = computed[owner] + torch.arange(num_tokens, device=rows.device) - starts[owner]
    blocks = state_block_tables[token_rows, pos // block_size].long()
    input_ids[:num_tokens] = token_ids[token_rows, pos]
    positions[:num_tokens] = pos
    slot_mapping[:num_tokens] = blocks * block_size + pos % block_size
    input_ids[num_tokens:] = 0
    positions[num_tokens:] = 0
    slot_mapping[num_tokens:] = -1
    seq_lens[:count] = computed + q_lens
    seq_lens[count:] = 0
    block_tables[:count] = state_block_tables[rows, : block_tables.shape[1]]
    block_tables[count:] = 0
    logits_indices[:count] = starts + q_lens - 1
    logits_indices[count:] = 0
    num_computed[rows] = seq_lens[:count]


REGISTRY.register(
    KernelImpl(
        OP, "triton", "interlock.runners.mrv2.prepare_triton:prepare_inputs",
        frozenset(PLATFORM_NAMES), frozenset(DTYPES), unavailable=triton_unavailable,
    )
)
