"""Kimi Delta Attention (KDA): the linear-attention layers of Kimi Linear.

A KDA layer keeps no per-token cache. Each request instead owns one slot of a state pool
(``interlock.runners.model.state_pool``) holding, per KDA layer, the last
``conv_kernel - 1`` inputs of its short convolution and its recurrent state
[H, D, D] (float32). ``AttentionMetadata.state_slots`` says which slot each sequence of a
step uses; a sequence with nothing cached yet (a new request, or a preempted one
recomputing from its prompt) starts from zeros, so a slot never carries one request's
state into another's.

The layer is split like attention: ``KDASelfAttention.project`` computes every projection
from the hidden state (q, k, v before the convolution, the forget and output gates' low
rank pairs, beta's logits) into one tensor; ``KDAttention.attend``, the split point,
runs the convolution, the gates, the delta rule and the gated output norm, reading and
updating the pool; ``output`` is o_proj. So piecewise and breakable programs cut a KDA
layer where they cut attention, and a decode graph captures the in-place state update
(``causal_conv1d_update``, ``kda_recurrent``: no host sync) on the pool's static slots.
A mixed step runs the chunked delta rule (``kda_chunked``), ``CHUNK_SIZE`` tokens at a
time.
"""

from __future__ import annotations

import torch
from torch import nn

from interlock.runners.dispatch import KernelTable
from interlock.runners.model.attention import AttentionLayer, AttentionMetadata
from interlock.runners.model.build import ModelBuild
from interlock.runners.model.config import LinearAttentionConfig
from interlock.runners.model.layers import (
    CheckpointSlots,
    Linear,
    RowParallelLinear,
    empty_weight,
    frozen,
)
from interlock.runners.model.sharding import Shard

#: Tokens per chunk of the chunked delta rule in a prefill (transformers' default).
CHUNK_SIZE = 64


class KDAttention(AttentionLayer):
    """The split point of a KDA layer: convolution, gates, delta rule and gated norm over
    the request's pooled state. Input [T, 5*H*D + H] (``KDASelfAttention.project``),
    output [T, H, D]."""

    def __init__(self, layer_index: int, linear: LinearAttentionConfig, eps: float,
                 ops: KernelTable, chunk_size: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.heads, self.head_dim = linear.num_heads, linear.head_dim
        self.width = linear.num_heads * linear.head_dim
        self.eps = eps
        self.ops = ops
        self.chunk_size = chunk_size
        taps = linear.conv_kernel
        self.conv_weight = empty_weight(3 * self.width, 1, taps)  # q, k, v channels
        self.dt_bias = frozen(torch.empty(self.width, dtype=torch.float32))
        self.a_log = empty_weight(1, 1, self.heads, 1)
        self.o_norm = empty_weight(self.head_dim)
        self.conv_state: torch.Tensor | None = None  # [S, 3*H*D, K-1], bound by the runner
        self.recurrent_state: torch.Tensor | None = None  # [S, H, D, D] float32

    def bind_cache(self, *tensors: torch.Tensor) -> None:
        if tensors:
            raise ValueError(f"layer {self.layer_index}: a KDA layer has no paged cache, "
                             f"given {len(tensors)} tensors")

    def bind_state(self, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """Bind this layer's tensors of the state pool (``state_pool.allocate_state_pool``)."""
        self.conv_state, self.recurrent_state = conv, recurrent

    def attend(self, x: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        if self.conv_state is None or self.recurrent_state is None:
            raise RuntimeError(f"layer {self.layer_index}: no state pool bound (bind_state)")
        slots = metadata.state_slots
        if slots is None:
            raise RuntimeError(f"layer {self.layer_index}: the step has no state slots")
        ops, width, tokens = self.ops, self.width, x.shape[0]
        shape = (tokens, self.heads, self.head_dim)
        mixed = x[:, : 3 * width]
        f = x[:, 3 * width: 4 * width]
        b = x[:, 4 * width: 4 * width + self.heads]
        gate = x[:, 4 * width + self.heads:].view(shape)
        weight = self.conv_weight[:, 0]
        if metadata.decode_only:
            conv = ops.causal_conv1d_update(mixed, weight, self.conv_state, slots)
        else:
            conv = ops.causal_conv1d(mixed, weight, self.conv_state, slots,
                                     metadata.query_start_loc, metadata.seq_lens)
        q, k, v = (conv[:, i * width:(i + 1) * width].view(shape) for i in range(3))
        g, beta = ops.kda_gates(f, b, self.dt_bias, self.a_log)
        if metadata.decode_only:
            out = ops.kda_recurrent(q, k, v, g, beta, self.recurrent_state, slots)
        else:
            out = ops.kda_chunked(q, k, v, g, beta, self.recurrent_state, slots,
                                  metadata.query_start_loc, metadata.seq_lens, self.chunk_size)
        return ops.gated_rms_norm(out, gate, self.o_norm, self.eps)

    def empty_output(self, q: torch.Tensor) -> torch.Tensor:
        return q.new_empty(q.shape[0], self.heads, self.head_dim)

    @property
    def break_label(self) -> str:
        return f"layer {self.layer_index}: linear attention (KDA)"


class KDASelfAttention(nn.Module):
    """A KDA layer with the interface of ``layers.SelfAttention``: ``project``, ``attn``
    (the split point), ``output``, ``checkpoint_slots``.

    Tensor parallelism splits the KDA heads: each rank holds its heads' rows of q, k, v,
    of the convolution, of the gates' second projections, of beta, dt_bias and A_log, and
    their state in the pool; the gates' first (low-rank) projections and the output norm
    are whole, o_proj is row-parallel (one all-reduce)."""

    def __init__(self, build: ModelBuild, layer_index: int) -> None:
        super().__init__()
        config, ops, tp, plan = build.config, build.ops, build.tp, build.plan
        linear = config.linear
        if linear is None:
            raise ValueError(f"{config.architecture} has no linear-attention configuration")
        self.ops = ops
        heads = plan.linear_heads
        rank_dim = self.head_dim = linear.head_dim
        width = self.width = heads * rank_dim
        full_width = linear.num_heads * rank_dim
        local = LinearAttentionConfig(heads, rank_dim, linear.conv_kernel, linear.layers)
        hidden = config.hidden_size
        self.shard = plan.rows(tp.rank, width, full_width)
        self.head_shard = plan.rows(tp.rank, heads, linear.num_heads)
        # One product for everything read from the hidden state: [q, k, v (this rank's
        # heads), forget gate's low rank, output gate's low rank (whole), beta logits].
        self.in_proj = Linear(hidden, 3 * width + 2 * rank_dim + heads, ops)
        self.f_b_proj = Linear(rank_dim, width, ops)
        self.g_b_proj = Linear(rank_dim, width, ops)
        self.o_proj = RowParallelLinear(width, hidden, ops, tp)
        self.attn = KDAttention(layer_index, local, config.rms_norm_eps, ops, CHUNK_SIZE)

    def project(self, positions: torch.Tensor, hidden: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        """Every projection before the split point, as one tensor [T, 5*H*D + H]: q, k, v
        (before the convolution), the forget gate's and the output gate's projections,
        beta's logits. KDA carries position in its state: ``positions`` is unused."""
        width, rank = self.width, self.head_dim
        a = self.in_proj(hidden)
        mixed = a[:, : 3 * width]
        f = self.f_b_proj(a[:, 3 * width: 3 * width + rank])
        gate = self.g_b_proj(a[:, 3 * width + rank: 3 * width + 2 * rank])
        b = a[:, 3 * width + 2 * rank:]
        return self.ops.concat([mixed, f, b, gate])

    def output(self, attn_out: torch.Tensor) -> torch.Tensor:
        """o_proj of [T, H, D] -> [T, hidden], summed over ranks."""
        return self.o_proj(attn_out.reshape(attn_out.shape[0], self.width))

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        width, rank, shard = self.width, self.head_dim, self.shard
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            rows = slice(i * width, (i + 1) * width)
            yield from self.in_proj.checkpoint_slots(f"{prefix}.{name}", rows, shard)
            yield f"{prefix}.{name[0]}_conv1d.weight", self.attn.conv_weight[rows], shard
        start = 3 * width
        yield from self.in_proj.checkpoint_slots(f"{prefix}.f_a_proj", slice(start, start + rank))
        yield from self.in_proj.checkpoint_slots(f"{prefix}.g_a_proj",
                                                 slice(start + rank, start + 2 * rank))
        yield from self.in_proj.checkpoint_slots(f"{prefix}.b_proj",
                                                 slice(start + 2 * rank, None), self.head_shard)
        yield from self.f_b_proj.checkpoint_slots(f"{prefix}.f_b_proj", shard=shard)
        yield from self.g_b_proj.checkpoint_slots(f"{prefix}.g_b_proj", shard=shard)
        o_shard = Shard(1, shard.start, shard.stop, shard.full)
        yield from self.o_proj.checkpoint_slots(f"{prefix}.o_proj", shard=o_shard)
        yield f"{prefix}.dt_bias", self.attn.dt_bias, shard
        head = self.head_shard
        yield f"{prefix}.A_log", self.attn.a_log, Shard(2, head.start, head.stop, head.full)
        yield f"{prefix}.o_norm.weight", self.attn.o_norm, None
