"""What one token slot of the paged cache holds, per layer: the spec the KV cache is
allocated from and the scheduler's blocks are sized by. Torch-free.

A layer's cache is a tuple of named tensors, each ``[num_blocks, block_size, *shape]``:

* per-head attention: ``k`` and ``v``, each ``(kv_heads, head_dim)`` (this rank's KV heads);
* multi-head latent attention (MLA): one ``latent`` of ``(kv_lora_rank + qk_rope_head_dim,)``,
  the compressed KV then the rotary key, both shared by every head. It is the same on every
  tensor-parallel rank: heads split across ranks, but each head reads the whole latent, so
  sharding heads cannot shard it (production engines replicate it too);
* DeepSeek sparse attention (DSA): the latent, then on each layer that runs a lightning
  indexer its ``index`` key of ``index_head_dim`` (also the same on every rank).

A layer that keeps more per token returns one more ``CacheTensor`` from :func:`layer_cache`
(DSA's ``index`` is one); allocation (``interlock.runners.model.kv_cache``),
block sizing (``interlock.runners.batching.kv_cache``) and binding (each attention layer's
``bind_cache`` receives the tensors in this order) follow from the spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from interlock.runners.model.config import ModelConfig
from interlock.runners.model.sharding import plan_shards


@dataclass(frozen=True)
class CacheTensor:
    name: str
    shape: tuple[int, ...]  # per token slot

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class LayerCache:
    """One layer's cache tensors, in the order its attention binds them."""

    tensors: tuple[CacheTensor, ...]

    @property
    def elements_per_token(self) -> int:
        return sum(t.elements for t in self.tensors)


def layer_cache(config: ModelConfig, layer: int, tensor_parallel_size: int = 1) -> LayerCache:
    """What layer ``layer`` caches per token on one rank (nothing for a linear-attention
    layer: its state is per request, ``state_spec``)."""
    if config.is_linear(layer):
        return LayerCache(())
    mla = config.mla
    if mla is not None:
        latent = CacheTensor("latent", (mla.kv_lora_rank + mla.qk_rope_head_dim,))
        dsa = config.dsa
        if dsa is not None and dsa.indexer_layers[layer]:
            # The lightning indexer's key, one per token, replicated like the latent: every
            # rank selects the same positions for its heads.
            return LayerCache((latent, CacheTensor("index", (dsa.head_dim,))))
        return LayerCache((latent,))
    kv_heads = plan_shards(config, tensor_parallel_size).num_kv_heads
    shape = (kv_heads, config.head_dim)
    return LayerCache((CacheTensor("k", shape), CacheTensor("v", shape)))


def layer_caches(config: ModelConfig, tensor_parallel_size: int = 1) -> tuple[LayerCache, ...]:
    return tuple(layer_cache(config, i, tensor_parallel_size) for i in range(config.num_layers))


@dataclass(frozen=True)
class StateSpec:
    """What one slot of the recurrent-state pool holds per linear-attention layer (the other
    kind of cache: per request, of fixed size, not per token): the short convolution's last
    ``conv_kernel - 1`` inputs of q, k and v, in the model's dtype, and the KDA state
    [heads, head_dim, head_dim], in float32 (the delta rule accumulates in it)."""

    layers: tuple[int, ...]
    conv: tuple[int, ...]
    recurrent: tuple[int, ...]

    def bytes_per_slot(self, itemsize: int) -> int:
        return len(self.layers) * (math.prod(self.conv) * itemsize
                                   + math.prod(self.recurrent) * 4)


def pool_slots(max_num_seqs: int) -> int:
    """Slots of the state pool of an engine of ``max_num_seqs``: one per sequence, and a
    scratch slot (the last) that padding rows of a graph step use."""
    return max_num_seqs + 1


def state_pool_bytes(config: ModelConfig, dtype_bytes: int, max_num_seqs: int,
                     tensor_parallel_size: int = 1) -> int:
    """The recurrent-state pool's size on one rank (0 for a model without linear
    attention)."""
    spec = state_spec(config, tensor_parallel_size)
    return 0 if spec is None else pool_slots(max_num_seqs) * spec.bytes_per_slot(dtype_bytes)


def state_spec(config: ModelConfig, tensor_parallel_size: int = 1) -> StateSpec | None:
    """The pool slot of a model with linear-attention layers, on one rank (each holds its
    KDA heads' state); None without."""
    linear = config.linear
    if linear is None or not linear.linear_layers:
        return None
    heads = plan_shards(config, tensor_parallel_size).linear_heads
    width = heads * linear.head_dim
    return StateSpec(linear.linear_layers, (3 * width, linear.conv_kernel - 1),
                     (heads, linear.head_dim, linear.head_dim))


def elements_per_token(config: ModelConfig, tensor_parallel_size: int = 1) -> int:
    """Cache elements one token takes over every layer, on one rank."""
    return sum(c.elements_per_token for c in layer_caches(config, tensor_parallel_size))


def per_head_elements_per_token(config: ModelConfig) -> int:
    """What the same model would cache per token (every layer, unsplit) with per-head K
    and V: for MLA, K of ``qk_nope + qk_rope`` and V of ``v_head_dim`` per head, as the
    expanded attention computes them; linear-attention layers cache no tokens either way."""
    layers = sum(not config.is_linear(i) for i in range(config.num_layers))
    mla = config.mla
    if mla is None:
        return 2 * layers * config.num_kv_heads * config.head_dim
    return layers * config.num_heads * (mla.qk_head_dim + mla.v_head_dim)
