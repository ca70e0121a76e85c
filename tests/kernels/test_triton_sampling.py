"""Sampling: greedy equals the reference exactly; random draws are reproducible per
(seed, step), stay inside the reference's top-k/top-p support, and follow the
distribution."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DEVICE, randn, torch_op, triton_op


def _rows(batch: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
          seeds: torch.Tensor | None = None, step: int = 0) -> tuple[torch.Tensor, ...]:
    """Per-row sampling parameters for ``batch`` rows."""
    return (
        torch.full((batch,), temperature, device=DEVICE),
        torch.full((batch,), top_k, device=DEVICE),
        torch.full((batch,), top_p, device=DEVICE),
        (torch.arange(batch) if seeds is None else seeds).to(DEVICE),
        torch.full((batch,), step, device=DEVICE),
    )


def _support(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The tokens the reference can draw: its top-k then top-p filter, written out."""
    scaled = logits.float() / temperature
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if 0 < top_k < scaled.shape[0]:
        keep &= scaled >= torch.topk(scaled, top_k).values[-1]
    if top_p < 1.0:
        probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)
        sorted_probs, order = torch.sort(probs, descending=True)
        mass_before = sorted_probs.cumsum(0) - sorted_probs
        keep[order[mass_before >= top_p]] = False
    return keep


@settings(max_examples=12, deadline=None)
@given(batch=st.integers(1, 4), vocab=st.sampled_from([1, 2, 100, 1023, 1024, 1025, 5000]),
       ties=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_greedy_equals_reference(batch: int, vocab: int, ties: bool, seed: int) -> None:
    logits = randn(torch.Generator().manual_seed(seed), batch, vocab)
    if ties:  # coarse logits: the maximum repeats, and the first index must win
        logits = (logits * 2).round() / 2
    params = _rows(batch, temperature=0.0, top_k=5, top_p=0.5)
    assert torch.equal(triton_op("sample")(logits, *params), torch_op("sample")(logits, *params))


@settings(max_examples=12, deadline=None)
@given(batch=st.integers(1, 4), vocab=st.sampled_from([2, 17, 300, 1500]),
       temperature=st.sampled_from([0.3, 1.0, 2.5]), top_k=st.integers(0, 40),
       top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]), seed=st.integers(0, 2**31 - 1))
def test_random_tokens_stay_in_the_reference_support(
    batch: int, vocab: int, temperature: float, top_k: int, top_p: float, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = randn(gen, batch, vocab, scale=3.0)
    seeds = torch.randint(0, 2**40, (batch,), generator=gen)
    tokens = triton_op("sample")(logits, *_rows(batch, temperature, top_k, top_p, seeds))
    for row, token in enumerate(tokens.tolist()):
        assert _support(logits[row], temperature, top_k, top_p)[token], (row, token)


def test_draws_depend_only_on_seed_and_step() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = randn(gen, 6, 500)
    seeds = torch.tensor([11, 12, 13, 14, 15, 2**40 + 1])
    params = _rows(6, temperature=1.0, seeds=seeds, step=3)
    sample = triton_op("sample")
    first = sample(logits, *params)
    assert torch.equal(sample(logits, *params), first)
    # A row alone draws what it drew inside the batch.
    alone = sample(logits[4:5], *(p[4:5] for p in params))
    assert alone.item() == first[4].item()
    # Flat logits: the draw is decided by the noise alone, which must move with the step.
    flat = torch.zeros(1, 1000, device=DEVICE)
    draws = {sample(flat, *_rows(1, seeds=torch.tensor([7]), step=s)).item() for s in range(8)}
    assert len(draws) > 1


def _assert_follows(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    """Pearson chi-square over the categories with a cut-off at a ~1e-4 false-alarm rate."""
    n = tokens.numel()
    observed = torch.bincount(tokens.cpu(), minlength=probs.numel()).double()
    assert observed[probs == 0].sum() == 0, "drew a token outside the support"
    expected = probs[probs > 0].double() * n
    chi2 = ((observed[probs > 0] - expected) ** 2 / expected).sum().item()
    assert chi2 < 25.0, (observed.tolist(), expected.tolist(), chi2)


def test_distribution_matches_the_softmax() -> None:
    draws = 400
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]], device=DEVICE).expand(draws, 5)
    tokens = triton_op("sample")(logits, *_rows(draws, temperature=0.7))
    _assert_follows(tokens, torch.softmax(logits[0].cpu() / 0.7, dim=-1))


@pytest.mark.slow
def test_distribution_under_top_k_and_top_p() -> None:
    draws = 150
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]], device=DEVICE).expand(draws, 5)
    seeds = torch.arange(draws) + 1000
    # top-k 3 keeps logits 2, 1, 0.5 (probabilities .63 .23 .14); top-p .8 then keeps two.
    tokens = triton_op("sample")(logits, *_rows(draws, top_k=3, top_p=0.8, seeds=seeds))
    kept = torch.tensor([2.0, 1.0, float("-inf"), float("-inf"), float("-inf")])
    _assert_follows(tokens, torch.softmax(kept, dim=-1))
