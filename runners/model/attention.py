"""The one attention layer every model uses, its metadata, and the split point graph backends use.

Every attention in every model goes through an ``AttentionLayer`` (``Attention`` for per-head
K/V, ``interlock.runners.model.mla.LatentAttention`` for MLA), in two calls:

1. a store (``store_kv_cache``, or ``store_latent_cache`` for MLA) writes this step's keys and
   values into the paged cache (padding rows have slot -1 and are skipped);
2. the attention computation itself — ``Attention.attend``, which reads only
   the paged cache and the query — is the **split point**.

By default the split point just calls ``attend``. A graph backend changes
what happens there for one forward pass with ``with attention_split(hook):``;
the hook receives the layer, the query and the metadata and must return the
attention output (``layer.attend(q, metadata)`` computes it). This is how a
backend cuts the forward at attention:

* *piecewise* capture: the segments between split points are captured
  separately, planned before capture (``CausalLM.pieces`` cuts the forward
  at every split point, so the split does not need the hook);
* *breakable* capture: the hook ends the current graph segment, runs
  ``attend`` eagerly into a preallocated output, and starts the next segment
  (break points discovered during capture). The KV-cache store happens before
  the split point, so it stays inside the captured segment.

Nothing here syncs with the host or branches on tensor data: the only Python
decision, decode-only vs mixed, is a static fact of the metadata.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from interlock.runners.dispatch import KernelTable


@dataclass(frozen=True)
class AttentionMetadata:
    """Where this step's tokens sit in the paged KV cache.

    Tensors only, plus static facts, so a captured graph can replay it from
    static buffers. B sequences (padding rows: seq_len 0), T tokens (padding
    tokens: slot -1).
    """

    slot_mapping: torch.Tensor  # [T] int64: flat cache slot of each token, -1 = padding
    block_tables: torch.Tensor  # [B, W] int32: cache blocks of each sequence
    seq_lens: torch.Tensor  # [B] int32: cached + new tokens per sequence, 0 = padding
    query_start_loc: torch.Tensor  # [B+1] int32: offsets of each sequence's new tokens
    decode_only: bool  # every sequence feeds exactly one token (T == B)
    #: [B] int64: each sequence's slot of the recurrent-state pool (``state_pool``; -1 for
    #: padding: the pool's scratch slot), for a model with linear-attention layers.
    state_slots: torch.Tensor | None = None


class AttentionSplit(Protocol):
    """Called at each attention split point instead of ``layer.attend(q, metadata)`` (with
    the arguments by position: a hook names them as it likes)."""

    def __call__(
        self, layer: AttentionLayer, q: torch.Tensor, metadata: AttentionMetadata, /
    ) -> torch.Tensor: ...


_SPLIT: ContextVar[AttentionSplit | None] = ContextVar("attention_split", default=None)


@contextmanager
def attention_split(hook: AttentionSplit) -> Iterator[None]:
    """Route every attention split point through ``hook`` while the block runs."""
    token = _SPLIT.set(hook)
    try:
        yield
    finally:
        _SPLIT.reset(token)


class AttentionLayer(nn.Module):
    """What the runners and graph backends need of a layer's attention: bind its paged
    cache, and the split point with what it computes (``attend``).

    Subclasses: :class:`Attention` (per-head K/V) and
    ``interlock.runners.model.mla.LatentAttention`` (MLA over a latent cache). Another kind
    (a sparse attention over selected positions, say) subclasses this: ``bind_cache`` takes
    the tensors its ``cache_spec.layer_cache`` declares, ``attend`` reads only them and the
    query it is given, and ``empty_output`` says what ``attend`` returns for a query, so a
    graph break can hold it in a static buffer.
    """

    layer_index: int

    def bind_cache(self, *tensors: torch.Tensor) -> None:
        """Bind this layer's cache tensors, in its ``cache_spec.layer_cache`` order."""
        raise NotImplementedError

    def split(self, q: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """The split point: ``attend``, or the active ``attention_split`` hook."""
        hook = _SPLIT.get()
        if hook is None:
            return self.attend(q, metadata)
        return hook(self, q, metadata)

    def attend(self, q: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """Attention of q over the paged cache (this step's entries already stored)."""
        raise NotImplementedError

    def empty_output(self, q: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor shaped as ``attend(q, ...)`` returns."""
        return torch.empty_like(q)

    @property
    def break_label(self) -> str:
        """What this split point computes, for the run report's break points."""
        return f"layer {self.layer_index}: attention"


class Attention(AttentionLayer):
    """Paged causal attention of one layer: store K/V, then attend (the split point)."""

    def __init__(
        self,
        layer_index: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        sliding_window: int | None,
        ops: KernelTable,
    ) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.sliding_window = sliding_window
        self.ops = ops
        self.k_cache: torch.Tensor | None = None  # [NB, BS, Hk, D], bound by the runner
        self.v_cache: torch.Tensor | None = None

    def bind_cache(self, *tensors: torch.Tensor) -> None:
        k_cache, v_cache = tensors
        expected = (self.num_kv_heads, self.head_dim)
        if tuple(k_cache.shape[2:]) != expected or k_cache.shape != v_cache.shape:
            raise ValueError(
                f"layer {self.layer_index}: KV cache shapes {tuple(k_cache.shape)} / "
                f"{tuple(v_cache.shape)} do not end in (kv heads, head dim) = {expected}"
            )
        self.k_cache, self.v_cache = k_cache, v_cache

    def store(self, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata) -> None:
        """Write this step's keys and values into the paged cache (before the split point)."""
        if self.k_cache is None:
            raise RuntimeError(f"layer {self.layer_index}: no KV cache bound (bind_kv_cache)")
        self.ops.store_kv_cache(k, v, self.k_cache, self.v_cache, metadata.slot_mapping)

    def attend(self, q: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """Attention of q over the paged cache (this step's K/V already stored)."""
        if metadata.decode_only:
            return self.ops.paged_decode_attention(
                q, self.k_cache, self.v_cache, metadata.block_tables, metadata.seq_lens,
                self.scale, self.sliding_window,
            )
        return self.ops.paged_attention(
            q, self.k_cache, self.v_cache, metadata.block_tables, metadata.seq_lens,
            metadata.query_start_loc, self.scale, self.sliding_window,
        )
