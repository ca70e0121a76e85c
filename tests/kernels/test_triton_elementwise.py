"""Row-wise Triton kernels against their torch references: norms, SwiGLU, rotary, KV store."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DEVICE, DTYPES, TOLERANCES, assert_close, randn, torch_op, triton_op

# Hidden sizes around the power-of-two row blocks, plus odd ones.
HIDDEN = st.sampled_from([1, 7, 64, 127, 128, 129, 300, 1024, 1025])
TOKENS = st.integers(1, 9)
SEEDS = st.integers(0, 2**31 - 1)
DTYPE = st.sampled_from(DTYPES)


@settings(max_examples=12, deadline=None)
@given(tokens=TOKENS, hidden=HIDDEN, dtype=DTYPE, seed=SEEDS, strided=st.booleans())
def test_rms_norm(tokens: int, hidden: int, dtype: torch.dtype, seed: int, strided: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, tokens, hidden + 3 if strided else hidden, dtype=dtype)[:, :hidden]
    weight = randn(gen, hidden, dtype=dtype)
    actual = triton_op("rms_norm", dtype)(x, weight, 1e-6)
    assert_close(actual, torch_op("rms_norm")(x, weight, 1e-6), dtype)


@settings(max_examples=12, deadline=None)
@given(tokens=TOKENS, hidden=HIDDEN, dtype=DTYPE, seed=SEEDS)
def test_fused_add_rms_norm(tokens: int, hidden: int, dtype: torch.dtype, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, residual = randn(gen, tokens, hidden, dtype=dtype), randn(gen, tokens, hidden, dtype=dtype)
    weight = randn(gen, hidden, dtype=dtype)
    before = x.clone(), residual.clone()
    out, summed = triton_op("fused_add_rms_norm", dtype)(x, residual, weight, 1e-5)
    expected_out, expected_summed = torch_op("fused_add_rms_norm")(x, residual, weight, 1e-5)
    assert_close(summed, expected_summed, dtype)
    assert_close(out, expected_out, dtype)
    assert torch.equal(x, before[0]) and torch.equal(residual, before[1]), "inputs were modified"


@settings(max_examples=12, deadline=None)
@given(tokens=TOKENS, intermediate=st.sampled_from([1, 5, 64, 1000, 1024, 1500]), dtype=DTYPE,
       seed=SEEDS)
def test_silu_and_mul(tokens: int, intermediate: int, dtype: torch.dtype, seed: int) -> None:
    x = randn(torch.Generator().manual_seed(seed), tokens, 2 * intermediate, dtype=dtype)
    assert_close(triton_op("silu_and_mul", dtype)(x), torch_op("silu_and_mul")(x), dtype)


@settings(max_examples=12, deadline=None)
@given(tokens=TOKENS, kv_heads=st.integers(1, 3), group=st.sampled_from([1, 2, 4, 8]),
       head_size=st.sampled_from([64, 128]), dtype=DTYPE, seed=SEEDS)
def test_rotary_embedding_in_place_on_qkv_views(
    tokens: int, kv_heads: int, group: int, head_size: int, dtype: torch.dtype, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    q_heads = kv_heads * group
    max_positions = 300
    positions = torch.randint(0, max_positions, (tokens,), generator=gen).to(DEVICE)
    cos_sin = randn(gen, max_positions, head_size)
    # q and k are strided views into one fused projection, as a model produces them.
    qkv = randn(gen, tokens, (q_heads + 2 * kv_heads) * head_size, dtype=dtype)
    q = qkv[:, : q_heads * head_size].view(tokens, q_heads, head_size)
    k = qkv[:, q_heads * head_size : (q_heads + kv_heads) * head_size].view(
        tokens, kv_heads, head_size)
    # The kernel rotates in float32 and rounds once; the reference rounds each product to the
    # activation dtype, which cancellation can leave several bfloat16 ulps off. So the
    # reference runs in float32 here (on cos/sin rounded to the activation dtype, as both
    # do) and the results meet in the activation dtype. A rotation keeps norms, so the
    # absolute tolerance scales with the inputs: rounding cos/sin (truncating, in the
    # interpreter) moves an output by up to an ulp of 1 times |x1| + |x2|.
    expected_q, expected_k = q.float(), k.float()
    v_before = qkv[:, (q_heads + kv_heads) * head_size :].clone()
    torch_op("rotary_embedding")(positions, expected_q, expected_k, cos_sin.to(dtype).float())
    magnitude = max(q.abs().max().item(), k.abs().max().item(), 1.0)
    tolerance = {**TOLERANCES, dtype: {"atol": TOLERANCES[dtype]["atol"] * magnitude,
                                       "rtol": TOLERANCES[dtype]["rtol"]}}
    assert triton_op("rotary_embedding", dtype)(positions, q, k, cos_sin) is None
    assert_close(q, expected_q.to(dtype), dtype, tolerance)
    assert_close(k, expected_k.to(dtype), dtype, tolerance)
    assert torch.equal(qkv[:, (q_heads + kv_heads) * head_size :], v_before), "v was touched"


@settings(max_examples=12, deadline=None)
@given(tokens=st.integers(1, 12), kv_heads=st.integers(1, 4),
       head_size=st.sampled_from([64, 128]), dtype=DTYPE, seed=SEEDS, data=st.data())
def test_store_kv_cache_skips_padding_slots(
    tokens: int, kv_heads: int, head_size: int, dtype: torch.dtype, seed: int, data: st.DataObject
) -> None:
    gen = torch.Generator().manual_seed(seed)
    blocks, block_size = 3, 16
    slots = data.draw(st.lists(st.integers(0, blocks * block_size - 1), min_size=tokens,
                               max_size=tokens, unique=True))
    # Padding tokens (slot -1), e.g. a batch padded up to a captured graph size.
    padding = data.draw(st.lists(st.booleans(), min_size=tokens, max_size=tokens))
    slot_mapping = torch.tensor([-1 if pad else s for s, pad in zip(slots, padding, strict=True)],
                                device=DEVICE)
    k, v = (randn(gen, tokens, kv_heads, head_size, dtype=dtype) for _ in range(2))
    caches = [randn(gen, blocks, block_size, kv_heads, head_size, dtype=dtype) for _ in range(2)]
    expected = [c.clone() for c in caches]
    torch_op("store_kv_cache")(k, v, *expected, slot_mapping)
    triton_op("store_kv_cache", dtype)(k, v, *caches, slot_mapping)
    assert torch.equal(caches[0], expected[0])
    assert torch.equal(caches[1], expected[1])


def test_rotary_rejects_a_strided_head_dimension() -> None:
    q = torch.zeros(2, 4, 128, device=DEVICE)[..., ::2]
    k = torch.zeros(2, 4, 64, device=DEVICE)
    with pytest.raises(ValueError, match="q must be contiguous in its last dimension"):
        triton_op("rotary_embedding")(torch.zeros(2, dtype=torch.int64, device=DEVICE), q, k,
                                      torch.zeros(8, 64, device=DEVICE))
