"""Routed-experts MLPs: ``SparseMoE`` (Mixtral, Qwen2-MoE with its gated shared expert,
Qwen3-MoE) and ``DeepseekMoE`` (DeepSeek V2/V3).

Under tensor parallelism every rank holds every expert, each with its part of the
intermediate features (tensor parallelism inside each expert), and the router whole:
all ranks route alike, each computes its partial expert outputs (and shared expert),
and one all-reduce sums them."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from interlock.kernels.native import BACKEND as NATIVE
from interlock.kernels.packing import PACK_STRIP
from interlock.kernels.registry import REFERENCE_BACKEND
from interlock.runners.dispatch import KernelTable
from interlock.runners.model.config import ModelConfig
from interlock.runners.model.layers import CheckpointSlots, DenseMLP, empty_weight, frozen
from interlock.runners.model.sharding import Shard
from interlock.runners.parallel.group import TensorParallel


def pack_experts(
    w13: torch.Tensor, w2: torch.Tensor, ops: KernelTable
) -> tuple[torch.Tensor, torch.Tensor]:
    """The expert weights packed in place, each expert's matrix by ``pack_weight``, when the
    table packs linear weights (``KernelTable.packs_weights``) and its ``moe_experts`` takes
    packed experts (the native kernels and the reference do) and every matrix's outputs are
    a multiple of ``PACK_STRIP``; else as they are. Once, after loading."""
    experts = w13.shape[0]
    if (not ops.packs_weights
            or ops.choice("moe_experts").impl.backend not in (NATIVE, REFERENCE_BACKEND)
            or w13.shape[1] % PACK_STRIP or w2.shape[1] % PACK_STRIP):
        return w13, w2
    for matrices in (w13, w2):
        for expert in range(experts):
            ops.pack_weight(matrices[expert])
    return (frozen(w13.view(experts, w13.shape[1] // PACK_STRIP, w13.shape[2], PACK_STRIP)),
            frozen(w2.view(experts, w2.shape[1] // PACK_STRIP, w2.shape[2], PACK_STRIP)))


class RoutedExperts(nn.Module):
    """What both MoE blocks hold alike: the router's weight and every expert's gate/up and
    down weights, each rank with its shard of the intermediate features; their packing after
    loading and their checkpoint names."""

    def __init__(
        self,
        config: ModelConfig,
        ops: KernelTable,
        expert_names: tuple[str, str, str],
        tp: TensorParallel,
    ) -> None:
        """``expert_names``: the checkpoint names of an expert's gate, up and down projections."""
        super().__init__()
        moe = config.moe
        assert moe is not None  # each block refuses a config without one, naming it
        hidden, size = config.hidden_size, moe.intermediate_size // tp.size
        self.shard = Shard(0, tp.rank * size, (tp.rank + 1) * size, moe.intermediate_size)
        self.tp = tp
        self.ops = ops
        self.top_k = moe.top_k
        self.renormalize = moe.norm_topk_prob
        self.intermediate_size = size
        self.expert_names = expert_names
        self.router_weight = empty_weight(moe.num_experts, hidden)
        self.w13 = empty_weight(moe.num_experts, 2 * size, hidden)  # per expert: gate, then up
        self.w2 = empty_weight(moe.num_experts, hidden, size)

    def pack(self) -> None:
        self.w13, self.w2 = pack_experts(self.w13, self.w2, self.ops)

    def expert_slots(self, prefix: str) -> CheckpointSlots:
        """Each expert's gate, up and down weights (``prefix.experts.N.*``)."""
        gate, up, down = self.expert_names
        size, rows = self.intermediate_size, self.shard
        columns = Shard(1, rows.start, rows.stop, rows.full)
        for expert in range(self.w13.shape[0]):
            name = f"{prefix}.experts.{expert}"
            yield f"{name}.{gate}.weight", self.w13[expert, :size], rows
            yield f"{name}.{up}.weight", self.w13[expert, size:], rows
            yield f"{name}.{down}.weight", self.w2[expert], columns


class SparseMoE(RoutedExperts):
    """Softmax router, top-k experts (optionally renormalised), plus an optional shared expert.

    The shared expert is scaled by sigmoid(shared_expert_gate(x)) as in Qwen2-MoE.
    """

    def __init__(
        self,
        config: ModelConfig,
        ops: KernelTable,
        expert_names: tuple[str, str, str],
        tp: TensorParallel,
    ) -> None:
        moe = config.moe
        if moe is None:
            raise ValueError(f"{config.architecture} has no MoE configuration")
        super().__init__(config, ops, expert_names, tp)
        hidden = config.hidden_size
        self.shared_expert: DenseMLP | None = None
        self.shared_expert_gate: nn.Parameter | None = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = DenseMLP(
                hidden, moe.shared_expert_intermediate_size, ops, tp, reduce=False
            )
            self.shared_expert_gate = empty_weight(1, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        router_logits = F.linear(x, self.router_weight)
        weights, ids = self.ops.moe_route(router_logits, self.top_k, self.renormalize)
        out = self.ops.moe_experts(x, self.w13, self.w2, weights, ids)
        if self.shared_expert is not None:
            gate = torch.sigmoid(F.linear(x, self.shared_expert_gate))
            out = out + gate * self.shared_expert(x)
        return self.tp.all_reduce(out)

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        yield f"{prefix}.gate.weight", self.router_weight, None
        yield from self.expert_slots(prefix)
        if self.shared_expert is not None:
            yield from self.shared_expert.checkpoint_slots(f"{prefix}.shared_expert")
            yield f"{prefix}.shared_expert_gate.weight", self.shared_expert_gate, None


class DeepseekMoE(RoutedExperts):
    """DeepSeek's MoE block: grouped routing (``moe_grouped_route``: softmax or sigmoid
    scores, greedy, group-limited or bias-corrected group choice, renormalised and scaled),
    the routed experts, plus ``n_shared_experts`` ungated shared experts, one SwiGLU MLP as
    wide as all of them together (``shared_experts`` in the checkpoint) run for every token.

    Every computation goes through the kernel table, so a native tape can record the block.
    Under tensor parallelism, as ``SparseMoE``: every rank routes alike and holds its part of
    every expert's (and the shared MLP's) intermediate features; one all-reduce sums them."""

    def __init__(
        self,
        config: ModelConfig,
        ops: KernelTable,
        expert_names: tuple[str, str, str],
        tp: TensorParallel,
    ) -> None:
        moe = config.moe
        if moe is None or moe.routing is None:
            raise ValueError(f"{config.architecture} has no DeepSeek routing configuration")
        super().__init__(config, ops, expert_names, tp)
        self.routing = routing = moe.routing
        hidden = config.hidden_size
        self.correction_bias = empty_weight(moe.num_experts) if routing.correction_bias else None
        # Built even with n_shared_experts 0: transformers then saves the shared MLP's
        # zero-sized tensors, and they must load.
        self.shared_experts = DenseMLP(
            hidden, moe.intermediate_size * routing.shared_experts, ops, tp, reduce=False
        )

    def pack(self) -> None:
        """The experts as ``RoutedExperts.pack``; and, where the table packs linear weights,
        the router too, its outputs padded with zero rows to a multiple of ``PACK_STRIP``
        (``forward`` reads the real experts' columns), so that its product is a packed one
        like every other rather than torch's (on a native tape: a Python call per layer)."""
        super().pack()
        weight = self.router_weight
        if self.ops.packs_weights and weight.dim() == 2:
            experts, hidden = weight.shape
            if experts % PACK_STRIP:
                weight = weight.new_zeros(-(-experts // PACK_STRIP) * PACK_STRIP, hidden)
                weight[:experts] = self.router_weight
            self.router_weight = frozen(self.ops.pack_weight(weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops, routing = self.ops, self.routing
        logits = ops.linear(x, self.router_weight, None, False)[:, : self.w13.shape[0]]
        weights, ids = ops.moe_grouped_route(
            logits, self.correction_bias, self.top_k, routing.scoring, routing.method,
            routing.n_group, routing.topk_group, self.renormalize, routing.scaling,
        )
        out = ops.moe_experts(x, self.w13, self.w2, weights, ids)
        if self.routing.shared_experts:
            out = ops.add(out, self.shared_experts(x))
        return self.tp.all_reduce(out)

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        yield f"{prefix}.gate.weight", self.router_weight, None
        if self.correction_bias is not None:
            yield f"{prefix}.gate.e_score_correction_bias", self.correction_bias, None
        yield from self.expert_slots(prefix)
        yield from self.shared_experts.checkpoint_slots(f"{prefix}.shared_experts")
