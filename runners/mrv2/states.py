"""mrv2's request state, kept on the device and updated incrementally.

Each live request owns a row: every token it has so far (prompt chunks are
uploaded when first scheduled; sampled tokens are written on the device right
after sampling and never come back as input), its block table, how many of
its tokens are in the KV cache, and its sampling parameters. The host keeps
only a mirror of what each row holds, to send each step just the differences:
a decode step of requests that need no new block uploads nothing but the
step's rows and token counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from interlock.runners.contract import ScheduledBatch


@dataclass(frozen=True)
class StepRows:
    """A step's view of the state: one entry per scheduled sequence, on the device."""

    rows: torch.Tensor  # [B] int64 state rows
    query_lens: torch.Tensor  # [B] int32 tokens fed this step
    samples: torch.Tensor  # [B] bool: the sequence samples a token this step


@dataclass
class _Mirror:
    """What the device holds for one row."""

    tokens: int = 0  # positions [0, tokens) of token_ids are valid
    table: tuple[int, ...] = ()  # block-table entries uploaded
    computed: int = -1  # num_computed (-1: must be uploaded)
    step: int = -1  # generated-token count (-1: must be uploaded)


class RequestStates:
    def __init__(
        self, max_requests: int, max_model_len: int, width: int, device: torch.device
    ) -> None:
        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.device = device
        # One extra column: where rows that sample nothing this step write their token.
        self.sink = max_model_len
        self.token_ids = zeros(max_requests, max_model_len + 1, dtype=torch.int64)
        self.block_tables = zeros(max_requests, width, dtype=torch.int32)
        self.num_computed = zeros(max_requests, dtype=torch.int32)
        self.temperature = zeros(max_requests, dtype=torch.float32)
        self.top_k = zeros(max_requests, dtype=torch.int64)
        self.top_p = zeros(max_requests, dtype=torch.float32)
        self.seeds = zeros(max_requests, dtype=torch.int64)
        self.steps = zeros(max_requests, dtype=torch.int64)
        self._rows: dict[str, int] = {}
        self._free = list(range(max_requests - 1, -1, -1))
        self._mirror = [_Mirror() for _ in range(max_requests)]

    def update(self, batch: ScheduledBatch) -> StepRows:
        """Drop finished requests, admit new ones, upload what the device lacks."""
        for request_id in batch.finished_request_ids:
            row = self._rows.pop(request_id, None)
            if row is not None:
                self._free.append(row)
        admitted: list[tuple[int, int, int]] = []  # row, top_k, seed
        admitted_floats: list[tuple[float, float]] = []  # temperature, top_p
        counters: list[tuple[int, int, int]] = []
        tokens: list[tuple[int, int, int]] = []
        blocks: list[tuple[int, int, int]] = []
        step: list[tuple[int, int, int]] = []
        for seq in batch.sequences:
            row = self._rows.get(seq.request_id)
            if row is None:
                row = self._admit(seq.request_id)
                s = seq.sampling
                admitted.append((row, s.top_k, s.seed))
                admitted_floats.append((s.temperature, s.top_p))
            mirror = self._mirror[row]
            if (mirror.computed, mirror.step) != (seq.start_position, seq.step):
                counters.append((row, seq.start_position, seq.step))
                mirror.step = seq.step
            end = seq.seq_len
            for pos in range(max(seq.start_position, mirror.tokens), end):
                tokens.append((row, pos, seq.token_ids[pos - seq.start_position]))
            mirror.tokens = max(mirror.tokens, end)
            mirror.computed = end
            table = seq.block_table
            known = len(mirror.table) if table[: len(mirror.table)] == mirror.table else 0
            blocks.extend((row, col, table[col]) for col in range(known, len(table)))
            mirror.table = table
            step.append((row, seq.num_tokens, int(seq.sample)))
        self._upload(admitted, admitted_floats, counters, tokens, blocks)
        rows, query_lens, samples = self._tensor(step).T.contiguous()
        return StepRows(rows, query_lens.to(torch.int32), samples.bool())

    def record_samples(self, step: StepRows, seq_lens: torch.Tensor, sampled: torch.Tensor) -> None:
        """Write each sampling sequence's new token after its last one, on the device."""
        positions = torch.where(step.samples, seq_lens.long(), self.sink)
        self.token_ids[step.rows, positions] = sampled
        self.steps[step.rows] += step.samples.long()

    def after_samples(self, batch: ScheduledBatch) -> None:
        """Mirror ``record_samples`` on the host."""
        for seq in batch.sequences:
            if seq.sample:
                mirror = self._mirror[self._rows[seq.request_id]]
                mirror.tokens = seq.seq_len + 1
                mirror.step = seq.step + 1

    def _admit(self, request_id: str) -> int:
        if not self._free:
            raise RuntimeError(
                f"request {request_id}: all {len(self._mirror)} request-state rows are in use; "
                "the engine scheduled more requests than max_num_seqs"
            )
        row = self._free.pop()
        self._rows[request_id] = row
        self._mirror[row] = _Mirror()
        return row

    def _upload(
        self,
        admitted: list[tuple[int, int, int]],
        admitted_floats: list[tuple[float, float]],
        counters: list[tuple[int, int, int]],
        tokens: list[tuple[int, int, int]],
        blocks: list[tuple[int, int, int]],
    ) -> None:
        if admitted:
            rows, top_k, seeds = self._tensor(admitted).unbind(1)
            temperature, top_p = torch.tensor(admitted_floats, dtype=torch.float32).unbind(1)
            self.temperature[rows] = temperature.to(self.device)
            self.top_p[rows] = top_p.to(self.device)
            self.top_k[rows] = top_k
            self.seeds[rows] = seeds
        if counters:
            rows, computed, steps = self._tensor(counters).unbind(1)
            self.num_computed[rows] = computed.to(torch.int32)
            self.steps[rows] = steps
        if tokens:
            rows, positions, ids = self._tensor(tokens).unbind(1)
            self.token_ids[rows, positions] = ids
        if blocks:
            rows, cols, ids = self._tensor(blocks).unbind(1)
            self.block_tables[rows, cols] = ids.to(torch.int32)

    def _tensor(self, values: Sequence[tuple[int, ...]]) -> torch.Tensor:
        host = torch.tensor(values, dtype=torch.int64)
        if self.device.type == "cpu":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)
