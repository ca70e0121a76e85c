"""Building blocks of the decoder: linear projection, self-attention block, SwiGLU MLP.

Weights are fused where one matmul can replace several (q/k/v, gate/up);
``checkpoint_slots`` says which slice of which fused weight each checkpoint
tensor fills, so loading never needs per-architecture renaming code.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F

from interlock.runners.dispatch import KernelTable
from interlock.runners.model.attention import Attention, AttentionMetadata
from interlock.runners.model.config import ModelConfig

CheckpointSlots = Iterator[tuple[str, torch.Tensor]]  # (checkpoint tensor name, view to fill)


def empty_weight(*shape: int) -> nn.Parameter:
    """An uninitialised frozen parameter in the current default dtype and device."""
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class Linear(nn.Module):
    """y = x W^T + b, with W kept in whichever layout streams faster for decode.

    A decode step multiplies a few rows by every weight, so it is bound by how
    fast the weight is read. For projections wider than their input, BLAS
    reads an [in, out] matrix about twice as fast as the checkpoint's [out, in]
    one (measured on x86 CPUs with MKL; neutral for batched rows), so those
    weights are stored transposed. ``rows`` gives the checkpoint-oriented view.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.transposed = out_features > in_features
        shape = (in_features, out_features) if self.transposed else (out_features, in_features)
        self.weight = empty_weight(*shape)
        self.bias = empty_weight(out_features) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.transposed:
            return F.linear(x, self.weight, self.bias)
        if self.bias is None:
            return torch.mm(x, self.weight)
        return torch.addmm(self.bias, x, self.weight)

    def rows(self, rows: slice = slice(None)) -> torch.Tensor:
        """Output rows ``rows`` of W as an [out, in] view (what a checkpoint stores)."""
        weight = self.weight.t() if self.transposed else self.weight
        return weight[rows]

    def checkpoint_slots(self, name: str, rows: slice = slice(None)) -> CheckpointSlots:
        yield f"{name}.weight", self.rows(rows)
        if self.bias is not None:
            yield f"{name}.bias", self.bias[rows]


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
        self.qkv_proj = Linear(hidden, self.q_size + 2 * self.kv_size, config.qkv_bias)
        self.o_proj = Linear(self.q_size, hidden, config.o_bias)
        self.q_norm = empty_weight(config.head_dim) if config.qk_norm else None
        self.k_norm = empty_weight(config.head_dim) if config.qk_norm else None
        self.attn = Attention(
            layer_index, config.num_heads, config.num_kv_heads, config.head_dim,
            config.sliding_windows[layer_index], ops,
        )

    def project(
        self, positions: torch.Tensor, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Everything before the attention split point: q/k/v, norms, rotary, the KV-cache
        store. Returns q [T, Hq, D]."""
        tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
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
        self.attn.store(k, v, metadata)
        return q

    def output(self, attn_out: torch.Tensor) -> torch.Tensor:
        """The output projection of the attention output [T, Hq, D] -> [T, H]."""
        return self.o_proj(attn_out.reshape(attn_out.shape[0], self.q_size))

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        q, kv = self.q_size, self.kv_size
        parts = {
            "q_proj": slice(0, q), "k_proj": slice(q, q + kv), "v_proj": slice(q + kv, q + 2 * kv)
        }
        for name, rows in parts.items():
            yield from self.qkv_proj.checkpoint_slots(f"{prefix}.{name}", rows)
        yield from self.o_proj.checkpoint_slots(f"{prefix}.o_proj")
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
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        size = self.intermediate_size
        halves = {"gate_proj": slice(0, size), "up_proj": slice(size, 2 * size)}
        for name, rows in halves.items():
            yield from self.gate_up_proj.checkpoint_slots(f"{prefix}.{name}", rows)
        yield from self.down_proj.checkpoint_slots(f"{prefix}.down_proj")
