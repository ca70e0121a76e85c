"""Weights are kept in the layout that streams faster for decode: packed in strips after
loading for a table whose linear wants it (the native CPU kernels), else [in, out] for wide
float32 projections and the checkpoint's [out, in] in bfloat16 and float16 (where only
F.linear reaches torch's reduced-precision GEMV); either way the outputs agree."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.nn import functional as F

from interlock.kernels.native import unavailable
from interlock.runners.dispatch import build_kernel_table
from interlock.runners.model.checkpoint import build_model, default_dtype
from interlock.runners.model.demo import demo_config
from interlock.runners.model.layers import Linear, stored_transposed


@pytest.mark.parametrize(
    "dtype, wide, narrow",
    [(torch.float32, True, False), (torch.bfloat16, False, False), (torch.float16, False, False)],
)
def test_only_wide_float32_weights_are_stored_transposed(dtype, wide, narrow) -> None:
    ops = build_kernel_table("cpu", str(dtype).removeprefix("torch."), ["torch"])
    with default_dtype(dtype):
        assert stored_transposed(576, 1536, ops) is wide
        assert stored_transposed(1536, 576, ops) is narrow


NATIVE = pytest.mark.skipif(unavailable("cpu") is not None, reason="native kernels not built")
LAYOUTS = [
    pytest.param("float32", None, "packed", marks=NATIVE),
    ("float32", ["torch"], "[in, out]"),
    ("bfloat16", None, "[out, in]"),
]


@pytest.mark.parametrize("dtype, preference, layout", LAYOUTS)
def test_a_linear_gives_x_times_its_checkpoint_rows_in_any_layout(dtype, preference,
                                                                  layout) -> None:
    ops = build_kernel_table("cpu", dtype, preference)
    torch_dtype = getattr(torch, dtype)
    with default_dtype(torch_dtype):
        linear = Linear(8, 32, ops, bias=True)
    checkpoint = torch.randn(32, 8).to(torch_dtype)
    with torch.no_grad():
        linear.rows().copy_(checkpoint)
        linear.bias.copy_(torch.randn(32).to(torch_dtype))
    linear.pack()
    stored = {3: "packed", 2: "[in, out]" if linear.transposed else "[out, in]"}
    assert stored[linear.weight.dim()] == layout
    x = torch.randn(3, 8).to(torch_dtype)
    expected = F.linear(x.float(), checkpoint.float(), linear.bias.float())
    torch.testing.assert_close(linear(x).float(), expected, atol=0.05, rtol=0.02)
    if layout == "packed":
        with pytest.raises(RuntimeError, match="load before packing"):
            linear.rows()


def test_a_weight_the_strips_do_not_divide_stays_as_loaded() -> None:
    linear = Linear(8, 20, build_kernel_table("cpu", "float32"))
    linear.pack()
    assert linear.weight.shape == (20, 8)


@pytest.mark.parametrize("dtype, preference, layout", LAYOUTS)
def test_a_tied_head_is_stored_as_it_streams_fastest(dtype, preference, layout) -> None:
    config = replace(demo_config(), tie_word_embeddings=True)
    ops = build_kernel_table("cpu", dtype, preference)
    model = build_model(config, ops, dtype, "cpu", 8)
    assert model.head_transposed is (layout == "[in, out]")
    assert tuple(model.embedding.shape) == (config.vocab_size, config.hidden_size)
    with torch.no_grad():
        model.embedding.copy_(torch.randn(config.vocab_size, config.hidden_size))
    ids = torch.tensor([0, 5, config.vocab_size - 1])
    hidden = torch.randn(2, config.hidden_size).to(getattr(torch, dtype))
    rows, logits = ops.embedding(ids, model.embedding), model.compute_logits(hidden)
    model.pack_weights()
    assert (model.embedding.dim() == 3) is (layout == "packed"), "a packed head is looked up packed"
    assert torch.equal(ops.embedding(ids, model.embedding), rows)
    # the native product sums in another order than torch's
    torch.testing.assert_close(model.compute_logits(hidden), logits, atol=1e-4, rtol=1e-4)
