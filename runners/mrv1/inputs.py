"""mrv1 input preparation: a scheduled batch becomes flat host arrays, then device tensors.

``prepare_host_inputs`` builds every array on the host with numpy, optionally
padded to a fixed number of tokens, sequences and block-table columns: padding
tokens have slot -1, padding sequences seq_len 0, so padded rows are
harmless. For a graph step mrv1 pads to the key's shape and copies the arrays
into the static buffers (``copy_to_static``); an eager step moves them as
they are (``to_device``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from interlock.runners.contract import ScheduledBatch
from interlock.runners.graphs.buffers import ForwardInputs, SamplingInputs
from interlock.runners.model.attention import AttentionMetadata


@dataclass(frozen=True)
class HostInputs:
    """Flat numpy inputs of one step (padded sizes: ``len(input_ids)``, ``len(seq_lens)``)."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64, -1 = padding
    block_tables: np.ndarray  # [B, W] int32
    seq_lens: np.ndarray  # [B] int32, 0 = padding
    query_start_loc: np.ndarray  # [B+1] int32
    logits_indices: np.ndarray  # [B] int64: row of each sequence's last token
    temperature: np.ndarray  # [B] float32
    top_k: np.ndarray  # [B] int64
    top_p: np.ndarray  # [B] float32
    seeds: np.ndarray  # [B] int64
    steps: np.ndarray  # [B] int64
    state_slots: np.ndarray  # [B] int64: recurrent-state pool slots, -1 = padding / none
    num_tokens: int  # real (unpadded) tokens
    num_seqs: int  # real (unpadded) sequences
    decode_only: bool


def prepare_host_inputs(
    batch: ScheduledBatch,
    block_size: int,
    num_tokens: int | None = None,
    num_seqs: int | None = None,
    table_width: int | None = None,
) -> HostInputs:
    """Flatten ``batch``; pad to ``num_tokens`` / ``num_seqs`` / ``table_width`` when given."""
    seqs = batch.sequences
    real_seqs = len(seqs)
    counts = np.fromiter((s.num_tokens for s in seqs), dtype=np.int64, count=real_seqs)
    starts = np.fromiter((s.start_position for s in seqs), dtype=np.int64, count=real_seqs)
    real_tokens = int(counts.sum())
    total_tokens = real_tokens if num_tokens is None else num_tokens
    total_seqs = real_seqs if num_seqs is None else num_seqs
    width = max((len(s.block_table) for s in seqs), default=0)
    if table_width is not None:
        width = table_width
    if total_tokens < real_tokens or total_seqs < real_seqs:
        raise ValueError(
            f"cannot pad {real_tokens} tokens / {real_seqs} sequences down to "
            f"{total_tokens} / {total_seqs}"
        )

    query_start_loc = np.zeros(total_seqs + 1, dtype=np.int32)
    np.cumsum(counts, out=query_start_loc[1 : real_seqs + 1])
    # Padding sequences own one padding token each while tokens last, so a
    # padded decode batch keeps T == B.
    pad_offsets = np.arange(1, total_seqs - real_seqs + 1)
    query_start_loc[real_seqs + 1 :] = np.minimum(real_tokens + pad_offsets, total_tokens)

    block_tables = np.zeros((total_seqs, width), dtype=np.int32)
    for row, seq in enumerate(seqs):
        block_tables[row, : len(seq.block_table)] = seq.block_table

    input_ids = np.zeros(total_tokens, dtype=np.int64)
    input_ids[:real_tokens] = np.fromiter(
        itertools.chain.from_iterable(s.token_ids for s in seqs), dtype=np.int64, count=real_tokens
    )
    seq_of_token = np.repeat(np.arange(real_seqs), counts)
    positions = np.zeros(total_tokens, dtype=np.int64)
    positions[:real_tokens] = (
        np.arange(real_tokens) - query_start_loc[:real_seqs][seq_of_token] + starts[seq_of_token]
    )
    slot_mapping = np.full(total_tokens, -1, dtype=np.int64)
    blocks = block_tables[seq_of_token, positions[:real_tokens] // block_size]
    slot_mapping[:real_tokens] = blocks * block_size + positions[:real_tokens] % block_size

    seq_lens = np.zeros(total_seqs, dtype=np.int32)
    seq_lens[:real_seqs] = starts + counts
    logits_indices = np.zeros(total_seqs, dtype=np.int64)
    logits_indices[:real_seqs] = query_start_loc[1 : real_seqs + 1] - 1

    def per_seq(values: list[Any], dtype: type, padding: float = 0) -> np.ndarray:
        out: np.ndarray = np.full(total_seqs, padding, dtype=dtype)
        out[:real_seqs] = values
        return out

    return HostInputs(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        block_tables=block_tables,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
        logits_indices=logits_indices,
        temperature=per_seq([s.sampling.temperature for s in seqs], np.float32),
        top_k=per_seq([s.sampling.top_k for s in seqs], np.int64),
        top_p=per_seq([s.sampling.top_p for s in seqs], np.float32, padding=1.0),
        seeds=per_seq([s.sampling.seed for s in seqs], np.int64),
        steps=per_seq([s.step for s in seqs], np.int64),
        state_slots=per_seq([s.state_slot for s in seqs], np.int64, padding=-1),
        num_tokens=real_tokens,
        num_seqs=real_seqs,
        decode_only=batch.decode_only and total_tokens == total_seqs,
    )


def to_device(host: HostInputs, device: torch.device) -> tuple[ForwardInputs, SamplingInputs]:
    """Fresh device tensors for one eager step (``to`` is a no-op on the CPU)."""

    def move(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(device)

    forward = ForwardInputs(
        input_ids=move(host.input_ids),
        positions=move(host.positions),
        metadata=AttentionMetadata(
            slot_mapping=move(host.slot_mapping),
            block_tables=move(host.block_tables),
            seq_lens=move(host.seq_lens),
            query_start_loc=move(host.query_start_loc),
            decode_only=host.decode_only,
            state_slots=move(host.state_slots),
        ),
        logits_indices=move(host.logits_indices),
    )
    return forward, sampling_to_device(host, host.num_seqs, device)


def copy_to_static(host: HostInputs, target: ForwardInputs) -> None:
    """Write padded host inputs into a graph key's static views (same shapes)."""
    metadata = target.metadata
    for dst, src in (
        (target.input_ids, host.input_ids),
        (target.positions, host.positions),
        (metadata.slot_mapping, host.slot_mapping),
        (metadata.block_tables, host.block_tables),
        (metadata.seq_lens, host.seq_lens),
        (metadata.query_start_loc, host.query_start_loc),
        (target.logits_indices, host.logits_indices),
        *(((metadata.state_slots, host.state_slots),) if metadata.state_slots is not None
          else ()),
    ):
        dst.copy_(torch.from_numpy(src))


def sampling_to_device(host: HostInputs, count: int, device: torch.device) -> SamplingInputs:
    """Sampling parameters of the first ``count`` (real) sequences."""

    def move(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array[:count]).to(device)

    return SamplingInputs(
        temperature=move(host.temperature),
        top_k=move(host.top_k),
        top_p=move(host.top_p),
        seeds=move(host.seeds),
        steps=move(host.steps),
    )
