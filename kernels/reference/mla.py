"""Multi-head latent attention (MLA) over the latent cache: storing entries, the absorbed
decode and the expanded mixed-batch form."""

from __future__ import annotations

import torch

from interlock.kernels.reference.contract import torch_op
from interlock.kernels.reference.paged import attend, gather_blocks, gather_sequence, visible


@torch_op("store_latent_cache")
def store_latent_cache(
    latent: torch.Tensor, k_pe: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write MLA's per-token entries into cache [NB, BS, L + R] at flat slots: the
    compressed KV latent [T, L] then the rotary key [T, R]; slot -1 is padding."""
    flat = cache.view(-1, cache.shape[-1])
    entries = torch.cat([latent, k_pe], dim=-1)
    if slot_mapping.device.type == "cpu" and min(slot_mapping.tolist(), default=0) >= 0:
        flat.index_copy_(0, slot_mapping, entries)
        return
    keep = slot_mapping >= 0
    flat[slot_mapping[keep]] = entries[keep]


def absorbed_query(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_b: torch.Tensor) -> torch.Tensor:
    """[B, H, Dn] and [B, H, R] with kv_b [H, Dn + Dv, L] -> [B, H, L + R]: W_UK folded into
    the query (q_nope W_UK), so it scores the latent itself."""
    w_uk = kv_b[:, : q_nope.shape[2]]  # [H, Dn, L]
    q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [B, H, L]
    return torch.cat([q_latent, q_pe], dim=-1)


@torch_op("mla_decode_attention")
def mla_decode_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    kv_b: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """MLA decode in the absorbed form: one query per sequence, q_nope [B, H, Dn] and its
    rotary part q_pe [B, H, R], over the latent cache [NB, BS, L + R]; kv_b [H, Dn + Dv, L]
    is kv_b_proj per head (W_UK rows, then W_UV rows). -> [B, H, Dv]; seq_len 0 gives zeros.

    Each head scores the cached latent with (q_nope W_UK, q_pe), attends over the latent
    itself (one shared "KV head" of L + R / L features), and W_UV maps the attended latent to
    the head's values: no per-head K or V is ever built. On the CPU only the blocks the
    longest sequence uses are read; elsewhere the whole block table (no host sync)."""
    rank = kv_b.shape[2]
    query = absorbed_query(q_nope, q_pe, kv_b)
    # Without a host sync (a GPU), every row is masked to its length and padding rows are
    # cleaned; on the CPU the lengths are free to read, and both only when needed.
    same_length: int | None = None  # every sequence this long: no mask
    padded = True
    if block_tables.device.type == "cpu":
        lengths = seq_lens.tolist()
        longest = max(lengths, default=0)
        if longest == 0:
            shape = (q_nope.shape[0], q_nope.shape[1], kv_b.shape[1] - q_nope.shape[2])
            return q_nope.new_zeros(shape)
        block_tables = block_tables[:, : -(-longest // cache.shape[1])]
        same_length = longest if min(lengths) == longest else None
        padded = min(lengths) == 0
    latent = gather_blocks(cache, block_tables)[:, :same_length]
    # Batched products over the one shared latent per sequence (SDPA would repeat it for
    # every head): scores [B, H, S], softmax in float32, attended latent [B, H, L].
    scores = torch.bmm(query, latent.transpose(1, 2)).float() * scale
    if same_length is None:
        allowed = visible(seq_lens.long() - 1, latent.shape[1], None)[:, None, :]
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if padded:  # a padding row (seq_len 0) has every key masked: the softmax yields NaN
        weights = weights.nan_to_num(0.0)
    weights = weights.to(query.dtype)
    attended = torch.bmm(weights, latent[..., :rank])
    w_uv = kv_b[:, q_nope.shape[2]:]  # [H, Dv, L]
    return torch.bmm(attended.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)


@torch_op("mla_attention")
def mla_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    kv_b: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """MLA for a mixed prefill/decode batch, expanded: each sequence's cached latents
    become per-head keys (W_UK c, then the shared rotary key) and values (W_UV c), and
    causal attention runs over them as ``paged_attention`` does. q_nope [T, H, Dn], q_pe
    [T, H, R] (sequences back to back, query_start_loc [B+1]), cache [NB, BS, L + R], kv_b
    [H, Dn + Dv, L] -> [T, H, Dv]."""
    heads, width, rank = kv_b.shape
    nope = q_nope.shape[2]
    out = q_nope.new_zeros(q_nope.shape[0], heads, width - nope)
    starts = query_start_loc.tolist()
    expand = kv_b.reshape(heads * width, rank)
    for b, seq_len in enumerate(seq_lens.tolist()):
        lo, hi = starts[b], starts[b + 1]
        if hi == lo or seq_len == 0:
            continue
        latent = gather_sequence(cache, block_tables[b], seq_len)  # [S, L + R]
        kv = (latent[:, :rank] @ expand.t()).view(seq_len, heads, width)
        k_pe = latent[:, None, rank:].expand(seq_len, heads, latent.shape[1] - rank)
        keys = torch.cat([kv[..., :nope], k_pe], dim=-1)
        query = torch.cat([q_nope[lo:hi], q_pe[lo:hi]], dim=-1)
        positions = torch.arange(seq_len - (hi - lo), seq_len, device=q_nope.device)
        out[lo:hi] = attend(query, keys, kv[..., nope:], positions, scale, None)
    return out
