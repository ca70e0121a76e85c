"""The native CPU kernels against their torch references, and what they refuse."""

from __future__ import annotations

import platform
import shutil
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.kernels import REGISTRY, KernelError
from interlock.kernels.native import unavailable

WHY_NOT = unavailable("cpu")
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"native kernels: {WHY_NOT}")

SEEDS = st.integers(0, 2**31 - 1)
TIGHT = {"atol": 1e-5, "rtol": 1e-5}
SUMS = {"atol": 1e-4, "rtol": 1e-4}  # hundreds of products summed in another order


def native(op: str):
    return REGISTRY.select(op, "cpu", "float32", force="native").fn


def reference(op: str):
    return REGISTRY.select(op, "cpu", "float32", force="torch").fn


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def test_the_native_kernels_are_built_wherever_they_can_be() -> None:
    """An x86-64 Linux machine with a C compiler builds them at install: a silent failure
    to build would leave every CPU run on the slower torch kernels."""
    if platform.machine() != "x86_64" or sys.platform != "linux" or not shutil.which("cc"):
        pytest.skip("the native kernels build on x86-64 Linux with a C compiler")
    assert WHY_NOT is None


def test_the_cpu_prefers_native_and_says_so() -> None:
    choice = REGISTRY.select("linear", "cpu", "float32")
    assert choice.impl.backend == "native" and choice.reason == "preferred native on cpu"
    assert choice.impl.packed_weights, "native linear wants its weights packed"
    prefill = REGISTRY.select("paged_attention", "cpu", "float32")
    assert prefill.impl.backend == "native"
    bf16 = REGISTRY.select("linear", "cpu", "bfloat16")
    assert bf16.impl.backend == "torch" and "native linear does not support bfloat16" in bf16.reason


def packed(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] packed by the reference, leaving ``weight`` as it was."""
    return reference("pack_weight")(weight.clone())


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 60), inputs=st.integers(1, 70), strips=st.integers(1, 6),
       bias=st.booleans(), strided=st.booleans(), seed=SEEDS)
def test_linear(rows: int, inputs: int, strips: int, bias: bool, strided: bool,
                seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, rows, inputs + 5 if strided else inputs)[:, :inputs]
    weight = randn(gen, 16 * strips, inputs)
    b = randn(gen, 16 * strips) if bias else None
    expected = reference("linear")(x, weight, b, False)
    torch.testing.assert_close(native("linear")(x, packed(weight), b, False), expected, **SUMS)
    torch.testing.assert_close(reference("linear")(x, packed(weight), b, False), expected,
                               **SUMS)
    torch.testing.assert_close(reference("linear")(x, weight.t().contiguous(), b, True),
                               expected, **SUMS)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(2, 60), seed=SEEDS)
def test_a_row_comes_out_the_same_in_any_batch(rows: int, seed: int) -> None:
    """Each output is one chain of FMAs over the inputs in order, whatever the number of
    rows: a request's logits do not depend on what it is batched with."""
    gen = torch.Generator().manual_seed(seed)
    x, weight = randn(gen, rows, 50), packed(randn(gen, 48, 50))
    whole = native("linear")(x, weight, None, False)
    for row in range(rows):
        assert torch.equal(whole[row], native("linear")(x[row : row + 1], weight, None, False)[0])


@pytest.mark.parametrize("rows", [1, 7, 32])
def test_linear_over_a_head_as_wide_as_a_vocabulary(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    x, weight, bias = randn(gen, rows, 9), randn(gen, 70_000, 9), randn(gen, 70_000)
    torch.testing.assert_close(native("linear")(x, packed(weight), bias, False),
                               reference("linear")(x, weight, bias, False), **SUMS)


def test_a_weight_that_is_not_packed_goes_to_torch() -> None:
    """Outputs that are not a multiple of 16 stay unpacked: native linear hands them to the
    reference, in either layout."""
    gen = torch.Generator().manual_seed(5)
    x, weight = randn(gen, 3, 8), randn(gen, 10, 8)
    assert torch.equal(native("linear")(x, weight, None, False),
                       reference("linear")(x, weight, None, False))
    assert torch.equal(native("linear")(x, weight.t().contiguous(), None, True),
                       reference("linear")(x, weight.t().contiguous(), None, True))


@pytest.mark.parametrize("outputs, inputs", [(16, 1), (48, 50), (1024, 576)])
def test_packing_is_in_place_and_the_same_in_both_backends(outputs: int, inputs: int) -> None:
    gen = torch.Generator().manual_seed(outputs)
    weight = randn(gen, outputs, inputs)
    ours, theirs = weight.clone(), weight.clone()
    got = native("pack_weight")(ours)
    assert got.data_ptr() == ours.data_ptr() and got.shape == (outputs // 16, inputs, 16)
    assert torch.equal(got, reference("pack_weight")(theirs))
    strip, k, c = outputs // 16 - 1, inputs - 1, 5
    assert got[strip, k, c] == weight[16 * strip + c, k]


def test_packing_refuses_what_it_cannot_pack() -> None:
    for pack in (native("pack_weight"), reference("pack_weight")):
        with pytest.raises(ValueError, match="multiple of 16"):
            pack(torch.ones(20, 4))
        with pytest.raises(ValueError, match="contiguous"):
            pack(torch.ones(4, 32).t())


@pytest.mark.parametrize("vocab", [16, 64])
def test_embedding_reads_rows_of_a_packed_table(vocab: int) -> None:
    """A tied LM head packed for the products is also the embedding table."""
    gen = torch.Generator().manual_seed(vocab)
    table = randn(gen, vocab, 12)
    ids = torch.tensor([0, vocab - 1, 17 % vocab, 3])
    for op in (native("embedding"), reference("embedding")):
        assert torch.equal(op(ids, packed(table)), table[ids])
    with pytest.raises(ValueError, match=rf"outside the vocabulary \(0\.\.{vocab - 1}\)"):
        native("embedding")(torch.tensor([vocab]), packed(table))


@settings(max_examples=30, deadline=None)
@given(seqs=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1,
                     max_size=3),
       kv_heads=st.integers(1, 2), group=st.integers(1, 3), head_dim=st.sampled_from([16, 32]),
       window=st.sampled_from([None, 1, 7]), padding=st.integers(0, 2), seed=SEEDS)
def test_paged_attention(seqs: list[tuple[int, int]], kv_heads: int, group: int,
                         head_dim: int, window: int | None, padding: int, seed: int) -> None:
    """Mixed batches: each sequence's new tokens (up to its length) at its last positions;
    rows of no sequence (padding) are zero; at any thread count."""
    gen = torch.Generator().manual_seed(seed)
    block_size, width, blocks = 4, 11, 40
    lens = [length for length, _ in seqs]
    news = [min(new, length) for length, new in seqs]
    k_cache, v_cache = (randn(gen, blocks, block_size, kv_heads, head_dim) for _ in "kv")
    tables = torch.stack([torch.randperm(blocks, generator=gen)[:width] for _ in seqs]).int()
    starts = torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()], dtype=torch.int32)
    fused = randn(gen, int(starts[-1]) + padding, (group + 2) * kv_heads, head_dim)
    q = fused[:, : group * kv_heads]  # a view of a fused q/k/v projection, as models pass it
    args = (q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), starts,
            head_dim**-0.5, window)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = native("paged_attention")(*args)
        torch.set_num_threads(3)  # the (sequence, head) pairs shared: the same bits
        assert torch.equal(native("paged_attention")(*args), alone)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(alone, reference("paged_attention")(*args), **SUMS)


def test_a_head_size_the_strips_do_not_divide_goes_to_torch() -> None:
    gen = torch.Generator().manual_seed(1)
    caches = randn(gen, 4, 4, 1, 20), randn(gen, 4, 4, 1, 20)
    args = (randn(gen, 3, 2, 20), *caches, torch.tensor([[2, 0]], dtype=torch.int32),
            torch.tensor([5], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32), 0.2)
    assert torch.equal(native("paged_attention")(*args), reference("paged_attention")(*args))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 5), hidden=st.sampled_from([1, 7, 64, 129, 576]),
       residual=st.booleans(), strided=st.booleans(), seed=SEEDS)
def test_norms(rows: int, hidden: int, residual: bool, strided: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, rows, hidden + 3 if strided else hidden)[:, :hidden]
    weight = randn(gen, hidden)
    if not residual:
        torch.testing.assert_close(native("rms_norm")(x, weight, 1e-5),
                                   reference("rms_norm")(x, weight, 1e-5), **TIGHT)
        return
    res = randn(gen, rows, hidden)
    before = x.clone(), res.clone()
    out, summed = native("fused_add_rms_norm")(x, res, weight, 1e-6)
    expected_out, expected_summed = reference("fused_add_rms_norm")(x, res, weight, 1e-6)
    torch.testing.assert_close(summed, expected_summed, atol=0, rtol=0)
    torch.testing.assert_close(out, expected_out, **TIGHT)
    assert torch.equal(x, before[0]) and torch.equal(res, before[1]), "inputs were modified"


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 5), half=st.sampled_from([1, 8, 33, 1536]), seed=SEEDS)
def test_silu_and_mul(rows: int, half: int, seed: int) -> None:
    x = randn(torch.Generator().manual_seed(seed), rows, 2 * half) * 4
    torch.testing.assert_close(native("silu_and_mul")(x), reference("silu_and_mul")(x), **TIGHT)


@settings(max_examples=20, deadline=None)
@given(tokens=st.integers(1, 5), heads=st.integers(1, 4), kv_heads=st.integers(1, 3),
       head_dim=st.sampled_from([2, 8, 64]), fused=st.booleans(), seed=SEEDS)
def test_rotary_and_kv_store(tokens: int, heads: int, kv_heads: int, head_dim: int,
                             fused: bool, seed: int) -> None:
    """Rotary in place on q and k, as views of one fused q/k/v row or alone, then the
    store of k and v into the paged cache."""
    gen = torch.Generator().manual_seed(seed)
    widths = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    if fused:
        q, k, v = randn(gen, tokens, sum(widths)).split(widths, dim=-1)
    else:
        q, k, v = (randn(gen, tokens, w) for w in widths)
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))
    table = randn(gen, 40, head_dim)
    positions = torch.randperm(40, generator=gen)[:tokens]
    q2, k2 = q.clone(), k.clone()
    native("rotary_embedding")(positions, q, k, table)
    reference("rotary_embedding")(positions, q2, k2, table)
    torch.testing.assert_close(q, q2, **TIGHT)
    torch.testing.assert_close(k, k2, **TIGHT)

    caches = [torch.zeros(6, 4, kv_heads, head_dim) for _ in range(4)]
    slots = torch.randperm(24, generator=gen)[:tokens]
    slots[0] = -1  # padding
    native("store_kv_cache")(k, v, caches[0], caches[1], slots)
    reference("store_kv_cache")(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.integers(0, 23), min_size=1, max_size=4),
       kv_heads=st.integers(1, 3), group=st.integers(1, 3),
       head_dim=st.sampled_from([4, 16, 20]), window=st.sampled_from([None, 1, 5]),
       seed=SEEDS)
def test_paged_decode_attention(lens: list[int], kv_heads: int, group: int, head_dim: int,
                                window: int | None, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    block_size, width = 4, 6
    k_cache, v_cache = randn(gen, 30, block_size, kv_heads, head_dim), randn(
        gen, 30, block_size, kv_heads, head_dim)
    tables = torch.stack([torch.randperm(30, generator=gen)[:width] for _ in lens]).int()
    q = randn(gen, len(lens), kv_heads * group, head_dim)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    args = (q, k_cache, v_cache, tables, seq_lens, head_dim**-0.5, window)
    torch.testing.assert_close(native("paged_decode_attention")(*args),
                               reference("paged_decode_attention")(*args), **SUMS)


def test_out_of_range_indices_are_refused_before_anything_is_written() -> None:
    k = torch.ones(2, 1, 4)
    caches = torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4)
    with pytest.raises(ValueError, match=r"slot is outside the KV cache .*0\.\.3"):
        native("store_kv_cache")(k, k, *caches, torch.tensor([0, 4]))
    assert not caches[0].any(), "a row was written before the bad slot was found"
    q = torch.ones(1, 2, 4)
    with pytest.raises(ValueError, match=r"a position is outside the rotary table \(0\.\.2\)"):
        native("rotary_embedding")(torch.tensor([3]), q, q[:, :1], torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"block outside 0\.\.1"):
        native("paged_decode_attention")(
            q, *caches, torch.tensor([[0, 2]], dtype=torch.int32),
            torch.tensor([3], dtype=torch.int32), 0.5)
    with pytest.raises(ValueError, match="exceeds its block table"):
        native("paged_decode_attention")(
            q, *caches, torch.tensor([[0, 1]], dtype=torch.int32),
            torch.tensor([5], dtype=torch.int32), 0.5)
    wide = torch.ones(1, 2, 16)
    wide_caches = torch.zeros(2, 2, 1, 16), torch.zeros(2, 2, 1, 16)
    out = native("paged_attention")  # prefill
    with pytest.raises(ValueError, match=r"block outside 0\.\.1"):
        out(wide, *wide_caches, torch.tensor([[0, 2]], dtype=torch.int32),
            torch.tensor([3], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32), 0.5)
    for lens, starts in (([1], [0, 2]), ([5], [0, 1]), ([1], [1, 0])):
        with pytest.raises(ValueError, match="new tokens exceed q, its length or its block"):
            out(wide, *wide_caches, torch.tensor([[0, 1]], dtype=torch.int32),
                torch.tensor(lens, dtype=torch.int32), torch.tensor(starts, dtype=torch.int32),
                0.5)


def test_arguments_outside_the_contract_are_named() -> None:
    with pytest.raises(KernelError, match=r"x as a 2-d torch.float32 CPU tensor.*torch.float64"):
        native("linear")(torch.ones(1, 4, dtype=torch.float64), torch.ones(4, 4), None, True)
    with pytest.raises(KernelError, match=r"weight \(1, 4, 16\) is not packed \[out / 16, "
                                          r"in, 16\] for x with 5 features"):
        native("linear")(torch.ones(1, 5), torch.ones(1, 4, 16), None, False)
    with pytest.raises(KernelError, match="block_tables as a contiguous torch.int32"):
        native("paged_decode_attention")(
            torch.ones(1, 1, 4), torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4),
            torch.zeros(1, 2, dtype=torch.int64), torch.ones(1, dtype=torch.int32), 0.5)


def test_a_compiled_forward_gets_the_traceable_references_and_is_told_why() -> None:
    """torch.compile cannot trace a call through raw addresses: the choice says so, and
    forcing native into compiled code is an error rather than a crash while tracing."""
    choice = REGISTRY.select("linear", "cpu", "float32", compiled=True)
    assert choice.impl.backend == "torch"
    assert choice.reason == (
        "preferred torch on cpu (native linear cannot be traced by torch.compile)")
    with pytest.raises(KernelError, match="backend 'native' was forced for op 'rms_norm': "
                                          "native rms_norm cannot be traced by torch.compile"):
        REGISTRY.select("rms_norm", "cpu", "float32", force="native", compiled=True)


def test_per_head_norms_read_the_heads_of_a_fused_projection_in_place() -> None:
    """q/k norms (Qwen3) over views of one q/k/v output: [T, heads, D] in, same shape out."""
    gen = torch.Generator().manual_seed(3)
    q = randn(gen, 5, 3 * 8 + 2 * 8).split([24, 16], dim=-1)[0].view(5, 3, 8)
    weight = randn(gen, 8)
    out = native("rms_norm")(q, weight, 1e-6)
    assert out.shape == (5, 3, 8)
    torch.testing.assert_close(out, reference("rms_norm")(q, weight, 1e-6), **TIGHT)


@settings(max_examples=12, deadline=None)
@given(tokens=st.integers(1, 20), experts=st.integers(1, 6), hidden=st.sampled_from([16, 48]),
       intermediate=st.sampled_from([8, 16, 40]), seed=SEEDS, data=st.data())
def test_moe_experts_over_packed_experts(tokens: int, experts: int, hidden: int,
                                         intermediate: int, seed: int,
                                         data: st.DataObject) -> None:
    top_k = data.draw(st.integers(1, experts))
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, tokens, hidden)
    w13 = randn(gen, experts, 2 * intermediate, hidden) * hidden**-0.5
    w2 = randn(gen, experts, hidden, intermediate) * intermediate**-0.5
    weights, ids = reference("moe_route")(randn(gen, tokens, experts), top_k, True)
    expected = reference("moe_experts")(x, w13, w2, weights, ids)
    # Unpacked, native hands the experts to the reference; packed, both take them packed.
    torch.testing.assert_close(native("moe_experts")(x, w13, w2, weights, ids), expected,
                               **TIGHT)
    packed13, packed2 = w13.clone(), w2.clone()
    for expert in range(experts):
        native("pack_weight")(packed13[expert])
        native("pack_weight")(packed2[expert])
    packed13 = packed13.view(experts, 2 * intermediate // 16, hidden, 16)
    packed2 = packed2.view(experts, hidden // 16, intermediate, 16)
    torch.testing.assert_close(native("moe_experts")(x, packed13, packed2, weights, ids),
                               expected, **SUMS)
    torch.testing.assert_close(reference("moe_experts")(x, packed13, packed2, weights, ids),
                               expected, **SUMS)


def _packed_experts(gen: torch.Generator, experts: int, hidden: int, intermediate: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    w13 = randn(gen, experts, 2 * intermediate, hidden) * hidden**-0.5
    w2 = randn(gen, experts, hidden, intermediate) * intermediate**-0.5
    for expert in range(experts):
        native("pack_weight")(w13[expert])
        native("pack_weight")(w2[expert])
    return (w13.view(experts, 2 * intermediate // 16, hidden, 16),
            w2.view(experts, hidden // 16, intermediate, 16))


@settings(max_examples=10, deadline=None)
@given(tokens=st.integers(2, 12), experts=st.integers(1, 5), seed=SEEDS, data=st.data())
def test_a_tokens_experts_come_out_the_same_in_any_batch(tokens: int, experts: int, seed: int,
                                                         data: st.DataObject) -> None:
    """Each row goes through its experts' packed products, which give a row the same bits in
    any batch, and its sum over its picks is taken in the same (expert) order."""
    top_k = data.draw(st.integers(1, experts))
    gen = torch.Generator().manual_seed(seed)
    w13, w2 = _packed_experts(gen, experts, 32, 24)
    x = randn(gen, tokens, 32)
    weights, ids = reference("moe_route")(randn(gen, tokens, experts), top_k, True)
    together = native("moe_experts")(x, w13, w2, weights, ids)
    row = data.draw(st.integers(0, tokens - 1))
    alone = native("moe_experts")(x[row:row + 1], w13, w2, weights[row:row + 1],
                                  ids[row:row + 1])
    assert torch.equal(together[row:row + 1], alone)


def test_moe_experts_is_taped_natively_and_replays_each_steps_routing() -> None:
    from interlock.kernels.native import tape

    gen = torch.Generator().manual_seed(1)
    w13, w2 = _packed_experts(gen, 4, 16, 16)
    x, logits = randn(gen, 3, 16), randn(gen, 3, 4)
    weights, ids = reference("moe_route")(logits, 2, True)
    with tape.recording() as recorded:
        out = native("moe_experts")(x, w13, w2, weights, ids)
    assert (recorded.calls, recorded.foreign_calls) == (1, 0)
    new_weights, new_ids = reference("moe_route")(randn(gen, 3, 4), 2, True)
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    x.copy_(randn(gen, 3, 16))
    recorded.replay()
    assert torch.equal(out, native("moe_experts")(x, w13, w2, weights, ids))


def test_moe_experts_refuses_an_expert_id_out_of_range_and_a_mismatched_shape() -> None:
    gen = torch.Generator().manual_seed(2)
    w13, w2 = _packed_experts(gen, 3, 16, 16)
    x, weights = randn(gen, 2, 16), torch.ones(2, 1)
    with pytest.raises(ValueError, match=r"an expert id is outside 0\.\.2"):
        native("moe_experts")(x, w13, w2, weights, torch.tensor([[0], [3]]))
    with pytest.raises(KernelError, match=r"moe_experts: x \(2, 16\).*do not agree"):
        native("moe_experts")(x, w13, w2, torch.ones(2, 2), torch.zeros(2, 1, dtype=torch.int64))


def _mla_step(gen: torch.Generator, data: st.DataObject):
    """A decode step of absorbed MLA as the model hands it over: q_nope and q_pe views of
    one projection row per sequence, a latent cache, kv_b, block tables and lengths."""
    heads = data.draw(st.sampled_from([1, 3, 12]))
    nope, rope = data.draw(st.sampled_from([8, 24])), data.draw(st.sampled_from([4, 16]))
    rank, values = data.draw(st.sampled_from([8, 40])), data.draw(st.sampled_from([8, 12]))
    block_size = data.draw(st.sampled_from([1, 4, 16]))
    lengths = data.draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
    batch, width = len(lengths), max(1, -(-max(lengths) // block_size))
    blocks = width * batch + 2
    q = randn(gen, batch, heads * (nope + rope))
    tables = torch.randperm(blocks, generator=gen)[: width * batch].view(batch, width)
    return (q[:, : heads * nope].view(batch, heads, nope),
            q[:, heads * nope:].view(batch, heads, rope),
            randn(gen, blocks, block_size, rank + rope),
            randn(gen, heads, nope + values, rank) * rank**-0.5,
            tables.to(torch.int32), torch.tensor(lengths, dtype=torch.int32),
            (nope + rope) ** -0.5)


@settings(max_examples=15, deadline=None)
@given(data=st.data(), seed=SEEDS)
def test_mla_decode_attention(data: st.DataObject, seed: int) -> None:
    args = _mla_step(torch.Generator().manual_seed(seed), data)
    actual = native("mla_decode_attention")(*args)
    torch.testing.assert_close(actual, reference("mla_decode_attention")(*args), **SUMS)
    # Each sequence and head is computed on its own: a sequence alone gives the same bits.
    row = data.draw(st.integers(0, args[0].shape[0] - 1))
    q_nope, q_pe, cache, kv_b, tables, lengths, scale = args
    alone = native("mla_decode_attention")(q_nope[row:row + 1], q_pe[row:row + 1], cache,
                                           kv_b, tables[row:row + 1], lengths[row:row + 1],
                                           scale)
    assert torch.equal(actual[row:row + 1], alone)


def test_mla_decode_attention_is_taped_and_reads_the_lengths_at_replay() -> None:
    from interlock.kernels.native import tape

    data_gen = torch.Generator().manual_seed(3)
    q = randn(data_gen, 2, 2 * 12)
    q_nope, q_pe = q[:, :16].view(2, 2, 8), q[:, 16:].view(2, 2, 4)
    cache, kv_b = randn(data_gen, 6, 4, 8 + 4), randn(data_gen, 2, 8 + 8, 8)
    tables = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    lengths = torch.tensor([5, 2], dtype=torch.int32)
    with tape.recording() as recorded:
        out = native("mla_decode_attention")(q_nope, q_pe, cache, kv_b, tables, lengths, 0.3)
    assert (recorded.calls, recorded.foreign_calls) == (1, 0)
    lengths.copy_(torch.tensor([9, 0], dtype=torch.int32))
    q.copy_(randn(data_gen, 2, 24))
    recorded.replay()
    expected = reference("mla_decode_attention")(q_nope, q_pe, cache, kv_b, tables, lengths, 0.3)
    torch.testing.assert_close(out, expected, **SUMS)
    assert not out[1].any()


def test_mla_decode_attention_refuses_what_it_cannot_read() -> None:
    q_nope, q_pe = torch.ones(1, 2, 8), torch.ones(1, 2, 4)
    cache, kv_b = torch.ones(2, 4, 8 + 4), torch.ones(2, 8 + 8, 8)
    call = native("mla_decode_attention")
    with pytest.raises(ValueError, match=r"a block table names a block outside 0\.\.1"):
        call(q_nope, q_pe, cache, kv_b, torch.tensor([[0, 2]], dtype=torch.int32),
             torch.tensor([6], dtype=torch.int32), 0.5)
    with pytest.raises(ValueError, match="a sequence length exceeds its block table"):
        call(q_nope, q_pe, cache, kv_b, torch.tensor([[0, 1]], dtype=torch.int32),
             torch.tensor([9], dtype=torch.int32), 0.5)
    with pytest.raises(KernelError, match=r"mla_decode_attention: .*cache \(2, 4, 10\).*agree"):
        call(q_nope, q_pe, torch.ones(2, 4, 10), kv_b, torch.zeros(1, 2, dtype=torch.int32),
             torch.ones(1, dtype=torch.int32), 0.5)


def test_a_large_mla_decode_batch_goes_to_the_reference_as_a_foreign_call() -> None:
    from interlock.kernels.native import ops, tape

    gen = torch.Generator().manual_seed(4)
    batch = ops.MLA_DECODE_NATIVE_BATCH + 1
    q_nope, q_pe = randn(gen, batch, 2, 8), randn(gen, batch, 2, 4)
    cache, kv_b = randn(gen, batch, 4, 8 + 4), randn(gen, 2, 8 + 8, 8)
    tables = torch.arange(batch, dtype=torch.int32).view(batch, 1)
    lengths = torch.full((batch,), 3, dtype=torch.int32)
    with tape.recording() as recorded:
        out = native("mla_decode_attention")(q_nope, q_pe, cache, kv_b, tables, lengths, 0.3)
    assert (recorded.calls, recorded.foreign_calls) == (0, 1)
    assert torch.equal(out, reference("mla_decode_attention")(q_nope, q_pe, cache, kv_b, tables,
                                                               lengths, 0.3))


@settings(max_examples=15, deadline=None)
@given(tokens=st.integers(0, 9), rank=st.sampled_from([8, 40, 256]),
       rope=st.sampled_from([4, 16, 32]), block_size=st.sampled_from([1, 4, 16]),
       data=st.data(), seed=SEEDS)
def test_store_latent_cache(tokens: int, rank: int, rope: int, block_size: int,
                            data: st.DataObject, seed: int) -> None:
    """Bitwise the reference's store, from views of one projection's output row (as the
    model hands over the latent and rotary key); padding tokens (slot -1) write nothing."""
    gen = torch.Generator().manual_seed(seed)
    blocks = 10
    slots = data.draw(st.lists(st.integers(0, blocks * block_size - 1), min_size=tokens,
                               max_size=tokens, unique=True))
    padding = data.draw(st.lists(st.booleans(), min_size=tokens, max_size=tokens))
    mapping = torch.tensor([-1 if p else s for s, p in zip(slots, padding, strict=True)],
                           dtype=torch.int64)
    row = randn(gen, tokens, 3 + rank + rope)
    latent, k_pe = row[:, 3:3 + rank], row[:, 3 + rank:]
    cache = randn(gen, blocks, block_size, rank + rope)
    expected = cache.clone()
    reference("store_latent_cache")(latent, k_pe, expected, mapping)
    native("store_latent_cache")(latent, k_pe, cache, mapping)
    assert torch.equal(cache, expected)


def test_store_latent_cache_is_taped_and_refuses_a_slot_outside_the_cache() -> None:
    from interlock.kernels.native import tape

    gen = torch.Generator().manual_seed(6)
    latent, k_pe, cache = randn(gen, 2, 8), randn(gen, 2, 4), torch.zeros(3, 2, 12)
    slots = torch.tensor([0, 5])
    with tape.recording() as recorded:
        native("store_latent_cache")(latent, k_pe, cache, slots)
    assert (recorded.calls, recorded.foreign_calls) == (1, 0)
    latent.copy_(randn(gen, 2, 8))
    slots.copy_(torch.tensor([1, -1]))
    recorded.replay()
    assert torch.equal(cache.view(6, 12)[1], torch.cat([latent[0], k_pe[0]]))
    with pytest.raises(ValueError, match=r"a slot is outside the latent cache .*0\.\.5\)"):
        native("store_latent_cache")(latent, k_pe, cache, torch.tensor([0, 6]))
    with pytest.raises(KernelError, match=r"store_latent_cache: .*cache \(3, 2, 12\).*agree"):
        native("store_latent_cache")(latent, randn(gen, 2, 5), cache, slots)


@settings(max_examples=10, deadline=None)
@given(tokens=st.integers(0, 9), hidden=st.integers(1, 70), seed=SEEDS)
def test_add(tokens: int, hidden: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, y = randn(gen, tokens, hidden + 2)[:, 1:hidden + 1], randn(gen, tokens, hidden)
    assert torch.equal(native("add")(x, y), reference("add")(x, y))
    with pytest.raises(KernelError, match=r"add: x .* and y .* differ"):
        native("add")(x, randn(gen, tokens, hidden + 1))


def _route_case(data: st.DataObject, gen: torch.Generator, tokens: int):
    """Logits (the first experts' columns of a wider product, as the padded router gives
    them) and the rest of a routing call, every method and scoring."""
    n_group, size = data.draw(st.sampled_from([(1, 2), (2, 2), (4, 2), (2, 4), (4, 4), (8, 8),
                                               (3, 5), (2, 6)]))
    method = data.draw(st.sampled_from(["greedy", "group_limited_greedy", "noaux_tc"]))
    scoring = data.draw(st.sampled_from(["softmax", "sigmoid"]))
    experts = n_group * size
    topk_group = data.draw(st.integers(1, n_group))
    top_k = data.draw(st.integers(1, min(8, topk_group * size if method != "greedy"
                                         else experts)))
    logits = randn(gen, tokens, experts + 4)[:, :experts]
    bias = randn(gen, experts) * 0.1 if data.draw(st.booleans()) else None
    return (logits, bias, top_k, scoring, method, n_group, topk_group,
            data.draw(st.booleans()), 2.5)


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 7), data=st.data(), seed=SEEDS)
def test_moe_grouped_route(tokens: int, data: st.DataObject, seed: int) -> None:
    """The reference's picks in its order (best first; random logits do not tie), weights
    within a few roundings (its exp and division are torch's, not libm's)."""
    args = _route_case(data, torch.Generator().manual_seed(seed), tokens)
    weights, ids = native("moe_grouped_route")(*args)
    expected_weights, expected_ids = reference("moe_grouped_route")(*args)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
    # A token's routing is its own: alone, the same bits.
    row = data.draw(st.integers(0, tokens - 1))
    alone = native("moe_grouped_route")(args[0][row:row + 1], *args[1:])
    assert torch.equal(alone[0], weights[row:row + 1]) and torch.equal(alone[1], ids[row:row + 1])


def test_moe_grouped_route_is_taped_and_replays_each_steps_logits() -> None:
    from interlock.kernels.native import tape

    gen = torch.Generator().manual_seed(7)
    logits, bias = randn(gen, 3, 8), randn(gen, 8) * 0.1
    args = (bias, 2, "sigmoid", "noaux_tc", 2, 1, True, 2.5)
    with tape.recording() as recorded:
        weights, ids = native("moe_grouped_route")(logits, *args)
    assert (recorded.calls, recorded.foreign_calls) == (1, 0)
    logits.copy_(randn(gen, 3, 8))
    recorded.replay()
    expected_weights, expected_ids = reference("moe_grouped_route")(logits, *args)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)


def test_noaux_tc_in_c_chooses_with_the_bias_and_weighs_without_it() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    weights, ids = native("moe_grouped_route")(logits, bias, 1, "sigmoid", "noaux_tc", 2, 1,
                                               False, 1.0)
    assert ids.tolist() == [[3]]  # -1 + 5 beats 2 + 0
    torch.testing.assert_close(weights, torch.sigmoid(logits[:, 3:]))


def test_moe_grouped_route_refuses_what_the_reference_cannot_route() -> None:
    logits = torch.zeros(2, 6)
    call = native("moe_grouped_route")
    with pytest.raises(KernelError, match="scoring 'tanh' is not softmax or sigmoid"):
        call(logits, None, 2, "tanh", "greedy", 1, 1, True, 1.0)
    with pytest.raises(KernelError, match="method 'best' is not greedy"):
        call(logits, None, 2, "softmax", "best", 1, 1, True, 1.0)
    with pytest.raises(KernelError, match="top 2 of 6 experts in 4 groups"):
        call(logits, None, 2, "softmax", "group_limited_greedy", 4, 1, True, 1.0)
    with pytest.raises(KernelError, match="noaux_tc scores a group by its two best"):
        call(logits, None, 1, "sigmoid", "noaux_tc", 6, 1, True, 1.0)
    with pytest.raises(KernelError, match=r"correction_bias \(5,\) for 6 experts"):
        call(logits, torch.zeros(5), 2, "sigmoid", "noaux_tc", 2, 1, True, 1.0)
