"""DeepSeek sparse attention (DSA: DeepSeek V3.2, GLM-5): MLA over the positions a lightning
indexer selects.

Per layer that runs an indexer, each token also gets an indexer key (``wk`` of the hidden
state, a LayerNorm, rotary on its first ``qk_rope_head_dim`` dims), stored in the layer's
``index`` cache beside the latent (``cache_spec``), paged by the same block table. The
indexer's queries come from the query latent (``wq_b`` of the normed ``q_lora_rank``
latent, rotary too) and its per-head weights from the hidden state (``weights_proj``).
At the split point, ``DSAttention.attend`` runs what depends on the data:

1. ``dsa_index_topk``: every visible position's score, sum over indexer heads of
   weight * relu(q . k / sqrt(index_head_dim)) / sqrt(index_n_heads), and the ``index_topk``
   best positions per token (all of them while a token sees fewer), equal scores going as
   ``torch.topk`` sends them over transformers' rows (the op's docstring);
2. ``sparse_mla_attention``: MLA in the absorbed form over the latent rows of those
   positions only, for prefill and decode alike.

That is exactly what breakable capture exists for: both run eagerly between graph
segments, so a breakable (or piecewise) program breaks once per layer at "top-k + sparse
attention". Under ``full`` capture they are inside the graph: static shapes and a fixed k
(each token's output is [index_topk] positions, padded with -1), as vLLM's full decode
graphs do; the kernels need no host sync. A GLM-5 layer without an indexer (``shared``)
reuses the selection of the nearest indexer layer before it, computed in the same forward.

Rotary layout: the indexer rotates with the ordinary (neox) rotary op over whole heads. Each
head's dims are permuted once at load (``arrange_loaded``; q and k alike, so every dot
product is unchanged) so that the rotary pairs, halves (V3.2) or interleaved (GLM-5), sit at
(j, j + D/2) for j < R/2, and the remaining dims pair with each other under a table whose
extra angles are 0 (cos 1, sin 0): they pass through unrotated, exactly.

Tensor parallelism: the indexer (its weights and its cache) is replicated, as the latent is;
each rank selects the same positions and attends with its own heads.
"""

from __future__ import annotations

import torch

from interlock.runners.dispatch import KernelTable
from interlock.runners.model.attention import AttentionMetadata
from interlock.runners.model.build import ModelBuild
from interlock.runners.model.config import DSAConfig, MLAConfig
from interlock.runners.model.layers import CheckpointSlots, Linear, empty_weight
from interlock.runners.model.mla import LatentAttention, MLASelfAttention

#: transformers builds the indexer's key LayerNorm with this epsilon, whatever the config.
INDEX_NORM_EPS = 1e-6


def index_cos_sin_cache(cos_sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The indexer's rotary table [P, head_dim] from the attention's [P, R] (cos in the first
    R/2 columns, sin in the last): its R/2 angles, then head_dim/2 - R/2 angles of 0."""
    positions, rope = cos_sin.shape
    extra = head_dim // 2 - rope // 2
    ones = cos_sin.new_ones(positions, extra)
    return torch.cat([cos_sin[:, : rope // 2], ones, cos_sin[:, rope // 2:], ones * 0], dim=1)


def index_dim_order(head_dim: int, rope: int, interleave: bool) -> torch.Tensor:
    """Where each of a head's dims comes from after ``arrange_loaded``: the rotary pairs'
    first members at 0..R/2-1 and second members at D/2..D/2+R/2-1, the unrotated dims in
    the remaining places."""
    half, pairs = head_dim // 2, rope // 2
    first = torch.arange(pairs) * 2 if interleave else torch.arange(pairs)
    second = first + 1 if interleave else first + pairs
    passing = torch.arange(rope, head_dim)
    extra = half - pairs
    return torch.cat([first, passing[:extra], second, passing[extra:]])


class DSAttention(LatentAttention):
    """One layer's sparse attention: the latent cache, the indexer's key cache when the layer
    runs an indexer, and at the split point the top-k selection and attention over it.

    The query handed to ``attend`` is ``[T, H*Dn + H*R | Hi*Di | Hi]`` (MLA's query, the
    indexer's rotated queries, its head weights) for an indexer layer, MLA's query alone for
    a layer that reuses ``source``'s selection."""

    def __init__(
        self, layer_index: int, mla: MLAConfig, num_heads: int, kv_b: torch.Tensor,
        ops: KernelTable, dsa: DSAConfig,
    ) -> None:
        super().__init__(layer_index, mla, num_heads, kv_b, ops)
        self.dsa = dsa
        self.runs_indexer = dsa.indexer_layers[layer_index]
        # relu(s x) w c = relu(c s x) w for c > 0: the 1/sqrt(heads) weight scale folds in.
        self.index_scale = (dsa.head_dim * dsa.n_heads) ** -0.5
        self.index_cache: torch.Tensor | None = None  # [NB, BS, Di], bound by the runner
        self.share_selection_of(self)
        self.indices: torch.Tensor | None = None  # this forward's selection [T, index_topk]

    source: DSAttention  # set by share_selection_of

    def share_selection_of(self, source: DSAttention) -> None:
        """Attend over ``source``'s selection (itself for an indexer layer). A plain
        attribute, not a submodule: the layer belongs to its own decoder layer."""
        object.__setattr__(self, "source", source)

    def bind_cache(self, *tensors: torch.Tensor) -> None:
        expected = 2 if self.runs_indexer else 1
        if len(tensors) != expected:
            raise ValueError(f"layer {self.layer_index}: {len(tensors)} cache tensors for a "
                             f"DSA layer that caches {expected}")
        super().bind_cache(tensors[0])
        if self.runs_indexer:
            index = tensors[1]
            if index.dim() != 3 or index.shape[2] != self.dsa.head_dim:
                raise ValueError(
                    f"layer {self.layer_index}: index cache shape {tuple(index.shape)} does "
                    f"not end in index_head_dim = {self.dsa.head_dim}"
                )
            self.index_cache = index

    def store_index(self, keys: torch.Tensor, metadata: AttentionMetadata) -> None:
        """Write this step's indexer keys [T, Di] into the index cache (before the split
        point); one row per token, as the latent rows (written as its two halves)."""
        if self.index_cache is None:
            raise RuntimeError(f"layer {self.layer_index}: no index cache bound")
        half = keys.shape[1] // 2
        self.ops.store_latent_cache(keys[:, :half], keys[:, half:], self.index_cache,
                                    metadata.slot_mapping)

    @property
    def query_width(self) -> int:
        return self.num_heads * (self.nope + self.rope)

    def attend(self, q: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        tokens = q.shape[0]
        width = self.query_width
        if self.runs_indexer:
            dsa = self.dsa
            index_width = dsa.n_heads * dsa.head_dim
            index_q = q[:, width:width + index_width].view(tokens, dsa.n_heads, dsa.head_dim)
            weights = q[:, width + index_width:]
            self.indices = self.ops.dsa_index_topk(
                index_q, weights, self.index_cache, metadata.block_tables, metadata.seq_lens,
                metadata.query_start_loc, self.index_scale, dsa.top_k,
            )
        q_nope, q_pe = self.query_parts(q[:, :width])
        return self.ops.sparse_mla_attention(
            q_nope, q_pe, self.cache, self.kv_b, metadata.block_tables, metadata.seq_lens,
            metadata.query_start_loc, self.source.indices, self.scale,
        )

    @property
    def break_label(self) -> str:
        if self.runs_indexer:
            return f"layer {self.layer_index}: DSA index top-{self.dsa.top_k} + sparse attention"
        return (f"layer {self.layer_index}: sparse attention over layer "
                f"{self.source.layer_index}'s top-{self.dsa.top_k}")


class DSASelfAttention(MLASelfAttention):
    """MLA's attention block with the lightning indexer's projections: before the split point
    they add the indexer's queries and head weights to the query and store its keys."""

    def __init__(self, build: ModelBuild, layer_index: int) -> None:
        config, ops = build.config, build.ops
        dsa = config.dsa
        if dsa is None or build.index_cos_sin is None:
            raise ValueError(f"{config.architecture} has no DSA configuration")
        self.dsa = dsa
        super().__init__(build, layer_index)
        self.index_cos_sin = build.index_cos_sin
        self.runs_indexer = dsa.indexer_layers[layer_index]
        if self.runs_indexer:
            assert self.mla.q_lora_rank is not None  # refused at config load otherwise
            self.wq_b = Linear(self.mla.q_lora_rank, dsa.n_heads * dsa.head_dim, ops)
            # wk and weights_proj read the hidden state: one product, keys then weights.
            self.wk_weights = Linear(config.hidden_size, dsa.head_dim + dsa.n_heads, ops)
            self.k_norm_weight = empty_weight(dsa.head_dim)
            self.k_norm_bias = empty_weight(dsa.head_dim)

    def attention_layer(self, layer_index: int, heads: int) -> LatentAttention:
        return DSAttention(layer_index, self.mla, heads, self.kv_b, self.ops, self.dsa)

    def project(
        self, positions: torch.Tensor, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        q, q_latent = self.project_latent(positions, hidden, metadata)
        if not self.runs_indexer:
            return q
        dsa, ops = self.dsa, self.ops
        tokens = hidden.shape[0]
        kw = self.wk_weights(hidden)
        keys = ops.layer_norm(kw[:, : dsa.head_dim], self.k_norm_weight, self.k_norm_bias,
                              INDEX_NORM_EPS)
        index_q = self.wq_b(q_latent)
        ops.rotary_embedding(positions, index_q.view(tokens, dsa.n_heads, dsa.head_dim),
                             keys.view(tokens, 1, dsa.head_dim), self.index_cos_sin)
        assert isinstance(self.attn, DSAttention)
        self.attn.store_index(keys, metadata)
        return ops.concat([q, index_q, kw[:, dsa.head_dim:]])

    def checkpoint_slots(self, prefix: str) -> CheckpointSlots:
        yield from super().checkpoint_slots(prefix)
        if self.runs_indexer:
            # Replicated on every rank: no shard.
            name, head_dim = f"{prefix}.indexer", self.dsa.head_dim
            yield from self.wq_b.checkpoint_slots(f"{name}.wq_b")
            yield from self.wk_weights.checkpoint_slots(f"{name}.wk", slice(0, head_dim))
            yield from self.wk_weights.checkpoint_slots(f"{name}.weights_proj",
                                                        slice(head_dim, None))
            yield f"{name}.k_norm.weight", self.k_norm_weight, None
            yield f"{name}.k_norm.bias", self.k_norm_bias, None

    @torch.no_grad()
    def arrange_loaded(self) -> None:
        """MLA's reordering, then each indexer head's dims in the rotary op's layout (module
        docstring): q rows of every head, k rows and the key norm alike."""
        super().arrange_loaded()
        if not self.runs_indexer:
            return
        dsa = self.dsa
        order = index_dim_order(dsa.head_dim, self.mla.qk_rope_head_dim, dsa.rope_interleave)
        per_head = torch.arange(dsa.n_heads)[:, None] * dsa.head_dim
        _permute_rows(self.wq_b.rows(), (per_head + order).flatten())
        _permute_rows(self.wk_weights.rows(slice(0, dsa.head_dim)), order)
        for norm in (self.k_norm_weight, self.k_norm_bias):
            _permute_rows(norm, order)


def _permute_rows(weight: torch.Tensor, order: torch.Tensor) -> None:
    """Row i of ``weight`` (a view, written in place) takes what row ``order[i]`` held."""
    weight.copy_(weight[order.to(weight.device)])


def link_selections(layers: list[DSAttention]) -> None:
    """Point each layer without an indexer at the nearest indexer layer before it."""
    source: DSAttention | None = None
    for layer in layers:
        if layer.runs_indexer:
            source = layer
        elif source is None:
            raise ValueError(f"layer {layer.layer_index} shares a selection no earlier layer "
                             "makes (indexer_types[0] must be full)")
        else:
            layer.share_selection_of(source)
