"""Attention over the paged KV cache: storing new keys and values, then attention for
mixed prefill/decode batches and for decode alone."""

from __future__ import annotations

import torch

from interlock.kernels.reference.contract import torch_op
from interlock.kernels.reference.paged import attend, gather_blocks, gather_sequence, visible


@torch_op("store_kv_cache")
def store_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write k, v [T, Hk, D] into caches [NB, BS, Hk, D] at flat slots; slot -1 is padding."""
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    flat_v = v_cache.view(-1, *v_cache.shape[2:])
    # On the CPU, asking the host whether there is padding costs nothing, and without
    # any the rows are copied straight in (masking costs several ops per layer).
    if slot_mapping.device.type == "cpu" and min(slot_mapping.tolist(), default=0) >= 0:
        flat_k.index_copy_(0, slot_mapping, k)
        flat_v.index_copy_(0, slot_mapping, v)
        return
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    flat_k[slots] = k[keep]
    flat_v[slots] = v[keep]


@torch_op("paged_attention")
def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention for a mixed prefill/decode batch over the paged cache.

    q [T, Hq, D] holds each sequence's new tokens back to back
    (query_start_loc [B+1]); seq_lens [B] counts cached + new tokens; the new
    tokens' K/V must already be stored. Query j of sequence b sits at
    position seq_lens[b] - q_len[b] + j.
    """
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        lo, hi = starts[b], starts[b + 1]
        if hi == lo or seq_len == 0:
            continue
        keys = gather_sequence(k_cache, block_tables[b], seq_len)
        values = gather_sequence(v_cache, block_tables[b], seq_len)
        positions = torch.arange(seq_len - (hi - lo), seq_len, device=q.device)
        out[lo:hi] = attend(q[lo:hi], keys, values, positions, scale, sliding_window)
    return out


@torch_op("paged_decode_attention")
def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """One query per sequence: q [B, Hq, D] -> [B, Hq, D]; seq_len 0 (padding) gives zeros.

    Vectorised over the whole block table (no host sync), so it can be captured
    in a graph; SDPA groups the query heads over their shared KV head instead
    of materialising repeated keys. On the CPU, where nothing is captured, only
    the blocks the longest sequence uses are read: a graph's static block
    table is as wide as the longest sequence the engine allows.
    """
    if block_tables.device.type == "cpu":
        return _cpu_decode_attention(
            q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window
        )
    keys = gather_blocks(k_cache, block_tables).transpose(1, 2)  # [B, Hk, S, D]
    values = gather_blocks(v_cache, block_tables).transpose(1, 2)
    allowed = visible(seq_lens.long() - 1, keys.shape[2], sliding_window)
    out = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None, :], keys, values, attn_mask=allowed[:, None, None, :], scale=scale,
        enable_gqa=True,
    )
    # A padding row (seq_len 0) has every key masked: SDPA yields NaN there.
    return out[:, :, 0].nan_to_num(0.0)


def _consecutive_blocks(
    k_cache: torch.Tensor, v_cache: torch.Tensor, used: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One sequence whose blocks are consecutive in the cache (as a lone request's usually
    are): its keys and values [1, length, Hk, D] as views, with nothing copied; None
    otherwise."""
    if used.shape[0] != 1:
        return None
    blocks = used[0].tolist()
    first = blocks[0]
    if blocks != list(range(first, first + len(blocks))):
        return None
    span = slice(first, first + len(blocks))
    shape = (1, -1, *k_cache.shape[2:])
    return k_cache[span].view(shape)[:, :length], v_cache[span].view(shape)[:, :length]


def _cpu_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """``paged_decode_attention`` where the host sees the lengths for free: only the keys
    the longest sequence has are read, and the mask (and the NaN clean-up of padding rows)
    is left out when no key needs hiding: every row as long as the longest, within any
    window."""
    lengths = seq_lens.tolist()
    longest = max(lengths, default=0)
    if longest == 0:
        return torch.zeros_like(q)
    block_size = k_cache.shape[1]
    used = block_tables[:, : -(-longest // block_size)]
    views = _consecutive_blocks(k_cache, v_cache, used, longest)
    if views is None:  # [B, S, Hk, D] either way
        keys = gather_blocks(k_cache, used)[:, :longest]
        values = gather_blocks(v_cache, used)[:, :longest]
    else:
        keys, values = views
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)  # [B, Hk, S, D]
    unmasked = min(lengths) == longest and (sliding_window is None or longest <= sliding_window)
    mask = None
    if not unmasked:
        mask = visible(seq_lens.long() - 1, longest, sliding_window)[:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None, :], keys, values, attn_mask=mask, scale=scale, enable_gqa=True,
    )[:, :, 0]
    # A padding row (seq_len 0) has every key masked: SDPA yields NaN there.
    return out if min(lengths) > 0 else out.nan_to_num(0.0)
