"""Mixture of experts: routing (softmax top-k, DeepSeek's grouped routing) and the
routed SwiGLU experts."""

from __future__ import annotations

import torch

from interlock.kernels.reference.contract import torch_op
from interlock.kernels.reference.dense import linear
from interlock.kernels.reference.elementwise import silu_and_mul


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
