"""EagerRunner: the ``interlock.runners.contract.Runner`` of this plugin.

Built only on interlock's public pieces: the runner contract, the kernel
dispatch (``interlock.runners.dispatch``) and the shared model execution
(``interlock.runners.model``). Plugin kernels (this plugin's included) are in the
registry before ``load``: interlock installs them for every runner. Inputs are
prepared with torch directly on the device, every step runs eagerly.
"""

from __future__ import annotations

import torch

from interlock.kernels.registry import default_preference
from interlock.runners.contract import (
    Decision,
    KernelReport,
    KVCacheSpec,
    ModelSpec,
    RunnerOutput,
    RunnerReport,
    ScheduledBatch,
)
from interlock.runners.dispatch import build_kernel_table, platform_of
from interlock.runners.graphs.logits import (
    LOGITS_REPORT,
    needs_processing,
    process_logits,
    sample_logprobs,
)
from interlock.runners.model.attention import AttentionMetadata
from interlock.runners.model.checkpoint import load_model
from interlock.runners.model.kv_cache import allocate_kv_cache
from interlock_eager.plugin import RUNNER

# The plugin's own backend (it implements silu_and_mul) before the registry's usual choice.
OWN_BACKEND = "eager_example"


class EagerRunnerError(RuntimeError):
    """The runner was asked for something its spec does not declare."""


class EagerRunner:
    name = "eager"

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None

    def load(self, model: ModelSpec, kv_cache: KVCacheSpec, decision: Decision) -> None:
        self.spec = model
        self.device = torch.device(model.device)
        platform = platform_of(self.device)
        unserved = RUNNER.unserved(decision, platform)
        if unserved:
            # Stage 5 of the policy never sends these (the spec does not declare
            # them); a caller building a decision by hand gets an error, not eager.
            raise EagerRunnerError(
                f"eager runs without graphs or compile; got {', '.join(map(str, unserved))}"
            )
        preference = (OWN_BACKEND, *default_preference(platform))
        # model.kernels: the backend INTERLOCK_KERNELS forces, read where the run started.
        self.ops = build_kernel_table(platform, model.dtype, preference, model.kernels)
        self.model = load_model(model, self.ops, self.device)
        self.block_size = kv_cache.block_size
        self.model.bind_kv_cache(
            allocate_kv_cache(model.config, kv_cache, model.dtype, self.device)
        )

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        if self.model is None:
            raise EagerRunnerError("execute() before load()")
        seqs = batch.sequences
        dev = self.device
        counts = torch.tensor([s.num_tokens for s in seqs])
        query_start_loc = torch.zeros(len(seqs) + 1, dtype=torch.int32)
        query_start_loc[1:] = counts.cumsum(0)
        positions = torch.cat([torch.arange(s.start_position, s.seq_len) for s in seqs])
        block_tables = torch.zeros(
            len(seqs), max(len(s.block_table) for s in seqs), dtype=torch.int32
        )
        for row, seq in enumerate(seqs):
            block_tables[row, : len(seq.block_table)] = torch.tensor(seq.block_table)
        seq_of_token = torch.repeat_interleave(torch.arange(len(seqs)), counts)
        blocks = block_tables[seq_of_token, positions // self.block_size].long()
        metadata = AttentionMetadata(
            slot_mapping=(blocks * self.block_size + positions % self.block_size).to(dev),
            block_tables=block_tables.to(dev),
            seq_lens=torch.tensor([s.seq_len for s in seqs], dtype=torch.int32, device=dev),
            query_start_loc=query_start_loc.to(dev),
            decode_only=batch.decode_only,
        )
        input_ids = torch.tensor([t for s in seqs for t in s.token_ids], device=dev)
        hidden = self.model(input_ids, positions.to(dev), metadata)
        last = (query_start_loc[1:] - 1).long().to(dev)
        logits = self.model.compute_logits(hidden[last])

        def per_seq(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=dev)

        # Penalties, min_p and logprobs: interlock's torch step around the sample kernel,
        # as its built-in runners do it.
        processed = process_logits(logits, batch) if needs_processing(batch) else logits
        tokens = self.ops.sample(
            processed,
            per_seq([s.sampling.temperature for s in seqs], torch.float32),
            per_seq([s.sampling.top_k for s in seqs], torch.int64),
            per_seq([s.sampling.top_p for s in seqs], torch.float32),
            per_seq([s.sampling.seed for s in seqs], torch.int64),
            per_seq([s.step for s in seqs], torch.int64),
        ).tolist()
        return RunnerOutput(
            tuple(t if s.sample else None for t, s in zip(tokens, seqs, strict=True)),
            sample_logprobs(logits, tokens, batch),
        )

    def report(self) -> RunnerReport:
        if self.model is None:
            raise EagerRunnerError("report() before load()")
        return RunnerReport(
            runner=self.name,
            device=str(self.device),
            dtype=self.spec.dtype,
            kernels=tuple(KernelReport(c.op, c.label, c.reason) for c in self.ops.choices)
            + (LOGITS_REPORT,),
        )
