"""Sampling the next token: greedy, or seeded Gumbel-max under top-k and top-p."""

from __future__ import annotations

import torch

from interlock.kernels.reference.contract import torch_op


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
