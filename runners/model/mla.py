"""Multi-head latent attention (DeepSeek V2/V3) over a paged latent cache.

Per token the cache holds what production engines hold: the compressed KV latent
(``kv_lora_rank``) and the rotary key (``qk_rope_head_dim``), both shared by every head, in
one ``latent`` tensor [NB, BS, L + R] (``cache_spec``). Per-head keys and values exist
only inside attention:

* decode (``mla_decode_attention``) runs in the absorbed form: W_UK (kv_b_proj's key rows)
  is folded into the query, the heads attend over the latent itself, and W_UV (its value
  rows) maps the result to each head's values;
* a mixed or prefill batch (``mla_attention``) expands each sequence's latents to per-head
  K and V, which for a prompt costs less than scoring the wide latent for every query.

Both are behind the split point: the query handed to ``LatentAttention.attend`` is
``[T, H*Dn + H*R]`` (every head's non-rotary part, then every head's rotated part), its
output is ``[T, H, Dv]``; everything before (projections, norms, rotary, the cache store)
and after (o_proj) is ordinary graph-captured code.

Weights load in checkpoint order, then ``MLASelfAttention.arrange_loaded`` reorders rows:
the query's rotary rows after all the non-rotary ones (so the rotary op sees [T, H, R] with
heads back to back), and, for checkpoints whose rotary dims are interleaved pairs
(``rope_interleave``, always for DeepSeek-V2), the pairs split into halves. Rotating the
halves with the ordinary (neox) rotary op is then exactly the interleaved rotation, up to a
permutation that q and k share and a dot product does not see.

Tensor parallelism: each rank holds its heads' q rows, kv_b rows and o_proj columns. The
latent projection (kv_a_proj_with_mqa, its norm) and the latent cache are replicated:
every head reads the whole latent, so splitting heads cannot split it.

Extension points (a sparse attention such as DSA builds on this): a subclass of
``LatentAttention`` adds cache tensors (``cache_spec.layer_cache`` declares them, and
``bind_cache`` receives them after the latent) and overrides ``attend`` to attend over the
positions it selects; ``MLASelfAttention.attention_class`` says which class a layer gets and
``project`` / ``store`` are where per-token extras (an indexer's keys) are computed and stored.
"""

from __future__ import annotations

import torch
from torch import nn

from interlock.runners.dispatch import KernelTable
from interlock.runners.model.attention import AttentionLayer, AttentionMetadata
from interlock.runners.model.build import ModelBuild
from interlock.runners.model.config import MLAConfig
from interlock.runners.model.layers import CheckpointSlots, Linear, RowParallelLinear, empty_weight

#: transformers builds the q_a and kv_a norms with RMSNorm's default epsilon, whatever the
#: config's rms_norm_eps.
LATENT_NORM_EPS = 1e-6


class LatentAttention(AttentionLayer):
    """One layer's attention over its paged latent cache: store the latent and rotary key,
    then attend (the split point) in the absorbed form for decode, expanded otherwise."""

    def __init__(
        self, layer_index: int, mla: MLAConfig, num_heads: int, kv_b: torch.Tensor,
        ops: KernelTable,
    ) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = num_heads  # this rank's
        self.nope = mla.qk_nope_head_dim
        self.rope = mla.qk_rope_head_dim
        self.rank = mla.kv_lora_rank
        self.v_head_dim = mla.v_head_dim
        self.scale = mla.softmax_scale
        self.kv_b = kv_b  # [H, Dn + Dv, L]: kv_b_proj per head, W_UK rows then W_UV rows
        self.ops = ops
        self.cache: torch.Tensor | None = None  # [NB, BS, L + R], bound by the runner

    def bind_cache(self, *tensors: torch.Tensor) -> None:
        (cache,) = tensors
        width = self.rank + self.rope
        if cache.dim() != 3 or cache.shape[2] != width:
            raise ValueError(
                f"layer {self.layer_index}: latent cache shape {tuple(cache.shape)} does not "
                f"end in kv_lora_rank + qk_rope_head_dim = {width}"
            )
        self.cache = cache

    def store(self, latent: torch.Tensor, k_pe: torch.Tensor, metadata: AttentionMetadata
              ) -> None:
        """Write this step's latents [T, L] and rotary keys [T, R] (before the split point)."""
        if self.cache is None:
            raise RuntimeError(f"layer {self.layer_index}: no latent cache bound (bind_kv_cache)")
        self.ops.store_latent_cache(latent, k_pe, self.cache, metadata.slot_mapping)

    def query_parts(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H*Dn + H*R] -> (q_nope [T, H, Dn], q_pe [T, H, R]), views."""
        tokens, split = q.shape[0], self.num_heads * self.nope
        return (q[:, :split].view(tokens, self.num_heads, self.nope),
                q[:, split:].view(tokens, self.num_heads, self.rope))

    def attend(self, q: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        q_nope, q_pe = self.query_parts(q)
        if metadata.decode_only:
            return self.ops.mla_decode_attention(
                q_nope, q_pe, self.cache, self.kv_b, metadata.block_tables, metadata.seq_lens,
                self.scale,
            )
        return self.ops.mla_attention(
            q_nope, q_pe, self.cache, self.kv_b, metadata.block_tables, metadata.seq_lens,
            metadata.query_start_loc, self.scale,
        )

    def empty_output(self, q: torch.Tensor) -> torch.Tensor:
        return q.new_empty(q.shape[0], self.num_heads, self.v_head_dim)

    @property
    def break_label(self) -> str:
        return f"layer {self.layer_index}: latent attention"


class MLASelfAttention(nn.Module):
    """DeepSeek's attention block: q (plain or through ``q_lora_rank``), the latent and
    rotary key (``kv_a_proj_with_mqa``), rotary, the latent-cache store, the split point, and
    ``o_proj``. The same interface as ``layers.SelfAttention``: ``project``, ``output``,
    ``attn``, ``checkpoint_slots``."""

    attention_class: type[LatentAttention] = LatentAttention

    def __init__(self, build: ModelBuild, layer_index: int) -> None:
        super().__init__()
        config, ops, tp, plan = build.config, build.ops, build.tp, build.plan
        mla = config.mla
        if mla is None:
            raise ValueError(f"{config.architecture} has no MLA configuration")
        self.mla = mla
        self.ops = ops
        self.cos_sin_cache = build.cos_sin
        heads = self.num_heads = plan.num_heads
        self.q_size = heads * mla.qk_head_dim
        hidden = config.hidden_size
        latent = mla.kv_lora_rank + mla.qk_rope_head_dim
        full_heads = config.num_heads
        self.q_shard = plan.rows(tp.rank, self.q_size, full_heads * mla.qk_head_dim)
        # One product for everything computed from the hidden state: [q_a or q, kv_a].
        # Under tensor parallelism q is this rank's heads; q_a and kv_a are whole.
        self.a_split = mla.q_lora_rank if mla.q_lora_rank is not None else self.q_size
        self.a_proj = Linear(hidden, self.a_split + latent, ops, config.qkv_bias)
        if self.a_proj.bias is not None and mla.q_lora_rank is None:
            # attention_bias biases kv_a, not a plain q_proj: its rows of the bias stay 0.
            self.a_proj.bias.data[: self.a_split].zero_()
        self.q_a_norm: nn.Parameter | None = None
        self.q_b_proj: Linear | None = None
        if mla.q_lora_rank is not None:
            self.q_a_norm = empty_weight(mla.q_lora_rank)
            self.q_b_proj = Linear(mla.q_lora_rank, self.q_size, ops)
        self.kv_a_norm = empty_weight(mla.kv_lora_rank)
        width = mla.qk_nope_head_dim + mla.v_head_dim
        self.kv_b = empty_weight(heads, width, mla.kv_lora_rank)
        self.kv_b_shard = plan.rows(tp.rank, heads * width, full_heads * width)
        self.o_size = heads * mla.v_head_dim
        self.o_shard = plan.rows(tp.rank, self.o_size, full_heads * mla.v_head_dim, dim=1)
        self.o_proj = RowParallelLinear(self.o_size, hidden, ops, tp, config.o_bias)
        self.attn = self.attention_layer(layer_index, heads)

    def attention_layer(self, layer_index: int, heads: int) -> LatentAttention:
        """The split point's layer (``attention_class``; a subclass may build it with more)."""
        return self.attention_class(layer_index, self.mla, heads, self.kv_b, self.ops)

    def project(
        self, positions: torch.Tensor, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Everything before the split point: projections, norms, rotary, the latent-cache
        store. Returns q [T, H*Dn + H*R] (``LatentAttention.query_parts``)."""
        return self.project_latent(positions, hidden, metadata)[0]

    def project_latent(
        self, positions: torch.Tensor, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``project``'s q, and the normed ``q_lora_rank`` latent it came from (None for a
        plain q_proj): what a DSA indexer computes its queries from."""
        mla, ops = self.mla, self.ops
        tokens = hidden.shape[0]
        a = self.a_proj(hidden)
        q = a[:, : self.a_split]
        q_latent = None
        if self.q_b_proj is not None:
            q_latent = ops.rms_norm(q, self.q_a_norm, LATENT_NORM_EPS)
            q = self.q_b_proj(q_latent)
        kv_a = a[:, self.a_split:]
        latent = ops.rms_norm(kv_a[:, : mla.kv_lora_rank], self.kv_a_norm, LATENT_NORM_EPS)
        k_pe = kv_a[:, mla.kv_lora_rank:]
        if mla.rotary:
            _, q_pe = self.attn.query_parts(q)
            ops.rotary_embedding(positions, q_pe, k_pe.view(tokens, 1, mla.qk_rope_head_dim),
                                 self.cos_sin_cache)
        self.attn.store(latent, k_pe, metadata)
        return q, q_latent

    def output(self, attn_out: torch.Tensor) -> torch.Tensor:
        """o_proj of the attention output [T, H, Dv] -> [T, hidden], summed over ranks."""
        return self.o_proj(attn_out.reshape(attn_out.shape[0], self.o_size))

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        mla = self.mla
        split = self.a_split
        if mla.q_lora_rank is None:
            yield f"{prefix}.q_proj.weight", self.a_proj.rows(slice(0, split)), self.q_shard
        else:
            yield from self.a_proj.checkpoint_slots(f"{prefix}.q_a_proj", slice(0, split))
            yield f"{prefix}.q_a_layernorm.weight", self.q_a_norm, None
            assert self.q_b_proj is not None
            yield from self.q_b_proj.checkpoint_slots(f"{prefix}.q_b_proj", shard=self.q_shard)
        yield from self.a_proj.checkpoint_slots(
            f"{prefix}.kv_a_proj_with_mqa", slice(split, None)
        )
        yield f"{prefix}.kv_a_layernorm.weight", self.kv_a_norm, None
        yield f"{prefix}.kv_b_proj.weight", self.kv_b.view(-1, mla.kv_lora_rank), self.kv_b_shard
        yield from self.o_proj.checkpoint_slots(f"{prefix}.o_proj", shard=self.o_shard)

    @torch.no_grad()
    def arrange_loaded(self) -> None:
        """Reorder the loaded rows for the rotary op (see the module docstring): once, after
        loading and before packing."""
        mla = self.mla
        heads, nope, rope = self.num_heads, mla.qk_nope_head_dim, mla.qk_rope_head_dim
        halves = torch.arange(rope)
        if mla.rope_interleave:
            halves = torch.cat([halves[0::2], halves[1::2]])
        per_head = torch.arange(heads)[:, None] * mla.qk_head_dim
        q_order = torch.cat([(per_head + torch.arange(nope)).flatten(),
                             (per_head + nope + halves).flatten()])
        q_linear = self.a_proj if self.q_b_proj is None else self.q_b_proj
        _reorder(q_linear, 0, q_order)
        kv_order = torch.cat([torch.arange(mla.kv_lora_rank), mla.kv_lora_rank + halves])
        _reorder(self.a_proj, self.a_split, kv_order)


def _reorder(linear: Linear, start: int, order: torch.Tensor) -> None:
    """Output rows ``start + i`` of ``linear`` take (its bias too) what rows
    ``start + order[i]`` held."""
    rows = slice(start, start + order.numel())
    weight = linear.rows(rows)
    weight.copy_(weight[order.to(weight.device)])
    if linear.bias is not None:
        bias = linear.bias[rows]
        bias.copy_(bias[order.to(bias.device)])

