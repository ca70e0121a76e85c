"""mrv2: request state on the device, input preparation by device kernels.

Per step the host sends the state only what changed (new requests, new
blocks, prompt chunks) and the step's rows; positions, slot mapping,
block-table gather, query start offsets and sequence lengths are computed on
the device by ``mrv2_prepare_inputs`` (Triton on GPU platforms, which mrv2
requires there; torch on CPU) straight into the graph key's static buffers,
or into fresh tensors for an eager step. Sampled tokens are written into the
request state on the device, so a decode step's input never crosses to the
device again.
"""

from __future__ import annotations

import torch

from interlock.core.platform import TRITON_FACT
from interlock.kernels import REGISTRY, KernelChoice, KernelError
from interlock.runners.contract import Decision, KVCacheSpec, ModelSpec, ScheduledBatch
from interlock.runners.dispatch import platform_of
from interlock.runners.graphs.buffers import ForwardInputs, SamplingInputs
from interlock.runners.graphs.runner import GraphRunner, RunnerError
from interlock.runners.graphs.sizes import CaptureSizes
from interlock.runners.model.attention import AttentionMetadata
from interlock.runners.mrv2.graphs import MRV2Plan
from interlock.runners.mrv2.plugin import SPEC
from interlock.runners.mrv2.prepare import OP as PREPARE_OP
from interlock.runners.mrv2.prepare import prepare_step
from interlock.runners.mrv2.states import RequestStates, StepRows


class MRV2Runner(GraphRunner):
    name = "mrv2"
    runner_spec = SPEC

    def make_plan(self, model: ModelSpec, decision: Decision) -> MRV2Plan:
        sizes = CaptureSizes.choose(
            decision.capture_sizes, model.max_num_batched_tokens, auto_max=model.max_num_seqs
        )
        return MRV2Plan(
            decision.cudagraph, decision.breakable, sizes, model.max_num_seqs,
            model.max_num_batched_tokens,
        )

    def setup(self, model: ModelSpec, kv_cache: KVCacheSpec) -> None:
        platform = platform_of(self.device)
        # Where the spec requires Triton (GPU platforms; load checked that it runs here),
        # the inputs are prepared with it.
        requires = SPEC.platforms[platform].requires
        preference = ["triton"] if TRITON_FACT in requires else ["torch"]
        try:
            self.prepare: KernelChoice = REGISTRY.select(
                PREPARE_OP, platform, model.dtype, preference, model.kernels
            )
        except KernelError as exc:
            raise RunnerError(f"mrv2 input preparation: {exc}") from None
        self.states = RequestStates(
            model.max_num_seqs, model.max_model_len, self.table_width, self.device
        )
        self._step: StepRows | None = None

    def kernel_choices(self) -> tuple[KernelChoice, ...]:
        return (*super().kernel_choices(), self.prepare)

    def begin_step(self, batch: ScheduledBatch) -> None:
        self._step = self.states.update(batch)

    def stage(
        self, batch: ScheduledBatch, target: ForwardInputs | None
    ) -> tuple[ForwardInputs, SamplingInputs]:
        step = self._step
        assert step is not None
        if target is None:
            width = max(len(s.block_table) for s in batch.sequences)
            target = self._fresh(batch.num_tokens, len(batch.sequences), width, batch.decode_only)
        prepare_step(
            self.prepare.fn, step, batch.num_tokens, self.states, self.block_size, target
        )
        slots = target.metadata.state_slots
        if slots is not None:
            # The pool slots are the scheduler's, not state rows: a few ints per step.
            host = [s.state_slot for s in batch.sequences]
            host += [-1] * (slots.shape[0] - len(host))
            slots.copy_(torch.tensor(host, dtype=torch.int64))
        states, rows = self.states, step.rows
        sampling = SamplingInputs(
            states.temperature[rows], states.top_k[rows], states.top_p[rows], states.seeds[rows],
            states.steps[rows],
        )
        return target, sampling

    def end_step(self, batch: ScheduledBatch, inputs: ForwardInputs, sampled: torch.Tensor) -> None:
        assert self._step is not None
        count = len(batch.sequences)
        self.states.record_samples(self._step, inputs.metadata.seq_lens[:count], sampled)
        self.states.after_samples(batch)

    def _fresh(self, tokens: int, seqs: int, width: int, decode_only: bool) -> ForwardInputs:
        def empty(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device=self.device)

        return ForwardInputs(
            input_ids=empty(tokens, dtype=torch.int64),
            positions=empty(tokens, dtype=torch.int64),
            metadata=AttentionMetadata(
                slot_mapping=empty(tokens, dtype=torch.int64),
                block_tables=empty(seqs, width, dtype=torch.int32),
                seq_lens=empty(seqs, dtype=torch.int32),
                query_start_loc=empty(seqs + 1, dtype=torch.int32),
                decode_only=decode_only,
                state_slots=empty(seqs, dtype=torch.int64),
            ),
            logits_indices=empty(seqs, dtype=torch.int64),
        )
