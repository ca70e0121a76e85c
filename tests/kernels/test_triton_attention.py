"""Paged attention kernels against their torch references."""

from __future__ import annotations

from unittest import mock

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

from interlock.kernels.triton import attention

BLOCK_SIZE = 16
# Context lengths at the edges: empty (padding), one token, block and partition boundaries.
CONTEXT = st.one_of(st.sampled_from([0, 1, 15, 16, 17, 32, 33, 64]), st.integers(0, 80))
WINDOW = st.one_of(st.none(), st.integers(1, 40))
# The model sizes 64 and 128, and others real configs use (padded inside the kernel).
HEAD_SIZES = st.sampled_from([64, 128, 24, 80])


def _paged_cache(gen: torch.Generator, n_blocks: int, kv_heads: int, head_size: int,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (n_blocks, BLOCK_SIZE, kv_heads, head_size)
    return randn(gen, *shape, dtype=dtype), randn(gen, *shape, dtype=dtype)


def _block_tables(
    gen: torch.Generator, batch: int, table_width: int, n_blocks: int
) -> torch.Tensor:
    """Each sequence's blocks scattered over the cache, never shared."""
    order = torch.randperm(n_blocks, generator=gen)[: batch * table_width]
    return order.view(batch, table_width).to(torch.int32).to(DEVICE)


@settings(max_examples=15, deadline=None)
@given(seq_lens=st.lists(CONTEXT, min_size=1, max_size=4), kv_heads=st.integers(1, 2),
       group=st.sampled_from([1, 2, 4, 8]), head_size=HEAD_SIZES,
       window=WINDOW, dtype=st.sampled_from(DTYPES), split=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_paged_decode_attention(
    seq_lens: list[int], kv_heads: int, group: int, head_size: int, window: int | None,
    dtype: torch.dtype, split: bool, seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch, table_width = len(seq_lens), 6  # room for 96 tokens
    n_blocks = batch * table_width + 2
    k_cache, v_cache = _paged_cache(gen, n_blocks, kv_heads, head_size, dtype)
    tables = _block_tables(gen, batch, table_width, n_blocks)
    q = randn(gen, batch, kv_heads * group, head_size, dtype=dtype)
    lens = torch.tensor(seq_lens, device=DEVICE)
    scale = head_size**-0.5
    # split: contexts cut into 32-token partitions merged by the second kernel.
    with mock.patch.object(attention, "PARTITION_TOKENS", 32 if split else 512):
        actual = triton_op("paged_decode_attention", dtype)(q, k_cache, v_cache, tables, lens,
                                                            scale, window)
    expected = torch_op("paged_decode_attention")(q, k_cache, v_cache, tables, lens, scale, window)
    assert_close(actual, expected, dtype, ACCUMULATING_TOLERANCES)
    assert torch.all(actual[lens == 0] == 0), "padding sequences must give zeros"


@settings(max_examples=12, deadline=None)
@pytest.mark.slow
@given(data=st.data(), batch=st.integers(1, 3), kv_heads=st.integers(1, 2),
       group=st.sampled_from([1, 2, 4, 8]), head_size=HEAD_SIZES, window=WINDOW,
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_paged_attention_mixed_prefill_and_decode(
    data: st.DataObject, batch: int, kv_heads: int, group: int, head_size: int,
    window: int | None, dtype: torch.dtype, seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    # Each sequence: cached tokens plus new ones (1 new token = a decode step).
    cached = data.draw(st.lists(st.integers(0, 40), min_size=batch, max_size=batch))
    new = data.draw(st.lists(st.sampled_from([1, 2, 15, 16, 17, 40, 65, 70]), min_size=batch,
                             max_size=batch))
    seq_lens = [c + n for c, n in zip(cached, new, strict=True)]
    table_width = 7  # room for 112 tokens
    n_blocks = batch * table_width
    k_cache, v_cache = _paged_cache(gen, n_blocks, kv_heads, head_size, dtype)
    tables = _block_tables(gen, batch, table_width, n_blocks)
    starts = torch.tensor([0, *new], device=DEVICE).cumsum(0)
    q = randn(gen, sum(new), kv_heads * group, head_size, dtype=dtype)
    args = (q, k_cache, v_cache, tables, torch.tensor(seq_lens, device=DEVICE), starts,
            head_size**-0.5, window)
    actual = triton_op("paged_attention", dtype)(*args)
    assert_close(actual, torch_op("paged_attention")(*args), dtype, ACCUMULATING_TOLERANCES)
