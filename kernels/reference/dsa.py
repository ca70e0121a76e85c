"""DeepSeek sparse attention (DSA): the lightning indexer's choice of positions, and MLA
over just those."""

from __future__ import annotations

import torch

from interlock.kernels.reference.contract import torch_op
from interlock.kernels.reference.mla import absorbed_query
from interlock.kernels.reference.paged import gather_blocks, token_positions


def _used_width(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> int:
    """Block-table columns to read: on the CPU, where the host sees the lengths for free,
    only those the longest sequence uses; elsewhere all of them (no sync, so it can be
    captured in a graph)."""
    if block_tables.device.type != "cpu":
        return block_tables.shape[1]
    return -(-max(seq_lens.tolist(), default=0) // block_size)


def index_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """``dsa_index_topk``'s scores: [T, S] float32 over the positions the block table holds
    (on the CPU, those the longest sequence has), -inf where a token may not look; -0.0
    is made 0.0."""
    n_tokens = q.shape[0]
    seq, position = token_positions(seq_lens, query_start_loc, n_tokens)
    width = _used_width(block_tables, seq_lens, index_cache.shape[1])
    keys = gather_blocks(index_cache, block_tables[:, :width]).float()  # [B, S, Di]
    head_weights = weights.float()[:, None, :]  # [T, 1, Hi]

    def weighted(q_rows: torch.Tensor, seq_keys: torch.Tensor) -> torch.Tensor:
        dots = torch.matmul(q_rows.float(), seq_keys.transpose(-1, -2))  # [L, Hi, S]
        return torch.relu(dots * scale)

    if q.device.type == "cpu":
        # The host knows where each sequence's tokens are: score them against their own
        # sequence's keys, without a copy of those keys per token.
        scores = torch.empty(n_tokens, keys.shape[1], device=q.device)
        starts = query_start_loc.tolist()
        for b in range(seq_lens.shape[0]):
            lo, hi = starts[b], starts[b + 1]
            scores[lo:hi] = torch.matmul(head_weights[lo:hi], weighted(q[lo:hi], keys[b]))[:, 0]
    else:
        scores = torch.matmul(head_weights, weighted(q, keys[seq]))[:, 0]
    visible = torch.arange(keys.shape[1], device=q.device)[None, :] <= position[:, None]
    return scores.masked_fill(~visible, float("-inf")) + 0.0  # + 0.0 turns -0.0 into 0.0


@torch_op("dsa_index_topk")
def dsa_index_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    top_k: int,
) -> torch.Tensor:
    """The DSA lightning indexer: which cached positions each new token attends to.

    q [T, Hi, Di] holds the indexer's queries (rope applied), weights [T, Hi] each head's
    weight, index_cache [NB, BS, Di] one indexer key per cached token, paged like the
    attention cache (block_tables, seq_lens and query_start_loc as in ``paged_attention``;
    the new tokens' keys must already be stored). The score of position p for token t is

        sum over heads h of weights[t, h] * relu(scale * q[t, h] . key[p])

    in float32, over the positions t may see (p <= its own). Returns [T, top_k] int32: the
    top_k best positions in ascending order, then -1 where fewer than top_k are visible (a
    token that sees at most top_k positions takes them all).

    Equal scores at the cut (common: relu makes exact zeros) go as ``torch.topk`` sends them
    on this device, over the row transformers builds: on the CPU each token's row is its
    sequence's ``seq_lens`` positions, -inf past its own, and k = min(top_k, that length),
    so the selection is transformers' own (``torch.topk`` there is an ``nth_element``
    whose ties depend on the whole row); elsewhere the row is the block table's width, no
    host sync, where CUDA's ``torch.topk`` keeps the lowest of equal positions.
    """
    out = torch.full((q.shape[0], top_k), -1, dtype=torch.int32, device=q.device)
    scores = index_scores(q, weights, index_cache, block_tables, seq_lens, query_start_loc, scale)
    if q.device.type != "cpu":
        _select_top_k(scores, top_k, out)
        return out
    starts, lengths = query_start_loc.tolist(), seq_lens.tolist()
    for b, length in enumerate(lengths):
        lo, hi = starts[b], starts[b + 1]
        if hi > lo:
            _select_top_k(scores[lo:hi, :length], top_k, out[lo:hi])
    return out


def _select_top_k(scores: torch.Tensor, top_k: int, out: torch.Tensor) -> None:
    """Write into ``out`` [T, top_k] the visible positions of ``torch.topk`` over each row of
    ``scores`` [T, S] (k = min(top_k, S), as transformers asks), ascending, then -1."""
    k = min(top_k, scores.shape[1])
    if k == 0:
        return
    picked = torch.topk(scores, k, dim=-1).indices
    # A row with fewer than k visible positions picks hidden ones too: they sort last.
    beyond = scores.shape[1]
    visible = scores.gather(1, picked) > float("-inf")
    chosen = torch.where(visible, picked, beyond).sort(dim=-1).values
    out[:, :k] = torch.where(chosen == beyond, -1, chosen).to(torch.int32)


@torch_op("sparse_mla_attention")
def sparse_mla_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    kv_b: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """MLA attention of each new token over the cached positions it was given (DSA), in the
    absorbed form for prefill and decode alike.

    q_nope [T, H, Dn] and q_pe [T, H, R] as in ``mla_attention`` (sequences back to back,
    query_start_loc [B+1]), cache [NB, BS, L + R] the latent cache, kv_b [H, Dn + Dv, L];
    indices [T, K] int32 the positions each token attends to, -1 for none
    (``dsa_index_topk``'s output). Each head scores the chosen latent rows with (q_nope W_UK,
    q_pe), softmax in float32, attends over the rows' latent part, and W_UV maps that to
    its values: -> [T, H, Dv]. A token given no position gets zeros."""
    rank = kv_b.shape[2]
    query = absorbed_query(q_nope, q_pe, kv_b)  # [T, H, L + R]
    n_tokens, _, dim = query.shape
    seq, _ = token_positions(seq_lens, query_start_loc, n_tokens)
    block_size = cache.shape[1]
    chosen = indices.long()
    valid = chosen >= 0
    safe = chosen.clamp(min=0)
    blocks = block_tables.long()[seq[:, None], safe // block_size]
    rows = cache.reshape(-1, dim).index_select(
        0, (blocks * block_size + safe % block_size).reshape(-1)
    ).view(n_tokens, chosen.shape[1], dim).float()  # [T, K, L + R]
    scores = torch.matmul(query.float(), rows.transpose(1, 2)) * scale  # [T, H, K]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all masked: NaN, then zeros
    attended = torch.matmul(probs, rows[..., :rank]).to(query.dtype)  # [T, H, L]
    # W_UV after attention, [T, H, 1, L] x [H, L, Dv]: contiguous [T, H, Dv] (o_proj views it
    # as [T, H * Dv] without a copy, which a native tape could not replay).
    w_uv = kv_b[:, q_nope.shape[2]:].transpose(1, 2)  # [H, L, Dv]
    return torch.matmul(attended[:, :, None, :], w_uv)[:, :, 0]
