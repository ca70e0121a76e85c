"""MoE routing and the grouped expert GEMMs against their torch references."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import (
    ACCUMULATING_TOLERANCES,
    DEVICE,
    DTYPES,
    assert_close,
    randn,
    torch_op,
    triton_op,
)


@settings(max_examples=15, deadline=None)
@given(tokens=st.integers(1, 9), experts=st.sampled_from([1, 2, 3, 8, 17, 64]), data=st.data(),
       renormalize=st.booleans(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_moe_route(tokens: int, experts: int, data: st.DataObject, renormalize: bool,
                   dtype: torch.dtype, seed: int) -> None:
    top_k = data.draw(st.integers(1, min(experts, 8)))
    logits = randn(torch.Generator().manual_seed(seed), tokens, experts, dtype=dtype)
    weights, ids = triton_op("moe_route", dtype)(logits, top_k, renormalize)
    expected_weights, expected_ids = torch_op("moe_route")(logits, top_k, renormalize)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
    if dtype == torch.float32:
        assert torch.equal(ids, expected_ids)
    else:
        # Coarse logits tie, and torch.topk breaks ties in no documented order: the chosen
        # experts must be distinct and carry the reference's probabilities.
        probs = torch.softmax(logits.float(), dim=-1)
        assert torch.equal(probs.gather(1, ids), probs.gather(1, expected_ids))
        assert all(len(set(row)) == top_k for row in ids.tolist())


@settings(max_examples=12, deadline=None)
@given(tokens=st.sampled_from([1, 2, 5, 12, 40]), experts=st.integers(1, 8), data=st.data(),
       hidden=st.sampled_from([16, 40, 64, 96]), intermediate=st.sampled_from([8, 24, 64, 80]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_moe_experts(tokens: int, experts: int, data: st.DataObject, hidden: int,
                     intermediate: int, dtype: torch.dtype, seed: int) -> None:
    top_k = data.draw(st.integers(1, min(experts, 4)))
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, tokens, hidden, dtype=dtype)
    w13 = randn(gen, experts, 2 * intermediate, hidden, dtype=dtype, scale=hidden**-0.5)
    w2 = randn(gen, experts, hidden, intermediate, dtype=dtype, scale=intermediate**-0.5)
    weights, ids = torch_op("moe_route")(randn(gen, tokens, experts), top_k, True)
    actual = triton_op("moe_experts", dtype)(x, w13, w2, weights, ids)
    expected = torch_op("moe_experts")(x, w13, w2, weights, ids)
    assert_close(actual, expected, dtype, ACCUMULATING_TOLERANCES)


def test_moe_experts_with_every_token_on_one_expert() -> None:
    """Most tiles of the bounded grid are idle; the busy expert spans several tiles."""
    gen = torch.Generator().manual_seed(0)
    tokens, experts, hidden, intermediate = 70, 6, 32, 16
    x = randn(gen, tokens, hidden)
    w13 = randn(gen, experts, 2 * intermediate, hidden, scale=hidden**-0.5)
    w2 = randn(gen, experts, hidden, intermediate, scale=intermediate**-0.5)
    ids = torch.full((tokens, 1), 4, device=DEVICE)
    weights = torch.ones(tokens, 1, device=DEVICE)
    actual = triton_op("moe_experts")(x, w13, w2, weights, ids)
    assert_close(actual, torch_op("moe_experts")(x, w13, w2, weights, ids), torch.float32,
                 ACCUMULATING_TOLERANCES)


def test_moe_route_rejects_top_k_above_experts() -> None:
    with pytest.raises(ValueError, match=r"top_k=5 must be in 1\.\.4"):
        triton_op("moe_route")(torch.zeros(2, 4, device=DEVICE), 5, True)
