"""The DSA kernels (indexer top-k, sparse MLA attention) against their torch references."""

from __future__ import annotations

from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import (
    ACCUMULATING_TOLERANCES,
    DEVICE,
    DTYPES,
    INTERPRETED,
    assert_close,
    randn,
    torch_op,
    triton_op,
)

from interlock.kernels.reference.dsa import index_scores
from interlock.kernels.triton import indexer

BLOCK_SIZE = 16
TABLE_WIDTH = 6  # room for 96 tokens per sequence
# Each sequence: tokens already cached, and new ones (1 = a decode step, 0 = padding row).
CACHED = st.one_of(st.sampled_from([0, 1, 15, 16, 17, 40]), st.integers(0, 60))
NEW = st.sampled_from([0, 1, 1, 2, 5, 17])
TOP_K = st.sampled_from([1, 2, 3, 4, 8, 16, 33])


def _batch(gen: torch.Generator, cached: list[int], new: list[int], trailing: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(block tables with every sequence's blocks scattered over the cache, seq_lens,
    query_start_loc, tokens: the sequences' new ones, then ``trailing`` padding tokens)."""
    batch = len(cached)
    n_blocks = batch * TABLE_WIDTH + 2
    order = torch.randperm(n_blocks, generator=gen)[: batch * TABLE_WIDTH]
    tables = order.view(batch, TABLE_WIDTH).to(torch.int32).to(DEVICE)
    seq_lens = torch.tensor([c + n for c, n in zip(cached, new, strict=True)], dtype=torch.int32)
    starts = torch.tensor([0, *new], dtype=torch.int32).cumsum(0).to(torch.int32)
    return tables, seq_lens.to(DEVICE), starts.to(DEVICE), sum(new) + trailing


def _check_selection(actual: torch.Tensor, expected: torch.Tensor, scores: torch.Tensor) -> None:
    """``actual`` is a top-k of ``scores`` as good as ``expected``: the same number of
    positions per token, visible, distinct and ascending, with the same scores up to
    rounding (scores computed in another order may swap near-equal positions)."""
    assert actual.dtype == torch.int32 and actual.shape == expected.shape
    for row, (got, want) in enumerate(zip(actual.tolist(), expected.tolist(), strict=True)):
        chosen = [p for p in got if p >= 0]
        assert got == chosen + [-1] * (len(got) - len(chosen)), f"token {row}: {got}"
        assert len(chosen) == sum(p >= 0 for p in want), f"token {row}: {got} vs {want}"
        assert chosen == sorted(set(chosen)), f"token {row}: {got} not distinct and ascending"
        got_scores = scores[row, chosen].sort().values
        want_scores = scores[row, [p for p in want if p >= 0]].sort().values
        assert bool(torch.isfinite(got_scores).all()), f"token {row} chose a hidden position"
        torch.testing.assert_close(got_scores, want_scores, atol=1e-4, rtol=1e-4)


@settings(max_examples=12, deadline=None)
@given(data=st.data(), batch=st.integers(1, 3), heads=st.sampled_from([1, 2, 4, 8, 20]),
       head_dim=st.sampled_from([16, 32, 64, 24]), top_k=TOP_K, dtype=st.sampled_from(DTYPES),
       trailing=st.integers(0, 2), split=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_dsa_index_topk(
    data: st.DataObject, batch: int, heads: int, head_dim: int, top_k: int, dtype: torch.dtype,
    trailing: int, split: bool, seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    cached = data.draw(st.lists(CACHED, min_size=batch, max_size=batch))
    new = data.draw(st.lists(NEW, min_size=batch, max_size=batch))
    tables, seq_lens, starts, tokens = _batch(gen, cached, new, trailing)
    cache = randn(gen, batch * TABLE_WIDTH + 2, BLOCK_SIZE, head_dim, dtype=dtype)
    q = randn(gen, tokens, heads, head_dim, dtype=dtype)
    weights = randn(gen, tokens, heads)
    args = (q, weights, cache, tables, seq_lens, starts, head_dim**-0.5)
    # split: the top-k passes read each row in 16-score steps, so most rows take several.
    with mock.patch.object(indexer, "SELECT_TILE", 16 if split else indexer.SELECT_TILE):
        actual = triton_op("dsa_index_topk", dtype)(*args, top_k)
    expected = torch_op("dsa_index_topk")(*args, top_k)
    _check_selection(actual, expected, index_scores(*args))
    assert torch.all(actual[sum(new):] == -1), "padding tokens must choose nothing"


def lowest_of_equals(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """What torch.topk keeps on CUDA (seen on an H200, torch 2.11): the top_k best visible
    positions, the lower of equal scores first, ascending, -1 padded."""
    order = torch.sort(scores.cpu(), dim=-1, descending=True, stable=True).indices[:, :top_k]
    visible = scores.cpu().gather(1, order) > float("-inf")
    chosen = [sorted(p for p, v in zip(row, seen, strict=True) if v)
              for row, seen in zip(order.tolist(), visible.tolist(), strict=True)]
    return torch.tensor([c + [-1] * (top_k - len(c)) for c in chosen], dtype=torch.int32)


def test_dsa_index_topk_breaks_ties_as_torch_topk_does_on_cuda() -> None:
    """All scores equal (zero queries; -0.0 from negative weights counts as 0.0): the
    first top_k positions, as CUDA's torch.topk keeps them. The reference selects with
    torch.topk on its device: on a GPU the same, on the CPU (the interpreter) whatever
    the CPU's nth_element keeps of transformers' rows (tests/runners/test_dsa_ties.py)."""
    gen = torch.Generator().manual_seed(0)
    tables, seq_lens, starts, tokens = _batch(gen, [30, 0], [3, 20], 0)
    cache = randn(gen, 2 * TABLE_WIDTH + 2, BLOCK_SIZE, 32)
    q = torch.zeros(tokens, 4, 32, device=DEVICE)
    weights = -torch.ones(tokens, 4, device=DEVICE)
    args = (q, weights, cache, tables, seq_lens, starts, 0.1, 5)
    with mock.patch.object(indexer, "SELECT_TILE", 16):
        actual = triton_op("dsa_index_topk")(*args)
    assert torch.equal(actual.cpu(), lowest_of_equals(index_scores(*args[:-1]), 5))
    assert actual[0].tolist() == [0, 1, 2, 3, 4]
    assert actual[3].tolist() == [0, -1, -1, -1, -1]  # the second sequence's first token
    if not INTERPRETED:
        assert torch.equal(actual, torch_op("dsa_index_topk")(*args))


def test_dsa_index_topk_matches_the_reference_exactly_without_near_ties() -> None:
    """Scores spread far apart (one head, keys along one axis at distinct lengths): the
    very same positions."""
    gen = torch.Generator().manual_seed(1)
    tables, seq_lens, starts, tokens = _batch(gen, [40, 9], [7, 1], 0)
    n_blocks = 2 * TABLE_WIDTH + 2
    lengths = torch.randperm(n_blocks * BLOCK_SIZE, generator=gen).float() + 1.0
    cache = torch.zeros(n_blocks * BLOCK_SIZE, 16)
    cache[:, 0] = lengths
    cache = cache.view(n_blocks, BLOCK_SIZE, 16).to(DEVICE)
    q = torch.zeros(tokens, 1, 16, device=DEVICE)
    q[:, 0, 0] = 1.0
    args = (q, torch.ones(tokens, 1, device=DEVICE), cache, tables, seq_lens, starts, 1.0, 6)
    assert torch.equal(triton_op("dsa_index_topk")(*args), torch_op("dsa_index_topk")(*args))


def _indices(gen: torch.Generator, positions: int, top_k: int) -> list[int]:
    """Up to top_k distinct positions below ``positions`` in random order, then -1s."""
    if positions <= 0:
        return [-1] * top_k
    chosen = torch.randperm(positions, generator=gen)[:top_k].tolist()
    return chosen + [-1] * (top_k - len(chosen))


@settings(max_examples=15, deadline=None)
@given(data=st.data(), batch=st.integers(1, 3), heads=st.sampled_from([1, 3, 16, 20]),
       rank=st.sampled_from([16, 32, 64, 48]), rope=st.sampled_from([16, 8]),
       nope=st.sampled_from([8, 16]), top_k=TOP_K, dtype=st.sampled_from(DTYPES),
       trailing=st.integers(0, 2), seed=st.integers(0, 2**31 - 1))
def test_sparse_mla_attention(
    data: st.DataObject, batch: int, heads: int, rank: int, rope: int, nope: int, top_k: int,
    dtype: torch.dtype, trailing: int, seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    cached = data.draw(st.lists(CACHED, min_size=batch, max_size=batch))
    new = data.draw(st.lists(NEW, min_size=batch, max_size=batch))
    tables, seq_lens, starts, tokens = _batch(gen, cached, new, trailing)
    cache = randn(gen, batch * TABLE_WIDTH + 2, BLOCK_SIZE, rank + rope, dtype=dtype)
    kv_b = randn(gen, heads, nope + 12, rank, dtype=dtype, scale=rank**-0.5)
    q_nope = randn(gen, tokens, heads, nope, dtype=dtype)
    q_pe = randn(gen, tokens, heads, rope, dtype=dtype)
    rows = []
    for c, n in zip(cached, new, strict=True):
        rows += [_indices(gen, c + j + 1, top_k) for j in range(n)]
    rows += [[-1] * top_k] * trailing
    indices = torch.tensor(rows, dtype=torch.int32).view(tokens, top_k).to(DEVICE)
    args = (q_nope, q_pe, cache, kv_b, tables, seq_lens, starts, indices,
            (nope + rope)**-0.5)
    actual = triton_op("sparse_mla_attention", dtype)(*args)
    expected = torch_op("sparse_mla_attention")(*args)
    assert actual.shape == (tokens, heads, 12) and actual.dtype == dtype
    assert_close(actual, expected, dtype, ACCUMULATING_TOLERANCES)
    assert torch.all(actual[sum(new):] == 0), "tokens given no position must get zeros"


def test_sparse_attention_over_every_visible_position_is_mla_decode() -> None:
    """Given every position a decoding token sees, the sparse op is MLA's dense decode
    attention (the reference checked against another op, not against itself)."""
    gen = torch.Generator().manual_seed(2)
    lens = [9, 30, 1]
    tables, seq_lens, starts, tokens = _batch(gen, [n - 1 for n in lens], [1, 1, 1], 0)
    cache = randn(gen, 3 * TABLE_WIDTH + 2, BLOCK_SIZE, 24)
    kv_b = randn(gen, 2, 8 + 12, 16, scale=0.25)
    q_nope, q_pe = randn(gen, tokens, 2, 8), randn(gen, tokens, 2, 8)
    indices = torch.tensor([list(range(n)) + [-1] * (32 - n) for n in lens], dtype=torch.int32,
                           device=DEVICE)
    dense = torch_op("mla_decode_attention")(q_nope, q_pe, cache, kv_b, tables, seq_lens, 0.3)
    args = (q_nope, q_pe, cache, kv_b, tables, seq_lens, starts, indices, 0.3)
    torch.testing.assert_close(torch_op("sparse_mla_attention")(*args), dense)
    assert_close(triton_op("sparse_mla_attention")(*args), dense, torch.float32,
                 ACCUMULATING_TOLERANCES)


def test_the_reference_selects_on_the_cpu_as_transformers_over_its_own_rows() -> None:
    """On the CPU each token's row is its sequence's seq_lens positions, -inf past its
    own, and k = min(top_k, that length): transformers' row, whose ties torch.topk breaks
    by the whole row. So a sequence selects alike alone or beside a longer one (whose
    length widens the block table's used width)."""
    gen = torch.Generator().manual_seed(3)
    cached, new = [9, 30, 0], [1, 2, 7]
    tables, seq_lens, starts, tokens = _batch(gen, cached, new, 0)
    tables, seq_lens, starts = tables.cpu(), seq_lens.cpu(), starts.cpu()
    # Keys and queries of a few levels and one head: many exactly equal scores.
    cache = torch.randint(-1, 2, (3 * TABLE_WIDTH + 2, BLOCK_SIZE, 16), generator=gen).float()
    q = torch.randint(-1, 2, (tokens, 1, 16), generator=gen).float()
    weights = torch.ones(tokens, 1)
    args = (q, weights, cache, tables, seq_lens, starts, 0.25)
    top_k = 4
    chosen = torch_op("dsa_index_topk")(*args, top_k)
    scores = index_scores(*args)
    for b, (lo, hi) in enumerate(zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)):
        length = int(seq_lens[b])
        for t in range(lo, hi):
            picked = torch.topk(scores[t, :length], min(top_k, length)).indices.tolist()
            want = sorted(p for p in picked if scores[t, p] > float("-inf"))
            assert chosen[t].tolist() == want + [-1] * (top_k - len(want)), (b, t)
        alone = torch_op("dsa_index_topk")(
            q[lo:hi], weights[lo:hi], cache, tables[b:b + 1], seq_lens[b:b + 1],
            torch.tensor([0, hi - lo], dtype=torch.int32), 0.25, top_k)
        assert torch.equal(alone, chosen[lo:hi]), b
    ordered = scores.sort(dim=-1, descending=True).values
    cut = ordered[:, top_k]
    assert bool(((ordered[:, top_k - 1] == cut) & (cut > float("-inf"))).any()), "no tie at a cut"
