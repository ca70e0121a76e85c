"""mrv1: host-side (numpy) input preparation, kernel dispatch from the registry, eager execution.

Graph capture is not part of this runner yet: it runs ``cudagraph=none``
and refuses any other decision rather than silently running eager.
"""

from __future__ import annotations

from pathlib import Path

import torch

from runners.contract import (
    KernelReport,
    KVCacheSpec,
    ModelSpec,
    RunDecision,
    RunnerOutput,
    RunnerReport,
    ScheduledBatch,
)
from runners.dispatch import KernelTable, build_kernel_table, platform_of
from runners.model.checkpoint import ModelSource, load_model
from runners.model.decoder import CausalLM
from runners.model.demo import DEMO
from runners.model.kv_cache import allocate_kv_cache
from runners.mrv1.inputs import DeviceInputs, prepare_host_inputs, to_device


class RunnerError(RuntimeError):
    """A runner asked to do something it cannot."""


class MRV1Runner:
    name = "mrv1"

    def __init__(self, kernel_preference: tuple[str, ...] | None = None) -> None:
        self.kernel_preference = kernel_preference
        self.model: CausalLM | None = None
        self.ops: KernelTable | None = None

    def load(self, model: ModelSpec, kv_cache: KVCacheSpec, decision: RunDecision) -> None:
        if decision.cudagraph != "none" or decision.breakable or decision.compile:
            raise RunnerError(
                f"{self.name} runs eager only in this build; cannot serve cudagraph="
                f"{decision.cudagraph}, breakable={decision.breakable}, compile={decision.compile}"
            )
        self.spec = model
        self.device = torch.device(model.device)
        self.ops = build_kernel_table(platform_of(self.device), model.dtype, self.kernel_preference)
        directory = None if model.name == DEMO else Path(model.name)
        self.model = load_model(
            ModelSource(model.name, directory, model.config),
            self.ops,
            dtype=model.dtype,
            device=self.device,
            max_positions=model.max_model_len,
            load_format=model.load_format,
            seed=model.seed,
        )
        self.block_size = kv_cache.block_size
        self.kv_caches = allocate_kv_cache(model.config, kv_cache, model.dtype, self.device)
        self.model.bind_kv_cache(self.kv_caches)

    def prepare(self, batch: ScheduledBatch) -> DeviceInputs:
        return to_device(prepare_host_inputs(batch, self.block_size), self.device)

    @torch.inference_mode()
    def compute_logits(self, inputs: DeviceInputs) -> torch.Tensor:
        """Logits [B, V] of each sequence's last fed token."""
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.attn_metadata)
        return self.model.compute_logits(hidden[inputs.logits_indices])

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        if self.model is None:
            raise RunnerError(f"{self.name}: execute() before load()")
        inputs = self.prepare(batch)
        logits = self.compute_logits(inputs)
        tokens = self.ops.sample(
            logits, inputs.temperature, inputs.top_k, inputs.top_p, inputs.seeds, inputs.steps
        ).tolist()
        return RunnerOutput(
            tuple(t if s.sample else None for t, s in zip(tokens, batch.sequences, strict=True))
        )

    def report(self) -> RunnerReport:
        if self.ops is None:
            raise RunnerError(f"{self.name}: report() before load()")
        return RunnerReport(
            runner=self.name,
            device=str(self.device),
            dtype=self.spec.dtype,
            kernels=tuple(KernelReport(c.op, c.label, c.reason) for c in self.ops.choices),
        )
