"""Building blocks of the decoder: linear projection, self-attention block, SwiGLU MLP.

Weights are fused where one matmul can replace several (q/k/v, gate/up);
``checkpoint_slots`` says which slice of which fused weight each checkpoint
tensor fills, and which rows of the checkpoint tensor a tensor-parallel rank
reads (a ``Shard``), so loading never needs per-architecture renaming code.

Under tensor parallelism (``interlock.runners.model.sharding``) the fused q/k/v and
gate/up projections are column-parallel (each rank holds its heads' q, k and v rows,
its part of gate and of up), the attention output and down projections row-parallel
(each rank holds the matching input columns), followed by one all-reduce each.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from interlock.kernels.packing import PACK_STRIP
from interlock.runners.dispatch import KernelTable
from interlock.runners.model.attention import Attention, AttentionMetadata
from interlock.runners.model.build import ModelBuild
from interlock.runners.model.sharding import Shard
from interlock.runners.parallel.group import TensorParallel

# (checkpoint tensor name, view to fill, rows of the checkpoint tensor it holds or None: all)
CheckpointSlots = Iterator[tuple[str, torch.Tensor, Shard | None]]


def empty_weight(*shape: int) -> nn.Parameter:
    """An uninitialised frozen parameter in the current default dtype and device."""
    return frozen(torch.empty(*shape))


def frozen(tensor: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(tensor, requires_grad=False)


def stored_transposed(in_features: int, out_features: int, ops: KernelTable) -> bool:
    """Whether a weight made now (in the current default dtype) for the kernel table ``ops``
    is stored [in, out] rather than the checkpoint's [out, in]: the layout that streams
    faster for decode. Never for a table that packs weights: they load [out, in], then are
    packed (``Linear.pack``).

    A decode step multiplies a few rows by every weight, so it is bound by how fast the
    weight is read. In float32, for projections wider than their input, BLAS reads an
    [in, out] matrix about twice as fast as [out, in] (measured on x86 CPUs with MKL;
    neutral for batched rows). In bfloat16 and float16 the opposite holds by far: only
    ``F.linear`` over [out, in] reaches torch's reduced-precision GEMV, and a one-row
    ``mm`` over [in, out] measured 8x slower for a gate/up weight and 20x for the LM head
    (AVX2 CPU without native bfloat16)."""
    return (not ops.packs_weights and out_features > in_features
            and torch.get_default_dtype() == torch.float32)


class Linear(nn.Module):
    """y = x W^T + b, with W loaded in whichever layout streams faster for decode
    (:func:`stored_transposed`; ``rows`` gives the checkpoint-oriented view), then packed
    if the kernel table wants it (``pack``)."""

    def __init__(
        self, in_features: int, out_features: int, ops: KernelTable, bias: bool = False
    ) -> None:
        super().__init__()
        self.ops = ops
        self.in_features, self.out_features = in_features, out_features
        self.transposed = stored_transposed(in_features, out_features, ops)
        shape = (in_features, out_features) if self.transposed else (out_features, in_features)
        self.weight = empty_weight(*shape)
        self.bias = empty_weight(out_features) if bias else None
        # The GGML type of a weight kept quantized (``keep_quantized``), else None; whether
        # its records are those of the products on int8 activations.
        self.weight_format: str | None = None
        self.int8_activations = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x, self.bias)

    def product(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x W^T + ``bias``, with W as it is held (floats, packed, or quantized)."""
        if self.int8_activations:
            assert self.weight_format is not None
            return self.ops.quantized_linear_int8(x, self.weight, self.weight_format, bias)
        if self.weight_format is not None:
            return self.ops.quantized_linear(x, self.weight, self.weight_format, bias)
        return self.ops.linear(x, self.weight, bias, self.transposed)

    def keep_quantized(self, packed: torch.Tensor, ggml_type: str, int8: bool = False) -> None:
        """Hold the weight as ``packed`` records of ``ggml_type`` (``kernels.quant.pack``;
        those of ``quant.INT8_FORMATS`` if ``int8``) instead of floats; the float weight,
        never written, is freed."""
        self.weight = frozen(packed)
        self.weight_format = ggml_type
        self.int8_activations = int8

    def rows(self, rows: slice = slice(None)) -> torch.Tensor:
        """Output rows ``rows`` of W as an [out, in] view (what a checkpoint stores)."""
        if self.weight.dim() != 2:
            raise RuntimeError("a packed weight has no row views: load before packing")
        weight = self.weight.t() if self.transposed else self.weight
        return weight[rows]

    def pack(self) -> None:
        """Pack the loaded weight in place (``ops.pack_weight``) if the table's ``linear``
        wants it (``KernelTable.packs_weights``: the weight then loaded [out, in]); a weight
        whose outputs are not a multiple of ``PACK_STRIP`` stays as it is."""
        weight = self.weight
        if self.ops.packs_weights and weight.dim() == 2 and weight.shape[0] % PACK_STRIP == 0:
            self.weight = frozen(self.ops.pack_weight(weight))

    def checkpoint_slots(
        self, name: str, rows: slice = slice(None), shard: Shard | None = None
    ) -> CheckpointSlots:
        """``shard`` along dim 0 (output rows) applies to the bias too; along dim 1 (input
        columns, row-parallel) the bias is whole."""
        if self.weight_format is None:  # else already filled (``keep_quantized``)
            yield f"{name}.weight", self.rows(rows), shard
        if self.bias is not None:
            yield f"{name}.bias", self.bias[rows], shard if shard and shard.dim == 0 else None


class RowParallelLinear(Linear):
    """A Linear whose input features are split across ranks: each rank multiplies its
    columns, the partial outputs are summed over ranks (unless ``reduce`` is False: the
    caller sums them with other partials), then the bias is added once."""

    def __init__(
        self, in_features: int, out_features: int, ops: KernelTable, tp: TensorParallel,
        bias: bool = False, reduce: bool = True,
    ) -> None:
        super().__init__(in_features, out_features, ops, bias)
        if bias and not reduce:
            raise ValueError("a row-parallel bias needs the reduction before it is added")
        self.tp = tp
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(x)
        y = self.product(x, None)
        if self.reduce:
            y = self.tp.all_reduce(y)
        return y if self.bias is None else self.ops.add(y, self.bias.expand_as(y))


class SelfAttention(nn.Module):
    """q/k/v projection, optional per-head q/k norm, rotary, paged attention, output projection."""

    def __init__(self, build: ModelBuild, layer_index: int) -> None:
        super().__init__()
        config, ops, tp, plan = build.config, build.ops, build.tp, build.plan
        # This rank's heads (all of them on one rank).
        self.num_heads, self.num_kv_heads = plan.num_heads, plan.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = plan.num_heads * config.head_dim
        self.kv_size = plan.num_kv_heads * config.head_dim
        self.eps = config.rms_norm_eps
        self.ops = ops
        self.cos_sin_cache = build.cos_sin
        dim = config.head_dim
        self.q_shard = plan.rows(tp.rank, self.q_size, config.num_heads * dim)
        kv_start = plan.kv_head_start(tp.rank) * dim
        self.kv_shard = Shard(0, kv_start, kv_start + self.kv_size, config.num_kv_heads * dim)
        hidden = config.hidden_size
        self.qkv_proj = Linear(hidden, self.q_size + 2 * self.kv_size, ops, config.qkv_bias)
        self.o_proj = RowParallelLinear(self.q_size, hidden, ops, tp, config.o_bias)
        self.q_norm = empty_weight(config.head_dim) if config.qk_norm else None
        self.k_norm = empty_weight(config.head_dim) if config.qk_norm else None
        self.attn = Attention(
            layer_index, plan.num_heads, plan.num_kv_heads, config.head_dim,
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
            q = self.ops.rms_norm(q, self.q_norm, self.eps)
            k = self.ops.rms_norm(k, self.k_norm, self.eps)
            q = q.view(tokens, self.num_heads, self.head_dim)
            k = k.view(tokens, self.num_kv_heads, self.head_dim)
        self.ops.rotary_embedding(positions, q, k, self.cos_sin_cache)
        self.attn.store(k, v, metadata)
        return q

    def output(self, attn_out: torch.Tensor) -> torch.Tensor:
        """The output projection of the attention output [T, Hq, D] -> [T, H], summed over
        ranks."""
        return self.o_proj(attn_out.reshape(attn_out.shape[0], self.q_size))

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        q, kv = self.q_size, self.kv_size
        parts = {
            "q_proj": (slice(0, q), self.q_shard),
            "k_proj": (slice(q, q + kv), self.kv_shard),
            "v_proj": (slice(q + kv, q + 2 * kv), self.kv_shard),
        }
        for name, (rows, shard) in parts.items():
            yield from self.qkv_proj.checkpoint_slots(f"{prefix}.{name}", rows, shard)
        q_shard = self.q_shard
        columns = Shard(1, q_shard.start, q_shard.stop, q_shard.full)
        yield from self.o_proj.checkpoint_slots(f"{prefix}.o_proj", shard=columns)
        if self.q_norm is not None:
            yield f"{prefix}.q_norm.weight", self.q_norm, None
            yield f"{prefix}.k_norm.weight", self.k_norm, None


class DenseMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one weight.

    Each rank holds ``intermediate_size / tp.size`` of the intermediate features; the
    output is summed over ranks unless ``reduce`` is False (the caller sums it with other
    partial outputs: the shared expert of a MoE block)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        ops: KernelTable,
        tp: TensorParallel,
        bias: bool = False,
        reduce: bool = True,
    ) -> None:
        super().__init__()
        local = intermediate_size // tp.size
        self.intermediate_size = local
        self.shard = Shard(0, tp.rank * local, (tp.rank + 1) * local, intermediate_size)
        self.ops = ops
        self.gate_up_proj = Linear(hidden_size, 2 * local, ops, bias)
        self.down_proj = RowParallelLinear(local, hidden_size, ops, tp, bias, reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        size, shard = self.intermediate_size, self.shard
        halves = {"gate_proj": slice(0, size), "up_proj": slice(size, 2 * size)}
        for name, rows in halves.items():
            yield from self.gate_up_proj.checkpoint_slots(f"{prefix}.{name}", rows, shard)
        columns = Shard(1, shard.start, shard.stop, shard.full)
        yield from self.down_proj.checkpoint_slots(f"{prefix}.down_proj", shard=columns)
