"""The decoder-only causal LM shared by every supported architecture.

Llama, Mistral, Qwen2/3 and their MoE variants differ only in what their
``ModelConfig`` switches on (biases, q/k norm, sliding windows, routed or
dense MLP per layer) and in checkpoint names, so one class serves them all;
each family's module in ``interlock.runners.model.families`` declares both.

The forward is written to be capturable: tensors in, tensors out, no host
syncs, and every attention goes through ``interlock.runners.model.attention.Attention``.

Built with a ``TensorParallel`` group of more than one rank, the model holds this
rank's shard (``interlock.runners.model.sharding``): its attention heads and KV heads,
its part of each MLP, and its rows of a vocabulary-parallel embedding and LM head. The
forward then all-reduces after the embedding, after each attention and after each
MLP, and all-gathers the logits, so every rank ends with the whole logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import torch
from torch import nn

from interlock.kernels.packing import PACK_STRIP
from interlock.runners.dispatch import KernelTable
from interlock.runners.model.attention import AttentionLayer, AttentionMetadata
from interlock.runners.model.build import ModelBuild
from interlock.runners.model.config import ModelConfig
from interlock.runners.model.dsa import DSASelfAttention, index_cos_sin_cache, link_selections
from interlock.runners.model.families import checkpoint_names
from interlock.runners.model.kda import KDASelfAttention, KDAttention
from interlock.runners.model.layers import (
    CheckpointSlots,
    DenseMLP,
    Linear,
    SelfAttention,
    empty_weight,
    frozen,
    stored_transposed,
)
from interlock.runners.model.mla import MLASelfAttention
from interlock.runners.model.moe import DeepseekMoE, RoutedExperts, SparseMoE
from interlock.runners.model.rope import cos_sin_cache
from interlock.runners.model.sharding import plan_shards
from interlock.runners.model.state_pool import StateTensors
from interlock.runners.parallel.group import SINGLE, TensorParallel

Tensor: TypeAlias = torch.Tensor
PieceFn = Callable[[Tensor | None, Tensor | None], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class ForwardPiece:
    """Part of the forward between attention split points:
    ``(attention output before it, residual) -> (q of split, or final hidden; residual)``."""

    run: PieceFn
    split: AttentionLayer | None  # the attention that ends this piece; None for the last

    def __call__(self, attn_out: Tensor | None, residual: Tensor | None) -> tuple[Tensor, Tensor]:
        return self.run(attn_out, residual)


class DecoderLayer(nn.Module):
    def __init__(self, build: ModelBuild, index: int) -> None:
        super().__init__()
        config, ops, tp = build.config, build.ops, build.tp
        self.ops = ops
        self.eps = config.rms_norm_eps
        self.input_norm = empty_weight(config.hidden_size)
        self.post_attention_norm = empty_weight(config.hidden_size)
        self.self_attn: SelfAttention | MLASelfAttention | KDASelfAttention
        if config.is_linear(index):
            self.self_attn = KDASelfAttention(build, index)
        elif build.index_cos_sin is not None:
            self.self_attn = DSASelfAttention(build, index)
        elif config.mla is not None:
            self.self_attn = MLASelfAttention(build, index)
        else:
            self.self_attn = SelfAttention(build, index)
        self.mlp: DenseMLP | SparseMoE | DeepseekMoE
        names = checkpoint_names(config.architecture)
        self.mlp_prefix = names.dense_block
        if config.moe is not None and index in config.moe.sparse_layers:
            self.mlp_prefix = names.moe_block
            if config.moe.routing is not None:
                self.mlp = DeepseekMoE(config, ops, names.experts, tp)
            else:
                self.mlp = SparseMoE(config, ops, names.experts, tp)
        else:
            self.mlp = DenseMLP(
                config.hidden_size, config.intermediate_size, ops, tp, config.mlp_bias
            )

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, residual = self.before_attention(positions, hidden, residual, metadata)
        return self.after_attention(self.self_attn.attn.split(q, metadata), residual)

    def before_attention(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Input norm and attention up to its split point: (q, residual)."""
        if residual is None:
            residual = hidden
            hidden = self.ops.rms_norm(hidden, self.input_norm, self.eps)
        else:
            hidden, residual = self.ops.fused_add_rms_norm(
                hidden, residual, self.input_norm, self.eps
            )
        return self.self_attn.project(positions, hidden, metadata), residual

    def after_attention(
        self, attn_out: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Output projection, post-attention norm and MLP: (hidden, residual)."""
        hidden, residual = self.ops.fused_add_rms_norm(
            self.self_attn.output(attn_out), residual, self.post_attention_norm, self.eps
        )
        return self.mlp(hidden), residual

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        yield f"{prefix}.input_layernorm.weight", self.input_norm, None
        yield f"{prefix}.post_attention_layernorm.weight", self.post_attention_norm, None
        yield from self.self_attn.checkpoint_slots(f"{prefix}.self_attn")
        yield from self.mlp.checkpoint_slots(f"{prefix}.{self.mlp_prefix}")


class CausalLM(nn.Module):
    """``forward(input_ids [T], positions [T], metadata) -> hidden [T, H]``;
    ``compute_logits(hidden [N, H]) -> [N, V]``.

    Build it under the target default dtype and device; the rotary table
    stays float32. Bind a KV cache (``bind_kv_cache``) before the first forward.
    """

    def __init__(
        self,
        config: ModelConfig,
        ops: KernelTable,
        max_positions: int,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        self.tp = tp
        self.shards = plan = plan_shards(config, tp.size)
        self.eps = config.rms_norm_eps
        # Tied, the table is also the LM head, which every decode step streams whole: it is
        # then stored in the layout that streams faster for a few rows
        # (``stored_transposed``: [hidden, vocab] in float32, where a lookup reads one
        # strided column per token), or packed after loading (``pack_weights``).
        # ``embedding`` gives it as the embedding op takes it. Each rank holds its rows of
        # the vocabulary (the last rank's past vocab_size are zero).
        self.vocab_shard = plan.rows(tp.rank, plan.vocab_rows, config.vocab_size)
        # wrapped unbound: a bound method kept on the model would be a reference cycle
        self._own_rows = ops.foreign(CausalLM._own_rows_now)
        self.head_transposed = config.tie_word_embeddings and stored_transposed(
            config.hidden_size, plan.vocab_rows, ops
        )
        shape = (config.hidden_size, plan.vocab_rows)
        self.embed_tokens = empty_weight(*(shape if self.head_transposed else shape[::-1]))
        # The GGML type of a table kept quantized (``keep_quantized_embedding``), else None;
        # whether a tied head takes it on int8 activations.
        self.embed_format: str | None = None
        self.embed_int8 = False
        # How the weights are held, by format ("native q4_1", "dequantized") -> why: set by
        # the loader (``runners.model.quantized``), reported by the runner.
        self.weight_decisions: dict[str, str] = {}
        self.register_buffer(
            "cos_sin_cache", cos_sin_cache(config.rope, config.head_dim, max_positions),
            persistent=False,
        )
        index_cos_sin = None
        if config.dsa is not None:
            self.register_buffer(
                "index_cos_sin", index_cos_sin_cache(self.cos_sin_cache, config.dsa.head_dim),
                persistent=False,
            )
            index_cos_sin = self.index_cos_sin
        build = ModelBuild(config, ops, tp, plan, self.cos_sin_cache, index_cos_sin)
        self.layers = nn.ModuleList(DecoderLayer(build, i) for i in range(config.num_layers))
        if config.dsa is not None:
            link_selections([layer.self_attn.attn for layer in self.layers])
        self.norm = empty_weight(config.hidden_size)
        # None when tied: the logits then reuse the embedding table.
        self.lm_head = (
            None if config.tie_word_embeddings
            else Linear(config.hidden_size, plan.vocab_rows, ops)
        )

    @property
    def embedding(self) -> torch.Tensor:
        """The embedding table as [vocab, hidden] (a view when stored transposed), or
        packed (``pack_weights``)."""
        return self.embed_tokens.t() if self.head_transposed else self.embed_tokens

    def keep_quantized_embedding(self, packed: torch.Tensor, ggml_type: str,
                                 int8: bool = False) -> None:
        """Hold the embedding table (a tied LM head too) as ``packed`` records of
        ``ggml_type`` (``kernels.quant.pack``) instead of floats; a tied head's product on
        int8 activations if ``int8`` (the records ``quant.INT8_FORMATS`` names: Q8_0's are
        its own, which the embedding reads as they are)."""
        self.embed_tokens = frozen(packed)
        self.embed_format = ggml_type
        self.embed_int8 = int8

    def finish_loading(self) -> None:
        """Once, after the checkpoint's tensors are in their slots: MLA layers reorder rows
        for the rotary op (``MLASelfAttention.arrange_loaded``), then ``pack_weights``."""
        for module in self.modules():
            if isinstance(module, MLASelfAttention):
                module.arrange_loaded()
        self.pack_weights()

    def pack_weights(self) -> None:
        """Pack every linear weight and routed expert (``moe.pack_experts``), and a tied LM
        head if the table's ``embedding`` takes a packed table, if the table's ``linear``
        wants them packed (``KernelTable.packs_weights``): once, after loading."""
        for module in self.modules():
            if isinstance(module, (Linear, RoutedExperts)):
                module.pack()
        table = self.embed_tokens
        if (self.config.tie_word_embeddings and self.ops.packs_weights
                and self.ops.packed_embedding and table.dim() == 2
                and table.shape[0] % PACK_STRIP == 0):
            self.embed_tokens = frozen(self.ops.pack_weight(table))

    @property
    def attention_layers(self) -> list[AttentionLayer]:
        return [layer.self_attn.attn for layer in self.layers]

    def bind_kv_cache(self, caches: Sequence[tuple[torch.Tensor, ...]]) -> None:
        """Give each layer its cache tensors (``cache_spec.layer_cache``: (k_cache, v_cache),
        each [NB, BS, Hk, D], or an MLA layer's (latent,) [NB, BS, L + R])."""
        layers = self.attention_layers
        if len(caches) != len(layers):
            raise ValueError(f"{len(caches)} KV caches for {len(layers)} attention layers")
        for layer, tensors in zip(layers, caches, strict=True):
            layer.bind_cache(*tensors)

    def bind_state_pool(self, pool: StateTensors) -> None:
        """Give each linear-attention layer its tensors of the recurrent-state pool
        (``state_pool.allocate_state_pool``)."""
        linear = {layer.layer_index: layer for layer in self.attention_layers
                  if isinstance(layer, KDAttention)}
        if set(linear) != set(pool):
            raise ValueError(f"state pool for layers {sorted(pool)}, linear-attention layers "
                             f"are {sorted(linear)}")
        for index, (conv, recurrent) in pool.items():
            linear[index].bind_state(conv, recurrent)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden = self.embed(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, metadata)
        hidden, _ = self.ops.fused_add_rms_norm(hidden, residual, self.norm, self.eps)
        return hidden

    def pieces(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> list[ForwardPiece]:
        """The forward cut at every attention split point, planned ahead (for piecewise
        graphs): running the pieces in order with ``split.attend`` between them is
        ``forward``. Piece 0 embeds and runs layer 0 up to its attention; piece i runs
        layer i-1 after its attention and layer i up to its own; the last piece finishes
        the last layer and applies the final norm."""
        layers = self.layers

        def first(_: torch.Tensor | None, __: torch.Tensor | None) -> tuple[Tensor, Tensor]:
            hidden = self.embed(input_ids)
            return layers[0].before_attention(positions, hidden, None, metadata)

        def middle(index: int) -> PieceFn:
            def run(attn_out: Tensor | None, residual: Tensor | None) -> tuple[Tensor, Tensor]:
                hidden, residual = layers[index - 1].after_attention(attn_out, residual)
                return layers[index].before_attention(positions, hidden, residual, metadata)

            return run

        def last(attn_out: Tensor | None, residual: Tensor | None) -> tuple[Tensor, Tensor]:
            hidden, residual = layers[-1].after_attention(attn_out, residual)
            return self.ops.fused_add_rms_norm(hidden, residual, self.norm, self.eps)

        runs = [first, *(middle(i) for i in range(1, len(layers))), last]
        splits = [*self.attention_layers, None]
        return [ForwardPiece(run, split) for run, split in zip(runs, splits, strict=True)]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows of ``input_ids``: each rank looks up the ids in its rows (zero
        for the others) and the all-reduce assembles them."""
        if self.embed_format is not None:  # one rank: kept quantized only unsharded
            return self.ops.quantized_embedding(input_ids, self.embed_tokens, self.embed_format)
        if self.tp.size == 1:
            return self.ops.embedding(input_ids, self.embedding)
        return self.tp.all_reduce(self._own_rows(self, input_ids))

    def _own_rows_now(self, input_ids: torch.Tensor) -> torch.Tensor:
        """This rank's part of the embedding: its rows of the ids it holds, zero elsewhere
        (``_own_rows`` is this as a native tape records it: one call, since the masking is
        torch ops)."""
        rows = self.shards.vocab_rows
        local = input_ids - self.vocab_shard.start
        mine = (local >= 0) & (local < rows)
        hidden = self.ops.embedding(local.clamp(0, rows - 1), self.embedding)
        return hidden * mine.unsqueeze(-1).to(hidden.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, V]; under tensor parallelism every rank gets them whole."""
        if self.lm_head is None and self.embed_int8:
            assert self.embed_format is not None
            logits = self.ops.quantized_linear_int8(hidden, self.embed_tokens, self.embed_format,
                                                    None)
        elif self.lm_head is None and self.embed_format is not None:
            logits = self.ops.quantized_linear(hidden, self.embed_tokens, self.embed_format, None)
        elif self.lm_head is None:
            logits = self.ops.linear(hidden, self.embed_tokens, None, self.head_transposed)
        else:
            logits = self.lm_head(hidden)
        if self.tp.size == 1:
            return logits
        return self.tp.all_gather(logits)[:, : self.config.vocab_size]

    def checkpoint_slots(self) -> CheckpointSlots:
        """Every checkpoint tensor this model needs, with the view it fills (HF names) and
        the rows of it this rank holds."""
        if self.embed_format is None:  # else already filled (``keep_quantized_embedding``)
            yield "model.embed_tokens.weight", self.embedding, self.vocab_shard
        for i, layer in enumerate(self.layers):
            yield from layer.checkpoint_slots(f"model.layers.{i}")
        yield "model.norm.weight", self.norm, None
        if self.lm_head is not None:
            yield from self.lm_head.checkpoint_slots("lm_head", shard=self.vocab_shard)
