"""Forward inputs, and the static buffers graphs read them from.

Every graph key reads prefixes of one set of buffers allocated at the largest
key's shape, so addresses never change between capture and replay; a runner
writes each step's (padded) inputs into the same prefixes before replaying.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from interlock.runners.model.attention import AttentionMetadata


@dataclass(frozen=True)
class ForwardInputs:
    """What the model's forward and the logits head read."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [B] int64: row of each sequence's last fed token


@dataclass(frozen=True)
class SamplingInputs:
    """Per-sequence sampling parameters, [B] each (sampling runs outside graphs)."""

    temperature: torch.Tensor  # float32
    top_k: torch.Tensor  # int64
    top_p: torch.Tensor  # float32
    seeds: torch.Tensor  # int64
    steps: torch.Tensor  # int64


class StaticInputs:
    """Forward inputs at the largest graph shape; a key's inputs are views of prefixes."""

    def __init__(self, max_tokens: int, max_seqs: int, width: int, device: torch.device) -> None:
        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.width = width
        self.input_ids = zeros(max_tokens, dtype=torch.int64)
        self.positions = zeros(max_tokens, dtype=torch.int64)
        self.slot_mapping = zeros(max_tokens, dtype=torch.int64)
        self.block_tables = zeros(max_seqs, width, dtype=torch.int32)
        self.seq_lens = zeros(max_seqs, dtype=torch.int32)
        self.query_start_loc = zeros(max_seqs + 1, dtype=torch.int32)
        self.logits_indices = zeros(max_seqs, dtype=torch.int64)
        self.state_slots = zeros(max_seqs, dtype=torch.int64)

    def view(self, tokens: int, seqs: int, decode_only: bool) -> ForwardInputs:
        return ForwardInputs(
            input_ids=self.input_ids[:tokens],
            positions=self.positions[:tokens],
            metadata=AttentionMetadata(
                slot_mapping=self.slot_mapping[:tokens],
                block_tables=self.block_tables[:seqs],
                seq_lens=self.seq_lens[:seqs],
                query_start_loc=self.query_start_loc[: seqs + 1],
                decode_only=decode_only,
                state_slots=self.state_slots[:seqs],
            ),
            logits_indices=self.logits_indices[:seqs],
        )

    def fill_padding(self, tokens: int, seqs: int) -> None:
        """An all-padding batch (no KV write, no attended key): what graphs are captured on."""
        self.input_ids[:tokens] = 0
        self.positions[:tokens] = 0
        self.slot_mapping[:tokens] = -1
        self.block_tables[:seqs] = 0
        self.seq_lens[:seqs] = 0
        # Each padding sequence owns one padding token while tokens last (as in real batches).
        self.query_start_loc[: seqs + 1] = torch.arange(seqs + 1).clamp_(max=tokens)
        self.logits_indices[:seqs] = 0
        self.state_slots[:seqs] = -1  # the state pool's scratch slot
