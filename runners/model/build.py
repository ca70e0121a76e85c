"""What every layer of one model is built with, made once per model (``CausalLM``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from interlock.runners.dispatch import KernelTable
from interlock.runners.model.config import ModelConfig
from interlock.runners.model.sharding import ShardPlan
from interlock.runners.parallel.group import TensorParallel


@dataclass(frozen=True, eq=False)
class ModelBuild:
    """The model's config, the kernel table its ops run through, this rank's
    tensor-parallel group and shard plan, and the rotary tables every attention layer
    shares (``index_cos_sin``: the DSA indexer's, for a model with DeepSeek sparse
    attention)."""

    config: ModelConfig
    ops: KernelTable
    tp: TensorParallel
    plan: ShardPlan
    cos_sin: torch.Tensor
    index_cos_sin: torch.Tensor | None = None
