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
    prefill = REGISTRY.select("paged_attention", "cpu", "float32")
    assert prefill.impl.backend == "torch" and "no native implementation" in prefill.reason
    bf16 = REGISTRY.select("linear", "cpu", "bfloat16")
    assert bf16.impl.backend == "torch" and "native linear does not support bfloat16" in bf16.reason


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 40), inputs=st.integers(1, 70), outputs=st.integers(1, 70),
       transposed=st.booleans(), bias=st.booleans(), strided=st.booleans(), seed=SEEDS)
def test_linear(rows: int, inputs: int, outputs: int, transposed: bool, bias: bool,
                strided: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, rows, inputs + 5 if strided else inputs)[:, :inputs]
    weight = randn(gen, *((inputs, outputs) if transposed else (outputs, inputs)))
    b = randn(gen, outputs) if bias else None
    torch.testing.assert_close(native("linear")(x, weight, b, transposed),
                               reference("linear")(x, weight, b, transposed), **SUMS)


@pytest.mark.parametrize("rows", [1, 7, 32])
def test_linear_over_a_head_wider_than_its_column_chunks(rows: int) -> None:
    """[in, out] products walk the outputs in chunks of 65,536 / rows columns."""
    gen = torch.Generator().manual_seed(rows)
    x, weight, bias = randn(gen, rows, 9), randn(gen, 9, 70_001), randn(gen, 70_001)
    torch.testing.assert_close(native("linear")(x, weight, bias, True),
                               reference("linear")(x, weight, bias, True), **SUMS)


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


def test_arguments_outside_the_contract_are_named() -> None:
    with pytest.raises(KernelError, match=r"x as a 2-d torch.float32 CPU tensor.*torch.float64"):
        native("linear")(torch.ones(1, 4, dtype=torch.float64), torch.ones(4, 4), None, True)
    with pytest.raises(KernelError, match=r"weight \(4, 3\) \(\[in, out\]\) does not take x"):
        native("linear")(torch.ones(1, 5), torch.ones(4, 3), None, True)
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
