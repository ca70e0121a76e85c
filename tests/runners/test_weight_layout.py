"""Weights are kept in the layout that streams faster for decode: [in, out] for wide float32
projections, the checkpoint's [out, in] in bfloat16 and float16 (where only F.linear reaches
torch's reduced-precision GEMV); either way the checkpoint view and the outputs agree."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.nn import functional as F

from interlock.runners.dispatch import build_kernel_table
from interlock.runners.model.checkpoint import build_model, default_dtype
from interlock.runners.model.demo import demo_config
from interlock.runners.model.layers import Linear, stored_transposed


@pytest.mark.parametrize(
    "dtype, wide, narrow",
    [(torch.float32, True, False), (torch.bfloat16, False, False), (torch.float16, False, False)],
)
def test_only_wide_float32_weights_are_stored_transposed(dtype, wide, narrow) -> None:
    with default_dtype(dtype):
        assert stored_transposed(576, 1536) is wide
        assert stored_transposed(1536, 576) is narrow


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_linear_gives_x_times_its_checkpoint_rows_in_either_layout(dtype) -> None:
    ops = build_kernel_table("cpu", str(dtype).removeprefix("torch."))
    with default_dtype(dtype):
        linear = Linear(8, 24, ops, bias=True)
    checkpoint = torch.randn(24, 8).to(dtype)
    with torch.no_grad():
        linear.rows().copy_(checkpoint)
        linear.bias.copy_(torch.randn(24).to(dtype))
    x = torch.randn(3, 8).to(dtype)
    expected = F.linear(x.float(), checkpoint.float(), linear.bias.float())
    torch.testing.assert_close(linear(x).float(), expected, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("dtype, transposed", [("float32", True), ("bfloat16", False)])
def test_a_tied_head_is_stored_as_it_streams_fastest(dtype, transposed) -> None:
    config = replace(demo_config(), tie_word_embeddings=True)
    model = build_model(config, build_kernel_table("cpu", dtype), dtype, "meta", 8)
    assert model.head_transposed is transposed
    assert tuple(model.embedding.shape) == (config.vocab_size, config.hidden_size)
