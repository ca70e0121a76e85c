"""Next-token sampling: greedy argmax, or Gumbel-max under top-k / top-p.

One program per row walks the vocabulary in chunks. The top-k and top-p
cut-offs are found without sorting: logits map to int32 keys that order like
the floats, and a radix search fixes the cut-off key four bits per pass (eight
passes): for top-k the k-th largest logit, for top-p the largest logit whose
tokens at or above it hold at least p of the mass left by top-k. The kept set is
every token at or above the cut-off, as in the reference (up to which of several
tokens tied at the cut-off it keeps).

Noise comes from Philox keyed by the row's seed with (vocab index, step) as the
counter, so a request's sample depends only on its seed and step: reproducible,
and independent of the batch around it. Rows with temperature 0 only take the
first pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from interlock.kernels.triton.runtime import unit_stride, warps_for


@dataclass(frozen=True)
class _Launch:
    block_vocab: int
    num_warps: int


def _launch(vocab: int) -> _Launch:
    # The cut-off search compares each chunk against 16 candidate keys at once.
    block = min(triton.next_power_of_2(vocab), 1024)
    return _Launch(block, num_warps=warps_for(block, 128))


@triton.jit
def _order_key(x):
    """int32 keys that compare like the float32 values x (-0.0 just below +0.0)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _largest_cutoff(row_ptr, vocab, target, floor, row_max, inv_temperature,
                    BY_MASS: tl.constexpr, BLOCK: tl.constexpr):
    """Largest key c with F(c) >= target, F(c) = the tokens with key >= max(c, floor).

    F counts those tokens, or with BY_MASS sums their unnormalised probabilities
    and ``target`` is a fraction of the total. Radix search over the 32 key bits.
    """
    digits = tl.arange(0, 16).to(tl.int64)
    cutoff = tl.full([], -(2**31), tl.int64)
    for i in tl.static_range(8):
        shift = 28 - 4 * i
        candidates = cutoff + (digits << shift)
        totals = tl.zeros([16], tl.float32)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
            key = _order_key(x)
            keep = (offs < vocab) & (key >= floor)
            if BY_MASS:
                weight = tl.exp((x - row_max) * inv_temperature)
            else:
                weight = tl.full([BLOCK], 1.0, tl.float32)
            hit = keep[:, None] & (key[:, None] >= candidates[None, :])
            totals += tl.sum(tl.where(hit, weight[:, None], 0.0), axis=0)
        if BY_MASS and i == 0:
            # The lowest candidate sees every kept token: the total mass.
            target = target * tl.sum(tl.where(digits == 0, totals, 0.0), axis=0)
        # F is non-increasing in the key and F(lowest candidate) >= target holds throughout.
        cutoff += tl.max(tl.where(totals >= target, digits, 0), axis=0) << shift
    return cutoff


@triton.jit
def _sample_kernel(
    logits_ptr,
    logits_row_stride,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seeds_ptr,
    steps_ptr,
    out_ptr,
    vocab,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * logits_row_stride

    # The greedy token (first index of the maximum, as torch.argmax) and the row max.
    row_max = tl.full([], float("-inf"), tl.float32)
    token = tl.full([], 0, tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        chunk_max = tl.max(x, axis=0)
        token = tl.where(chunk_max > row_max, start + tl.argmax(x, axis=0), token)
        row_max = tl.maximum(chunk_max, row_max)

    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    if temperature > 0:
        inv_temperature = 1.0 / temperature
        top_k = tl.load(top_k_ptr + row).to(tl.int32)
        top_p = tl.load(top_p_ptr + row).to(tl.float32)
        # Temperature keeps the order, so top-k works on raw logits.
        cutoff = tl.full([], -(2**31), tl.int64)
        if (top_k > 0) & (top_k < vocab):
            cutoff = _largest_cutoff(row_ptr, vocab, top_k.to(tl.float32), cutoff, row_max,
                                     inv_temperature, False, BLOCK)
        if top_p < 1.0:
            cutoff = _largest_cutoff(row_ptr, vocab, top_p, cutoff, row_max, inv_temperature,
                                     True, BLOCK)

        seed = tl.load(seeds_ptr + row).to(tl.int64)
        step = tl.load(steps_ptr + row).to(tl.int64)
        best_score = tl.full([], float("-inf"), tl.float32)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
            zero = offs.to(tl.uint32) * 0
            bits, _, _, _ = tl.philox(seed, offs.to(tl.uint32), zero + step.to(tl.uint32),
                                      zero + (step >> 32).to(tl.uint32), zero)
            uniform = tl.maximum(tl.random.uint_to_uniform_float(bits), 1.0e-20)
            # Gumbel-max: argmax(log p - log(-log u)) is a sample from p.
            score = x * inv_temperature - tl.log(-tl.log(uniform))
            score = tl.where((_order_key(x) >= cutoff) & (offs < vocab), score, float("-inf"))
            chunk_best = tl.max(score, axis=0)
            token = tl.where(chunk_best > best_score, start + tl.argmax(score, axis=0), token)
            best_score = tl.maximum(chunk_best, best_score)
    tl.store(out_ptr + row, token.to(tl.int64))


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
) -> torch.Tensor:
    """top_p must be in (0, 1]."""
    unit_stride("logits", logits)
    batch, vocab = logits.shape
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    launch = _launch(vocab)
    _sample_kernel[(batch,)](
        logits, logits.stride(0), temperature, top_k, top_p, seeds, steps, out, vocab,
        BLOCK=launch.block_vocab, num_warps=launch.num_warps,
    )
    return out
