"""mrv1: per-step input preparation on the host (numpy), copied into static device buffers.

The classic runner: each step's inputs are built on the host from the
scheduled batch (``interlock.runners.mrv1.inputs``), padded to the graph key's shape and
copied into its static buffers, or moved as they are for an eager step. Its
capture plan is ``interlock.runners.mrv1.graphs.MRV1Plan``; graph capture, replay,
kernel dispatch and sampling come from the shared base.
"""

from __future__ import annotations

from interlock.runners.contract import Decision, ModelSpec, ScheduledBatch
from interlock.runners.graphs.buffers import ForwardInputs, SamplingInputs
from interlock.runners.graphs.runner import GraphRunner, RunnerError
from interlock.runners.graphs.sizes import CaptureSizes
from interlock.runners.mrv1.graphs import MRV1Plan
from interlock.runners.mrv1.inputs import (
    copy_to_static,
    prepare_host_inputs,
    sampling_to_device,
    to_device,
)
from interlock.runners.mrv1.plugin import SPEC

__all__ = ["MRV1Runner", "RunnerError"]


class MRV1Runner(GraphRunner):
    name = "mrv1"
    runner_spec = SPEC

    def make_plan(self, model: ModelSpec, decision: Decision) -> MRV1Plan:
        # Automatic sizes cover decode batches; explicit ones may reach the token budget.
        sizes = CaptureSizes.choose(
            decision.capture_sizes, model.max_num_batched_tokens, auto_max=model.max_num_seqs
        )
        return MRV1Plan(decision.cudagraph, decision.breakable, sizes)

    def stage(
        self, batch: ScheduledBatch, target: ForwardInputs | None
    ) -> tuple[ForwardInputs, SamplingInputs]:
        if target is None:
            return to_device(prepare_host_inputs(batch, self.block_size), self.device)
        host = prepare_host_inputs(
            batch, self.block_size, num_tokens=target.input_ids.shape[0],
            num_seqs=target.logits_indices.shape[0], table_width=self.table_width,
        )
        copy_to_static(host, target)
        return target, sampling_to_device(host, len(batch.sequences), self.device)
