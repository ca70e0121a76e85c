"""The base of the built-in runners: load, graph capture and replay, sampling, report.

A runner subclass brings what makes it that runner:

* ``make_plan`` — its capture plan (sizes, keys, dispatch, capture order);
* ``stage`` — its input preparation, either into a graph key's static views
  (padded to the key's shape) or into fresh tensors for an eager step;
* ``begin_step`` / ``end_step`` — optional per-step state (mrv2 keeps request
  state on the device).

Kernel dispatch is one ``KernelTable`` chosen from ``interlock.kernels.REGISTRY`` at
load and handed to the model; the base samples with the same table.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from interlock.core.errors import InterlockError
from interlock.kernels import KernelChoice
from interlock.plugins import RunnerSpec
from interlock.plugins.spec import CONTEXT
from interlock.runners.contract import (
    Decision,
    KernelReport,
    KVCacheSpec,
    ModelSpec,
    RunnerOutput,
    RunnerReport,
    ScheduledBatch,
)
from interlock.runners.dispatch import KernelTable, build_kernel_table, platform_of
from interlock.runners.graphs.buffers import ForwardInputs, SamplingInputs
from interlock.runners.graphs.capture import ForcedFailures, forward_logits
from interlock.runners.graphs.logits import (
    LOGITS_REPORT,
    needs_processing,
    process_logits,
    sample_logprobs,
)
from interlock.runners.graphs.manager import GraphManager
from interlock.runners.graphs.plan import CapturePlan
from interlock.runners.machine import why_missing
from interlock.runners.model.checkpoint import load_model
from interlock.runners.model.decoder import CausalLM
from interlock.runners.model.kv_cache import allocate_kv_cache, kv_cache_report
from interlock.runners.model.state_pool import allocate_state_pool
from interlock.runners.parallel.group import current as current_group


class RunnerError(InterlockError, RuntimeError):
    """A runner asked to do something it cannot."""

    kind = "runtime"


class GraphRunner(ABC):
    name: ClassVar[str]
    #: What the runner's plugin declares; ``load`` refuses a decision outside it.
    runner_spec: ClassVar[RunnerSpec]

    def __init__(
        self, *, graph_backend: str = "auto", kernel_preference: tuple[str, ...] | None = None
    ) -> None:
        """``graph_backend``: ``auto`` (cuda on a GPU, native on a CPU whose kernels are native,
        debug elsewhere), ``cuda``, ``native`` or ``debug``."""
        self.graph_backend = graph_backend
        self.kernel_preference = kernel_preference
        self.model: CausalLM | None = None
        self.ops: KernelTable | None = None
        self.graphs: GraphManager | None = None

    @abstractmethod
    def make_plan(self, model: ModelSpec, decision: Decision) -> CapturePlan:
        """This runner's capture plan for the decision."""

    @abstractmethod
    def stage(
        self, batch: ScheduledBatch, target: ForwardInputs | None
    ) -> tuple[ForwardInputs, SamplingInputs]:
        """Prepare a step's inputs: into ``target`` (static views, padded to their shape) or,
        without one, into fresh tensors for an eager step. Sampling inputs cover the real
        sequences only."""

    def setup(self, model: ModelSpec, kv_cache: KVCacheSpec) -> None:
        """Runner state beyond the model and the KV cache (called by ``load``)."""
        return None

    def begin_step(self, batch: ScheduledBatch) -> None:
        """Before a step's inputs are prepared."""
        return None

    def end_step(self, batch: ScheduledBatch, inputs: ForwardInputs, sampled: torch.Tensor) -> None:
        """After sampling, with the step's inputs and the sampled tokens [B] (on the device)."""
        return None

    def kernel_choices(self) -> tuple[KernelChoice, ...]:
        """Every op this runner dispatched through the registry, with the reason of each choice."""
        assert self.ops is not None
        return self.ops.choices

    def load(self, model: ModelSpec, kv_cache: KVCacheSpec, decision: Decision) -> None:
        self.device = torch.device(model.device)
        platform = platform_of(self.device)
        self._check(decision, platform, model.tensor_parallel_size)
        tp = current_group()
        if tp.size != model.tensor_parallel_size:
            raise RunnerError(
                f"{self.name}: the model asks for tensor_parallel_size="
                f"{model.tensor_parallel_size} but this process is one of {tp.size} rank(s); "
                "tensor-parallel runs are started by interlock.runners.parallel"
            )
        self.model_spec = model
        self.decision = decision
        self.ops = build_kernel_table(platform, model.dtype, self.kernel_preference,
                                      model.kernels, compiled=decision.compile)
        tp.record_with(self.ops.foreign)  # a tape replays the collectives too
        self.model = load_model(model, self.ops, self.device, tp)
        self.block_size = kv_cache.block_size
        self.table_width = min(-(-model.max_model_len // kv_cache.block_size), kv_cache.num_blocks)
        self.kv_caches = allocate_kv_cache(
            model.config, kv_cache, model.dtype, self.device, tp.size
        )
        self.model.bind_kv_cache(self.kv_caches)
        self.state_pool = allocate_state_pool(model.config, model.max_num_seqs, model.dtype,
                                              self.device, tp.size)
        self.model.bind_state_pool(self.state_pool)
        self.kv_cache_report = kv_cache_report(model.config, model.dtype, kv_cache, tp.size,
                                               model.max_num_seqs)
        self.setup(model, kv_cache)
        self.graphs = GraphManager(
            self.make_plan(model, decision), self.device, self.graph_backend, self.table_width,
            compile=decision.compile, tapeable=self.ops.all_native(),
            debug=model.debug_graphs, forced=ForcedFailures.parse(model.fail_capture),
        )
        with torch.inference_mode():
            self.graphs.capture(self.model)

    @torch.inference_mode()
    def compute_logits(self, inputs: ForwardInputs) -> torch.Tensor:
        """An eager forward: logits [B, V] of each sequence's last fed token."""
        assert self.model is not None
        return forward_logits(self.model, inputs)

    def _check(self, decision: Decision, platform: str, tensor_parallel_size: int) -> None:
        """The decision must be one this runner's spec serves on ``platform`` on this machine
        (``RunnerSpec.unserved``, the judge stage 5 asks too): stage 5 of the policy never
        hands it anything else; a hand-made decision gets an error."""
        if decision.runner != self.name:
            cls = type(self)
            raise RunnerError(
                f"runner {self.name} ({cls.__module__}.{cls.__qualname__}) refuses the "
                f"decision: it names runner {decision.runner!r}, but this is {self.name!r}; a "
                f"runner built on {self.name} subclasses {cls.__qualname__} and sets its own "
                f"name (and runner_spec) to the RunnerSpec its plugin declares (docs/plugins.md, "
                f"'Building on a built-in runner'; examples/wrapped-runner-plugin)"
            )
        support = self.runner_spec.platforms.get(platform)
        missing = why_missing(support.requires if support is not None else (), platform)
        unserved = self.runner_spec.unserved(
            decision, platform, tensor_parallel_size=tensor_parallel_size,
            facts={name: why is None for name, why in missing.items()},
        )
        for item in unserved:
            if item.kind == CONTEXT and item.field == "requires":
                raise RunnerError(
                    f"{self.name} requires {item.what} on {platform}: {missing[item.value]}"
                )
        if unserved:
            raise RunnerError(
                f"{self.name} does not serve {', '.join(map(str, unserved))} on {platform}; its "
                "plugin declares what it serves, and the policy falls back to that automatically"
            )

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        if self.model is None or self.graphs is None or self.ops is None:
            raise RunnerError(f"{self.name}: execute() before load()")
        self.begin_step(batch)
        count = len(batch.sequences)
        chosen = self.graphs.select(batch.num_tokens, count, batch.decode_only)
        if chosen is None:
            inputs, sampling = self.stage(batch, None)
            logits = self.compute_logits(inputs)
        else:
            key, program = chosen
            inputs, sampling = self.stage(batch, self.graphs.inputs(key, batch.decode_only))
            logits = program.replay(inputs.metadata)[0][:count]
        processed = process_logits(logits, batch) if needs_processing(batch) else logits
        sampled = self.ops.sample(
            processed, sampling.temperature, sampling.top_k, sampling.top_p, sampling.seeds,
            sampling.steps,
        )
        self.end_step(batch, inputs, sampled)
        tokens = sampled.tolist()
        return RunnerOutput(
            tuple(t if s.sample else None for t, s in zip(tokens, batch.sequences, strict=True)),
            sample_logprobs(logits, tokens, batch),
        )

    def _reason(self, choice: KernelChoice) -> str:
        """Why ``choice`` was made; for the quantized products, also how the loader held
        the weights (``runners.model.quantized``: "native q4_1: weights kept quantized")."""
        if choice.op not in ("quantized_linear", "quantized_linear_int8") or self.model is None:
            return choice.reason
        held = "; ".join(f"{k}: {v}" for k, v in self.model.weight_decisions.items())
        return f"{held} ({choice.reason})" if held else choice.reason

    def report(self) -> RunnerReport:
        if self.ops is None or self.graphs is None:
            raise RunnerError(f"{self.name}: report() before load()")
        graphs = self.graphs.report()
        return RunnerReport(
            runner=self.name,
            device=str(self.device),
            dtype=self.model_spec.dtype,
            kernels=tuple(KernelReport(c.op, c.label, self._reason(c))
                          for c in self.kernel_choices()) + (LOGITS_REPORT,),
            cudagraph=self.decision.cudagraph,
            breakable=self.decision.breakable,
            captured_sizes=graphs.captured_sizes,
            fallbacks=self.graphs.fallbacks(),
            graphs=graphs,
            kv_cache=self.kv_cache_report,
        )
