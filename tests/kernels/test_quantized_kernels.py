"""The quantized products: GGUF's block formats repacked (kernels.quant), dequantized as
the gguf package does, and the native kernels against their references."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.kernels import REGISTRY, quant
from interlock.kernels.native import unavailable
from interlock.kernels.native.ops import NativeArgumentError

WHY_NOT = unavailable("cpu")
native_only = pytest.mark.skipif(WHY_NOT is not None, reason=f"native kernels: {WHY_NOT}")
FORMATS = sorted(quant.FORMATS)
T = TypeVar("T")


def _isas() -> list[str]:
    """The instruction sets the quantized products can take here (AVX-512 first)."""
    if WHY_NOT is not None:
        return []
    from interlock.kernels.native import _cpu
    return ["avx512", "avx2"] if _cpu.quantized_isa() == "avx512" else ["avx2"]


ISAS = _isas()


@contextmanager
def switched(get: Callable[[], T], put: Callable[[T], object], value: T) -> Iterator[None]:
    """``put(value)`` for the block, then what ``get`` gave before it."""
    before = get()
    put(value)
    try:
        yield
    finally:
        put(before)


def running_with(isa: str) -> AbstractContextManager[None]:
    from interlock.kernels.native import _cpu
    return switched(_cpu.quantized_isa, _cpu.quantized_isa, isa)


def torch_threads(count: int) -> AbstractContextManager[None]:
    return switched(torch.get_num_threads, torch.set_num_threads, count)


def file_bytes(name: str, rows: int, inputs: int, seed: int) -> np.ndarray:
    """Random blocks of ``name`` [rows, row bytes]: every quant drawn, the float16 scales
    drawn finite (the product of a weight full of NaN says nothing)."""
    fmt = quant.FORMATS[name]
    rng = np.random.default_rng(seed)
    blocks = inputs // fmt.file_block
    raw = rng.integers(0, 256, (rows, blocks, fmt.file_bytes), dtype=np.uint8)
    # where each format keeps its float16 scale(s): d (and m / dmin)
    at = {"Q8_0": (0, 2), "Q4_0": (0, 2), "Q4_1": (0, 4), "Q4_K": (0, 4), "Q6_K": (208, 210)}
    lo, hi = at[name]
    scales = rng.uniform(-0.05, 0.05, (rows, blocks, (hi - lo) // 2)).astype("<f2")
    raw[..., lo:hi] = scales.view(np.uint8)
    return raw.reshape(rows, -1)


def packed(name: str, rows: int, inputs: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    raw = file_bytes(name, rows, inputs, seed)
    q, scale, offset = quant.decode(torch.from_numpy(raw), name, inputs)
    return quant.pack(q, scale, offset, quant.FORMATS[name]), raw


def impl(op: str, backend: str):
    return REGISTRY.select(op, "cpu", "float32", force=backend).fn


@pytest.mark.parametrize("name", FORMATS)
def test_repacked_weights_dequantize_as_gguf_does(name: str) -> None:
    """Bitwise: the records hold exactly the file's weights (-0 and +0 compare equal)."""
    inputs = 2 * quant.FORMATS[name].file_block
    weight, raw = packed(name, 32, inputs, seed=7)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(32, inputs)
    assert torch.equal(quant.dequantize(weight, name), torch.from_numpy(expected))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1"])
def test_weights_quantized_by_gguf_round_trip(name: str) -> None:
    """The formats gguf can quantize: real weights, not only random bytes."""
    values = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType[name])
    weight = quant.pack(*quant.decode(torch.from_numpy(raw), name, 64), quant.FORMATS[name])
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])
    assert torch.equal(quant.dequantize(weight, name), torch.from_numpy(expected))


def test_partial_blocks_and_strips_are_refused_by_name() -> None:
    raw = torch.zeros(16, 20, dtype=torch.uint8)
    with pytest.raises(quant.QuantFormatError, match="48 inputs are not whole blocks of 32"):
        quant.decode(raw, "Q4_1", 48)
    with pytest.raises(quant.QuantFormatError, match="not \\[rows, 40\\] bytes for 64"):
        quant.decode(raw, "Q4_1", 64)
    q, scale, offset = quant.decode(torch.zeros(8, 20, dtype=torch.uint8), "Q4_1", 32)
    with pytest.raises(quant.QuantFormatError, match="8 outputs are not a multiple of 16"):
        quant.pack(q, scale, offset, quant.FORMATS["Q4_1"])
    with pytest.raises(quant.QuantFormatError, match="no quantized kernels for Q5_K"):
        quant.format_of("Q5_K")
    with pytest.raises(quant.QuantFormatError, match="Q4_1: a scale or offset is not a "
                       "float16 value"):
        quant.pack(*quant.decode(torch.zeros(16, 20, dtype=torch.uint8), "Q4_1", 32)[:1],
                   torch.full((16, 1), 0.1), torch.zeros(16, 1), quant.FORMATS["Q4_1"])


@native_only
@pytest.mark.parametrize("name", ["Q8_0", "Q4_1"])
def test_float16_scales_of_every_class_are_read_exactly(name: str) -> None:
    """Records keep Q8_0's and Q4_1's float16 scales as they are; the products and the
    embedding rows read them as float32 exactly (zero, -0, subnormal, the largest of each
    sign): against gguf's dequantization. (An infinite or NaN scale is refused when the
    file is decoded: tests/hostile/test_weight_files.py.)"""
    specials = np.array([0.0, -0.0, 2.0**-24, -(2.0**-20), 6.1e-5, 65504.0, -65504.0, 1.0],
                        dtype="<f2")
    raw = file_bytes(name, 16, 64, seed=5).reshape(16, 2, -1)
    scales = raw[..., 0:2].copy().view("<f2")
    scales[:8, 0, 0] = specials
    raw[..., 0:2] = scales.view(np.uint8)
    raw = raw.reshape(16, -1)
    weight = quant.pack(*quant.decode(torch.from_numpy(raw), name, 64), quant.FORMATS[name])
    expected = torch.from_numpy(
        gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(16, 64))
    rows = impl("quantized_embedding", "native")(torch.arange(16), weight, name)
    torch.testing.assert_close(rows, expected, rtol=0, atol=0)
    torch.testing.assert_close(quant.dequantize(weight, name), expected, rtol=0, atol=0)
    x = torch.zeros(1, 64)
    x[0, 40] = 1.0  # picks weight 40 of each row
    for isa in ISAS:
        with running_with(isa):
            got = impl("quantized_linear", "native")(x, weight, name, None)
        assert torch.equal(got[0], expected[:, 40])


def bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The tolerance: a float32 sum of K products in another order differs from the exact
    one by at most about K eps sum |x w|; both orders are, so 2 K eps (eps = 2^-24) of
    |x| |w|^T per output, plus a floor for outputs that cancel to almost nothing."""
    k = x.shape[1]
    return 2 * k * 2.0**-24 * (x.abs() @ weight.abs().t()) + 1e-6


@native_only
@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(FORMATS), strips=st.integers(1, 4), blocks=st.integers(1, 3),
       rows=st.integers(1, 64), with_bias=st.booleans(), seed=st.integers(0, 2**31 - 1),
       isa=st.sampled_from(ISAS or ["none"]))
def test_native_quantized_linear_matches_its_reference(
    name: str, strips: int, blocks: int, rows: int, with_bias: bool, seed: int, isa: str
) -> None:
    inputs = blocks * quant.FORMATS[name].file_block
    weight, _ = packed(name, 16 * strips, inputs, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inputs, generator=gen)
    bias = torch.randn(16 * strips, generator=gen) if with_bias else None
    with running_with(isa):
        got = impl("quantized_linear", "native")(x, weight, name, bias)
    want = impl("quantized_linear", "torch")(x, weight, name, bias)
    error = (got - want).abs()
    assert bool((error <= bound(x, quant.dequantize(weight, name))).all()), float(error.max())


@native_only
@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(FORMATS), rows=st.integers(2, 64), seed=st.integers(0, 2**31 - 1),
       isa=st.sampled_from(ISAS or ["none"]))
def test_a_rows_result_is_bitwise_the_same_in_any_batch(
    name: str, rows: int, seed: int, isa: str
) -> None:
    """Each row alone, and in a batch of ``rows`` (other tile shapes, other strips per
    tile), gives the same bits: the accumulation order is the row's own."""
    weight, _ = packed(name, 64, 2 * quant.FORMATS[name].file_block, seed)
    x = torch.randn(rows, weight.shape[1] * quant.FORMATS[name].block,
                    generator=torch.Generator().manual_seed(seed))
    linear = impl("quantized_linear", "native")
    with running_with(isa):
        batch = linear(x, weight, name, None)
        for r in {0, rows // 2, rows - 1}:
            assert torch.equal(linear(x[r:r + 1], weight, name, None)[0], batch[r])
        assert torch.equal(linear(x[1:], weight, name, None), batch[1:])


@pytest.mark.skipif(len(ISAS) < 2, reason="this CPU has no AVX-512: one path only")
@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(FORMATS), strips=st.integers(1, 9), blocks=st.integers(1, 3),
       rows=st.integers(1, 64), with_bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_the_avx512_and_avx2_products_are_bitwise_the_same(
    name: str, strips: int, blocks: int, rows: int, with_bias: bool, seed: int
) -> None:
    """The two instruction sets run one accumulation order, operation for operation, over
    every tile shape (1-9 strips: the wide tiles and the odd strip left after them)."""
    weight, _ = packed(name, 16 * strips, blocks * quant.FORMATS[name].file_block, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, blocks * quant.FORMATS[name].file_block, generator=gen)
    bias = torch.randn(16 * strips, generator=gen) if with_bias else None
    linear = impl("quantized_linear", "native")
    results = []
    for isa in ISAS:
        with running_with(isa):
            results.append(linear(x, weight, name, bias))
    assert torch.equal(results[0], results[1])


@native_only
@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(FORMATS), strips=st.integers(1, 13), blocks=st.integers(1, 3),
       rows=st.integers(1, 64), with_bias=st.booleans(), threads=st.integers(2, 5),
       isa=st.sampled_from(ISAS or ["none"]), seed=st.integers(0, 2**31 - 1))
def test_the_products_are_bitwise_the_same_at_any_thread_count(
    name: str, strips: int, blocks: int, rows: int, with_bias: bool, threads: int, isa: str,
    seed: int,
) -> None:
    """The threads share out whole strips (runs of 4, the last part shorter or empty: more
    threads than runs of strips leave some idle), and each output is computed as on one
    thread: torch's thread count changes no bit, of the quantized or the float products."""
    weight, _ = packed(name, 16 * strips, blocks * quant.FORMATS[name].file_block, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, blocks * quant.FORMATS[name].file_block, generator=gen)
    bias = torch.randn(16 * strips, generator=gen) if with_bias else None
    dense = torch.randn(16 * strips, x.shape[1], generator=gen)
    quantized, linear = impl("quantized_linear", "native"), impl("linear", "native")
    strip_packed = impl("pack_weight", "native")(dense.clone())
    results = []
    with running_with(isa):
        for count in (1, threads):
            with torch_threads(count):
                results.append((quantized(x, weight, name, bias),
                                linear(x, strip_packed, bias, False)))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


@native_only
def test_the_thread_count_is_checked_and_follows_torch() -> None:
    from interlock.kernels.native import _cpu
    for bad, error in ((0, ValueError), (257, ValueError), ("2", TypeError)):
        with pytest.raises(error):
            _cpu.threads(bad)
    weight, _ = packed("Q4_1", 64, 64, 0)
    with torch_threads(3):
        impl("quantized_linear", "native")(torch.randn(1, 64), weight, "Q4_1", None)
        assert _cpu.threads() == 3


@native_only
def test_an_instruction_set_the_cpu_lacks_is_refused_by_name() -> None:
    from interlock.kernels.native import _cpu
    with pytest.raises(ValueError, match="quantized_isa 'avx9': this CPU runs 'avx"):
        _cpu.quantized_isa("avx9")
    assert _cpu.quantized_isa() == ISAS[0]


@native_only
@pytest.mark.parametrize("name", FORMATS)
def test_native_quantized_embedding_is_its_reference_bitwise(name: str) -> None:
    """A tied LM head kept quantized: its rows dequantized as the reference does."""
    table, _ = packed(name, 48, quant.FORMATS[name].file_block, seed=11)
    ids = torch.tensor([0, 15, 16, 47, 3, 3])
    got = impl("quantized_embedding", "native")(ids, table, name)
    assert torch.equal(got, impl("quantized_embedding", "torch")(ids, table, name))
    assert torch.equal(got, quant.dequantize(table, name)[ids])
    with pytest.raises(ValueError, match="outside the vocabulary \\(0..47\\)"):
        impl("quantized_embedding", "native")(torch.tensor([48]), table, name)


@native_only
def test_native_quantized_linear_refuses_what_does_not_fit() -> None:
    weight, _ = packed("Q4_1", 16, 64, seed=1)
    linear = impl("quantized_linear", "native")
    with pytest.raises(NativeArgumentError, match="x has 32 features, the Q4_1 weight 64"):
        linear(torch.zeros(1, 32), weight, "Q4_1", None)
    with pytest.raises(NativeArgumentError, match="is not packed Q8_0 records"):
        linear(torch.zeros(1, 64), weight, "Q8_0", None)
    with pytest.raises(NativeArgumentError, match="bias \\(8,\\) for 16 outputs"):
        linear(torch.zeros(1, 64), weight, "Q4_1", torch.zeros(8))
