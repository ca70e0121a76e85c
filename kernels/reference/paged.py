"""Reading the paged caches, shared by the attention references: blocks gathered through
a block table, causal (and sliding-window) masks, and each new token's sequence and
position in a mixed batch."""

from __future__ import annotations

import torch


def visible(q_positions: torch.Tensor, num_keys: int, sliding_window: int | None) -> torch.Tensor:
    """Which of keys 0..num_keys-1 each query position may attend to: [Q, num_keys] bool.

    Causal, and within the sliding window (q - k < window) when there is one.
    """
    k_pos = torch.arange(num_keys, device=q_positions.device)[None, :]
    q_pos = q_positions[:, None]
    allowed = k_pos <= q_pos
    if sliding_window is not None:
        allowed &= q_pos - k_pos < sliding_window
    return allowed


def gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """cache [NB, BS, Hk, D] read through block_tables [B, W] -> [B, W * BS, Hk, D].

    ``index_select`` over the flattened table copies whole blocks; advanced
    indexing (``cache[block_tables]``) is about 5x slower on the CPU.
    """
    rows, width = block_tables.shape
    blocks = cache.index_select(0, block_tables.reshape(-1).long())
    return blocks.view(rows, width * cache.shape[1], *cache.shape[2:])


def gather_sequence(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    block_size = cache.shape[1]
    n_blocks = (length + block_size - 1) // block_size
    return gather_blocks(cache, block_table[None, :n_blocks])[0, :length]


def attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """q [L, Hq, D] at q_positions [L] over keys/values [S, Hk, D] at positions 0..S-1.

    SDPA (as transformers runs these models) groups query heads over their KV head; a
    whole prompt with no window is plain causal attention, which needs no mask.
    """
    whole_prompt = q.shape[0] == keys.shape[0]
    mask = None
    if not whole_prompt or sliding_window is not None:
        mask = visible(q_positions, keys.shape[0], sliding_window)[None, None]

    def heads_first(t: torch.Tensor) -> torch.Tensor:  # [1, H, L, D]: the CPU's fused
        return t.transpose(0, 1)[None]  # attention kernel takes 4-d inputs only

    out = torch.nn.functional.scaled_dot_product_attention(
        heads_first(q), heads_first(keys), heads_first(values), attn_mask=mask,
        is_causal=mask is None, scale=scale, enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def token_positions(
    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, n_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each of ``n_tokens`` new tokens' sequence and position, on the device, without a sync.

    seq_lens [B] counts cached + new tokens, query_start_loc [B+1] where each sequence's new
    tokens start (``paged_attention``'s layout). Returns (sequence [T] int64, position [T]
    int64); a token past the last sequence's range (graph padding) is given sequence 0 and
    position -1, so it sees no key.
    """
    token = torch.arange(n_tokens, device=query_start_loc.device)
    ends = query_start_loc[1:].long()
    seq = torch.searchsorted(ends, token, right=True)
    inside = seq < seq_lens.shape[0]
    seq = torch.where(inside, seq, 0)
    starts = query_start_loc[:-1].long()
    position = seq_lens.long()[seq] - (ends - starts)[seq] + token - starts[seq]
    return seq, torch.where(inside, position, -1)
