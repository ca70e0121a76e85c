"""The Q4_1 and Q8_0 products on int8 activations (``quantized_linear_int8``): their records, the
rounding of the rows, every instruction set bitwise alike and against the torch reference,
and the float product they stand in for, within the rounding of the rows."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_quantized_kernels import impl, native_only, packed, switched, torch_threads

from interlock.kernels import quant
from interlock.kernels.native import unavailable
from interlock.kernels.native.ops import NativeArgumentError


def _paths() -> list[str]:
    """The int8 paths this CPU runs, widest first."""
    if unavailable("cpu") is not None:
        return []
    from interlock.kernels.native import _cpu
    return {"vnni": ["vnni", "avx2", "portable"], "avx2": ["avx2", "portable"]}.get(
        _cpu.int8_isa(), ["portable"])


PATHS = _paths()


def running_with(path: str):
    from interlock.kernels.native import _cpu
    return switched(_cpu.int8_isa, _cpu.int8_isa, path)


def int8_records(rows: int, inputs: int, seed: int, name: str = "Q4_1"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random blocks of ``name`` as the int8 products' records, and as the float products'."""
    plain, raw = packed(name, rows, inputs, seed)
    q, scale, offset = quant.decode(torch.from_numpy(raw), name, inputs)
    return quant.pack(q, scale, offset, quant.INT8_FORMATS[name]), plain


def test_the_regrouped_records_hold_the_files_weights() -> None:
    """Bitwise: the int8 records dequantize as gguf does, and as the float products' do;
    a lane holds four consecutive inputs of one output, low and high nibbles."""
    weight, plain = int8_records(32, 96, seed=3)
    assert weight.shape == plain.shape
    assert torch.equal(quant.dequantize(weight, "Q4_1", int8=True), quant.dequantize(plain, "Q4_1"))
    q, _, _ = quant.unpack(plain, "Q4_1")
    record = weight[1, 2, quant.INT8_FORMATS["Q4_1"].scale_bytes:]  # outputs 16.., block 2
    for g, c, i in ((0, 0, 0), (3, 15, 3), (2, 5, 1)):
        byte = int(record[64 * g + 4 * c + i])
        assert byte & 15 == q[16 + c, 64 + 4 * g + i]
        assert byte >> 4 == q[16 + c, 64 + 16 + 4 * g + i]
    q8, plain8 = int8_records(16, 64, seed=3, name="Q8_0")
    assert torch.equal(q8, plain8), "Q8_0's records are its own"
    with pytest.raises(quant.QuantFormatError, match="no int8-activation products for Q4_K; "
                       "they take Q4_1, Q8_0"):
        quant.int8_format_of("Q4_K")


def test_rows_round_to_eight_bits_per_block() -> None:
    """d = max|x| / 127 per block, the largest input at +-127, ties to even, a block of
    zeros at d 0, and each block's float sum kept."""
    x = torch.zeros(2, 64)
    x[0, :32] = torch.linspace(-1, 2, 32)
    x[0, 32] = 0.5 * 3 / 127  # half a step of a block whose largest is 3: rounds to 0 (even)
    x[0, 33] = 3.0
    xq, d, sums = quant.quantize_rows(x)
    assert d[0].tolist() == pytest.approx([2 / 127, 3 / 127])
    assert xq[0, 31] == 127 and xq[0, 0] == -64 and xq[0, 33] == 127 and xq[0, 32] == 0
    assert d[1].tolist() == [0.0, 0.0] and not xq[1].any()
    assert torch.equal(sums, x.view(2, 2, 32).sum(-1))


@native_only
@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(sorted(quant.INT8_FORMATS)), rows=st.integers(1, 11),
       strips=st.integers(1, 4), blocks=st.integers(1, 5), bias=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_every_path_is_bitwise_the_same_and_its_reference(
        name: str, rows: int, strips: int, blocks: int, bias: bool, seed: int) -> None:
    """The paths differ only in how the exact integer sums are computed: bitwise the same
    results; against the torch reference (the float sums in another order) within a few
    ulps of the outputs' magnitude."""
    weight, _ = int8_records(16 * strips, 32 * blocks, seed, name)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 32 * blocks, generator=g)
    b = torch.randn(16 * strips, generator=g) if bias else None
    expected = impl("quantized_linear_int8", "torch")(x, weight, name, b)
    results = {}
    for path in PATHS:
        with running_with(path):
            results[path] = impl("quantized_linear_int8", "native")(x, weight, name, b)
    for path, got in results.items():
        assert torch.equal(got, results[PATHS[0]]), path
    scale = expected.abs().max().item() + 1e-6
    torch.testing.assert_close(results[PATHS[0]], expected, atol=4e-6 * scale, rtol=0)


@native_only
@pytest.mark.parametrize(("name", "measured"), [("Q4_1", 0.0076), ("Q8_0", 0.0055)])
def test_the_int8_product_stays_close_to_the_float_one(name: str, measured: float) -> None:
    """Rounding the row to 8 bits moves each output by a small part of its magnitude:
    on weights gguf quantized from normal values and a normal row, SmolLM2's hidden size,
    within 1.5 % of the largest output (measured: ``measured``)."""
    values = np.random.default_rng(11).standard_normal((64, 576)).astype(np.float32)
    raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType[name])
    decoded = quant.decode(torch.from_numpy(raw), name, 576)
    weight = quant.pack(*decoded, quant.INT8_FORMATS[name])
    plain = quant.pack(*decoded, quant.FORMATS[name])
    x = torch.from_numpy(np.random.default_rng(12).standard_normal((4, 576)).astype(np.float32))
    float_path = impl("quantized_linear", "native")(x, plain, name, None)
    got = impl("quantized_linear_int8", "native")(x, weight, name, None)
    error = (got - float_path).abs().max() / float_path.abs().max()
    assert error < 0.015, error


@native_only
@pytest.mark.parametrize("path", PATHS)
def test_a_row_is_the_same_in_any_batch_and_at_any_thread_count(path: str) -> None:
    """Alone, or among 40 rows that the threads round and multiply in row tiles and parts."""
    weight, _ = int8_records(64, 128, seed=5)
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(5))
    fn = impl("quantized_linear_int8", "native")
    with running_with(path), torch_threads(1):
        alone = torch.cat([fn(x[i:i + 1], weight, "Q4_1", None) for i in range(40)])
    with running_with(path), torch_threads(2):
        batched = fn(x, weight, "Q4_1", None)
    assert torch.equal(alone, batched)


@native_only
def test_non_finite_inputs_reach_the_outputs() -> None:
    """A NaN or an infinity in a row is not rounded away: its block's outputs are not
    finite, as the float product's are."""
    weight, _ = int8_records(16, 64, seed=9)
    x = torch.ones(3, 64)
    x[0, 3], x[1, 40] = float("nan"), float("inf")
    results = []
    for path in PATHS:
        with running_with(path):
            y = impl("quantized_linear_int8", "native")(x, weight, "Q4_1", None)
        assert not torch.isfinite(y[:2]).any() and torch.isfinite(y[2]).all(), path
        results.append(y)
    for y in results[1:]:  # the rows with a NaN or an infinity too
        torch.testing.assert_close(y, results[0], rtol=0, atol=0, equal_nan=True)


@native_only
def test_what_does_not_fit_is_refused_by_name() -> None:
    from interlock.kernels.native import _cpu

    weight, plain = int8_records(16, 64, seed=1)
    fn = impl("quantized_linear_int8", "native")
    with pytest.raises(NativeArgumentError, match="x has 32 features, the Q4_1 weight 64"):
        fn(torch.zeros(1, 32), weight, "Q4_1", None)
    with pytest.raises(NativeArgumentError, match="no int8-activation products for Q4_K"):
        fn(torch.zeros(1, 64), weight, "Q4_K", None)
    with pytest.raises(NativeArgumentError, match="bias \\(8,\\) for 16 outputs"):
        fn(torch.zeros(1, 64), weight, "Q4_1", torch.zeros(8))
    y = torch.empty(1, 16)
    x = torch.zeros(1, 64)
    with pytest.raises(ValueError, match="no quantized record of kind 2 with blocks of 32"):
        _cpu.call(_cpu.OP_QUANTIZED_LINEAR_INT8, x.data_ptr(), 64, plain.data_ptr(), 2, 32, 0,
                  y.data_ptr(), 1, 64, 16)
    with pytest.raises(ValueError, match="int8_isa 'avx9': this CPU runs"):
        _cpu.int8_isa("avx9")
    assert _cpu.int8_isa() == PATHS[0]
