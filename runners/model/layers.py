"""Building blocks of the decoder: self-attention block and SwiGLU MLP.

Weights are fused where one matmul can replace several (q/k/v, gate/up);
``checkpoint_slots`` says which slice of which fused weight each checkpoint
tensor fills, so loading never needs per-architecture renaming code.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F

from runners.dispatch import KernelTable
from runners.model.attention import Attention, AttentionMetadata
from runners.model.config import ModelConfig

CheckpointSlots = Iterator[tuple[str, torch.Tensor]]  # (checkpoint tensor name, view to fill)


def empty_weight(*shape: int) -> nn.Parameter:
    """An uninitialised frozen parameter in the current default dtype and device."""
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class SelfAttention(nn.Module):
    """q/k/v projection, optional per-head q/k norm, rotary, paged attention, output projection."""

    def __init__(
        self, config: ModelConfig, layer_index: int, ops: KernelTable, cos_sin_cache: torch.Tensor
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.eps = config.rms_norm_eps
        self.ops = ops
        self.cos_sin_cache = cos_sin_cache
        hidden = config.hidden_size
        self.qkv_weight = empty_weight(self.q_size + 2 * self.kv_size, hidden)
        self.qkv_bias = empty_weight(self.q_size + 2 * self.kv_size) if config.qkv_bias else None
        self.o_weight = empty_weight(hidden, self.q_size)
        self.o_bias = empty_weight(hidden) if config.o_bias else None
        self.q_norm = empty_weight(config.head_dim) if config.qk_norm else None
        self.k_norm = empty_weight(config.head_dim) if config.qk_norm else None
        self.attn = Attention(
            layer_index, config.num_heads, config.num_kv_heads, config.head_dim,
            config.sliding_windows[layer_index], ops,
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        qkv = F.linear(hidden, self.qkv_weight, self.qkv_bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.ops.rms_norm(q.reshape(-1, self.head_dim), self.q_norm, self.eps)
            k = self.ops.rms_norm(k.reshape(-1, self.head_dim), self.k_norm, self.eps)
            q = q.view(tokens, self.num_heads, self.head_dim)
            k = k.view(tokens, self.num_kv_heads, self.head_dim)
        self.ops.rotary_embedding(positions, q, k, self.cos_sin_cache)
        out = self.attn(q, k, v, metadata)
        return F.linear(out.reshape(tokens, self.q_size), self.o_weight, self.o_bias)

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        q, kv = self.q_size, self.kv_size
        parts = {
            "q_proj": slice(0, q), "k_proj": slice(q, q + kv), "v_proj": slice(q + kv, q + 2 * kv)
        }
        for name, rows in parts.items():
            yield f"{prefix}.{name}.weight", self.qkv_weight[rows]
            if self.qkv_bias is not None:
                yield f"{prefix}.{name}.bias", self.qkv_bias[rows]
        yield f"{prefix}.o_proj.weight", self.o_weight
        if self.o_bias is not None:
            yield f"{prefix}.o_proj.bias", self.o_bias
        if self.q_norm is not None:
            yield f"{prefix}.q_norm.weight", self.q_norm
            yield f"{prefix}.k_norm.weight", self.k_norm


class DenseMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one weight."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, ops: KernelTable, bias: bool = False
    ) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.ops = ops
        self.gate_up_weight = empty_weight(2 * intermediate_size, hidden_size)
        self.gate_up_bias = empty_weight(2 * intermediate_size) if bias else None
        self.down_weight = empty_weight(hidden_size, intermediate_size)
        self.down_bias = empty_weight(hidden_size) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = F.linear(x, self.gate_up_weight, self.gate_up_bias)
        return F.linear(self.ops.silu_and_mul(gate_up), self.down_weight, self.down_bias)

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        size = self.intermediate_size
        halves = {"gate_proj": slice(0, size), "up_proj": slice(size, 2 * size)}
        for name, rows in halves.items():
            yield f"{prefix}.{name}.weight", self.gate_up_weight[rows]
            if self.gate_up_bias is not None:
                yield f"{prefix}.{name}.bias", self.gate_up_bias[rows]
        yield f"{prefix}.down_proj.weight", self.down_weight
        if self.down_bias is not None:
            yield f"{prefix}.down_proj.bias", self.down_bias
