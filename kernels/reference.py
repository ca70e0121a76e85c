"""Torch reference implementations: the contract of every op, on any device.

Shapes: T tokens, B sequences, H hidden, Hq/Hk query/KV heads, D head size,
NB cache blocks of BS slots. Numerics follow Hugging Face transformers (norms
in float32 then cast back, softmax in float32) so the models match it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from interlock.kernels.registry import REGISTRY

#: The ops of the model contract, in definition order: what a runner's kernel table holds.
#: Defining a reference here is what adds an op; other backends may then implement it.
MODEL_OPS: list[str] = []


def torch_op(op: str) -> Callable[[Callable], Callable]:
    """Register ``fn`` as the reference of ``op`` (backend torch, every platform and dtype)."""

    def wrap(fn: Callable) -> Callable:
        REGISTRY.implement(op, "torch")(fn)
        MODEL_OPS.append(op)
        return fn

    return wrap


#: Output features per strip of a packed linear weight (``pack_weight``).
PACK_STRIP = 16


@torch_op("linear")
def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool
) -> torch.Tensor:
    """x [T, in] -> [T, out] through a weight stored [out, in], [in, out] (``transposed``)
    or packed by ``pack_weight`` ([out / 16, in, 16]), plus the bias [out] if any."""
    if weight.dim() == 3:
        y = torch.matmul(x, weight).transpose(0, 1).reshape(x.shape[0], -1)
        return y if bias is None else y + bias
    if not transposed:
        return torch.nn.functional.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight)
    return torch.addmm(bias, x, weight)


@torch_op("embedding")
def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """ids [T] int64 -> their rows of table [V, H] (any strides), or of a table packed by
    ``pack_weight`` ([V / 16, H, 16]: a tied LM head): [T, H]."""
    if table.dim() == 3:
        return table[ids // PACK_STRIP, :, ids % PACK_STRIP]
    return torch.nn.functional.embedding(ids, table)


@torch_op("pack_weight")
def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A contiguous linear weight [out, in] packed in place in strips of ``PACK_STRIP``
    outputs, returned as [out / 16, in, 16] over the same memory: element [s, k, c] is
    W[16 s + c, k]. A strip's weights for one input feature are then adjacent, and a strip
    is one contiguous run: what a kernel multiplying a few rows streams (``linear`` and
    ``embedding`` take either form)."""
    outputs, inputs = weight.shape
    if outputs % PACK_STRIP or not weight.is_contiguous():
        raise ValueError(f"pack_weight: weight {tuple(weight.shape)} is not a contiguous "
                         f"[out, in] with a multiple of {PACK_STRIP} outputs")
    strips = weight.view(outputs // PACK_STRIP, PACK_STRIP, inputs)
    for strip in strips:  # one strip's copy at a time: no second weight in memory
        strip.view(inputs, PACK_STRIP).copy_(strip.t().clone())
    return weight.view(outputs // PACK_STRIP, inputs, PACK_STRIP)


@torch_op("select_rows")
def select_rows(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """x [N, H], indices [M] int64 -> x[indices]: [M, H]."""
    return x.index_select(0, indices)


@torch_op("rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """[T, H] -> [T, H]: weight * (x / sqrt(mean(x^2) + eps)), computed in float32. Also
    [T, heads, H] -> [T, heads, H] (the per-head q/k norms)."""
    xf = x.float()
    # mean(x^2) as |x|^2 / H: one vector_norm is several times cheaper than pow + mean on
    # the CPU for decode-sized rows, and equal up to float rounding.
    inv = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_()
    inv = inv.div_(x.shape[-1]).add_(eps).rsqrt_()
    return weight * (xf * inv).to(x.dtype)


@torch_op("fused_add_rms_norm")
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual)."""
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


@torch_op("silu_and_mul")
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] -> [T, I]: silu(gate) * up."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@torch_op("rotary_embedding")
def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Neox-style rotary embedding applied in place.

    positions [T] int64; q [T, Hq, D]; k [T, Hk, D]; cos_sin_cache
    [max_positions, D] float32 holding cos in the first D/2 columns and sin in
    the last D/2.
    """
    half = cos_sin_cache.shape[-1] // 2
    cos_sin = cos_sin_cache.index_select(0, positions).to(q.dtype)
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    for t in _heads_of(q, k):
        x1, x2 = t[..., :half], t[..., half:]
        x1_sin = x1 * sin  # the one value both halves need before x1 is overwritten
        x1.mul_(cos).addcmul_(x2, sin, value=-1)
        x2.mul_(cos).add_(x1_sin)


def _heads_of(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(q, k), or one view of both when k's heads directly follow q's in memory (views of
    one fused q/k/v projection): the rotation then runs once, with half the ops."""
    if (
        q.stride() == k.stride()
        and q.dtype == k.dtype
        and q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
        and k.storage_offset() == q.storage_offset() + q.shape[1] * q.stride(1)
    ):
        shape = (q.shape[0], q.shape[1] + k.shape[1], q.shape[2])
        return (q.as_strided(shape, q.stride(), q.storage_offset()),)
    return q, k


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


def _visible(q_positions: torch.Tensor, num_keys: int, sliding_window: int | None) -> torch.Tensor:
    """Which of keys 0..num_keys-1 each query position may attend to: [Q, num_keys] bool.

    Causal, and within the sliding window (q - k < window) when there is one.
    """
    k_pos = torch.arange(num_keys, device=q_positions.device)[None, :]
    q_pos = q_positions[:, None]
    allowed = k_pos <= q_pos
    if sliding_window is not None:
        allowed &= q_pos - k_pos < sliding_window
    return allowed


def _gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """cache [NB, BS, Hk, D] read through block_tables [B, W] -> [B, W * BS, Hk, D].

    ``index_select`` over the flattened table copies whole blocks; advanced
    indexing (``cache[block_tables]``) is about 5x slower on the CPU.
    """
    rows, width = block_tables.shape
    blocks = cache.index_select(0, block_tables.reshape(-1).long())
    return blocks.view(rows, width * cache.shape[1], *cache.shape[2:])


def _gather_sequence(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    block_size = cache.shape[1]
    n_blocks = (length + block_size - 1) // block_size
    return _gather_blocks(cache, block_table[None, :n_blocks])[0, :length]


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
        keys = _gather_sequence(k_cache, block_tables[b], seq_len)
        values = _gather_sequence(v_cache, block_tables[b], seq_len)
        positions = torch.arange(seq_len - (hi - lo), seq_len, device=q.device)
        out[lo:hi] = _attend(q[lo:hi], keys, values, positions, scale, sliding_window)
    return out


def _attend(
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
        mask = _visible(q_positions, keys.shape[0], sliding_window)[None, None]

    def heads_first(t: torch.Tensor) -> torch.Tensor:  # [1, H, L, D]: the CPU's fused
        return t.transpose(0, 1)[None]  # attention kernel takes 4-d inputs only

    out = torch.nn.functional.scaled_dot_product_attention(
        heads_first(q), heads_first(keys), heads_first(values), attn_mask=mask,
        is_causal=mask is None, scale=scale, enable_gqa=True,
    )
    return out[0].transpose(0, 1)


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
    keys = _gather_blocks(k_cache, block_tables).transpose(1, 2)  # [B, Hk, S, D]
    values = _gather_blocks(v_cache, block_tables).transpose(1, 2)
    allowed = _visible(seq_lens.long() - 1, keys.shape[2], sliding_window)
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
        keys = _gather_blocks(k_cache, used)[:, :longest]
        values = _gather_blocks(v_cache, used)[:, :longest]
    else:
        keys, values = views
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)  # [B, Hk, S, D]
    unmasked = min(lengths) == longest and (sliding_window is None or longest <= sliding_window)
    mask = None
    if not unmasked:
        mask = _visible(seq_lens.long() - 1, longest, sliding_window)[:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None, :], keys, values, attn_mask=mask, scale=scale, enable_gqa=True,
    )[:, :, 0]
    # A padding row (seq_len 0) has every key masked: SDPA yields NaN there.
    return out if min(lengths) > 0 else out.nan_to_num(0.0)


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


def _absorbed_query(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_b: torch.Tensor) -> torch.Tensor:
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
    query = _absorbed_query(q_nope, q_pe, kv_b)
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
    latent = _gather_blocks(cache, block_tables)[:, :same_length]
    # Batched products over the one shared latent per sequence (SDPA would repeat it for
    # every head): scores [B, H, S], softmax in float32, attended latent [B, H, L].
    scores = torch.bmm(query, latent.transpose(1, 2)).float() * scale
    if same_length is None:
        allowed = _visible(seq_lens.long() - 1, latent.shape[1], None)[:, None, :]
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
        latent = _gather_sequence(cache, block_tables[b], seq_len)  # [S, L + R]
        kv = (latent[:, :rank] @ expand.t()).view(seq_len, heads, width)
        k_pe = latent[:, None, rank:].expand(seq_len, heads, latent.shape[1] - rank)
        keys = torch.cat([kv[..., :nope], k_pe], dim=-1)
        query = torch.cat([q_nope[lo:hi], q_pe[lo:hi]], dim=-1)
        positions = torch.arange(seq_len - (hi - lo), seq_len, device=q_nope.device)
        out[lo:hi] = _attend(query, keys, kv[..., nope:], positions, scale, None)
    return out


@torch_op("moe_route")
def moe_route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts, top-k, optional renormalisation.

    router_logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64).
    """
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


@torch_op("moe_grouped_route")
def moe_grouped_route(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    scoring: str,
    method: str,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-style routing: router_logits [T, E] -> (weights [T, k] float32, expert ids
    [T, k] int64).

    Scores are ``scoring`` (softmax or sigmoid) of the float32 logits. ``method``:

    * ``greedy``: the k best scores;
    * ``group_limited_greedy``: the experts split into ``n_group`` groups, each scored by its
      best expert; the k best among the ``topk_group`` best groups (others scored 0);
    * ``noaux_tc``: experts chosen by score + ``correction_bias`` (if any; the other methods
      ignore it), groups scored by their two best such values, the k best of the
      ``topk_group`` best groups (others excluded); weights are the scores themselves,
      without the bias.

    With ``renormalize`` the k weights are divided by their sum (+ 1e-20); then all k are
    multiplied by ``scaling``."""
    logits = router_logits.float()
    if scoring == "softmax":
        scores = torch.softmax(logits, dim=-1)
    elif scoring == "sigmoid":
        scores = logits.sigmoid()
    else:
        raise ValueError(f"moe_grouped_route: scoring {scoring!r} is not softmax or sigmoid")
    tokens, experts = scores.shape
    if method == "greedy":
        weights, ids = torch.topk(scores, top_k, dim=-1)
    elif method in ("group_limited_greedy", "noaux_tc"):
        choice = scores
        if method == "noaux_tc" and correction_bias is not None:
            choice = scores + correction_bias.float()
        grouped = choice.view(tokens, n_group, experts // n_group)
        if method == "noaux_tc":
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        else:
            group_scores = grouped.max(dim=-1).values
        groups = torch.topk(group_scores, topk_group, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
        keep = keep[:, :, None].expand(grouped.shape).reshape(tokens, experts)
        fill = float("-inf") if method == "noaux_tc" else 0.0
        ids = torch.topk(choice.masked_fill(~keep, fill), top_k, dim=-1).indices
        weights = scores.gather(1, ids)
    else:
        raise ValueError(f"moe_grouped_route: method {method!r} is not greedy, "
                         "group_limited_greedy or noaux_tc")
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


@torch_op("add")
def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y, of one shape (a MoE block's routed and shared experts' outputs)."""
    return x + y


@torch_op("moe_experts")
def moe_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Routed SwiGLU experts: x [T, H], w13 [E, 2I, H] (gate; up), w2 [E, H, I] -> [T, H].
    Either may have each expert's matrix packed by ``pack_weight`` ([E, 2I / 16, H, 16],
    [E, H / 16, I, 16]), as ``linear`` takes it.

    Each token's output is the sum over its k experts of
    weight * w2 @ silu_and_mul(w13 @ x), accumulated expert by expert.
    """
    out = torch.zeros_like(x)
    weights = topk_weights.to(x.dtype)
    for expert in torch.unique(topk_ids).tolist():
        token_idx, slot = torch.where(topk_ids == expert)
        gate_up = linear(x[token_idx], w13[expert], None, False)
        hidden = linear(silu_and_mul(gate_up), w2[expert], None, False)
        out.index_add_(0, token_idx, hidden * weights[token_idx, slot, None])
    return out


@torch_op("sample")
def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
) -> torch.Tensor:
    """Next token per row: logits [B, V] -> int64 [B].

    temperature 0 is greedy argmax. Otherwise Gumbel-max over the
    temperature-scaled distribution restricted by top_k (0 = off) and top_p
    (1.0 = off), with noise drawn from a generator seeded by (seed, step), so
    a request's sample depends only on its own seed and position.
    """
    logits = logits.float()
    tokens = logits.argmax(dim=-1)
    for row in torch.nonzero(temperature > 0).flatten().tolist():
        scaled = logits[row] / temperature[row]
        k = int(top_k[row])
        if 0 < k < scaled.shape[0]:
            kth = torch.topk(scaled, k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        p = float(top_p[row])
        if p < 1.0:
            sorted_logits, order = torch.sort(scaled, descending=True)
            cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
            drop = cum - torch.softmax(sorted_logits, dim=-1) >= p
            scaled = scaled.masked_fill(torch.zeros_like(drop).scatter(0, order, drop),
                                        float("-inf"))
        gen = torch.Generator(device=logits.device)
        gen.manual_seed((int(seeds[row]) * 1_000_003 + int(steps[row])) % (2**63))
        noise = torch.empty_like(scaled).exponential_(generator=gen)
        tokens[row] = (torch.softmax(scaled, dim=-1) / noise).argmax()
    return tokens


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
    keys = _gather_blocks(index_cache, block_tables[:, :width]).float()  # [B, S, Di]
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
    query = _absorbed_query(q_nope, q_pe, kv_b)  # [T, H, L + R]
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


@torch_op("layer_norm")
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
               ) -> torch.Tensor:
    """[T, D] -> [T, D]: (x - mean) / sqrt(var + eps) * weight + bias over the last
    dimension (the DSA indexer's key norm)."""
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


@torch_op("concat")
def concat(parts: list[torch.Tensor]) -> torch.Tensor:
    """[T, D1], [T, D2], ... -> [T, D1 + D2 + ...]: what one attention split point receives
    when its query is computed in parts (a DSA layer's MLA query, indexer query and head
    weights)."""
    return torch.cat(parts, dim=-1)


@torch_op("quantized_linear")
def quantized_linear(
    x: torch.Tensor, weight: torch.Tensor, ggml_type: str, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [T, in] -> [T, out] through a weight kept in GGUF block format ``ggml_type``
    (``kernels.quant.FORMATS``), packed by ``kernels.quant.pack`` ([out / 16, in / block,
    record] bytes): dequantized (bitwise as gguf dequantizes), then the float product."""
    from interlock.kernels import quant  # it builds on this module's PACK_STRIP

    return torch.nn.functional.linear(x, quant.dequantize(weight, ggml_type), bias)


@torch_op("quantized_embedding")
def quantized_embedding(ids: torch.Tensor, table: torch.Tensor, ggml_type: str) -> torch.Tensor:
    """ids [T] int64 -> their rows, dequantized, of a table [V, H] kept in GGUF block
    format ``ggml_type`` and packed as ``quantized_linear`` takes it (a tied LM head): [T, H]."""
    from interlock.kernels import quant

    rows = quant.dequantize(table[ids // PACK_STRIP], ggml_type)  # each id's strip
    return rows.view(ids.shape[0], PACK_STRIP, -1)[torch.arange(ids.shape[0]), ids % PACK_STRIP]


# Kimi Delta Attention (KDA): linear attention whose per-request state lives in a pool of
# fixed-size slots (``interlock.runners.model.state_pool``), not in the paged cache. Each op
# takes the pool and ``slots`` [B] int64, each sequence's slot (-1, a padding row: the
# pool's last slot, kept as scratch). A sequence with no cached tokens
# (``seq_lens - query length == 0``: a new or preempted request) starts from a zero state.


def _fresh_flags(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor
) -> list[tuple[int, int, int, int]]:
    """Per real sequence (query tokens > 0, seq_len > 0): (index, lo, hi, fresh)."""
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    rows = []
    for b, seq_len in enumerate(lens):
        lo, hi = starts[b], starts[b + 1]
        if hi > lo and seq_len > 0:
            rows.append((b, lo, hi, int(seq_len == hi - lo)))
    return rows


@torch_op("causal_conv1d")
def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    """Depthwise causal convolution then SiLU, per sequence of a mixed batch: x [T, C]
    (sequences back to back, query_start_loc [B+1]), weight [C, K], state [S, C, K-1] the
    previous K-1 inputs of each slot (zeros before a fresh sequence), updated in place to
    each sequence's last K-1 inputs. -> [T, C] in x's dtype (computed in weight's)."""
    out = torch.zeros_like(x)
    taps = weight.shape[1]
    slot_list = slots.tolist()
    for b, lo, hi, fresh in _fresh_flags(query_start_loc, seq_lens):
        slot = slot_list[b]
        window = state[slot]
        if fresh:
            window = torch.zeros_like(window)
        full = torch.cat([window, x[lo:hi].t().to(window.dtype)], dim=1)  # [C, K-1 + L]
        conv = torch.nn.functional.conv1d(full[None].to(weight.dtype), weight[:, None],
                                          groups=weight.shape[0])[0]  # [C, L]
        out[lo:hi] = torch.nn.functional.silu(conv).t().to(x.dtype)
        state[slot] = full[:, full.shape[1] - (taps - 1):]
    return out


@torch_op("causal_conv1d_update")
def causal_conv1d_update(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """One token per sequence: x [B, C], weight [C, K], state [S, C, K-1] (slots [B], -1 the
    scratch slot), the window advanced in place. -> SiLU(conv) [B, C]. No host sync: a
    decode graph captures it."""
    window = state[slots]  # [B, C, K-1]
    full = torch.cat([window, x[:, :, None].to(window.dtype)], dim=2)  # [B, C, K]
    conv = (full.to(weight.dtype) * weight).sum(dim=2)
    state[slots] = full[:, :, 1:]
    return torch.nn.functional.silu(conv).to(x.dtype)


@torch_op("kda_gates")
def kda_gates(
    f: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA's forget and input gates from their projections: f [T, H*D] and b [T, H], with
    dt_bias [H*D] and A_log [H] -> (log-decay g = -exp(A_log) * softplus(f + dt_bias)
    [T, H, D], beta = sigmoid(b) [T, H]), both float32. Softplus is exact past 20, as the
    checkpoint's training kernels compute it."""
    heads = a_log.numel()
    shifted = (f.float() + dt_bias.float()).view(f.shape[0], heads, -1)
    softplus = torch.where(shifted > 20.0, shifted, torch.log1p(torch.exp(shifted)))
    g = -torch.exp(a_log.float()).view(1, heads, 1) * softplus
    return g, torch.sigmoid(b.float())


def _l2_normalised(x: torch.Tensor) -> torch.Tensor:
    # x / sqrt(|x|^2 + 1e-6): the epsilon inside the root, as the training kernels have it.
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


@torch_op("kda_recurrent")
def kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One KDA step per sequence (decode): q, k [B, H, D], v [B, H, Dv], g [B, H, D]
    (log-decay), beta [B, H]; state [S, H, D, Dv] float32, slots [B] (-1 scratch).

    With q and k L2-normalised and q scaled by D ** -0.5: decay the state per key channel
    (S *= exp(g)), correct it towards v along k by beta (the delta rule,
    S += k (beta (v - S^T k))^T), read q^T S. The state is updated in place. -> [B, H, Dv]
    in v's dtype. No host sync: a decode graph captures it."""
    scale = q.shape[-1] ** -0.5
    q, k = _l2_normalised(q.float()) * scale, _l2_normalised(k.float())
    s = state[slots] * torch.exp(g.float())[..., None]  # [B, H, D, Dv]
    predicted = (k[..., None] * s).sum(dim=2)  # [B, H, Dv]
    delta = (v.float() - predicted) * beta.float()[..., None]
    s = s + k[..., None] * delta[..., None, :]
    state[slots] = s
    return (q[..., None] * s).sum(dim=2).to(v.dtype)


def kda_chunks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    initial: torch.Tensor, chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, chunk by chunk: q, k, g [L, H, D], v [L, H, Dv], beta [L, H] (float32,
    q and k already normalised, q scaled), initial [H, D, Dv] -> (out [L, H, Dv], final
    state).

    In a chunk, with G_t the running sum of g from its start and S0 the state entering it,
    the correction d_t = beta_t (v_t - S_t^T k_t) of each token depends on the earlier
    ones through A[t, j] = beta_t sum_c k_t[c] k_j[c] exp(G_t[c] - G_j[c]) (j < t):
    (I + A) d = beta (v - (k exp(G)) S0), one unit-lower-triangular solve. Then
    out_t = (q_t exp(G_t))^T S0 + sum_{j <= t} (q_t . k_j exp(G_t - G_j)) d_j, and the state
    leaving is exp(G_C) S0 + sum_j (k_j exp(G_C - G_j)) d_j^T."""
    length = q.shape[0]
    out = v.new_empty(v.shape)
    s = initial
    for lo in range(0, length, chunk_size):
        hi = min(lo + chunk_size, length)
        qc, kc, vc = (x[lo:hi].transpose(0, 1) for x in (q, k, v))  # [H, C, *]
        bc = beta[lo:hi].t()  # [H, C]
        cum = g[lo:hi].transpose(0, 1).cumsum(dim=1)  # [H, C, D]
        size = hi - lo
        lower = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        # exp(G_t - G_j) for j <= t; masked before exp (j > t would grow, not decay).
        gaps = (cum[:, :, None, :] - cum[:, None, :, :]).masked_fill(
            ~lower[None, :, :, None], float("-inf")).exp()  # [H, C, C, D]
        kk = (kc[:, :, None, :] * kc[:, None, :, :] * gaps).sum(-1)  # [H, C, C]
        a = (kk * bc[:, :, None]).tril(-1)
        eye = torch.eye(size, dtype=a.dtype, device=a.device)
        rhs = bc[..., None] * (vc - (kc * cum.exp()) @ s)  # [H, C, Dv]
        d = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        qk = (qc[:, :, None, :] * kc[:, None, :, :] * gaps).sum(-1)  # [H, C, C], j <= t
        out[lo:hi] = ((qc * cum.exp()) @ s + qk @ d).transpose(0, 1)
        last = cum[:, -1:, :]  # [H, 1, D]
        s = last.transpose(1, 2).exp() * s + (kc * (last - cum).exp()).transpose(1, 2) @ d
    return out, s


@torch_op("kda_chunked")
def kda_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    chunk_size: int,
) -> torch.Tensor:
    """KDA over a mixed batch (prefill chunks and decodes), chunk_size tokens at a time
    (``kda_chunks``): q, k, g [T, H, D], v [T, H, Dv], beta [T, H], sequences back to back
    (query_start_loc [B+1], seq_lens [B]); state [S, H, D, Dv] float32, slots [B]. Each
    sequence starts from its slot's state (zeros when fresh) and leaves its final state
    there; what ``kda_recurrent`` computes token by token. -> [T, H, Dv] in v's dtype."""
    scale = q.shape[-1] ** -0.5
    qn, kn = _l2_normalised(q.float()) * scale, _l2_normalised(k.float())
    out = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    slot_list = slots.tolist()
    for b, lo, hi, fresh in _fresh_flags(query_start_loc, seq_lens):
        slot = slot_list[b]
        initial = torch.zeros_like(state[slot]) if fresh else state[slot]
        seq_out, final = kda_chunks(qn[lo:hi], kn[lo:hi], v[lo:hi].float(), g[lo:hi].float(),
                                    beta[lo:hi].float(), initial, chunk_size)
        out[lo:hi] = seq_out.to(v.dtype)
        state[slot] = final
    return out


@torch_op("gated_rms_norm")
def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """[T, H, D] -> [T, H, D]: RMS norm over D, times weight [D], times sigmoid(gate), all
    in float32 (weight too), cast back (KDA's output norm)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (normed * torch.sigmoid(gate.float())).to(x.dtype)
