"""Kimi Delta Attention's ops over hypothesis-drawn shapes: the chunked delta rule against the
token-by-token recurrence (any chunk size, prefills continued across steps, several
sequences in one batch, fresh and continued slots), both against transformers' torch
fallbacks (``chunk_kda``, ``fused_recurrent_kda``, ``causal_conv1d``), the convolution's
mixed-batch and per-step forms against each other, and the Triton decode step against its
reference (in Triton's interpreter without a GPU)."""

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

from interlock.kernels.reference import kda as ops

TOL = {"atol": 2e-5, "rtol": 1e-4}


def _case(gen: torch.Generator, length: int, heads: int, dim: int, v_dim: int):
    q = torch.randn(length, heads, dim, generator=gen)
    k = torch.randn(length, heads, dim, generator=gen)
    v = torch.randn(length, heads, v_dim, generator=gen)
    g = -torch.rand(length, heads, dim, generator=gen) * 2
    beta = torch.rand(length, heads, generator=gen)
    return q, k, v, g, beta


def _loc(*lengths: int) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 23), st.integers(1, 3), st.sampled_from([4, 8, 16]),
       st.sampled_from([4, 8]), st.integers(1, 9), st.integers(0, 2**16))
def test_chunked_equals_the_recurrence_and_transformers(length, heads, dim, v_dim, chunk, seed):
    from transformers.models.kimi_linear import modeling_kimi_linear as hf

    gen = torch.Generator().manual_seed(seed)
    q, k, v, g, beta = _case(gen, length, heads, dim, v_dim)
    state = torch.zeros(3, heads, dim, v_dim)
    slot = torch.tensor([1])
    out = ops.kda_chunked(q, k, v, g, beta, state, slot, _loc(length),
                          torch.tensor([length], dtype=torch.int32), chunk)
    chunked_state = state[1].clone()
    state.zero_()
    steps = [ops.kda_recurrent(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1],
                               state, slot) for t in range(length)]
    torch.testing.assert_close(out, torch.cat(steps), **TOL)
    torch.testing.assert_close(chunked_state, state[1], **TOL)
    want, final = hf.chunk_kimi_delta_attention(
        q[None], k[None], v[None], g[None], beta[None], chunk_size=chunk,
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out, want[0], **TOL)
    torch.testing.assert_close(chunked_state, final[0], **TOL)
    step, _ = hf.recurrent_kimi_delta_attention(
        q[None, :1], k[None, :1], v[None, :1], g[None, :1], beta[None, :1], None, True,
        use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out[:1], step[0], **TOL)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=4), st.integers(1, 11),
       st.integers(1, 5), st.integers(0, 2**16))
def test_a_batch_of_sequences_continues_each_slot_and_resets_fresh_ones(
    lengths, split, chunk, seed
):
    """Each sequence fed in two steps (the second continuing its slot), batched with the
    others, equals it fed whole alone; a fresh sequence ignores what its slot held."""
    gen = torch.Generator().manual_seed(seed)
    heads, dim = 2, 8
    cases = [_case(gen, n, heads, dim, dim) for n in lengths]
    slots = torch.arange(len(lengths)).flip(0)
    pool = torch.randn(len(lengths) + 1, heads, dim, dim, generator=gen)  # stale garbage
    firsts = [min(split, n) for n in lengths]
    outs: list[list[torch.Tensor]] = [[] for _ in lengths]
    for step in range(2):
        parts = [(c, 0, f) if step == 0 else (c, f, n)
                 for c, f, n in zip(cases, firsts, lengths, strict=True)]
        batch = [torch.cat([c[i][lo:hi] for c, lo, hi in parts]) for i in range(5)]
        counts = [hi - lo for _, lo, hi in parts]
        seq_lens = torch.tensor([hi if hi > lo else 0 for _, lo, hi in parts], dtype=torch.int32)
        out = ops.kda_chunked(*batch, pool, slots, _loc(*counts), seq_lens, chunk)
        offsets = _loc(*counts).tolist()
        for i in range(len(lengths)):
            outs[i].append(out[offsets[i]:offsets[i + 1]])
    for i, case in enumerate(cases):
        alone = torch.zeros(1, heads, dim, dim)
        want = ops.kda_chunked(*case, alone, torch.tensor([0]), _loc(lengths[i]),
                               torch.tensor([lengths[i]], dtype=torch.int32), 64)
        torch.testing.assert_close(torch.cat(outs[i]), want, **TOL)
        torch.testing.assert_close(pool[slots[i]], alone[0], **TOL)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 16), st.integers(1, 12), st.integers(1, 5), st.integers(0, 2**16))
def test_the_convolution_prefill_then_steps_equals_transformers(length, channels, taps, seed):
    from transformers.models.kimi_linear import modeling_kimi_linear as hf

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(length + 3, channels, generator=gen)
    weight = torch.randn(channels, taps, generator=gen)
    want = hf.causal_conv1d_fn(x.t()[None], weight, None, activation="silu")[0].t()
    state = torch.randn(2, channels, taps - 1, generator=gen)  # stale: the prefill is fresh
    slot = torch.tensor([1])
    head = ops.causal_conv1d(x[:length], weight, state, slot, _loc(length),
                             torch.tensor([length], dtype=torch.int32))
    steps = [ops.causal_conv1d_update(x[t:t + 1], weight, state, slot)
             for t in range(length, length + 3)]
    torch.testing.assert_close(torch.cat([head, *steps]), want, **TOL)


def test_padding_rows_use_the_scratch_slot_only():
    gen = torch.Generator().manual_seed(0)
    q, k, v, g, beta = _case(gen, 2, 1, 4, 4)
    state = torch.zeros(3, 1, 4, 4)
    ops.kda_recurrent(q, k, v, g, beta, state, torch.tensor([0, -1]))
    assert state[1].abs().sum() == 0 and state[2].abs().sum() > 0


def test_gates_follow_transformers():
    from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearForgetGate

    config = KimiLinearConfig(hidden_size=16, linear_head_dim=4, linear_num_heads=3)
    gate = KimiLinearForgetGate(config)
    torch.manual_seed(0)
    for p in gate.parameters():
        torch.nn.init.normal_(p, std=3.0)
    hidden = torch.randn(1, 5, 16) * 4
    want = gate(hidden)[0]
    f = gate.f_b_proj(gate.f_a_proj(hidden))[0]
    g, beta = ops.kda_gates(f, torch.zeros(5, 3), gate.dt_bias, gate.A_log.view(-1))
    torch.testing.assert_close(g, want)
    torch.testing.assert_close(beta, torch.full((5, 3), 0.5))


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from([4, 8, 12]),
       st.sampled_from([4, 16]), st.sampled_from(DTYPES), st.integers(0, 2**16))
def test_the_triton_decode_step_matches_the_reference(batch, heads, dim, v_dim, dtype, seed):
    """Strided q/k/v views (as the convolution's output gives them), a padding row on the
    scratch slot, two steps so the state written back is read again."""
    gen = torch.Generator().manual_seed(seed)
    triton_step, torch_step = triton_op("kda_recurrent", dtype), torch_op("kda_recurrent", dtype)
    pool = randn(gen, batch + 2, heads, dim, v_dim) * 0.3
    pools = (pool.clone(), pool.clone())
    slots = torch.tensor([*range(batch)][::-1] + [-1], device=DEVICE)
    for _ in range(2):
        mixed = randn(gen, batch + 1, heads, 2 * dim + v_dim, dtype=dtype)
        q, k, v = mixed[..., :dim], mixed[..., dim:2 * dim], mixed[..., 2 * dim:]
        g = -torch.rand(batch + 1, heads, dim, generator=gen).to(DEVICE)
        beta = torch.rand(batch + 1, heads, generator=gen).to(DEVICE)
        got = triton_step(q, k, v, g, beta, pools[0], slots)
        want = torch_step(q, k, v, g, beta, pools[1], slots)
        assert_close(got, want, dtype, ACCUMULATING_TOLERANCES)
        assert_close(pools[0], pools[1], torch.float32, ACCUMULATING_TOLERANCES)
