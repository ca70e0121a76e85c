"""MLA decode attention over the latent cache and DeepSeek's grouped routing: the Triton
kernels against their torch references, and the absorbed reference against the expanded one."""

from __future__ import annotations

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


def _latent_case(gen: torch.Generator, data: st.DataObject, dtype: torch.dtype):
    """q_nope, q_pe, a latent cache, kv_b, block tables and lengths for a decode step."""
    heads = data.draw(st.sampled_from([1, 3, 4, 16, 20]))
    nope = data.draw(st.sampled_from([8, 16, 24]))
    rope = data.draw(st.sampled_from([4, 8, 16]))
    rank = data.draw(st.sampled_from([8, 16, 40]))
    v_dim = data.draw(st.sampled_from([8, 12, 16]))
    block_size = data.draw(st.sampled_from([1, 4, 16]))
    lengths = data.draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
    width = max(1, -(-max(lengths) // block_size))
    num_blocks = width * len(lengths) + 2
    tables = torch.randperm(num_blocks, generator=gen)[: width * len(lengths)]
    batch = len(lengths)
    return (
        randn(gen, batch, heads, nope, dtype=dtype),
        randn(gen, batch, heads, rope, dtype=dtype),
        randn(gen, num_blocks, block_size, rank + rope, dtype=dtype),
        randn(gen, heads, nope + v_dim, rank, dtype=dtype, scale=rank**-0.5),
        tables.view(batch, width).to(torch.int32).to(DEVICE),
        torch.tensor(lengths, dtype=torch.int32, device=DEVICE),
        (nope + rope) ** -0.5,
    )


@settings(max_examples=12, deadline=None)
@given(tokens=st.integers(0, 9), rank=st.sampled_from([8, 16, 40]),
       rope=st.sampled_from([4, 8, 16]), block_size=st.sampled_from([1, 4, 16]),
       dtype=st.sampled_from(DTYPES), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_store_latent_cache(tokens: int, rank: int, rope: int, block_size: int,
                            dtype: torch.dtype, data: st.DataObject, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 10  # at least as many slots as tokens
    slots = data.draw(st.lists(st.integers(0, num_blocks * block_size - 1), min_size=tokens,
                               max_size=tokens, unique=True))
    # Some tokens are padding (slot -1): they must leave the cache alone.
    padding = data.draw(st.lists(st.booleans(), min_size=tokens, max_size=tokens))
    mapping = torch.tensor([-1 if p else s for s, p in zip(slots, padding, strict=True)],
                           dtype=torch.int64, device=DEVICE)
    latent = randn(gen, tokens, rank, dtype=dtype)
    k_pe = randn(gen, tokens, rope, dtype=dtype)
    cache = randn(gen, num_blocks, block_size, rank + rope, dtype=dtype)
    expected = cache.clone()
    torch_op("store_latent_cache")(latent, k_pe, expected, mapping)
    triton_op("store_latent_cache", dtype)(latent, k_pe, cache, mapping)
    assert torch.equal(cache, expected)


@settings(max_examples=12, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_mla_decode_attention(data: st.DataObject, dtype: torch.dtype, seed: int) -> None:
    args = _latent_case(torch.Generator().manual_seed(seed), data, dtype)
    actual = triton_op("mla_decode_attention", dtype)(*args)
    expected = torch_op("mla_decode_attention")(*args)
    assert actual.shape == expected.shape
    assert_close(actual, expected, dtype, ACCUMULATING_TOLERANCES)


@settings(max_examples=15, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_the_absorbed_decode_equals_attention_over_expanded_keys_and_values(
    data: st.DataObject, seed: int
) -> None:
    q_nope, q_pe, cache, kv_b, tables, lengths, scale = _latent_case(
        torch.Generator().manual_seed(seed), data, torch.float32
    )
    absorbed = torch_op("mla_decode_attention")(q_nope, q_pe, cache, kv_b, tables, lengths,
                                                scale)
    # The same step as a mixed batch of one new token per sequence (none for padding rows).
    starts = torch.tensor([0, *torch.cumsum((lengths > 0).int(), 0).tolist()],
                          dtype=torch.int32, device=DEVICE)
    live = lengths > 0
    expanded = torch_op("mla_attention")(q_nope[live], q_pe[live], cache, kv_b, tables,
                                         lengths, starts, scale)
    torch.testing.assert_close(absorbed[live], expanded, atol=1e-4, rtol=1e-4)
    assert not absorbed[~live].any()


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.integers(1, 7),
    groups_and_size=st.sampled_from([(1, 2), (2, 2), (4, 2), (2, 4), (4, 4), (8, 8), (3, 5)]),
    method=st.sampled_from(["greedy", "group_limited_greedy", "noaux_tc"]),
    scoring=st.sampled_from(["softmax", "sigmoid"]),
    renormalize=st.booleans(),
    bias=st.booleans(),
    data=st.data(),
    seed=st.integers(0, 2**31 - 1),
)
def test_moe_grouped_route(tokens: int, groups_and_size: tuple[int, int], method: str,
                           scoring: str, renormalize: bool, bias: bool, data: st.DataObject,
                           seed: int) -> None:
    n_group, size = groups_and_size
    experts = n_group * size
    topk_group = data.draw(st.integers(1, n_group))
    top_k = data.draw(st.integers(1, min(8, topk_group * size if method != "greedy"
                                         else experts)))
    gen = torch.Generator().manual_seed(seed)
    logits = randn(gen, tokens, experts)
    correction = randn(gen, experts, scale=0.1) if bias else None
    args = (logits, correction, top_k, scoring, method, n_group, topk_group, renormalize, 2.5)
    weights, ids = triton_op("moe_grouped_route")(*args)
    expected_weights, expected_ids = torch_op("moe_grouped_route")(*args)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    # The same experts with the same weights; the order within a token's k is free.
    order, expected_order = ids.sort(dim=1), expected_ids.sort(dim=1)
    assert torch.equal(order.values, expected_order.values)
    torch.testing.assert_close(weights.gather(1, order.indices),
                               expected_weights.gather(1, expected_order.indices),
                               atol=1e-6, rtol=1e-5)


def test_noaux_tc_chooses_with_the_bias_and_weighs_without_it() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], device=DEVICE)
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0], device=DEVICE)
    for backend in (torch_op, triton_op):
        weights, ids = backend("moe_grouped_route")(logits, bias, 1, "sigmoid", "noaux_tc", 2,
                                                    1, False, 1.0)
        assert ids.tolist() == [[3]]  # -1 + 5 beats 2 + 0
        torch.testing.assert_close(weights, torch.sigmoid(logits[:, 3:]))
